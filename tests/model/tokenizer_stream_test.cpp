// decode_token rules, StreamDecoder (UTF-8 completion, U+FFFD), the byte stand-in tokenizer,
// and the legacy / array-merge tokenizer.json layouts.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::model_path;

const std::string kFFFD = "\xEF\xBF\xBD";

// Pushes `ids` one by one; returns what each push emitted, then the flush as the last element.
std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids,
                                int32_t prev = -1) {
  StreamDecoder d(t, prev);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(d.push(id));
  out.push_back(d.flush());
  return out;
}

std::vector<int32_t> bytes_ids(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c) + 3);
  return ids;
}

TEST(ByteTokenizer, EncodeDecode) {
  auto t = make_byte_tokenizer(512);
  EXPECT_EQ(t->kind(), "bytes");
  EXPECT_EQ(t->vocab_size(), 512);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  const std::string text("a\0\xFF z", 5);
  auto ids = t->encode(text, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 'a' + 3, 3, 258, ' ' + 3, 'z' + 3}));
  EXPECT_EQ(*t->encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(t->encode("", false)->empty());
  EXPECT_EQ(t->decode_token(1, ' ' + 3), " ");  // no dummy prefix: nothing is stripped
  EXPECT_EQ(t->decode_token(-1, 0), "");
  EXPECT_EQ(t->decode_token(-1, 1), "");
  EXPECT_EQ(t->decode_token(-1, 2), "");
  EXPECT_EQ(t->decode_token(-1, 300), "");  // past the bytes
  EXPECT_EQ(t->decode_token(-1, -5), "");
  std::string back;
  for (int32_t id : *ids) back += t->decode_token(-1, id);
  EXPECT_EQ(back, text);
}

TEST(ByteTokenizer, SmallVocabRejectsBytesThatDoNotFit) {
  auto t = make_byte_tokenizer(100);  // bytes 0..96 fit
  EXPECT_TRUE(t->encode("ABC", true).ok());
  auto bad = t->encode("abc", true);  // 'a' = 97 -> id 100
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("byte 97"), std::string::npos);
}

TEST(StreamDecoder, MultiByteCharactersSplitAcrossByteTokens) {
  auto t = make_byte_tokenizer(259);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  const std::string cjk = "\xE4\xB8\xAD";        // U+4E2D
  auto out = stream(*t, bytes_ids("a" + emoji + cjk + "b"));
  EXPECT_EQ(out, (std::vector<std::string>{"a", "", "", "", emoji, "", "", cjk, "b", ""}));
}

TEST(StreamDecoder, InvalidSequencesBecomeReplacementCharacters) {
  auto t = make_byte_tokenizer(259);
  // Stray continuation byte; a lead byte followed by ASCII; an overlong form; a surrogate.
  auto out = stream(*t, bytes_ids("\x80"
                                  "\xE4"
                                  "A"
                                  "\xC0\xAF"
                                  "\xED\xA0\x80"));
  std::string all;
  for (auto& s : out) all += s;
  EXPECT_EQ(out[0], kFFFD);
  EXPECT_EQ(out[1], "");  // E4 could still start a character
  EXPECT_EQ(out[2], kFFFD + "A");
  // C0 and AF are each invalid; ED A0 is an ill-formed subpart, then 80.
  EXPECT_EQ(all, kFFFD + kFFFD + "A" + kFFFD + kFFFD + kFFFD + kFFFD + kFFFD);
}

TEST(StreamDecoder, FlushReplacesAnIncompleteCharacter) {
  auto t = make_byte_tokenizer(259);
  auto out = stream(*t, bytes_ids("x\xF0\x9F\x98"));
  EXPECT_EQ(out, (std::vector<std::string>{"x", "", "", "", kFFFD}));
  StreamDecoder d(*t);
  EXPECT_EQ(d.flush(), "");
  EXPECT_EQ(d.push(1), "");  // BOS
  EXPECT_EQ(d.push('h' + 3), "h");
}

TEST(StreamDecoder, RealTokenizersStreamEmojiAndCjk) {
  KVSPLIT_REQUIRE_MODELS();
  for (const char* rel : {"tok512.bin", "stories260K-hf/tokenizer.json",
                          "tokenizers/llama2/tokenizer.bin", "tokenizers/llama2/tokenizer.json"}) {
    auto t = load_tokenizer(model_path(rel));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const std::string text = "Hi \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9!";
    auto ids = (*t)->encode(text, true);
    ASSERT_TRUE(ids.ok());
    StreamDecoder d(**t);
    const auto bytes = make_byte_tokenizer(259);
    std::string all;
    for (int32_t id : *ids) {
      const std::string piece = d.push(id);
      // Every emission is whole characters: valid UTF-8 on its own.
      std::string check;
      StreamDecoder inner(*bytes);
      for (char c : piece) check += inner.push(static_cast<uint8_t>(c) + 3);
      EXPECT_EQ(check + inner.flush(), piece) << rel;
      EXPECT_EQ(piece.find(kFFFD), std::string::npos) << rel;
      all += piece;
    }
    EXPECT_EQ(all + d.flush(), text) << rel;
  }
}

TEST(DecodeToken, Llama2cRules) {
  KVSPLIT_REQUIRE_MODELS();
  auto t = load_tokenizer(model_path("tok512.bin"), 512);
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.kind(), "llama2c");
  // 403 " Once": the leading space goes after BOS and at the start, stays elsewhere.
  EXPECT_EQ(tok.decode_token(1, 403), "Once");
  EXPECT_EQ(tok.decode_token(-1, 403), "Once");
  EXPECT_EQ(tok.decode_token(403, 403), " Once");
  EXPECT_EQ(tok.decode_token(-1, 13 + 3), "\r");  // <0x0D>
  EXPECT_EQ(tok.decode_token(5, 0), "");          // <unk>
  EXPECT_EQ(tok.decode_token(5, 1), "");          // BOS "\n<s>\n"
  EXPECT_EQ(tok.decode_token(5, 2), "");          // EOS
  EXPECT_EQ(tok.decode_token(5, 512), "");
  // NUL ends the text, as in run.c (a C string): "a\0b" is "a", "\0b" is empty (no dummy prefix).
  auto ids = tok.encode(std::string("a\0b", 3), true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, *tok.encode("a", true));
  EXPECT_EQ(*tok.encode(std::string("\0b", 2), true), std::vector<int32_t>{1});
}

TEST(DecodeToken, HfRules) {
  KVSPLIT_REQUIRE_MODELS();
  auto t = load_tokenizer(model_path("tokenizers/llama2/tokenizer.json"), 32000);
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.decode_token(1, 15043), "Hello");  // "▁Hello"
  EXPECT_EQ(tok.decode_token(-1, 15043), "Hello");
  EXPECT_EQ(tok.decode_token(263, 15043), " Hello");
  EXPECT_EQ(tok.decode_token(263, 13), "\n");  // <0x0A>
  EXPECT_EQ(tok.decode_token(263, 0), "");
  EXPECT_EQ(tok.decode_token(263, 1), "");
  EXPECT_EQ(tok.decode_token(263, 2), "");
  EXPECT_EQ(tok.decode_token(263, 32000), "");
}

// The same stories260K tokenizer.json rewritten: legacy Metaspace pre-tokenizer instead of the
// normalizer, and merges as ["a", "b"] arrays.
TEST(HfLayouts, LegacyMetaspaceAndArrayMerges) {
  KVSPLIT_REQUIRE_MODELS();
  std::ifstream in(model_path("stories260K-hf/tokenizer.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  nlohmann::json arrays = nlohmann::json::array();
  for (const std::string m : j["model"]["merges"]) {
    arrays.push_back({m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1)});
  }
  j["model"]["merges"] = arrays;
  kvsplit::testing::TempDir dir;
  auto write = [&](const std::string& name, const nlohmann::json& v) {
    std::ofstream(dir.file(name)) << v.dump();
    return dir.file(name);
  };
  auto arrays_tok = load_tokenizer(write("arrays.json", j), 512);
  ASSERT_TRUE(arrays_tok.ok()) << arrays_tok.status().to_string();

  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\xE2\x96\x81"},
                        {"prepend_scheme", "always"},
                        {"split", false}};
  auto legacy = load_tokenizer(write("legacy.json", j), 512);
  ASSERT_TRUE(legacy.ok()) << legacy.status().to_string();
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\xE2\x96\x81"},
                        {"add_prefix_space", true}};  // split defaults to true
  auto legacy_split = load_tokenizer(write("legacy_split.json", j), 512);
  ASSERT_TRUE(legacy_split.ok()) << legacy_split.status().to_string();

  int compared = 0;
  for (const auto& c : kvsplit::testing::read_jsonl(model_path("golden/tok512_encode.jsonl"))) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(*(*arrays_tok)->encode(text, true), want) << text;
    // Metaspace adds no "▁" when the text already starts with a space: only those differ.
    if (!text.empty() && text[0] == ' ') {
      EXPECT_NE(*(*legacy)->encode(text, true), want) << text;
    } else {
      EXPECT_EQ(*(*legacy)->encode(text, true), want) << text;
      ++compared;
    }
  }
  EXPECT_GT(compared, 30);
  // With split, merges stay inside words; plain prose is unaffected.
  EXPECT_EQ(*(*legacy_split)->encode("Once upon a time", true),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
  const std::string spaced = "a  b";
  auto split_ids = (*legacy_split)->encode(spaced, false);
  ASSERT_TRUE(split_ids.ok());
  std::string back;
  for (size_t i = 0; i < split_ids->size(); ++i) {
    back += (*legacy_split)->decode_token(i ? (*split_ids)[i - 1] : -1, (*split_ids)[i]);
  }
  EXPECT_EQ(back, spaced);
}

// Text from a request or a file is refused, naming the offset, where the tokenizer would end it
// at a NUL byte (llama2.c's format): nothing is cut silently. Tokenizers that encode NUL take it.
TEST(CheckNoDroppedText, RefusesANulOnlyWhereEncodeWouldCutThere) {
  KVSPLIT_REQUIRE_MODELS();
  auto bin = load_tokenizer(model_path("tok512.bin"));
  auto hf = load_tokenizer(model_path("stories260K-hf/tokenizer.json"));
  ASSERT_TRUE(bin.ok() && hf.ok());
  const std::string text("Once\0 upon", 10);
  EXPECT_TRUE((*bin)->text_ends_at_nul());
  const Status st = check_no_dropped_text(**bin, text, "prompt");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("prompt: a NUL byte at offset 4"), std::string::npos) << st.message();
  EXPECT_TRUE(check_no_dropped_text(**bin, "Once upon", "prompt").ok());
  EXPECT_FALSE((*hf)->text_ends_at_nul());
  EXPECT_TRUE(check_no_dropped_text(**hf, text, "prompt").ok());
  EXPECT_FALSE(make_byte_tokenizer(512)->text_ends_at_nul());
}

}  // namespace
}  // namespace kvsplit::model
