// Byte-level BPE tokenizers: the GPT-2 and Qwen2 encode vectors (plain-text and HF ids), decode
// round trips, streaming of characters split over tokens, and a synthetic Llama-3-style file
// (its split regex, <|begin_of_text|>, ignore_merges, added-token options) built here.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "model/pretokenize_regex.h"
#include "model/tokenizer.h"
#include "model/unicode.h"
#include "model/utf8.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::model_path;
using kvsplit::testing::read_jsonl;
using Ids = std::vector<int32_t>;

constexpr EncodeOptions kAsText{.add_special = true, .parse_special = false};
constexpr EncodeOptions kHfDefault{.add_special = true, .parse_special = true};
constexpr EncodeOptions kNoSpecial{.add_special = false, .parse_special = true};

#define REQUIRE_FILE(rel)                                                   \
  do {                                                                      \
    if (!std::filesystem::exists(model_path(rel)))                          \
      GTEST_SKIP() << model_path(rel) << " not found (set KVSPLIT_MODELS)"; \
  } while (0)

std::unique_ptr<Tokenizer> load(const std::string& path) {
  auto t = load_tokenizer(path, 0);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

Ids encode(const Tokenizer& t, std::string_view text, const EncodeOptions& o) {
  auto ids = t.encode(text, o);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : Ids{};
}

std::string decode_all(const Tokenizer& t, const Ids& ids) {
  StreamDecoder d(t);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  return out + d.flush();
}

// ---- the shared GPT-2 and Qwen2 files ----

struct SharedVectors : ::testing::TestWithParam<const char*> {};

// `ids` with special-token text as plain text; `hf_tokenizers_ids` (else `ids`) by default.
TEST_P(SharedVectors, ReproducesEveryVector) {
  const std::string dir = std::string("tokenizers/") + GetParam();
  REQUIRE_FILE(dir + "/tokenizer.json");
  auto tok = load(model_path(dir + "/tokenizer.json"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->kind(), "hf-byte-level-bpe");
  const bool qwen = std::string(GetParam()) == "qwen2";
  EXPECT_EQ(tok->vocab_size(), qwen ? 151646 : 50257);
  EXPECT_EQ(tok->eos_id(), qwen ? 151645 : 50256);  // tokenizer_config.json's eos_token
  EXPECT_EQ(tok->bos_id(), qwen ? -1 : 50256);
  int cases = 0, hf_cases = 0, round_trips = 0;
  for (const auto& c : read_jsonl(model_path(dir + "/encode_shared.jsonl"))) {
    const std::string text = c["text"];
    const Ids want = c["ids"].get<Ids>();
    const Ids as_text = encode(*tok, text, kAsText);
    EXPECT_EQ(as_text, want) << "text: " << text;
    const Ids hf = c.contains("hf_tokenizers_ids") ? c["hf_tokenizers_ids"].get<Ids>() : want;
    hf_cases += c.contains("hf_tokenizers_ids");
    EXPECT_EQ(encode(*tok, text, kHfDefault), hf) << "text: " << text;
    // Neither adds anything around the text.
    EXPECT_EQ(encode(*tok, text, kNoSpecial), hf) << "text: " << text;
    // Decoding gives the text back, except where NFC changed it (Qwen2).
    if (unicode::nfc(text) == text || !qwen) {
      EXPECT_EQ(decode_all(*tok, as_text), text) << "text: " << text;
      ++round_trips;
    } else {
      EXPECT_EQ(decode_all(*tok, as_text), unicode::nfc(text));
    }
    ++cases;
  }
  EXPECT_EQ(cases, 60);
  EXPECT_EQ(hf_cases, 1);
  EXPECT_GE(round_trips, qwen ? 50 : 60);
}

INSTANTIATE_TEST_SUITE_P(Files, SharedVectors, ::testing::Values("gpt2", "qwen2"));

// Llama-2's HF file with HF's default: special-token text becomes the special ids, and the
// Prepend normalizer runs on each stretch between them.
TEST(Llama2Tokenizer, TokenizerJsonGivesHfIdsByDefault) {
  REQUIRE_FILE("tokenizers/llama2/tokenizer.json");
  auto tok = load(model_path("tokenizers/llama2/tokenizer.json"));
  ASSERT_TRUE(tok);
  int hf_cases = 0;
  for (const auto& c : read_jsonl(model_path("tokenizers/llama2/encode_shared.jsonl"))) {
    const std::string text = c["text"];
    const Ids want =
        c.contains("hf_tokenizers_ids") ? c["hf_tokenizers_ids"].get<Ids>() : c["ids"].get<Ids>();
    hf_cases += c.contains("hf_tokenizers_ids");
    EXPECT_EQ(encode(*tok, text, kHfDefault), want) << "text: " << text;
    Ids no_bos = encode(*tok, text, kNoSpecial);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(no_bos, Ids(want.begin() + 1, want.end())) << "text: " << text;
  }
  EXPECT_EQ(hf_cases, 1);
  EXPECT_EQ(encode(*tok, "<s> Hello </s>", kHfDefault), (Ids{1, 1, 29871, 15043, 29871, 2}));
}

// Multi-byte characters split over byte-level tokens come out whole, never as U+FFFD.
TEST(ByteLevelStream, CharactersSplitOverTokens) {
  REQUIRE_FILE("tokenizers/gpt2/tokenizer.json");
  auto tok = load(model_path("tokenizers/gpt2/tokenizer.json"));
  ASSERT_TRUE(tok);
  const std::string text =
      "caf\xC3\xA9 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
      "\xE4\xB8\x96\xE7\x95\x8C \xE1\x83\x92";
  const Ids ids = encode(*tok, text, kAsText);
  StreamDecoder d(*tok);
  std::string out;
  int partial = 0;
  for (int32_t id : ids) {
    const std::string piece = tok->decode_token(-1, id);
    std::string valid;
    utf8::append_valid(piece, /*final=*/true, valid);
    if (valid != piece) ++partial;  // starts or ends inside a character
    const std::string got = d.push(id);
    EXPECT_EQ(got.find("\xEF\xBF\xBD"), std::string::npos);
    out += got;
  }
  out += d.flush();
  EXPECT_EQ(out, text);
  EXPECT_GE(partial, 2);  // the test is only meaningful if tokens do end inside characters
}

// Ill-formed UTF-8 is encoded byte by byte and decodes back to the same bytes.
TEST(ByteLevelStream, IllFormedBytesRoundTrip) {
  REQUIRE_FILE("tokenizers/gpt2/tokenizer.json");
  auto tok = load(model_path("tokenizers/gpt2/tokenizer.json"));
  ASSERT_TRUE(tok);
  const std::string text =
      "a\xFF b\xC3 \xE2\x82 c\x80\x80"
      "d \xF0\x9F\x98";
  std::string bytes;
  for (int32_t id : encode(*tok, text, kAsText)) bytes += tok->decode_token(-1, id);
  EXPECT_EQ(bytes, text);
}

// ---- the split regexes (PCRE2) ----

std::vector<std::string> split(std::string_view pattern, std::string_view text) {
  auto re = RegexSplitter::compile(pattern, /*literal=*/false);
  EXPECT_TRUE(re.ok()) << re.status().to_string();
  std::vector<std::string_view> pieces;
  if (re.ok()) {
    EXPECT_TRUE((*re)->split_isolated(text, pieces).ok());
  }
  return {pieces.begin(), pieces.end()};
}

using Pieces = std::vector<std::string>;

// \s is White_Space, as in HF tokenizers (Oniguruma) and Python's regex: U+0085 is whitespace,
// U+FEFF and U+180E (whitespace to PCRE2's own \s) are not. The first two are the GPT-2 vectors
// "a \u0085b" and "a \ufeffb"; U+180E follows from the same rule.
TEST(PreTokenRegex, WhitespaceIsTheUnicodeProperty) {
  EXPECT_EQ(split(kGpt2SplitRegex, "a \u0085b"), (Pieces{"a", " ", "\u0085", "b"}));
  EXPECT_EQ(split(kGpt2SplitRegex, "a \uFEFFb"), (Pieces{"a", " \uFEFF", "b"}));
  EXPECT_EQ(split(kGpt2SplitRegex, "a \u180Eb"), (Pieces{"a", " \u180E", "b"}));
  // \s+(?!\S): a run of spaces leaves its last one to the next word.
  EXPECT_EQ(split(kGpt2SplitRegex, "a   b  \n"), (Pieces{"a", "  ", " b", "  \n"}));
  EXPECT_EQ(split(kGpt2SplitRegex, "I'm 12345 x!!"), (Pieces{"I", "'m", " 12345", " x", "!!"}));
}

constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Worked by hand from the pattern: case-insensitive contractions, digits in groups of three, a
// non-letter glued to the word after it, punctuation keeping its newlines.
const char kLlama3Text[] = "I'm HERE'S 12345 apples!!\n\n  \tok  bye";
const Pieces kLlama3Pieces = {"I",       "'m",     " HERE", "'S",   " ", "123", "45",
                              " apples", "!!\n\n", "  ",    "\tok", " ", " bye"};

TEST(PreTokenRegex, Llama3Pattern) {
  EXPECT_EQ(split(kLlama3Regex, kLlama3Text), kLlama3Pieces);
  EXPECT_EQ(split(kLlama3Regex, "x\r\n\r\n  y"), (Pieces{"x", "\r\n\r\n", " ", " y"}));
  EXPECT_EQ(split(kLlama3Regex, "1234567"), (Pieces{"123", "456", "7"}));
}

TEST(PreTokenRegex, BadPatternIsAnError) {
  auto re = RegexSplitter::compile("(ab", false);
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.status().message().find("(ab"), std::string::npos) << re.status().to_string();
}

// A Split pre-tokenizer's {"String": ...} pattern is matched as plain text. It was compiled with
// UCP, which PCRE2 refuses beside LITERAL: every tokenizer.json with one failed to load.
TEST(PreTokenRegex, LiteralPatternsSplitOnTheTextItself) {
  auto ll = RegexSplitter::compile("ll", /*literal=*/true);
  ASSERT_TRUE(ll.ok()) << ll.status().to_string();
  std::vector<std::string_view> out;
  ASSERT_TRUE((*ll)->split_isolated("hello well", out).ok());
  EXPECT_EQ(out, (std::vector<std::string_view>{"he", "ll", "o we", "ll"}));
  auto meta = RegexSplitter::compile("a.(", /*literal=*/true);  // no regex meaning
  ASSERT_TRUE(meta.ok()) << meta.status().to_string();
  out.clear();
  ASSERT_TRUE((*meta)->split_isolated("axa.(é", out).ok());
  EXPECT_EQ(out, (std::vector<std::string_view>{"ax", "a.(", "é"}));
}

TEST(Unicode, Nfc) {
  EXPECT_EQ(unicode::nfc("e\u0301t\u00E9"), "\u00E9t\u00E9");
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  // An ill-formed byte is kept and separates what is around it.
  EXPECT_EQ(unicode::nfc("e\xFF\u0301"), "e\xFF\u0301");
  EXPECT_EQ(unicode::nfc("\xC3"
                         "e\u0301"),
            "\xC3\u00E9");
}

// ---- a synthetic Llama-3-style tokenizer.json ----

// GPT-2's byte-to-unicode map, written out independently of the library's.
std::string byte_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; ++x) {
      cp += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
    }
  }
  if (cp < 0x80) return std::string(1, char(cp));
  return {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
}
std::string mapped(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += byte_char(static_cast<uint8_t>(c));
  return s;
}

constexpr int32_t kBeginOfText = 300, kEndOfText = 301, kEotId = 302, kMask = 303, kOny = 304;

// Ids 0..255: the bytes (id = byte value). Then every piece of kLlama3Pieces (ignore_merges
// takes a pre-token that is a piece whole), and "Ġb", "Ġby", "Ġbye" reached by merges only.
nlohmann::json llama3_style() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  int32_t next = 256;
  for (const std::string& p : kLlama3Pieces) {
    if (!vocab.contains(mapped(p))) vocab[mapped(p)] = next++;
  }
  for (const char* p : {" b", " by"}) vocab[mapped(p)] = next++;
  if (!vocab.contains(mapped(" bye"))) vocab[mapped(" bye")] = next++;
  EXPECT_LT(next, kBeginOfText);
  auto added = [](int32_t id, const char* content, bool special) {
    return nlohmann::json{{"id", id},          {"content", content}, {"single_word", false},
                          {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                          {"special", special}};
  };
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = {added(kBeginOfText, "<|begin_of_text|>", true),
                       added(kEndOfText, "<|end_of_text|>", true),
                       added(kEotId, "<|eot_id|>", true)};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", std::string(kLlama3Regex)}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}}}};
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
                           {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                            {"pair", nlohmann::json::array()},
                            {"special_tokens",
                             {{"<|begin_of_text|>",
                               {{"id", "<|begin_of_text|>"},
                                {"ids", {kBeginOfText}},
                                {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", true},
                {"vocab", vocab},
                {"merges", {mapped(" ") + " b", {mapped(" b"), "y"}, mapped(" by") + " e"}}};
  return j;
}

class Llama3Style : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_.file(name), std::ios::binary) << bytes;
    return dir_.file(name);
  }
  std::unique_ptr<Tokenizer> load_json(const nlohmann::json& j) {
    return load(write("tokenizer.json", j.dump()));
  }
  int32_t id_of(const std::string& piece) { return json_["model"]["vocab"][mapped(piece)]; }
  kvsplit::testing::TempDir dir_;
  nlohmann::json json_ = llama3_style();
};

// Every pre-token of the Llama-3 regex is a piece here, so each must come out as one id.
TEST_F(Llama3Style, PreTokensFollowTheLlama3Regex) {
  auto tok = load_json(json_);
  ASSERT_TRUE(tok);
  Ids want;
  for (const std::string& p : kLlama3Pieces) want.push_back(id_of(p));
  EXPECT_EQ(encode(*tok, kLlama3Text, kNoSpecial), want);
  EXPECT_EQ(decode_all(*tok, want), kLlama3Text);
  // Not a piece: merged by rank ("Ġ b", "Ġb y", "Ġby e"), or left as bytes.
  EXPECT_EQ(encode(*tok, "bye bye", kNoSpecial), (Ids{'b', 'y', 'e', id_of(" bye")}));
  json_["model"]["ignore_merges"] = false;
  auto merging = load_json(json_);
  ASSERT_TRUE(merging);
  EXPECT_EQ(encode(*merging, " bye", kNoSpecial), (Ids{id_of(" bye")}));
  EXPECT_EQ(encode(*merging, "'m", kNoSpecial), (Ids{'\'', 'm'}));  // no merge makes "'m"
}

TEST_F(Llama3Style, BeginOfTextAndSpecialTokens) {
  auto tok = load_json(json_);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos_id(), kBeginOfText);  // the post-processor's token
  EXPECT_EQ(tok->eos_id(), -1);            // none named without a tokenizer_config.json
  EXPECT_EQ(tok->vocab_size(), kEotId + 1);
  EXPECT_EQ(encode(*tok, "", kHfDefault), (Ids{kBeginOfText}));
  EXPECT_EQ(encode(*tok, "I<|eot_id|>I", kHfDefault), (Ids{kBeginOfText, 'I', kEotId, 'I'}));
  EXPECT_EQ(*tok->encode("I", true), (Ids{kBeginOfText, 'I'}));  // the bool form adds it too
  const Ids as_text = encode(*tok, "<|eot_id|>", kAsText);
  EXPECT_EQ(as_text.front(), kBeginOfText);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), kEotId), 0);
  EXPECT_EQ(decode_all(*tok, as_text), "<|eot_id|>");
  // Special tokens decode to "" (skip_special_tokens).
  EXPECT_EQ(decode_all(*tok, {kBeginOfText, 'I', kEotId}), "I");
}

// tokenizer_config.json beside the file names BOS / EOS; without a post-processor its
// add_bos_token decides whether BOS is added.
TEST_F(Llama3Style, TokenizerConfig) {
  write("tokenizer_config.json",
        R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"},
            "add_bos_token": true})");
  auto tok = load_json(json_);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->eos_id(), kEotId);
  json_["post_processor"] = nullptr;
  auto no_pp = load_json(json_);
  ASSERT_TRUE(no_pp);
  EXPECT_EQ(encode(*no_pp, "I", kHfDefault), (Ids{kBeginOfText, 'I'}));
  write("tokenizer_config.json", R"({"bos_token": "<|begin_of_text|>", "add_bos_token": false})");
  auto no_bos = load_json(json_);
  ASSERT_TRUE(no_bos);
  EXPECT_EQ(encode(*no_bos, "I", kHfDefault), (Ids{'I'}));
  EXPECT_EQ(no_bos->bos_id(), kBeginOfText);
  // A Llama tokenizer class: the flags replace the post-processor's template (transformers).
  json_["post_processor"] = {{"type", "TemplateProcessing"},
                             {"single",
                              {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                             {"special_tokens",
                              {{"<|begin_of_text|>",
                                {{"id", "<|begin_of_text|>"},
                                 {"ids", {kBeginOfText}},
                                 {"tokens", {"<|begin_of_text|>"}}}}}}};
  write("tokenizer_config.json",
        R"({"tokenizer_class": "LlamaTokenizerFast", "eos_token": "<|eot_id|>",
            "add_bos_token": false, "add_eos_token": true})");
  auto flags = load_json(json_);
  ASSERT_TRUE(flags);
  EXPECT_EQ(encode(*flags, "I", kHfDefault), (Ids{'I', kEotId}));
  write("tokenizer_config.json", R"({"eos_token": "<|eot_id|>", "add_eos_token": true})");
  auto file_template = load_json(json_);
  ASSERT_TRUE(file_template);
  EXPECT_EQ(encode(*file_template, "I", kHfDefault), (Ids{kBeginOfText, 'I'}));
}

// lstrip / rstrip take the whitespace around the token; single_word only matches between
// non-word characters (HF AddedVocabulary).
TEST_F(Llama3Style, AddedTokenOptions) {
  auto opt = [](int32_t id, const char* content, bool lstrip, bool rstrip, bool single_word) {
    return nlohmann::json{{"id", id},         {"content", content}, {"single_word", single_word},
                          {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", false},
                          {"special", false}};
  };
  json_["added_tokens"].push_back(opt(kMask, "<mask>", true, true, false));
  json_["added_tokens"].push_back(opt(kOny, "ony", false, false, true));
  auto tok = load_json(json_);
  ASSERT_TRUE(tok);
  // Non-special added tokens are matched even with special-token text as plain text.
  EXPECT_EQ(encode(*tok, "I  <mask> \tI", kNoSpecial), (Ids{'I', kMask, 'I'}));
  EXPECT_EQ(encode(*tok, "I  <mask> \tI", {.add_special = false, .parse_special = false}),
            (Ids{'I', kMask, 'I'}));
  EXPECT_EQ(decode_all(*tok, {'I', kMask, 'I'}), "I<mask>I");
  const Ids ids = encode(*tok, "Tony ony", kNoSpecial);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kOny), 1);  // not inside "Tony"
  EXPECT_EQ(ids.back(), kOny);
  EXPECT_EQ(decode_all(*tok, ids), "Tony ony");
}

// Malformed or unsupported files: the message names the file, the field and the value.
TEST_F(Llama3Style, ErrorsNameFileFieldAndValue) {
  struct Case {
    std::function<void(nlohmann::json&)> change;
    StatusCode code;
    std::string fault;
  };
  auto pre = [](nlohmann::json& j) -> nlohmann::json& {
    return j["pre_tokenizer"]["pretokenizers"][0];
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j["model"]["type"] = "WordPiece"; }, StatusCode::kUnimplemented,
       "field model.type: value 'WordPiece' is not supported"},
      {[&](auto& j) { pre(j)["type"] = "Digits"; }, StatusCode::kUnimplemented,
       "field pre_tokenizer.pretokenizers[0].type: pre-tokenizer type 'Digits'"},
      {[&](auto& j) { pre(j)["behavior"] = "Removed"; }, StatusCode::kUnimplemented,
       "field pre_tokenizer.pretokenizers[0].behavior: value 'Removed'"},
      {[&](auto& j) { pre(j)["invert"] = true; }, StatusCode::kUnimplemented,
       "field pre_tokenizer.pretokenizers[0].invert: value 'true'"},
      {[&](auto& j) { pre(j)["pattern"]["Regex"] = "(?<x"; }, StatusCode::kInvalidArgument,
       "field pre_tokenizer.pretokenizers[0].pattern.Regex: regex '(?<x'"},
      {[](auto& j) {
         std::swap(j["pre_tokenizer"]["pretokenizers"][0], j["pre_tokenizer"]["pretokenizers"][1]);
       },
       StatusCode::kUnimplemented, "a pre-tokenizer after ByteLevel is not supported"},
      {[](auto& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       StatusCode::kUnimplemented, "field normalizer.type: normalizer type 'NFKC'"},
      {[](auto& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       StatusCode::kUnimplemented, "field decoder.type: value 'Metaspace'"},
      {[](auto& j) {
         j["model"]["merges"][1] =
             "\xC4\xA0"
             "b zz";
       },
       StatusCode::kInvalidArgument, "field model.merges[1]: 'zz' is not in model.vocab"},
      {[](auto& j) { j["model"]["merges"][2] = {"a"}; }, StatusCode::kInvalidArgument,
       "field model.merges[2]: expected a \"left right\" string or a [left, right] array, got "
       "'[\"a\"]'"},
      {[](auto& j) { j["model"]["vocab"]["zz"] = 1 << 25; }, StatusCode::kInvalidArgument,
       "field model.vocab[\"zz\"]: expected an id in [0, 2^24), got '33554432'"},
      {[](auto& j) { j["model"]["vocab"]["zz"] = 65; }, StatusCode::kInvalidArgument,
       "field model.vocab: id 65 is used twice ('A' and 'zz')"},
      {[](auto& j) { j["added_tokens"][2]["id"] = kBeginOfText; }, StatusCode::kInvalidArgument,
       "field added_tokens[2].id: id 300 is used twice"},
      {[](auto& j) { j["added_tokens"][1]["content"] = "<|begin_of_text|>"; },
       StatusCode::kInvalidArgument,
       "field added_tokens[1].content: '<|begin_of_text|>' is used twice"},
      {[](auto& j) {
         j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = {
             9999};
       },
       StatusCode::kInvalidArgument,
       "field post_processor.processors[1].special_tokens.<|begin_of_text|>.ids: id '9999' is "
       "out of range"},
      {[](auto& j) { j["post_processor"]["processors"][0]["type"] = "Mystery"; },
       StatusCode::kUnimplemented,
       "field post_processor.processors[0].type: post-processor type 'Mystery'"},
      {[](auto& j) { j["model"]["byte_fallback"] = true; }, StatusCode::kUnimplemented,
       "field model.byte_fallback"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    nlohmann::json j = llama3_style();
    cases[i].change(j);
    const std::string path = write("bad" + std::to_string(i) + ".json", j.dump());
    auto t = load_tokenizer(path, 0);
    ASSERT_FALSE(t.ok()) << "case " << i;
    EXPECT_EQ(t.status().code(), cases[i].code) << t.status().to_string();
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find(cases[i].fault), std::string::npos)
        << "case " << i << ": " << t.status().to_string();
  }
  // The model's vocab is checked against the tokenizer's ids.
  auto t = load_tokenizer(write("ok.json", llama3_style().dump()), 100);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("vocab mismatch"), std::string::npos);
}

}  // namespace
}  // namespace kvsplit::model
