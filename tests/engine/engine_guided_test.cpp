// Guided decoding through the engine, in both serving modes, on stories260K (a model that never
// writes these texts unguided): the text of every request lies in its constraint's language
// (regex, choice, JSON schema, any JSON object, grammar), ends at EOS when complete, is a prefix of
// it when cut by max_tokens, n completions each obey it, bad constraints are refused at submit, and
// every KV block comes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/engine_test_util.h"
#include "model/tokenizer.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

class EngineGuided : public ::testing::TestWithParam<ServingMode> {
 protected:
  void SetUp() override {
    KVSPLIT_REQUIRE_MODELS();
    auto engine = Engine::create(testing::stories_config(GetParam()));
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    engine_ = std::move(*engine);
    free_at_start_ = testing::free_blocks(*engine_);
  }
  void TearDown() override {
    if (engine_) EXPECT_TRUE(testing::pools_back_to(*engine_, free_at_start_));
  }
  Collected run(const Request& r) {
    auto h = engine_->submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return {};
    Collected c = collect(*h);
    EXPECT_FALSE(c.timed_out);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    return c;
  }
  static Request guided(GuidedDecoding::Kind kind, std::string spec, float temperature,
                        uint64_t seed = 7) {
    Request r;
    r.prompt = "Once upon a time";
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.max_tokens = 120;
    r.sampling.guided.kind = kind;
    r.sampling.guided.spec = std::move(spec);
    return r;
  }
  std::unique_ptr<Engine> engine_;
  std::vector<int> free_at_start_;
};

TEST_P(EngineGuided, RegexHoldsGreedyAndSampledAndEndsAtEos) {
  const std::string rx = "[0-9]{3}-[a-z]{2,4}( [A-Z][a-z]{1,6})?";
  for (const float t : {0.0f, 1.0f, 1.5f}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const Collected c = run(guided(GuidedDecoding::Kind::kRegex, rx, t, seed));
      EXPECT_TRUE(std::regex_match(c.text, std::regex(rx))) << "t " << t << ": '" << c.text << "'";
      // The language is finite, so the text ends complete, at EOS (the only token allowed at
      // the end of its longest strings): kStop.
      EXPECT_EQ(c.final_event.finish_reason, FinishReason::kStop) << c.text;
      if (t == 0.0f) break;
    }
  }
}

TEST_P(EngineGuided, UnguidedTextIsNotAlreadyInTheLanguage) {
  // The constraint is what makes the text match: the same request unguided does not.
  Request r = guided(GuidedDecoding::Kind::kRegex, "", 0.0f);
  r.sampling.guided = {};
  r.sampling.max_tokens = 12;
  const Collected c = run(r);
  EXPECT_FALSE(std::regex_match(c.text, std::regex("[0-9]{3}-[a-z]{2,4}( [A-Z][a-z]{1,6})?")));
}

TEST_P(EngineGuided, ChoiceGivesExactlyOneChoiceForEveryCompletion) {
  Request r = guided(GuidedDecoding::Kind::kChoice, "", 1.0f, 11);
  r.sampling.guided.choices = {"the red fox", "a blue (bird)", "Tim.*", "ünïcode ✓"};
  r.n = 6;
  auto h = engine_->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const testing::CollectedCompletions all = testing::collect_completions(*h, r.n);
  ASSERT_FALSE(all.timed_out);
  for (const Collected& c : all.completions) {
    EXPECT_NE(std::find(r.sampling.guided.choices.begin(), r.sampling.guided.choices.end(), c.text),
              r.sampling.guided.choices.end())
        << "'" << c.text << "'";
    EXPECT_EQ(c.final_event.finish_reason, FinishReason::kStop);
  }
}

TEST_P(EngineGuided, JsonSchemaGivesAValidDocument) {
  const std::string schema = R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":12},
      "age":{"type":"integer","minimum":18,"exclusiveMaximum":100},
      "pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3},
      "happy":{"type":"boolean"}},
    "required":["name","age"]})";
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Request r = guided(GuidedDecoding::Kind::kJsonSchema, schema, 0.8f, seed);
    r.sampling.max_tokens = 400;
    const Collected c = run(r);
    ASSERT_EQ(c.final_event.finish_reason, FinishReason::kStop) << c.text;
    const nlohmann::json doc = nlohmann::json::parse(c.text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(doc.is_discarded()) << c.text;
    ASSERT_TRUE(doc.is_object()) << c.text;
    EXPECT_TRUE(doc["name"].is_string()) << c.text;
    EXPECT_LE(doc["name"].get<std::string>().size(), 12u * 4) << c.text;
    EXPECT_TRUE(doc["age"].is_number_integer()) << c.text;
    EXPECT_GE(doc["age"].get<int64_t>(), 18) << c.text;
    EXPECT_LT(doc["age"].get<int64_t>(), 100) << c.text;
    if (doc.contains("pets")) {
      EXPECT_LE(doc["pets"].size(), 3u) << c.text;
      for (const auto& p : doc["pets"]) EXPECT_TRUE(p == "cat" || p == "dog") << c.text;
    }
    if (doc.contains("happy")) EXPECT_TRUE(doc["happy"].is_boolean()) << c.text;
    for (const auto& [k, v] : doc.items())
      EXPECT_TRUE(k == "name" || k == "age" || k == "pets" || k == "happy") << c.text;
  }
}

// A recursive schema (a tree): any depth is allowed, and the document that ends is a valid tree.
bool valid_node(const nlohmann::json& n) {
  if (!n.is_object() || n.size() != 2 || !n.contains("name") || !n["name"].is_string() ||
      !n.contains("kids") || !n["kids"].is_array() || n["kids"].size() > 2)
    return false;
  for (const auto& k : n["kids"])
    if (!valid_node(k)) return false;
  return true;
}

TEST_P(EngineGuided, RecursiveJsonSchemaGivesATree) {
  const std::string schema = R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"name":{"type":"string","maxLength":6},
                    "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
      "required":["name","kids"]}}})";
  int stopped = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Request r = guided(GuidedDecoding::Kind::kJsonSchema, schema, 0.8f, seed);
    r.sampling.max_tokens = 300;
    const Collected c = run(r);
    ASSERT_FALSE(c.text.empty());
    EXPECT_EQ(c.text.rfind("{\"name\":", 0), 0u) << c.text;
    if (c.final_event.finish_reason != FinishReason::kStop) continue;
    ++stopped;
    const nlohmann::json doc = nlohmann::json::parse(c.text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << c.text;
    EXPECT_TRUE(valid_node(doc)) << c.text;
  }
  EXPECT_GT(stopped, 0);
}

TEST_P(EngineGuided, JsonObjectGivesAnObject) {
  Request r = guided(GuidedDecoding::Kind::kJsonObject, "", 1.0f, 5);
  r.sampling.max_tokens = 300;
  const Collected c = run(r);
  if (c.final_event.finish_reason == FinishReason::kStop) {
    const nlohmann::json doc = nlohmann::json::parse(c.text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << c.text;
    EXPECT_TRUE(doc.is_object()) << c.text;
  } else {
    EXPECT_EQ(c.final_event.finish_reason, FinishReason::kLength);
    EXPECT_EQ(c.text.front(), '{') << c.text;
  }
}

// Nested arrays of at most 3 items (a language no regex has): every text that ends is JSON of
// that shape.
bool nested_array(const nlohmann::json& j) {
  if (!j.is_array() || j.size() > 3) return false;
  for (const auto& v : j) {
    const bool ok = (v.is_number_unsigned() && v.get<uint64_t>() < 1000) ||
                    (v.is_string() && !v.get<std::string>().empty()) || nested_array(v);
    if (!ok) return false;
  }
  return true;
}

TEST_P(EngineGuided, GrammarGivesAStringOfTheGrammar) {
  const std::string gbnf =
      "root  ::= \"[\" array ( \",\" value ){0,2} \"]\"  # an array first: nested\n"
      "array ::= \"[\" ( value ( \",\" value ){0,2} )? \"]\"\n"
      "value ::= array | [0-9] | [1-9] [0-9]{1,2} | \"\\\"\" [a-z]{1,8} \"\\\"\"\n";
  int stopped = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Request r = guided(GuidedDecoding::Kind::kGrammar, gbnf, 1.0f, seed);
    r.sampling.max_tokens = 200;
    const Collected c = run(r);
    ASSERT_FALSE(c.text.empty());
    EXPECT_EQ(c.text.front(), '[') << c.text;
    if (c.final_event.finish_reason != FinishReason::kStop) continue;
    ++stopped;
    const nlohmann::json doc = nlohmann::json::parse(c.text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << c.text;
    EXPECT_TRUE(nested_array(doc)) << c.text;
    EXPECT_TRUE(doc[0].is_array()) << c.text;
    EXPECT_LE(doc.size(), 3u) << c.text;
    EXPECT_EQ(doc.dump(), c.text) << "no spaces in this grammar";
  }
  EXPECT_GT(stopped, 0);
}

TEST_P(EngineGuided, MaxTokensCutsTheTextAtAPrefixOfTheLanguage) {
  Request r = guided(GuidedDecoding::Kind::kRegex, "(ab|cd)+x", 1.0f, 3);
  r.sampling.max_tokens = 5;
  const Collected c = run(r);
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kLength);
  ASSERT_EQ(c.tokens.size(), 5u);
  // Every prefix of the language is (ab|cd)* then a, c or nothing (x would have ended it).
  EXPECT_TRUE(std::regex_match(c.text, std::regex("(ab|cd)*[ac]?"))) << c.text;
}

TEST_P(EngineGuided, MinTokensDoesNotOutliveACompleteText) {
  // The text is complete after "yes"; min_tokens would mask EOS, but nothing else is allowed.
  Request r = guided(GuidedDecoding::Kind::kChoice, "", 0.0f);
  r.sampling.guided.choices = {"yes"};
  r.sampling.min_tokens = 10;
  const Collected c = run(r);
  EXPECT_EQ(c.text, "yes");
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kStop);
}

TEST_P(EngineGuided, AfterBosTheFirstTokenIsReadWithoutItsLeadingSpace) {
  // The prompt is BOS alone: SentencePiece's first token drops its leading space ("▁Once" is
  // "Once"), the mask at the start must read it so, and every later one with its space.
  Request r = guided(GuidedDecoding::Kind::kChoice, "", 0.0f);
  r.prompt.clear();
  r.prompt_token_ids = {1};  // stories260K's BOS
  r.sampling.guided.choices = {"Once upon a time", "One day"};
  const Collected c = run(r);
  EXPECT_TRUE(c.text == "Once upon a time" || c.text == "One day") << "'" << c.text << "'";
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kStop);
}

TEST_P(EngineGuided, AConstraintTheVocabularyCannotContinueFailsTheRequestAlone) {
  // Every token whose text starts with '.' is a stop token id, so none can be text: after the
  // letters the language needs a '.' that nothing may give. The request fails with the reason;
  // its blocks come back (TearDown) and the engine serves the next request.
  auto tok = model::load_tokenizer(testing::model_path("tok512.bin"));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  Request r = guided(GuidedDecoding::Kind::kRegex, "[a-z]{1,3}\\.[a-z]", 0.0f);
  for (int32_t id = 0; id < (*tok)->vocab_size(); ++id)
    if ((*tok)->decode_token(0, id).rfind('.', 0) == 0) r.sampling.stop_token_ids.push_back(id);
  ASSERT_FALSE(r.sampling.stop_token_ids.empty());
  auto h = engine_->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const Collected c = collect(*h);
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kError) << c.text;
  EXPECT_NE(c.final_event.status.message().find("no token of the vocabulary continues"),
            std::string::npos)
      << c.final_event.status.to_string();
  EXPECT_TRUE(std::regex_match(c.text, std::regex("[a-z]{1,3}"))) << c.text;
  const Collected next = run(guided(GuidedDecoding::Kind::kRegex, "[0-9]{2}", 0.0f));
  EXPECT_TRUE(std::regex_match(next.text, std::regex("[0-9]{2}"))) << next.text;
}

TEST_P(EngineGuided, BadConstraintsAreRefusedAtSubmit) {
  struct Bad {
    GuidedDecoding g;
    bool ignore_eos;
    std::string field;
  };
  const std::vector<Bad> bad = {
      {{GuidedDecoding::Kind::kRegex, "[a-", {}}, false, "guided.regex"},
      {{GuidedDecoding::Kind::kRegex, "a{2000}", {}}, false, "guided.regex"},
      {{GuidedDecoding::Kind::kRegex, "", {}}, false, "guided.regex"},
      {{GuidedDecoding::Kind::kJsonSchema, "{\"type\":", {}}, false, "guided.json_schema"},
      {{GuidedDecoding::Kind::kJsonSchema, "{\"type\":\"integer\",\"multipleOf\":3}", {}},
       false,
       "guided.json_schema"},
      {{GuidedDecoding::Kind::kChoice, "", {}}, false, "guided.choice"},
      {{GuidedDecoding::Kind::kGrammar, "root ::= root \"a\" | \"b\"", {}},
       false,
       "guided.grammar"},
      {{GuidedDecoding::Kind::kGrammar, "root ::= \"a\" undefined", {}}, false, "guided.grammar"},
      {{GuidedDecoding::Kind::kRegex, "a+", {}}, true, "ignore_eos"},
  };
  for (const Bad& b : bad) {
    Request r = guided(b.g.kind, b.g.spec, 0.0f);
    r.sampling.guided.choices = b.g.choices;
    r.sampling.ignore_eos = b.ignore_eos;
    auto h = engine_->submit(r);
    ASSERT_FALSE(h.ok()) << b.g.spec;
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << h.status().to_string();
    EXPECT_EQ(h.status().message().rfind(b.field, 0), 0u) << h.status().to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineGuided,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
