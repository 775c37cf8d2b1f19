// Guided decoding's pieces against independent oracles: the regex automaton against std::regex
// over every short string of an alphabet, UTF-8 sequences against the encoder, token masks
// against walking every token's bytes, and the Sampler with a guide (only allowed tokens, end ids
// only at the end, min_tokens, no token left).
#include "sampling/guide.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

#include "sampling/guide_regex.h"
#include "sampling/guide_test_util.h"
#include "sampling/sampler.h"

namespace kvsplit::sampling {
namespace {

using testing::byte_vocab;

std::shared_ptr<GuideGrammar> grammar(const std::string& rx,
                                      std::shared_ptr<const TokenVocabulary> vocab = byte_vocab()) {
  StatusOr<std::shared_ptr<GuideGrammar>> g =
      GuideGrammar::compile({GuidedDecoding::Kind::kRegex, rx, {}}, std::move(vocab));
  EXPECT_TRUE(g.ok()) << rx << ": " << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

// Whole-text match by the automaton.
bool matches(GuideGrammar& g, std::string_view text) {
  StatusOr<int32_t> s = g.walk(g.start_state(), text);
  return s.ok() && *s != GuideGrammar::kDead && g.accepting(*s);
}

void all_strings(const std::string& alphabet, size_t max_len, std::vector<std::string>* out) {
  out->push_back("");
  size_t begin = 0;
  for (size_t len = 1; len <= max_len; ++len) {
    const size_t end = out->size();
    for (size_t i = begin; i < end; ++i)
      for (const char c : alphabet) out->push_back((*out)[i] + c);
    begin = end;
  }
}

TEST(GuideRegex, AgreesWithStdRegexOnEveryShortString) {
  const std::vector<std::string> patterns = {
      "a",
      "ab|ba",
      "(ab)*",
      "a+b?",
      "a{2,3}",
      "[ab]{0,2}c",
      "(a|b)*abb",
      "(?:a|)+b",
      "[^a]*",
      "a.b",
      "\\d+-?\\d",
      "a{2,}",
      "(a*)*b",
      "[a-c]+|-",
      "^ab$",
      "(a|b|c|-)?",
      "\\w\\W",
      "[\\d-]+",
      "a(b(c|-)*)?",
      "[-a]{3}",
      "a*?b",
      "(?<x>ab)+c",
      "(\\-|\\.)+",
      ".*",
      // Alternatives sharing a prefix (compiled factored): whole, partial, empty rests.
      "abc|abd|ab|b",
      "a-b|a-c|a1|a",
      "(ab|ac)*|a",
      "1ab1|1ab|1a|1",
      "[ab]c|[ab]|[ab]c-",
      "(?:ab)c|(?:ab)b|ab|(?:ab)*",
  };
  std::vector<std::string> texts;
  all_strings("abc1-", 6, &texts);
  for (const std::string& p : patterns) {
    const std::shared_ptr<GuideGrammar> g = grammar(p);
    ASSERT_NE(g, nullptr);
    const std::regex oracle(p.substr(0, 4) == "(?<x" ? "(ab)+c" : p, std::regex::ECMAScript);
    int accepted = 0;
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, oracle);
      ASSERT_EQ(matches(*g, t), want) << "pattern " << p << " text '" << t << "'";
      accepted += want;
    }
    EXPECT_GT(accepted, 0) << p;  // each pattern accepts something of the alphabet
  }
}

TEST(GuideRegex, ClassesMatchWholeUtf8CodePoints) {
  const std::shared_ptr<GuideGrammar> g = grammar("[^\"]*");
  EXPECT_TRUE(matches(*g, "h\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"));  // é 中 😀
  EXPECT_FALSE(matches(*g, "a\"b"));
  EXPECT_FALSE(matches(*g, "\xC3"));  // a character cut short: a prefix, not a whole text
  StatusOr<int32_t> s = g->walk(g->start_state(), "\xC3");
  ASSERT_TRUE(s.ok());
  EXPECT_NE(*s, GuideGrammar::kDead);
  for (const char* bad : {"\xFF", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80"}) {
    s = g->walk(g->start_state(), bad);  // ill-formed UTF-8 leaves the language at once
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s, GuideGrammar::kDead) << bad;
  }
  const std::shared_ptr<GuideGrammar> range = grammar("[\\u00e0-\\u00ff\\u4e00-\\u4e2d]+");
  EXPECT_TRUE(matches(*range, "\xC3\xA0\xC3\xBF\xE4\xB8\x80\xE4\xB8\xAD"));
  EXPECT_FALSE(matches(*range, "\xC3\x9F"));      // U+00DF, below the range
  EXPECT_FALSE(matches(*range, "\xE4\xB8\xAE"));  // U+4E2E, above the other
  EXPECT_TRUE(matches(*grammar("."), "\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(*grammar("."), "\n"));
}

// Every code point of a range encodes to one byte sequence of utf8_sequences, and the neighbours
// outside to none.
TEST(GuideRegex, Utf8SequencesCoverExactlyTheRange) {
  auto encode = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  auto hits = [&](const auto& seqs, uint32_t cp) {
    const std::string e = encode(cp);
    int n = 0;
    for (const auto& seq : seqs) {
      if (seq.size() != e.size()) continue;
      bool ok = true;
      for (size_t k = 0; k < e.size(); ++k) {
        const auto b = static_cast<uint8_t>(e[k]);
        ok = ok && b >= seq[k].first && b <= seq[k].second;
      }
      n += ok;
    }
    return n;
  };
  std::mt19937 rng(5);
  const std::vector<std::pair<uint32_t, uint32_t>> fixed = {
      {0, 0x7F},      {0x7F, 0x80},       {0x7FF, 0x800},
      {0x80, 0xD7FF}, {0xE000, 0x10FFFF}, {0x10000, 0x10FFFF}};
  std::vector<std::pair<uint32_t, uint32_t>> ranges = fixed;
  for (int i = 0; i < 40; ++i) {
    uint32_t a = rng() % 0x110000, b = rng() % 0x110000;
    if (a > b) std::swap(a, b);
    if (a <= 0xDFFF && b >= 0xD800) continue;  // callers never pass surrogates
    ranges.emplace_back(a, b);
  }
  for (const auto& [lo, hi] : ranges) {
    const auto seqs = regex::utf8_sequences(lo, hi);
    std::vector<uint32_t> probe = {lo, hi, lo + (hi - lo) / 2};
    for (int k = 0; k < 200; ++k) probe.push_back(lo + rng() % (hi - lo + 1));
    for (const uint32_t cp : probe) EXPECT_EQ(hits(seqs, cp), 1) << std::hex << cp;
    if (lo > 0 && (lo - 1 < 0xD800 || lo - 1 > 0xDFFF)) {
      EXPECT_EQ(hits(seqs, lo - 1), 0);
    }
    if (hi < 0x10FFFF && (hi + 1 < 0xD800 || hi + 1 > 0xDFFF)) {
      EXPECT_EQ(hits(seqs, hi + 1), 0);
    }
  }
}

TEST(GuideRegex, BadPatternsAreRefusedWithTheirOffset) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"(ab", "missing ')'"},
      {"ab)", "unmatched ')'"},
      {"[a-", "missing ']'"},
      {"[b-a]", "out of order"},
      {"*a", "anything to repeat"},
      {"a{3,2}", "m < n"},
      {"a{1001}", "above 1000"},
      {"a\\1", "unsupported escape"},
      {"(?=a)", "not supported"},
      {"a^b", "anchors"},
      {"a{", "'{' must start"},
      {"[]", "empty class"},
      {"\\u00", "hex digits"},
      {"\\ud800", "surrogate"},
      {"a++", "possessive"},
      {std::string(300, '(') + "a", "nested too deep"},
      {"[^\\x00-\\uffff\\u0000-\\uffff]", ""},  // a valid class (astral planes remain)
      {"(a{1000}){1000}", "more than"},
      // Bodies that make no node are bounded by compile calls, not nodes (was ~50 minutes).
      {"(?:(?:(?:(?:){1000}){1000}){1000}){1000}", "more than"},
      {"(?:(?:(?:a{0}){1000}){1000}){1000}", "more than"},
      {"\\012", "followed by a digit"},
      {"ab\xFF", "invalid UTF-8"},
  };
  for (const auto& [p, what] : bad) {
    StatusOr<regex::Nfa> nfa = regex::compile_regex(p);
    if (what.empty()) {
      EXPECT_TRUE(nfa.ok()) << p;
      continue;
    }
    ASSERT_FALSE(nfa.ok()) << p;
    EXPECT_EQ(nfa.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(nfa.status().message().find(what), std::string::npos) << nfa.status().message();
    EXPECT_EQ(nfa.status().message().rfind("regex: ", 0), 0u) << nfa.status().message();
  }
}

// A random vocabulary of short strings (with shared prefixes and duplicates) and patterns over
// the same alphabet: each mask is exactly the tokens whose bytes walk to a live state.
TEST(GuideMask, EqualsWalkingEveryToken) {
  std::mt19937 rng(17);
  std::vector<std::string> bytes(400);
  for (size_t id = 3; id < bytes.size(); ++id) {  // ids 0..2 add no bytes (special tokens)
    const int len = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < len; ++k) bytes[id] += "ab{}\":1 "[rng() % 8];
  }
  auto vocab = std::make_shared<const TokenVocabulary>(bytes, std::vector<std::string>{});
  for (const std::string p : {"\\{\"a\": ?(1|\"b*\")\\}", "(ab|ba)+ 1*", "[^:]{0,5}:[ab]*"}) {
    const std::shared_ptr<GuideGrammar> g = grammar(p, vocab);
    ASSERT_NE(g, nullptr);
    // States reached by random allowed tokens, from the start.
    for (int run = 0; run < 20; ++run) {
      GuideState state(g, false);
      int32_t s = g->start_state();
      for (int step = 0; step < 12; ++step) {
        StatusOr<std::shared_ptr<const TokenMask>> m = state.mask();
        ASSERT_TRUE(m.ok());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < static_cast<int32_t>(bytes.size()); ++id) {
          StatusOr<int32_t> next = g->walk(s, bytes[static_cast<size_t>(id)]);
          ASSERT_TRUE(next.ok());
          const bool want = !bytes[static_cast<size_t>(id)].empty() && *next != GuideGrammar::kDead;
          ASSERT_EQ((*m)->test(id), want)
              << p << " token '" << bytes[static_cast<size_t>(id)] << "'";
          if (want) allowed.push_back(id);
        }
        EXPECT_EQ((*m)->count, static_cast<int32_t>(allowed.size()));
        if (allowed.empty()) break;
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(state.advance(pick).ok());
        s = *g->walk(s, bytes[static_cast<size_t>(pick)]);
      }
    }
  }
}

TEST(GuideMask, TheStartContextUsesTheStartBytes) {
  // SentencePiece-like: token 3 is " yes" mid-text and "yes" after BOS.
  std::vector<std::string> mid = {"", "", "", " yes", "no", "yes"};
  std::vector<std::string> start = {"", "", "", "yes", "no", "yes"};
  auto vocab = std::make_shared<const TokenVocabulary>(mid, start);
  const std::shared_ptr<GuideGrammar> g = grammar("yes|no", vocab);
  GuideState at_start(g, true);
  auto m = at_start.mask();
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->test(3));
  EXPECT_TRUE((*m)->test(5));
  GuideState mid_text(g, false);
  m = mid_text.mask();
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE((*m)->test(3));  // " yes" starts with a space
  EXPECT_TRUE((*m)->test(5));
  ASSERT_TRUE(at_start.advance(3).ok());
  EXPECT_TRUE(at_start.accepting());
}

TEST(GuideCache, SharesACompiledConstraintAndTellsListsApart) {
  GuideCache cache(byte_vocab(), 2);
  GuidedDecoding a{GuidedDecoding::Kind::kChoice, "", {"ab", "c"}};
  GuidedDecoding b{GuidedDecoding::Kind::kChoice, "", {"a", "bc"}};
  auto ga = cache.get(a), ga2 = cache.get(a), gb = cache.get(b);
  ASSERT_TRUE(ga.ok() && ga2.ok() && gb.ok());
  EXPECT_EQ(*ga, *ga2);
  EXPECT_NE(*ga, *gb);
  EXPECT_TRUE(matches(**gb, "bc"));
  EXPECT_FALSE(matches(**ga, "bc"));
  EXPECT_FALSE(cache.get({GuidedDecoding::Kind::kRegex, "(", {}}).ok());
}

TEST(GuideCompile, EveryKindCompilesAndMatchesItsExamples) {
  const auto vocab = byte_vocab();
  struct Case {
    GuidedDecoding g;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {{GuidedDecoding::Kind::kJsonObject, "", {}},
       {"{}", R"({"a":[1,{"b":null}], "c":"\u00e9\n"})", R"({"x":{"y":{"z":[true]}}})"},
       {"[]", "{", R"({"a":1,})", R"({'a':1})"}},
      {{GuidedDecoding::Kind::kJsonSchema,
        R"({"type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array",
            "items":{"type":"string"}}},"required":["id"]})",
        {}},
       {R"({"id":-3})", R"({"id":0, "tags":["a","b"]})"},
       {R"({"tags":[]})", R"({"id":1.5})", R"({"id":1,"other":2})"}},
      {{GuidedDecoding::Kind::kChoice, "", {"a.b", "c|d", ""}}, {"a.b", "c|d", ""}, {"axb", "c"}},
  };
  for (const Case& c : cases) {
    StatusOr<std::shared_ptr<GuideGrammar>> g = GuideGrammar::compile(c.g, vocab);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    for (const std::string& t : c.yes) EXPECT_TRUE(matches(**g, t)) << t;
    for (const std::string& t : c.no) EXPECT_FALSE(matches(**g, t)) << t;
  }
  EXPECT_FALSE(GuideGrammar::compile({GuidedDecoding::Kind::kChoice, "", {}}, vocab).ok());
}

TEST(GuideGrammar, AnExplodingAutomatonStopsAtItsBound) {
  // (a|b)*a(a|b){17}: the DFA needs a state per last-18-bytes window, 2^18 > kMaxDfaStates.
  const std::shared_ptr<GuideGrammar> g = grammar("(a|b)*a(a|b){17}");
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(3);
  int32_t s = g->start_state();
  Status failure;
  for (int i = 0; i < 400000 && failure.ok(); ++i) {
    StatusOr<int32_t> next = g->walk(s, rng() % 2 ? "a" : "b");
    if (!next.ok()) {
      failure = next.status();
      break;
    }
    ASSERT_NE(*next, GuideGrammar::kDead);
    s = *next;
  }
  EXPECT_EQ(failure.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(failure.message().find("simplify the constraint"), std::string::npos);
  // Failed for good: its tables are freed and every call fails at once.
  EXPECT_TRUE(g->failed());
  EXPECT_EQ(g->num_states(), 0u);
  EXPECT_EQ(g->memory_bytes(), 0u);
  EXPECT_FALSE(g->walk(g->start_state(), "a").ok());
  // A sequence meeting the bound fails with the reason; nothing is sampled.
  SamplingParams p;
  p.guided = {GuidedDecoding::Kind::kRegex, "(a|b)*a(a|b){17}", {}};
  Sampler sampler(p, 1, {});
  sampler.set_guide(std::make_unique<GuideState>(g, false));
  std::vector<float> logits(256, 0.0f);
  int32_t t = 0;
  for (int i = 0; i < 400000 && t != Sampler::kNoAllowedToken; ++i) {
    for (float& l : logits) l = static_cast<float>(rng() % 100);
    t = sampler.sample(logits.data(), 256, {}, {});
  }
  EXPECT_EQ(t, Sampler::kNoAllowedToken);
  EXPECT_EQ(sampler.guide_status().code(), StatusCode::kInvalidArgument);
}

TEST(GuideCache, DropsFailedGrammarsAndKeepsToItsByteBudget) {
  GuideCache cache(byte_vocab(), 32, /*max_bytes=*/8 << 10);
  const GuidedDecoding exploding{GuidedDecoding::Kind::kRegex, "(a|b)*a(a|b){17}", {}};
  auto g = cache.get(exploding);
  ASSERT_TRUE(g.ok());
  std::mt19937 rng(3);
  int32_t s = (*g)->start_state();
  for (int i = 0; i < 400000; ++i) {
    StatusOr<int32_t> next = (*g)->walk(s, rng() % 2 ? "a" : "b");
    if (!next.ok()) break;
    s = *next;
  }
  ASSERT_TRUE((*g)->failed());
  auto again = cache.get(exploding);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *g);  // compiled anew, not the failed one
  EXPECT_FALSE((*again)->failed());
  // Grow one grammar past the 8 KiB budget: the next insert evicts it.
  auto big = cache.get({GuidedDecoding::Kind::kRegex, "[a-z0-9]{0,300}", {}});
  ASSERT_TRUE(big.ok());
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>('a' + i % 26);
  ASSERT_TRUE((*big)->walk((*big)->start_state(), text).ok());
  ASSERT_GT((*big)->memory_bytes(), size_t{8} << 10);
  auto other = cache.get({GuidedDecoding::Kind::kRegex, "x", {}});
  ASSERT_TRUE(other.ok());
  auto big_again = cache.get({GuidedDecoding::Kind::kRegex, "[a-z0-9]{0,300}", {}});
  ASSERT_TRUE(big_again.ok());
  EXPECT_NE(*big_again, *big);
}

TEST(GuidedValidate, NamesTheFieldOfEachBadConstraint) {
  using Kind = GuidedDecoding::Kind;
  auto error = [](GuidedDecoding g, bool ignore_eos = false) {
    SamplingParams p;
    p.guided = std::move(g);
    p.ignore_eos = ignore_eos;
    return p.validate().message();
  };
  EXPECT_EQ(error({Kind::kRegex, "a+", {}}), "");
  EXPECT_EQ(error({Kind::kChoice, "", std::vector<std::string>(256, std::string(128, 'x'))}), "");
  EXPECT_EQ(error({Kind::kRegex, "", {}}), "guided.regex: must not be empty");
  EXPECT_EQ(error({Kind::kNone, "a", {}}), "guided: a spec or choices without a kind");
  EXPECT_EQ(error({Kind::kJsonObject, "{}", {}}), "guided.json_object: takes no spec");
  EXPECT_EQ(error({Kind::kRegex, "a", {"b"}}), "guided.regex: takes no choices");
  EXPECT_EQ(error({Kind::kJsonSchema, std::string(kMaxGuidedSpecBytes + 1, ' '), {}})
                .rfind("guided.json_schema: at most 32768 bytes", 0),
            0u);
  EXPECT_EQ(error({Kind::kRegex, std::string(1, '\xC3'), {}}), "guided.regex: is not valid UTF-8");
  EXPECT_EQ(error({Kind::kChoice, "", {}}), "guided.choice: needs 1..256 choices, got 0");
  EXPECT_EQ(error({Kind::kChoice, "", std::vector<std::string>(257, "a")}),
            "guided.choice: needs 1..256 choices, got 257");
  EXPECT_EQ(error({Kind::kChoice, "", {std::string(1025, 'a')}}),
            "guided.choice: choice 0 has 1025 bytes, at most 1024");
  EXPECT_EQ(error({Kind::kChoice, "", std::vector<std::string>(40, std::string(1000, 'a'))}),
            "guided.choice: the choices take more than 32768 bytes in all");
  EXPECT_EQ(error({Kind::kRegex, "a+", {}}, /*ignore_eos=*/true).rfind("ignore_eos: ", 0), 0u);
}

// The Sampler with a guide over the byte vocabulary plus an EOS id (256).
class GuidedSampler : public ::testing::Test {
 protected:
  static constexpr int kVocab = 257;
  static constexpr int32_t kEos = 256;
  std::shared_ptr<const TokenVocabulary> vocab_ = [] {
    std::vector<std::string> bytes(kVocab);
    for (int b = 1; b < 256; ++b)
      bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<std::string>{});
  }();

  // Samples until EOS (or max steps) with random logits; returns the text.
  std::string generate(const std::string& rx, SamplingParams p, uint64_t seed, int max_steps,
                       std::vector<int32_t>* out_ids) {
    p.guided = {GuidedDecoding::Kind::kRegex, rx, {}};
    Sampler sampler(p, seed, std::vector<int32_t>{kEos});
    sampler.set_guide(std::make_unique<GuideState>(grammar(rx, vocab_), false));
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::string text;
    std::vector<float> logits(kVocab);
    for (int step = 0; step < max_steps; ++step) {
      for (float& l : logits) l = dist(rng);
      const int32_t t = sampler.sample(logits.data(), kVocab, {}, *out_ids);
      if (t == Sampler::kNoAllowedToken) break;
      out_ids->push_back(t);
      if (t == kEos) break;
      text += static_cast<char>(t);
    }
    return text;
  }
};

TEST_F(GuidedSampler, EveryTextIsInTheLanguageAndEosComesOnlyAtItsEnd) {
  const std::string rx = "(yes|no|maybe( not)?)!{0,2}";
  const std::regex oracle(rx);
  for (const float t : {0.0f, 0.7f, 1.0f, 2.0f}) {
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      SamplingParams p;
      p.temperature = t;
      p.top_k = seed % 3 == 0 ? 5 : 0;
      p.top_p = seed % 2 == 0 ? 0.9f : 1.0f;
      std::vector<int32_t> ids;
      const std::string text = generate(rx, p, seed, 40, &ids);
      EXPECT_TRUE(std::regex_match(text, oracle)) << text;
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.back(), kEos) << text;  // a finite language: it always ends at EOS
    }
  }
}

TEST_F(GuidedSampler, MinTokensMasksEosOnlyWhileTextCanGoOn) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_tokens = 6;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<int32_t> ids;
    const std::string text = generate("a{1,3}|b{8}", p, seed, 20, &ids);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), kEos);
    // "aaa" is complete before min_tokens: EOS is the only token left, so it is sampled.
    EXPECT_TRUE(text == "aaa" || text == "bbbbbbbb") << text;
  }
}

TEST_F(GuidedSampler, NothingAllowedReportsCompleteOrStuck) {
  // Without end ids a complete text has nothing left to sample: kNoAllowedToken and OK.
  SamplingParams p;
  p.temperature = 0.0f;
  p.guided = {GuidedDecoding::Kind::kRegex, "ab", {}};
  Sampler done(p, 1, {});
  done.set_guide(std::make_unique<GuideState>(grammar("ab", vocab_), false));
  std::vector<float> logits(kVocab, 0.0f);
  EXPECT_EQ(done.sample(logits.data(), kVocab, {}, {}), 'a');
  EXPECT_EQ(done.sample(logits.data(), kVocab, {}, {}), 'b');
  EXPECT_EQ(done.sample(logits.data(), kVocab, {}, {}), Sampler::kNoAllowedToken);
  EXPECT_TRUE(done.guide_status().ok());
  // A vocabulary without the byte the language needs next: stuck, an error.
  std::vector<std::string> bytes(kVocab);
  bytes['a'] = "a";
  auto small = std::make_shared<const TokenVocabulary>(bytes, std::vector<std::string>{});
  Sampler stuck(p, 1, std::vector<int32_t>{kEos});
  stuck.set_guide(std::make_unique<GuideState>(grammar("ab", small), false));
  EXPECT_EQ(stuck.sample(logits.data(), kVocab, {}, {}), 'a');
  EXPECT_EQ(stuck.sample(logits.data(), kVocab, {}, {}), Sampler::kNoAllowedToken);
  EXPECT_EQ(stuck.guide_status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GuidedSampler, AStopTokenIdWithBytesIsAnEndIdOnly) {
  // '.' as a stop token id: never text (it would end the request with its byte left out), an
  // end exactly where the text is complete.
  std::vector<float> logits(kVocab, 0.0f);
  SamplingParams p;
  p.temperature = 0.0f;
  p.stop_token_ids = {'.'};
  p.guided = {GuidedDecoding::Kind::kRegex, "a\\.b", {}};
  Sampler needs_dot(p, 1, std::vector<int32_t>{kEos});
  needs_dot.set_guide(std::make_unique<GuideState>(grammar("a\\.b", vocab_), false));
  logits['.'] = 5.0f;
  EXPECT_EQ(needs_dot.sample(logits.data(), kVocab, {}, {}), 'a');
  std::fill(logits.begin(), logits.end(), 0.0f);
  logits['.'] = 5.0f;
  EXPECT_EQ(needs_dot.sample(logits.data(), kVocab, {}, {}), Sampler::kNoAllowedToken);
  EXPECT_FALSE(needs_dot.guide_status().ok());

  p.guided.spec = "a(\\.b)?";
  Sampler ends(p, 1, std::vector<int32_t>{kEos});
  ends.set_guide(std::make_unique<GuideState>(grammar(p.guided.spec, vocab_), false));
  std::fill(logits.begin(), logits.end(), 0.0f);
  logits['.'] = 5.0f;
  EXPECT_EQ(ends.sample(logits.data(), kVocab, {}, {}), 'a');
  std::fill(logits.begin(), logits.end(), 0.0f);
  logits['.'] = 5.0f;
  EXPECT_EQ(ends.sample(logits.data(), kVocab, {}, {}), '.');  // "a" is complete: '.' ends it
}

TEST_F(GuidedSampler, AllowedLogitsKeepTheirOrder) {
  // Greedy under a guide is the argmax of the allowed tokens: the best-scored allowed byte.
  SamplingParams p;
  p.temperature = 0.0f;
  p.guided = {GuidedDecoding::Kind::kRegex, "[xyz]", {}};
  Sampler s(p, 1, std::vector<int32_t>{kEos});
  s.set_guide(std::make_unique<GuideState>(grammar("[xyz]", vocab_), false));
  std::vector<float> logits(kVocab, 0.0f);
  logits['q'] = 9.0f;  // not allowed
  logits['y'] = 2.0f;
  logits['z'] = 1.0f;
  EXPECT_EQ(s.sample(logits.data(), kVocab, {}, {}), 'y');
}

}  // namespace
}  // namespace kvsplit::sampling
