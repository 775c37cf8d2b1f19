// common/utf8.h: the one UTF-8 scanner (tokenizers, streaming decode, the gRPC edge, escaping).
#include "common/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kvsplit::utf8 {
namespace {

TEST(Utf8Test, ValidatesAndLocatesBadBytes) {
  EXPECT_TRUE(is_valid("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80"));
  size_t at = 99;
  EXPECT_FALSE(is_valid("ab\xff", &at));
  EXPECT_EQ(at, 2u);
  EXPECT_FALSE(is_valid("\xc0\xaf"));          // overlong
  EXPECT_FALSE(is_valid("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(is_valid("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid("x\xe4\xb8", &at));    // cut short
  EXPECT_EQ(at, 1u);
}

TEST(Utf8Test, AppendValidHoldsBackOrReplaces) {
  std::string out;
  EXPECT_EQ(append_valid("a\xe4\xb8", /*final=*/false, out), 1u);  // the cut tail is kept
  EXPECT_EQ(out, "a");
  out.clear();
  EXPECT_EQ(append_valid("\xff"
                         "c\xe4",
                         /*final=*/true, out),
            3u);
  EXPECT_EQ(out,
            "\xef\xbf\xbd"
            "c\xef\xbf\xbd");
  EXPECT_TRUE(is_valid(out));
}

TEST(Utf8Test, CodePoints) {
  EXPECT_EQ(code_point("A", 1), 0x41u);
  EXPECT_EQ(code_point("\xc3\xa9", 2), 0xE9u);
  EXPECT_EQ(code_point("\xe2\x80\xae", 3), 0x202Eu);
  EXPECT_EQ(code_point("\xf0\x9f\x98\x80", 4), 0x1F600u);
}

}  // namespace
}  // namespace kvsplit::utf8
