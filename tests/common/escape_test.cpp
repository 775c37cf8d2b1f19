// Escaping of user strings echoed in messages, and random request ids.
#include "common/escape.h"

#include <gtest/gtest.h>

#include <set>

#include "common/random_id.h"

namespace kvsplit {
namespace {

TEST(EscapeForMessage, PrintableTextPassesThrough) {
  EXPECT_EQ(escape_for_message("gold-class_1"), "gold-class_1");
  EXPECT_EQ(escape_for_message("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80"),
            "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80");
  EXPECT_EQ(escape_for_message(""), "");
}

TEST(EscapeForMessage, ControlsAndBadUtf8BecomeHexBytes) {
  EXPECT_EQ(escape_for_message(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escape_for_message("\x1b[31mred\x1b[0m"), "\\x1b[31mred\\x1b[0m");
  EXPECT_EQ(escape_for_message("line\nbreak\r\t\x7f"), "line\\x0abreak\\x0d\\x09\\x7f");
  EXPECT_EQ(escape_for_message("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(escape_for_message("\xc0\xaf"), "\\xc0\\xaf");               // overlong
  EXPECT_EQ(escape_for_message("\xed\xa0\x80"), "\\xed\\xa0\\x80");      // surrogate
  EXPECT_EQ(escape_for_message("ab\xe4\xb8"), "ab\\xe4\\xb8");           // cut short
  EXPECT_EQ(escape_for_message("\xc2\x85"), "\\xc2\\x85");               // C1 control (NEL)
  EXPECT_EQ(escape_for_message("x\xe2\x80\xaey"), "x\\xe2\\x80\\xaey");  // RLO bidi override
  EXPECT_EQ(escape_for_message("a\\b'c\"d"), "a\\\\b\\'c\\\"d");
}

TEST(EscapeForMessage, LongInputIsCutAtACharacterBoundary) {
  EXPECT_EQ(escape_for_message(std::string(10, 'x'), 4), "xxxx...(10 bytes)");
  // The 3-byte character at offset 3 does not fit in 4 bytes: it is left out whole.
  EXPECT_EQ(escape_for_message("abc\xe4\xb8\x96z", 4), "abc...(7 bytes)");
  EXPECT_EQ(escape_for_message(std::string(5000, '\0')).size(),
            kMaxEchoBytes * 4 + std::string("...(5000 bytes)").size());
}

TEST(EscapeForMessage, OutputHasNoControlBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string out = escape_for_message(all, all.size());
  for (unsigned char ch : out) EXPECT_TRUE(ch >= 0x20 && ch != 0x7f) << static_cast<int>(ch);
}

TEST(RandomId, PrefixAnd128BitsOfHex) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = random_id("grpc-");
    ASSERT_EQ(id.size(), 5u + 32u) << id;
    EXPECT_EQ(id.rfind("grpc-", 0), 0u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
    EXPECT_TRUE(ids.insert(id).second) << id;
  }
}

}  // namespace
}  // namespace kvsplit
