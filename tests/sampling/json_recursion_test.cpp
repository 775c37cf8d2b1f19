// Recursive JSON schemas ($ref that recurs: trees, linked lists, mutual recursion) through the
// whole guide: the recurring target becomes a rule that the automaton calls on its stack, so any
// depth is accepted (no expansion to a fixed depth), every document is checked against nlohmann
// and the schema by hand, and the schemas with no finite document, or that recur before any text,
// are refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "sampling/guide.h"
#include "sampling/guide_test_util.h"
#include "sampling/json_schema.h"

namespace kvsplit::sampling {
namespace {

using testing::byte_vocab;
using testing::live_prefix;
using testing::whole_match;

std::shared_ptr<GuideGrammar> schema_guide(const std::string& schema) {
  auto g = GuideGrammar::compile({GuidedDecoding::Kind::kJsonSchema, schema, {}}, byte_vocab());
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

std::string refusal(const std::string& schema) {
  auto g = GuideGrammar::compile({GuidedDecoding::Kind::kJsonSchema, schema, {}}, byte_vocab());
  EXPECT_FALSE(g.ok()) << schema;
  if (g.ok()) return "";
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message().rfind("guided.json_schema: ", 0), 0u) << g.status().message();
  return g.status().message();
}

// A tree `depth` levels deep, `fan` children per node.
std::string tree(int depth, int fan, int* next_value) {
  std::string children;
  if (depth > 1) {
    for (int k = 0; k < fan; ++k) children += (k ? "," : "") + tree(depth - 1, fan, next_value);
  }
  return fmt::format(R"({{"value":{},"children":[{}]}})", (*next_value)++, children);
}

TEST(JsonRecursion, ATreeOfAnyDepthIsAccepted) {
  const std::shared_ptr<GuideGrammar> g = schema_guide(R"({"$ref":"#/$defs/node","$defs":{"node":{
      "type":"object","properties":{"value":{"type":"integer"},
      "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["value","children"]}}})");
  ASSERT_NE(g, nullptr);
  for (const int depth : {1, 2, 4, 12, 40}) {
    int v = 0;
    const std::string doc = tree(depth, depth > 4 ? 1 : 2, &v);
    ASSERT_TRUE(nlohmann::json::accept(doc));
    EXPECT_TRUE(whole_match(*g, doc)) << depth << ": " << doc;
    EXPECT_FALSE(whole_match(*g, doc.substr(0, doc.size() - 1))) << depth;
    EXPECT_TRUE(live_prefix(*g, doc.substr(0, doc.size() - 1))) << depth;
  }
  EXPECT_FALSE(whole_match(*g, R"({"value":1})"));                           // required
  EXPECT_FALSE(whole_match(*g, R"({"value":1,"children":[{"value":2}]})"));  // nested too
  EXPECT_FALSE(whole_match(*g, R"({"value":1,"children":[{"value":"x","children":[]}]})"));
  EXPECT_FALSE(live_prefix(*g, R"({"value":1,"children":[{"val)"
                               "x"));
}

TEST(JsonRecursion, ALinkedListThroughTheRootEndsAtNull) {
  const std::shared_ptr<GuideGrammar> g = schema_guide(
      R"({"type":"object","properties":{"v":{"type":"integer"},
          "next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["v","next"]})");
  ASSERT_NE(g, nullptr);
  std::string list = "null";
  for (int k = 30; k >= 1; --k) {
    list = fmt::format(R"({{"v":{},"next":{}}})", k, list);
    EXPECT_TRUE(whole_match(*g, list)) << list;
  }
  EXPECT_FALSE(whole_match(*g, "null"));  // the text is an object, not the tail
  EXPECT_FALSE(whole_match(*g, R"({"v":1,"next":{"v":2}})"));
  // The list's depth costs states (a stack per depth), not a regex expanded per level.
  EXPECT_LT(g->num_states(), 2000u);
}

TEST(JsonRecursion, MutualRecursionAndRefsUsedOutsideTheirCycle) {
  // An expression: a number, or an op whose args are expressions; a term refers back to expr.
  const std::shared_ptr<GuideGrammar> g = schema_guide(R"({
      "$defs":{
        "expr":{"anyOf":[{"type":"integer"},{"$ref":"#/$defs/op"}]},
        "op":{"type":"object","properties":{"op":{"enum":["+","*"]},
              "args":{"type":"array","items":{"$ref":"#/$defs/expr"},"minItems":2,"maxItems":2}},
              "required":["op","args"]}},
      "type":"object","properties":{"first":{"$ref":"#/$defs/expr"},
                                    "second":{"$ref":"#/$defs/op"}},
      "required":["first","second"]})");
  ASSERT_NE(g, nullptr);
  const std::string deep = R"({"op":"+","args":[1,{"op":"*","args":[{"op":"+","args":[2,3]},4]}]})";
  EXPECT_TRUE(whole_match(*g, fmt::format(R"({{"first":7,"second":{}}})", deep)));
  EXPECT_TRUE(whole_match(*g, fmt::format(R"({{"first":{},"second":{}}})", deep, deep)));
  EXPECT_FALSE(whole_match(*g, R"({"first":7,"second":7})"));  // second is an op
  EXPECT_FALSE(
      whole_match(*g, R"({"first":{"op":"-","args":[1,2]},"second":{"op":"+","args":[1,2]}})"));
  EXPECT_FALSE(
      whole_match(*g, R"({"first":{"op":"+","args":[1]},"second":{"op":"+","args":[1,2]}})"));
}

TEST(JsonRecursion, NoFiniteDocumentOrRecurringBeforeAnyTextIsRefused) {
  std::string m = refusal(
      R"({"$defs":{"a":{"type":"object","properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]}},
          "$ref":"#/$defs/a"})");
  EXPECT_NE(m.find("$ref '#/$defs/a' derives no finite string"), std::string::npos) << m;
  m = refusal(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},
                  "$ref":"#/$defs/a"})");
  EXPECT_NE(m.find("left recursion (#/$defs/a -> #/$defs/a)"), std::string::npos) << m;
  // Six definitions, each an anyOf of refs to all six: cheap now (each is a rule, written once),
  // and refused for what it is: no document ends.
  nlohmann::json defs;
  for (int i = 0; i < 6; ++i) {
    nlohmann::json any = nlohmann::json::array();
    for (int j = 0; j < 6; ++j) any.push_back({{"$ref", "#/$defs/d" + std::to_string(j)}});
    defs["d" + std::to_string(i)] = {{"anyOf", any}};
  }
  m = refusal(nlohmann::json{{"$defs", defs}, {"$ref", "#/$defs/d0"}}.dump());
  EXPECT_NE(m.find("$ref '#/$defs/d"), std::string::npos) << m;
  EXPECT_NE(m.find("derives no finite string"), std::string::npos) << m;
  // The regex-only entry point says why it cannot.
  StatusOr<std::string> rx = json_schema_to_regex(
      R"({"type":"object","properties":{"n":{"anyOf":[{"$ref":"#"},{"type":"null"}]}}})");
  ASSERT_FALSE(rx.ok());
  EXPECT_NE(rx.status().message().find("$ref '#' is recursive"), std::string::npos)
      << rx.status().message();
}

TEST(JsonRecursion, FanOutWithoutRecursionIsStillBoundedByWork) {
  // d_i: an anyOf of ten refs to d_(i-1): written out where used, 10^6 expansions.
  nlohmann::json defs = {{"d0", {{"const", 1}}}};
  for (int i = 1; i <= 6; ++i) {
    nlohmann::json any = nlohmann::json::array();
    for (int j = 0; j < 10; ++j) any.push_back({{"$ref", "#/$defs/d" + std::to_string(i - 1)}});
    defs["d" + std::to_string(i)] = {{"anyOf", any}};
  }
  const std::string m = refusal(nlohmann::json{{"$defs", defs}, {"$ref", "#/$defs/d6"}}.dump());
  EXPECT_NE(m.find("too complex"), std::string::npos) << m;
}

}  // namespace
}  // namespace kvsplit::sampling
