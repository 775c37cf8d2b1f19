// Tokenizers against reference encodings: run.c (tok512_encode.jsonl, the stories260K prompts),
// SentencePiece / HF (Llama-2 encode_shared.jsonl), and naive quadratic merge loops.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::model_path;
using kvsplit::testing::read_jsonl;

std::unique_ptr<Tokenizer> load_ok(const std::string& rel, int vocab) {
  auto t = load_tokenizer(model_path(rel), vocab);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

std::string decode_all(const Tokenizer& t, const std::vector<int32_t>& ids) {
  StreamDecoder d(t);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  return out + d.flush();
}

struct Stories260kTokenizers : ::testing::TestWithParam<const char*> {};

TEST_P(Stories260kTokenizers, ReproducesTok512Goldens) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = load_ok(GetParam(), 512);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  const auto cases = read_jsonl(model_path("golden/tok512_encode.jsonl"));
  ASSERT_EQ(cases.size(), 36u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    auto ids = tok->encode(text, /*add_bos=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    // Both families treat "<s>" in the input as plain text, so the run.c `ids` hold for the HF
    // file too (HF tokenizers itself would give `hf_tokenizers_ids` on the last line).
    EXPECT_EQ(*ids, ids_of(c["ids"])) << "text: " << text;
    auto no_bos = tok->encode(text, /*add_bos=*/false);
    ASSERT_TRUE(no_bos.ok());
    EXPECT_EQ(no_bos->size() + 1, ids->size());
    // Round trip: the golden texts are valid UTF-8 without U+2581.
    EXPECT_EQ(decode_all(*tok, *ids), text);
    EXPECT_EQ(decode_all(*tok, *no_bos), text);
  }
}

TEST_P(Stories260kTokenizers, ReproducesGreedyPromptIds) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = load_ok(GetParam(), 512);
  ASSERT_TRUE(tok);
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  ASSERT_EQ(cases.size(), 12u);
  for (const auto& c : cases) {
    auto ids = tok->encode(c["prompt"].get<std::string>(), true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, ids_of(c["prompt_token_ids"])) << c["prompt"];
  }
}

// Whole stories (curly quotes, newlines, byte fallback): the token ids run.c scored.
TEST_P(Stories260kTokenizers, ReproducesTinyStoriesNllTokenIds) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = load_ok(GetParam(), 512);
  ASSERT_TRUE(tok);
  const auto cases = read_jsonl(model_path("golden/stories260K_tinystories_sample_nll.jsonl"));
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    auto ids = tok->encode(text, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, ids_of(c["token_ids"])) << "story " << c["story_index"];
    EXPECT_EQ(decode_all(*tok, *ids), text);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Stories260kTokenizers,
                         ::testing::Values("tok512.bin", "stories260K-hf/tokenizer.json"));

// Llama-2 32K, llama2.c tokenizer.bin: run.c's ids on every line. Where run.c departs from
// SentencePiece (`runc_agrees` false) they are its `runc_ids`: NUL ends the text (a C string), and
// U+2581 falls back to bytes (the .bin stores spaces, not U+2581).
TEST(Llama2Tokenizer, TokenizerBinMatchesRunC) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = load_ok("tokenizers/llama2/tokenizer.bin", 32000);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->kind(), "llama2c");
  int nul_cases = 0, marker_cases = 0;
  for (const auto& c : read_jsonl(model_path("tokenizers/llama2/encode_shared.jsonl"))) {
    const std::string text = c["text"];
    std::vector<int32_t> want = ids_of(c["ids"]);
    const bool nul = text.find('\0') != std::string::npos;
    if (!c["runc_agrees"].get<bool>()) {
      ++(nul ? nul_cases : marker_cases);
      want = ids_of(c["runc_ids"]);
    }
    auto ids = tok->encode(text, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, want) << "text: " << text;
    EXPECT_EQ(decode_all(*tok, *ids), text.substr(0, text.find('\0'))) << "text: " << text;
  }
  EXPECT_EQ(nul_cases, 1);
  EXPECT_EQ(marker_cases, 2);
}

// Llama-2 32K, HF tokenizer.json: SentencePiece's ids for every case (special-token text is
// plain text here, unlike HF tokenizers' `hf_tokenizers_ids`).
TEST(Llama2Tokenizer, TokenizerJsonMatchesSentencePiece) {
  KVSPLIT_REQUIRE_MODELS();
  auto tok = load_ok("tokenizers/llama2/tokenizer.json", 32000);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->kind(), "hf-sentencepiece-bpe");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  int cases = 0;
  for (const auto& c : read_jsonl(model_path("tokenizers/llama2/encode_shared.jsonl"))) {
    const std::string text = c["text"];
    auto ids = tok->encode(text, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, ids_of(c["ids"])) << "text: " << text;
    if (text.find("\xE2\x96\x81") == std::string::npos) {
      EXPECT_EQ(decode_all(*tok, *ids), text) << "text: " << text;
    } else {  // HF (and SentencePiece) decode a literal U+2581 as a space
      EXPECT_NE(decode_all(*tok, *ids), text);
    }
    ++cases;
  }
  EXPECT_EQ(cases, 60);
}

// ---- naive references: the quadratic loops of run.c and HF, on random text ----

// Random text built from vocab pieces (so many merges apply), with some random bytes mixed in.
std::string random_text(const Tokenizer& t, std::mt19937& rng, size_t target_bytes) {
  std::string s;
  std::uniform_int_distribution<int> id(3, t.vocab_size() - 1), pick(0, 19), byte(1, 255);
  while (s.size() < target_bytes) {
    const int k = pick(rng);
    if (k == 0) {
      s += char(byte(rng));
    } else if (k < 4) {
      s += ' ';
    } else if (k < 7) {  // runs of one character: overlapping equal pairs, where ties matter
      s.append(3 + pick(rng) % 6, " ae=-.0"[pick(rng) % 7]);
    } else {
      s += t.decode_token(/*prev=*/5, id(rng));
    }
  }
  return s;
}

// run.c: merge the best-scoring adjacent pair (leftmost on ties) until none is in the vocab.
std::vector<int32_t> naive_merge(
    std::vector<int32_t> ids,
    const std::function<std::optional<std::pair<double, int32_t>>(int32_t, int32_t)>& lookup) {
  while (true) {
    double best = -1e300;
    int best_i = -1;
    int32_t best_id = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      if (auto m = lookup(ids[i], ids[i + 1]); m && m->first > best) {
        best = m->first, best_i = int(i), best_id = m->second;
      }
    }
    if (best_i < 0) return ids;
    ids[best_i] = best_id;
    ids.erase(ids.begin() + best_i + 1);
  }
}

// transformers' LlamaTokenizerFast rebuilds its post-processor from tokenizer_config.json's
// add_bos_token / add_eos_token at load, whatever tokenizer.json's template says; other classes
// keep the file's template.
TEST(Llama2Tokenizer, LlamaClassesTakeBosAndEosFromTheConfigFlags) {
  KVSPLIT_REQUIRE_MODELS();
  kvsplit::testing::TempDir dir;
  std::filesystem::copy_file(model_path("tokenizers/llama2/tokenizer.json"),
                             dir.path() / "tokenizer.json");
  auto encode_with = [&](const std::string& config) {
    std::ofstream(dir.path() / "tokenizer_config.json") << config;
    auto t = load_tokenizer((dir.path() / "tokenizer.json").string(), 32000);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (!t.ok()) return std::vector<int32_t>{};
    auto ids = (*t)->encode("Hello", true);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  };
  const std::vector<int32_t> plain = encode_with("{}");  // the file's template: BOS
  ASSERT_GE(plain.size(), 2u);
  ASSERT_EQ(plain.front(), 1);
  const std::vector<int32_t> text(plain.begin() + 1, plain.end());
  auto with = [&](std::vector<int32_t> pre, std::vector<int32_t> post) {
    pre.insert(pre.end(), text.begin(), text.end());
    pre.insert(pre.end(), post.begin(), post.end());
    return pre;
  };
  const std::string llama = R"("tokenizer_class": "LlamaTokenizerFast")";
  EXPECT_EQ(encode_with("{" + llama + R"(, "add_eos_token": true})"), with({1}, {2}));
  EXPECT_EQ(encode_with("{" + llama + R"(, "add_bos_token": false})"), with({}, {}));
  EXPECT_EQ(encode_with("{" + llama + R"(, "add_bos_token": false, "add_eos_token": true})"),
            with({}, {2}));
  EXPECT_EQ(encode_with("{" + llama + "}"), with({1}, {}));  // defaults: BOS, no EOS
  // Another class keeps tokenizer.json's template.
  EXPECT_EQ(encode_with(R"({"tokenizer_class": "PreTrainedTokenizerFast", "add_eos_token": true})"),
            plain);
}

// Added tokens are found in the text as it is (leftmost-longest, non-overlapping) and take their
// lstrip / rstrip whitespace afterwards, as HF's AddedVocabulary::find_matches: a token that starts
// in the whitespace an rstrip token took is still found (both hold that whitespace), and an lstrip
// token takes no whitespace the token before it took. Llama-2's tokenizer.json with two added
// tokens (ids 32000, 32001; normalized false, special false) per case; the expected ids are HF
// tokenizers 0.23.3's output (Tokenizer.from_file(...).encode(text).ids).
TEST(Llama2Tokenizer, AddedTokensAreFoundBeforeTheirWhitespaceIsStripped) {
  KVSPLIT_REQUIRE_MODELS();
  struct Added {
    const char* content;
    bool lstrip, rstrip;
  };
  struct Case {
    Added first, second;
    std::string text;
    std::vector<int32_t> hf_ids;
  };
  const std::vector<Case> cases = {
      // " world" starts in the space "<tool>" took.
      {{"<tool>", false, true}, {" world", false, false}, "<tool> world", {1, 32000, 32001}},
      {{"<tool>", false, true},
       {" world", false, false},
       "<tool>  world x",
       {1, 32000, 32001, 29871, 921}},
      // The text after "  " starts where it ends, inside what "<tool>" took: " x" is encoded.
      {{"<tool>", false, true}, {"  ", false, false}, "<tool>   x", {1, 32000, 32001, 29871, 921}},
      {{"<tool>", false, true}, {"  ", false, false}, "<tool>  x", {1, 32000, 32001, 921}},
      // An lstrip token loses the part "<tool>" took: " w" is left with "w" ...
      {{"<tool>", false, true}, {" w", true, false}, "<tool> world", {1, 32000, 32001, 470, 430}},
      // ... and " " with nothing, which drops it.
      {{"<tool>", false, true}, {" ", true, false}, "<tool> x", {1, 32000, 921}},
      // lstrip reaches back to the token before it, not into it.
      {{"<a>", false, false}, {" <b>", true, false}, "<a>  <b>", {1, 32000, 32001}},
      {{"<a>", false, true}, {"<b>", true, false}, "<a>  <b>", {1, 32000, 32001}},
      {{"<a>", false, true},
       {"<b>", true, false},
       "x <a> \t<b> y",
       {1, 921, 29871, 32000, 32001, 29871, 343}},
      // HF 0.23.3 panics here ("AddedVocabulary bad split": " " ends inside the whitespace
      // "<tool>" took, before its stripped start); we drop the match.
      {{"<tool>", false, true}, {" ", true, false}, "<tool>   x", {1, 32000, 921}},
  };
  nlohmann::json base;
  std::ifstream(model_path("tokenizers/llama2/tokenizer.json")) >> base;
  ASSERT_EQ(base["added_tokens"].size(), 3u);  // <unk>, <s>, </s>
  kvsplit::testing::TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  for (const Case& c : cases) {
    nlohmann::json j = base;
    int32_t id = 32000;
    for (const Added& a : {c.first, c.second}) {
      j["added_tokens"].push_back({{"id", id++},
                                   {"content", a.content},
                                   {"single_word", false},
                                   {"lstrip", a.lstrip},
                                   {"rstrip", a.rstrip},
                                   {"normalized", false},
                                   {"special", false}});
    }
    std::ofstream(path, std::ios::trunc) << j.dump();
    auto tok = load_tokenizer(path, 0);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    auto ids = (*tok)->encode(c.text, EncodeOptions{});
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, c.hf_ids) << c.first.content << " + '" << c.second.content << "' on '" << c.text
                              << "'";
  }
}

TEST(TokenizerMerges, HeapMergeEqualsNaiveLoopOnRandomText) {
  KVSPLIT_REQUIRE_MODELS();
  for (const char* rel : {"tokenizers/llama2/tokenizer.bin", "tokenizers/llama2/tokenizer.json"}) {
    auto tok = load_ok(rel, 32000);
    ASSERT_TRUE(tok);
    // Independent reference data read straight from the files.
    std::unordered_map<std::string, int32_t> piece_id;
    std::vector<std::string> piece(32000);
    std::vector<float> score(32000);
    std::map<std::pair<int32_t, int32_t>, std::pair<double, int32_t>> merge;  // HF: -rank, id
    const bool bin = std::string(rel).ends_with(".bin");
    if (bin) {
      std::ifstream in(model_path(rel), std::ios::binary);
      uint32_t max_len;
      in.read(reinterpret_cast<char*>(&max_len), 4);
      for (int i = 0; i < 32000; ++i) {
        int32_t len;
        in.read(reinterpret_cast<char*>(&score[i]), 4);
        in.read(reinterpret_cast<char*>(&len), 4);
        piece[i].resize(len);
        in.read(piece[i].data(), len);
        piece_id.emplace(piece[i], i);
      }
    } else {
      std::ifstream in(model_path(rel));
      const auto j = nlohmann::json::parse(in);
      for (auto& [k, v] : j["model"]["vocab"].items()) piece_id[k] = v.get<int32_t>();
      const auto& ms = j["model"]["merges"];
      for (size_t r = 0; r < ms.size(); ++r) {
        const std::string m = ms[r];
        const size_t sp = m.find(' ');
        const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
        merge.emplace(std::make_pair(piece_id.at(a), piece_id.at(b)),
                      std::make_pair(-double(r), piece_id.at(a + b)));
      }
    }
    auto lookup = [&](int32_t l, int32_t r) -> std::optional<std::pair<double, int32_t>> {
      if (bin) {
        auto it = piece_id.find(piece[l] + piece[r]);
        if (it == piece_id.end()) return std::nullopt;
        return std::make_pair(double(score[it->second]), it->second);
      }
      auto it = merge.find({l, r});
      if (it == merge.end()) return std::nullopt;
      return it->second;
    };
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 20; ++trial) {
      const std::string text = random_text(*tok, rng, 300 + 50 * trial);
      auto got = tok->encode(text, false);
      ASSERT_TRUE(got.ok());
      // The initial symbols, rebuilt from the text: dummy prefix, then characters (run.c's
      // loose grouping for .bin) or their bytes as <0xNN> = byte + 3.
      std::vector<int32_t> split;
      std::string norm = bin ? " " + text : "\xE2\x96\x81" + text;
      if (!bin) {
        std::string r;
        for (char c : norm) r += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
        norm = r;
      }
      for (size_t i = 0; i < norm.size();) {
        size_t len = 1;
        if (bin) {
          while (i + len < norm.size() && len < 4 && (uint8_t(norm[i + len]) & 0xC0) == 0x80) ++len;
        } else {
          const uint8_t b = norm[i];
          const size_t want = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
          while (len < want && i + len < norm.size() && (uint8_t(norm[i + len]) & 0xC0) == 0x80)
            ++len;
          if (len != want) len = 1;
        }
        auto it = piece_id.find(norm.substr(i, len));
        if (it != piece_id.end() && norm[i] != '\0') {
          split.push_back(it->second);
        } else {
          for (size_t k = 0; k < len; ++k) split.push_back(uint8_t(norm[i + k]) + 3);
        }
        i += len;
      }
      EXPECT_EQ(*got, naive_merge(split, lookup)) << rel << " trial " << trial;
    }
  }
}

// A ~100 KB prompt encodes (the merge loop is O(n log n); the naive loop would do ~10^10 pair
// lookups here) and decodes back to the same text.
TEST(TokenizerMerges, HundredKilobyteText) {
  KVSPLIT_REQUIRE_MODELS();
  std::string story;
  std::ifstream in(kvsplit::testing::data_path("tinystories_sample.txt"));
  story.assign(std::istreambuf_iterator<char>(in), {});
  if (story.empty()) story = "Once upon a time, there was a little girl named Lily. ";
  std::string text;
  while (text.size() < 100000) text += story;
  for (const char* rel : {"tok512.bin", "stories260K-hf/tokenizer.json",
                          "tokenizers/llama2/tokenizer.bin", "tokenizers/llama2/tokenizer.json",
                          "tokenizers/gpt2/tokenizer.json", "tokenizers/qwen2/tokenizer.json"}) {
    auto tok = load_ok(rel, 0);
    ASSERT_TRUE(tok);
    auto ids = tok->encode(text, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_LT(ids->size(), text.size() / 2) << rel;  // merges happened
    EXPECT_EQ(decode_all(*tok, *ids), text) << rel;
  }
  // One long run of a single character, the worst case for pair re-queuing.
  auto tok = load_ok("tokenizers/llama2/tokenizer.json", 32000);
  ASSERT_TRUE(tok);
  const std::string run(100000, 'a');
  auto ids = tok->encode(run, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(decode_all(*tok, *ids), run);
}

}  // namespace
}  // namespace kvsplit::model
