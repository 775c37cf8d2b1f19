// GenerateRequest.guided at the gRPC edge: each constraint of the oneof copied into
// SamplingParams::guided, the oneof's own rules refused naming the field (a json_object set to
// false, an empty choice list), and SamplingParams::validate's refusals named by the proto's
// fields (guided.regex, guided.choice, guided.json_schema).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/convert.h"

namespace kvsplit::server {
namespace {

using Kind = GuidedDecoding::Kind;

RequestLimits limits() {
  RequestLimits l;
  l.vocab_size = 512;
  l.max_context = 512;
  l.default_max_tokens = 16;
  l.class_names = {"default"};
  return l;
}

v1::GenerateRequest request() {
  v1::GenerateRequest in;
  in.set_prompt("x");
  in.set_max_tokens(20);
  return in;
}

TEST(ConvertGuided, UnsetOrEmptyIsFreeText) {
  v1::GenerateRequest in = request();
  auto r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kNone);
  EXPECT_FALSE(r->sampling.guided.on());
  in.mutable_guided();  // the message present, no constraint in it
  ASSERT_TRUE(in.has_guided());
  r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kNone);
}

TEST(ConvertGuided, EachConstraintReachesTheEngineRequest) {
  v1::GenerateRequest in = request();
  in.mutable_guided()->set_regex("[0-9]{3}-[a-z]{2}");
  auto r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kRegex);
  EXPECT_EQ(r->sampling.guided.spec, "[0-9]{3}-[a-z]{2}");
  EXPECT_TRUE(r->sampling.guided.choices.empty());

  in = request();
  for (const char* c : {"yes", "no", "maybe so"})
    in.mutable_guided()->mutable_choice()->add_choices(c);
  r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kChoice);
  EXPECT_EQ(r->sampling.guided.choices, (std::vector<std::string>{"yes", "no", "maybe so"}));
  EXPECT_TRUE(r->sampling.guided.spec.empty());

  const std::string schema =
      R"({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})";
  in = request();
  in.mutable_guided()->set_json_schema(schema);
  r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kJsonSchema);
  EXPECT_EQ(r->sampling.guided.spec, schema);

  in = request();
  in.mutable_guided()->set_json_object(true);
  r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kJsonObject);
  EXPECT_TRUE(r->sampling.guided.spec.empty());
  EXPECT_TRUE(r->sampling.guided.choices.empty());
  const std::string gbnf = "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+";
  in = request();
  in.mutable_guided()->set_grammar(gbnf);
  r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.guided.kind, Kind::kGrammar);
  EXPECT_EQ(r->sampling.guided.spec, gbnf);
}

TEST(ConvertGuided, TheOneofsOwnRulesNameTheField) {
  v1::GenerateRequest in = request();
  in.mutable_guided()->set_json_object(false);  // set, so the oneof holds it, but false
  ASSERT_EQ(in.guided().constraint_case(), v1::GuidedDecoding::kJsonObject);
  auto r = to_engine_request(in, limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "guided.json_object: must be true when set");

  in = request();
  in.mutable_guided()->mutable_choice();  // a choice list with nothing in it
  ASSERT_EQ(in.guided().constraint_case(), v1::GuidedDecoding::kChoice);
  r = to_engine_request(in, limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "guided.choice: needs at least one choice");
}

// The limits are SamplingParams::validate's (kMaxGuidedSpecBytes, kMaxGuidedChoices,
// kMaxGuidedChoiceBytes); its refusals reach the client named by the proto's fields at the top
// level (guided and ignore_eos are fields of GenerateRequest, not of SamplingParams: no
// "sampling." prefix).
TEST(ConvertGuided, ValidateRefusalsNameTheProtoField) {
  auto refusal = [](const v1::GenerateRequest& in) {
    auto r = to_engine_request(in, limits());
    EXPECT_FALSE(r.ok());
    if (r.ok()) return std::string();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  };
  v1::GenerateRequest in = request();
  in.mutable_guided()->set_regex(std::string(kMaxGuidedSpecBytes + 1, 'a'));
  std::string m = refusal(in);
  EXPECT_EQ(m.rfind("guided.regex", 0), 0u) << m;

  in = request();
  in.mutable_guided()->set_json_schema(std::string(kMaxGuidedSpecBytes + 1, ' '));
  m = refusal(in);
  EXPECT_EQ(m.rfind("guided.json_schema", 0), 0u) << m;

  in = request();
  in.mutable_guided()->set_grammar(std::string(kMaxGuidedSpecBytes + 1, ' '));
  m = refusal(in);
  EXPECT_EQ(m.rfind("guided.grammar", 0), 0u) << m;
  in = request();
  in.mutable_guided()->set_grammar("");
  m = refusal(in);
  EXPECT_EQ(m, "guided.grammar: must not be empty") << m;

  in = request();
  for (size_t i = 0; i <= kMaxGuidedChoices; ++i)
    in.mutable_guided()->mutable_choice()->add_choices("c" + std::to_string(i));
  m = refusal(in);
  EXPECT_EQ(m.rfind("guided.choice", 0), 0u) << m;
  EXPECT_EQ(m.rfind("guided.choices", 0), std::string::npos) << m;  // the engine's name

  in = request();
  in.mutable_guided()->mutable_choice()->add_choices("ok");
  in.mutable_guided()->mutable_choice()->add_choices(std::string(kMaxGuidedChoiceBytes + 1, 'b'));
  m = refusal(in);
  EXPECT_EQ(m.rfind("guided.choice", 0), 0u) << m;

  in = request();
  in.mutable_guided()->set_json_object(true);
  in.set_ignore_eos(true);  // the constraint decides where the text ends
  m = refusal(in);
  EXPECT_EQ(m.rfind("ignore_eos: ", 0), 0u) << m;
}

}  // namespace
}  // namespace kvsplit::server
