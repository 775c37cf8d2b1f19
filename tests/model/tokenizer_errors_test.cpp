// Malformed tokenizer files: each returns a Status naming the file and the fault, never a crash.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "common/json_util.h"
#include "model/tokenizer.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::model_path;

class TokenizerErrors : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_.file(name), std::ios::binary) << bytes;
    return dir_.file(name);
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Expects `code` and a message that names the file and contains `fault`.
  static void expect_error(const std::string& path, int vocab, StatusCode code,
                           const std::string& fault) {
    auto t = load_tokenizer(path, vocab);
    ASSERT_FALSE(t.ok()) << path;
    EXPECT_EQ(t.status().code(), code) << t.status().to_string();
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find(fault), std::string::npos) << t.status().to_string();
  }
  static std::string entry(float score, int32_t len, const std::string& bytes) {
    std::string e(8, '\0');
    std::memcpy(e.data(), &score, 4);
    std::memcpy(e.data() + 4, &len, 4);
    return e + bytes;
  }
  static std::string header(uint32_t max_len) {
    std::string h(4, '\0');
    std::memcpy(h.data(), &max_len, 4);
    return h;
  }
  kvsplit::testing::TempDir dir_;
};

TEST_F(TokenizerErrors, MissingFile) {
  expect_error(dir_.file("nope.bin"), 0, StatusCode::kNotFound, "no such file");
}

TEST_F(TokenizerErrors, NegativeExpectedVocab) {
  expect_error(write("x.bin", header(7)), -1, StatusCode::kInvalidArgument, "negative");
}

TEST_F(TokenizerErrors, Llama2cTruncatedAndMismatched) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string good = read(model_path("tok512.bin"));
  ASSERT_EQ(good.size(), 6227u);
  ASSERT_TRUE(load_tokenizer(write("good.bin", good), 512).ok());
  expect_error(write("empty.bin", ""), 512, StatusCode::kInvalidArgument, "truncated");
  expect_error(write("hdr.bin", good.substr(0, 2)), 512, StatusCode::kInvalidArgument,
               "max_token_length");
  // Cut inside an entry header, and inside an entry's bytes.
  expect_error(write("t1.bin", good.substr(0, 4 + 5)), 512, StatusCode::kInvalidArgument,
               "truncated in the header of entry 0");
  expect_error(write("t2.bin", good.substr(0, good.size() - 2)), 512, StatusCode::kInvalidArgument,
               "truncated in the bytes of entry 511");
  expect_error(write("t3.bin", good.substr(0, good.size() - 2)), 0, StatusCode::kInvalidArgument,
               "truncated");
  // Vocab count vs the model.
  expect_error(write("v1.bin", good), 600, StatusCode::kInvalidArgument, "vocab mismatch");
  expect_error(write("v2.bin", good), 500, StatusCode::kInvalidArgument, "vocab mismatch");
  // Without an expected count the whole file is read.
  auto all = load_tokenizer(write("v3.bin", good), 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)->vocab_size(), 512);
}

// A llama2.c tokenizer.bin whose max_token_length is 123 starts with '{' like a tokenizer.json:
// it loads as what it is (it used to fail as "bad JSON").
TEST_F(TokenizerErrors, Llama2cFileStartingWithABraceLoads) {
  KVSPLIT_REQUIRE_MODELS();
  std::string bytes = read(model_path("tok512.bin"));
  ASSERT_GE(bytes.size(), 4u);
  const std::string h = header(123);  // low byte 0x7B = '{'
  ASSERT_EQ(h[0], '{');
  bytes.replace(0, 4, h);
  const std::string path = write("brace.bin", bytes);
  auto t = load_tokenizer(path, 512);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto ref = load_tokenizer(model_path("tok512.bin"), 512);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(*(*t)->encode("Once upon a time", true), *(*ref)->encode("Once upon a time", true));
  // A broken tokenizer.json still reports its JSON error.
  expect_error(write("bad.json", "{\"model\": "), 0, StatusCode::kInvalidArgument, "bad JSON");
}

TEST_F(TokenizerErrors, Llama2cBadLengths) {
  const std::string three = entry(0, 1, "a") + entry(0, 1, "b") + entry(0, 1, "c");
  ASSERT_TRUE(load_tokenizer(write("ok.bin", header(4) + three), 3).ok());
  expect_error(write("neg.bin", header(4) + entry(0, -1, "") + three), 0,
               StatusCode::kInvalidArgument, "negative length");
  expect_error(write("huge.bin", header(4) + entry(0, 2000000000, "abc")), 0,
               StatusCode::kInvalidArgument, "max_token_length");
  expect_error(write("huge2.bin", header(1 << 20) + entry(0, 1 << 19, "abc")), 0,
               StatusCode::kInvalidArgument, "truncated in the bytes of entry 0");
  expect_error(write("long.bin", header(1) + entry(0, 2, "ab") + three), 0,
               StatusCode::kInvalidArgument, "entry 0 has length 2 > max_token_length 1");
  expect_error(write("maxlen.bin", header(0) + three), 0, StatusCode::kInvalidArgument,
               "bad max_token_length");
  expect_error(write("few.bin", header(4) + entry(0, 1, "a")), 0, StatusCode::kInvalidArgument,
               "at least 3 entries");
}

// Scores rank the BPE merges: a NaN or infinite one would make every merge lose (one token per
// character, no error), so the file is refused naming the entry.
TEST_F(TokenizerErrors, Llama2cNonFiniteScore) {
  const std::string three = entry(0, 1, "a") + entry(0, 1, "b") + entry(0, 1, "c");
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    expect_error(write("nan.bin", header(4) + three + entry(bad, 2, "ab")), 0,
                 StatusCode::kInvalidArgument, "entry 3 has a non-finite score");
  }
}

// A file named *.json is reported as the HF tokenizer it claims to be, whatever it holds (an
// empty or random one used to read as a llama2.c tokenizer.bin: "bad max_token_length").
TEST_F(TokenizerErrors, ABrokenTokenizerJsonIsReportedAsJson) {
  for (const std::string& bytes : {std::string(), std::string("\x93\x01garbage\xff", 11)}) {
    auto t = load_tokenizer(write("tokenizer.json", bytes), 0);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().message().find("llama2.c"), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos)
        << t.status().to_string();
  }
}

// A tokenizer.bin without byte tokens still loads; text needing byte fallback is an error.
TEST_F(TokenizerErrors, Llama2cWithoutByteTokensRejectsUnknownText) {
  std::string f = header(5) + entry(0, 5, "<unk>") + entry(0, 3, "<s>") + entry(0, 4, "</s>") +
                  entry(0, 1, " ") + entry(-1, 1, "a");
  auto t = load_tokenizer(write("tiny.bin", f), 5);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*(*t)->encode("aa", true), (std::vector<int32_t>{1, 3, 4, 4}));
  auto bad = (*t)->encode("b", true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

class HfErrors : public TokenizerErrors {
 protected:
  void SetUp() override {
    KVSPLIT_REQUIRE_MODELS();
    std::ifstream in(model_path("stories260K-hf/tokenizer.json"));
    base_ = nlohmann::json::parse(in);
  }
  std::string write_json(const std::string& name, const nlohmann::json& j) {
    return write(name, j.dump());
  }
  nlohmann::json base_;
};

TEST_F(HfErrors, BadJson) {
  expect_error(write("bad.json", "{\"model\": {\"type\": \"BPE\", "), 0,
               StatusCode::kInvalidArgument, "bad JSON");
  expect_error(write("arr.json", "{}"), 0, StatusCode::kInvalidArgument, "field model");
}

TEST_F(HfErrors, MissingAndMistypedFields) {
  auto j = base_;
  j["model"].erase("vocab");
  expect_error(write_json("novocab.json", j), 0, StatusCode::kInvalidArgument, "model.vocab");
  j = base_;
  j["model"].erase("merges");
  expect_error(write_json("nomerges.json", j), 0, StatusCode::kInvalidArgument, "model.merges");
  j = base_;
  j["model"]["merges"][3] = "nospace";
  expect_error(write_json("m1.json", j), 0, StatusCode::kInvalidArgument, "model.merges[3]");
  j = base_;
  j["model"]["merges"][4] = "\xE2\x96\x81 zzzq";
  expect_error(write_json("m2.json", j), 0, StatusCode::kInvalidArgument, "'zzzq' is not in");
  j = base_;
  j["model"]["merges"][5] = 17;
  expect_error(write_json("m3.json", j), 0, StatusCode::kInvalidArgument, "model.merges[5]");
  j = base_;
  j["model"]["vocab"]["x"] = "seven";
  expect_error(write_json("v1.json", j), 0, StatusCode::kInvalidArgument, "model.vocab[\"x\"]");
  j = base_;
  j["model"]["vocab"]["xyzzy"] = 5;  // id 5 is already "<0x02>"
  expect_error(write_json("v2.json", j), 0, StatusCode::kInvalidArgument, "used twice");
  j = base_;
  j["model"]["byte_fallback"] = "yes";
  expect_error(write_json("bf.json", j), 0, StatusCode::kInvalidArgument, "model.byte_fallback");
  j = base_;
  j["added_tokens"][0].erase("id");
  expect_error(write_json("at.json", j), 0, StatusCode::kInvalidArgument, "added_tokens[0].id");
  j = base_;
  j["normalizer"]["normalizers"][1].erase("content");
  expect_error(write_json("n.json", j), 0, StatusCode::kInvalidArgument,
               "normalizer.normalizers[1].content");
}

TEST_F(HfErrors, VocabMismatch) {
  expect_error(write_json("ok.json", base_), 100, StatusCode::kInvalidArgument, "vocab mismatch");
  // A model with a padded embedding (more rows than tokens) is fine.
  EXPECT_TRUE(load_tokenizer(write_json("pad.json", base_), 520).ok());
}

TEST_F(HfErrors, UnsupportedModelAndComponents) {
  auto j = base_;
  j["model"]["type"] = "Unigram";
  expect_error(write_json("u.json", j), 0, StatusCode::kUnimplemented,
               "field model.type: value 'Unigram'");
  j = base_;
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(write_json("nfkc.json", j), 0, StatusCode::kUnimplemented,
               "field normalizer.type: normalizer type 'NFKC'");
  j = base_;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(write_json("ws.json", j), 0, StatusCode::kUnimplemented,
               "field pre_tokenizer.type: pre-tokenizer type 'Whitespace'");
  j = base_;
  j["model"]["dropout"] = 0.1;
  expect_error(write_json("dropout.json", j), 0, StatusCode::kUnimplemented,
               "field model.dropout: BPE dropout '0.1'");
  j = base_;
  j["post_processor"] = {{"type", "Custom"}};
  expect_error(write_json("pp.json", j), 0, StatusCode::kUnimplemented,
               "field post_processor.type: post-processor type 'Custom'");
}

// A ByteLevel component sends the file to the byte-level loader, which wants a ByteLevel
// pre-tokenizer (the SentencePiece layout has none).
TEST_F(HfErrors, ByteLevelDecoderWithoutByteLevelPreTokenizer) {
  auto j = base_;
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteLevel"}}}}};
  expect_error(write_json("bl.json", j), 0, StatusCode::kUnimplemented,
               "field pre_tokenizer: a byte-level file needs a ByteLevel one");
}

TEST_F(HfErrors, TemplateIdsAndAddedTokens) {
  auto j = base_;
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {600};
  expect_error(write_json("t1.json", j), 0, StatusCode::kInvalidArgument,
               "field post_processor.special_tokens.<s>.ids: id '600' is out of range");
  j = base_;
  j["added_tokens"][1]["id"] = 0;  // "<s>" on "<unk>"'s id
  expect_error(write_json("a1.json", j), 0, StatusCode::kInvalidArgument,
               "field added_tokens[1].id: id 0 is used twice");
  j = base_;
  j["added_tokens"][1]["id"] = -4;
  expect_error(write_json("a2.json", j), 0, StatusCode::kInvalidArgument,
               "field added_tokens[1].id: expected an id in [0, 2^24), got '-4'");
  j = base_;
  j["added_tokens"][2]["lstrip"] = "yes";
  expect_error(write_json("a3.json", j), 0, StatusCode::kInvalidArgument,
               "field added_tokens[2].lstrip: expected a bool, got 'yes'");
}

TEST_F(HfErrors, TokenizerConfigBesideTheFile) {
  const std::string path = write_json("tokenizer.json", base_);
  write("tokenizer_config.json", "{\"eos_token\": ");
  expect_error(path, 0, StatusCode::kInvalidArgument, "tokenizer_config.json");
  write("tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}");
  expect_error(path, 0, StatusCode::kInvalidArgument, "field eos_token: '<|nope|>'");
  write("tokenizer_config.json", "{\"eos_token\": {\"content\": \"<unk>\"}, \"bos_token\": null}");
  auto t = load_tokenizer(path, 0);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->eos_id(), 0);
  EXPECT_EQ((*t)->bos_id(), 1);  // from the post-processor
  // Not a regular file: refused at once (a FIFO hung the load, as /dev/zero grew without bound).
  const std::string config = write("tokenizer_config.json", "");
  std::filesystem::remove(config);
  ASSERT_EQ(mkfifo(config.c_str(), 0600), 0);
  expect_error(path, 0, StatusCode::kInvalidArgument, "tokenizer_config.json");
  std::filesystem::remove(config);
  write("tokenizer_config.json", "{\"eos_token\": \"<unk>\", \"eos_token\": \"<s>\"}");
  expect_error(path, 0, StatusCode::kInvalidArgument, "duplicate key 'eos_token'");
}

// The decoder decides the leading space: transformers' add_prefix_space=False file has no Strip
// step, and HF keeps the space (it was always dropped); a decoder this loader cannot follow is
// refused rather than decoded the Llama way.
TEST_F(HfErrors, TheDecoderDecidesTheLeadingSpace) {
  auto j = base_;
  auto with = load_tokenizer(write_json("strip.json", j), 0);
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  const int32_t once = (*with)->encode("Once", false)->front();  // "▁Once"
  EXPECT_EQ((*with)->decode_token(1, once), "Once");
  j["decoder"]["decoders"].erase(3);  // the Strip step
  auto without = load_tokenizer(write_json("nostrip.json", j), 0);
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  EXPECT_EQ((*without)->decode_token(1, once), " Once");
  EXPECT_EQ((*without)->decode_token(once, once), " Once");
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(write_json("wp.json", j), 0, StatusCode::kUnimplemented, "decoder.type");
  j = base_;
  std::swap(j["decoder"]["decoders"][2], j["decoder"]["decoders"][3]);  // Strip before Fuse
  expect_error(write_json("sf.json", j), 0, StatusCode::kUnimplemented, "decoder.decoders[2]");
}

// A few bytes of JSON must not make the loader allocate tables for 2^24 ids (1.2 GB): ids far
// beyond the number of entries are refused, in the vocabulary and in the added tokens.
TEST_F(HfErrors, SparseIdsAreRefused) {
  auto j = base_;
  j["model"]["vocab"]["far"] = 16777215;
  expect_error(write_json("v.json", j), 0, StatusCode::kInvalidArgument,
               "id 16777215 is far beyond");
  j = base_;
  j["added_tokens"][2]["id"] = 16777214;
  expect_error(write_json("a.json", j), 0, StatusCode::kInvalidArgument,
               "field added_tokens[2].id: id 16777214 is far beyond");
  j = base_;
  j["added_tokens"][2]["id"] = 600;  // a gap above the vocabulary is fine
  EXPECT_TRUE(load_tokenizer(write_json("gap.json", j), 0).ok());
}

// Nesting past 128 levels is refused before the parser builds it (each level ~90 bytes: a
// tokenizer.json of '[' took ~90x its size).
TEST_F(HfErrors, DeepNestingIsRefused) {
  expect_error(write("deep.json", std::string(100000, '[')), 0, StatusCode::kInvalidArgument,
               "nested deeper than 128 levels");
  // Brackets inside strings do not count, an escaped quote does not end one.
  EXPECT_TRUE(common::json_depth_within(R"([{"a": "[[[[{{"}])", 2));
  EXPECT_TRUE(common::json_depth_within(R"(["\"[[[["])", 1));
  EXPECT_FALSE(common::json_depth_within(R"([{"a": [1]}])", 2));
  EXPECT_TRUE(common::json_depth_within("[[],[],[]]", 2));
}

TEST_F(HfErrors, NoByteFallbackUsesUnkOrFails) {
  auto j = base_;
  j["model"]["byte_fallback"] = false;
  auto fused = load_tokenizer(write_json("unk.json", j), 512);
  ASSERT_TRUE(fused.ok());
  // Two unknown characters fuse into one <unk> (fuse_unk), then "a" merges as usual.
  auto ids = (*fused)->encode("\xE4\xB8\xAD\xE6\x96\x87", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[ids->size() - 1], 0);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 0), 1);
  j["model"]["fuse_unk"] = false;
  auto unfused = load_tokenizer(write_json("unk2.json", j), 512);
  ASSERT_TRUE(unfused.ok());
  ids = (*unfused)->encode("\xE4\xB8\xAD\xE6\x96\x87", false);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 0), 2);
  j["model"]["unk_token"] = nullptr;
  auto none = load_tokenizer(write_json("unk3.json", j), 512);
  ASSERT_TRUE(none.ok());
  auto bad = (*none)->encode("\xE4\xB8\xAD", false);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*none)->encode("plain text", false).ok());
}

}  // namespace
}  // namespace kvsplit::model
