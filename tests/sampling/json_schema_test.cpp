// JSON schema -> regex: documents valid under a schema match its regex, invalid ones do not, and
// unsupported schemas are rejected with the keyword and its path. The regexes are checked with
// std::regex (ECMAScript), of which the guide's syntax is a subset. std::regex recurses per input
// character, so documents stay short.
#include "sampling/json_schema.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

namespace kvsplit::sampling {
namespace {

using Json = nlohmann::ordered_json;

struct Compiled {
  std::string source;
  std::regex re;
  bool match(const std::string& text) const { return std::regex_match(text, re); }
};

Compiled compile(std::string source) {
  std::regex re(source, std::regex::ECMAScript);
  return {std::move(source), std::move(re)};
}

Compiled compile_schema(std::string_view schema) {
  StatusOr<std::string> rx = json_schema_to_regex(schema);
  EXPECT_TRUE(rx.ok()) << rx.status().to_string() << "\nschema: " << schema;
  return compile(rx.ok() ? *rx : "[^\\s\\S]");
}

void expect_accepts(const Compiled& c, const std::vector<std::string>& docs) {
  for (const std::string& doc : docs) EXPECT_TRUE(c.match(doc)) << doc << "\nregex: " << c.source;
}

void expect_rejects(const Compiled& c, const std::vector<std::string>& docs) {
  for (const std::string& doc : docs) EXPECT_FALSE(c.match(doc)) << doc << "\nregex: " << c.source;
}

// The error of converting `schema`; fails the test when it converts.
std::string error_of(std::string_view schema, size_t max_regex_bytes = size_t{1} << 20) {
  StatusOr<std::string> rx = json_schema_to_regex(schema, max_regex_bytes);
  EXPECT_FALSE(rx.ok()) << "converted: " << schema;
  if (rx.ok()) return "";
  EXPECT_EQ(rx.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rx.status().message().rfind("json_schema: ", 0), 0u) << rx.status().message();
  return rx.status().message();
}

// ---- regex_escape, choice_regex, json_object_regex ----

TEST(RegexEscape, RoundTripsTrickyStrings) {
  const std::vector<std::string> strings = {"",
                                            "a.b*c",
                                            "(x)[y]{z}",
                                            "^$|\\",
                                            "+?",
                                            "tab\tnl\nret\rff\fvt\v",
                                            std::string("\x01\x7f", 2),
                                            std::string("nul\0byte", 8),
                                            "\"quoted\"",
                                            "/-,:",
                                            "h\xC3\xA9llo \xE2\x82\xAC",
                                            "\\d\\w"};
  for (const std::string& s : strings) {
    const Compiled c = compile(regex_escape(s));
    EXPECT_TRUE(c.match(s)) << c.source;
    EXPECT_FALSE(c.match(s + "x")) << c.source;
  }
  expect_rejects(compile(regex_escape("a.b")), {"axb"});
  expect_rejects(compile(regex_escape("a*")), {"", "aa"});
}

TEST(RegexEscape, WritesControlBytesAsEscapes) {
  EXPECT_EQ(regex_escape("\n\t"), "\\n\\t");
  EXPECT_EQ(regex_escape(std::string("\x01\x1f", 2)), "\\x01\\x1F");
  EXPECT_EQ(regex_escape("a.b"), "a\\.b");
  EXPECT_EQ(regex_escape("\xC3\xA9"), "\xC3\xA9");  // non-ASCII stays literal
}

TEST(ChoiceRegex, MatchesExactlyOneChoice) {
  const Compiled c = compile(choice_regex({"a.b", "c|d", "(e)", "f*", "[g]"}));
  expect_accepts(c, {"a.b", "c|d", "(e)", "f*", "[g]"});
  expect_rejects(c, {"axb", "c", "d", "e", "ff", "", "g", "a.bc|d"});
  const Compiled one = compile(choice_regex({"x+"}) + "y");
  expect_accepts(one, {"x+y"});
  expect_rejects(one, {"xxy", "x+"});
}

TEST(ChoiceRegex, NoChoicesIsAProgrammerError) { EXPECT_DEATH(choice_regex({}), "no choices"); }

TEST(JsonObjectRegex, AcceptsDepthTwoRejectsDepthThree) {
  const Compiled c = compile(json_object_regex(2));
  expect_accepts(c, {"{}", R"({"a":1})", R"({"a":{"b":1}})", R"({"a":[1,"x",null]})",
                     R"({"a": [], "b": {}})", R"({"k":true, "l":-1.5e3, "m":"\"q\""})"});
  expect_rejects(
      c, {R"({"a":{"b":{}}})", R"({"a":[[1]]})", R"({"a":[{}]})", "[1]", "1", R"({"a":1,})",
          R"({ "a":1})", R"({"a" :1})", R"({"a":1 })", R"({"a":  1})", "{\"a\":\n1}", R"({a:1})"});
  expect_accepts(compile(json_object_regex(1)), {R"({"a":1, "b":"c"})"});
  expect_rejects(compile(json_object_regex(1)), {R"({"a":[]})"});
}

// ---- types ----

TEST(JsonSchema, ScalarTypes) {
  const Compiled str = compile_schema(R"({"type":"string"})");
  expect_accepts(
      str, {R"("abc")", R"("")", R"("a\"b")", R"("\u00e9\n\\")", "\"\xC3\xA9\"", R"("a/b\/c")"});
  expect_rejects(str, {"abc", R"("a"b")", R"("\x")", "\"a\nb\"", R"("\u12")", "\"", "1"});

  const Compiled integer = compile_schema(R"({"type":"integer"})");
  expect_accepts(integer, {"0", "-12", "7", "1234567890"});
  expect_rejects(integer, {"01", "1.5", "-", "+1", "\"1\"", "1e3", ""});

  const Compiled number = compile_schema(R"({"type":"number"})");
  expect_accepts(number, {"0", "-0.5", "1e10", "2.5E-3", "3e+2", "-0"});
  expect_rejects(number, {".5", "1.", "01", "1e", "-", "NaN", "Infinity"});

  expect_accepts(compile_schema(R"({"type":"boolean"})"), {"true", "false"});
  expect_rejects(compile_schema(R"({"type":"boolean"})"), {"True", "1", "null"});
  expect_accepts(compile_schema(R"({"type":"null"})"), {"null"});
  expect_rejects(compile_schema(R"({"type":"null"})"), {"nul", "\"null\""});
}

TEST(JsonSchema, TypeArrayIsAnAlternation) {
  const Compiled c = compile_schema(R"({"type":["string","null"],"maxLength":2})");
  expect_accepts(c, {"null", R"("ab")"});
  expect_rejects(c, {R"("abc")", "1", "nullnull"});
}

TEST(JsonSchema, NonNegativeAndPositiveIntegers) {
  const Compiled non_negative = compile_schema(R"({"type":"integer","minimum":0})");
  expect_accepts(non_negative, {"0", "15"});
  expect_rejects(non_negative, {"-1", "-0"});
  const Compiled positive = compile_schema(R"({"type":"integer","minimum":1})");
  expect_accepts(positive, {"1", "20"});
  expect_rejects(positive, {"0", "-3"});
  expect_rejects(compile_schema(R"({"type":"integer","exclusiveMinimum":0})"), {"0"});
  expect_rejects(compile_schema(R"({"type":"number","minimum":0})"), {"-0.5"});
}

TEST(JsonSchema, EmptySchemaAndTrueAcceptAnyValueThreeLevelsDeep) {
  for (std::string_view schema : {"{}", "true", R"({"description":"anything"})"}) {
    const Compiled c = compile_schema(schema);
    expect_accepts(c, {"1", "\"s\"", "null", R"({"a":[{"b":null}]})", R"([[[]]])", "[1, {}]"});
    expect_rejects(c, {"[[[[1]]]]", R"({"a":{"b":{"c":{}}}})", "", " 1"});
  }
}

// ---- enum, const ----

TEST(JsonSchema, EnumWithQuotesAndMetacharacters) {
  const Compiled c = compile_schema(R"j({"enum":["a\"b","x.*y","(p|q)",1,null,{"k":[1,2]},2.5]})j");
  expect_accepts(c,
                 {R"("a\"b")", R"("x.*y")", R"j("(p|q)")j", "1", "null", R"({"k":[1,2]})", "2.5"});
  expect_rejects(c, {R"("x..y")", R"("xay")", R"("p")", "2", R"("a"b")", R"({"k":[1, 2]})"});
}

TEST(JsonSchema, ConstAndTypedEnum) {
  const Compiled constant = compile_schema(R"({"const":"c+d\\e"})");
  expect_accepts(constant, {R"("c+d\\e")"});
  expect_rejects(constant, {R"("cd\\e")", R"("c+d\e")"});
  const Compiled typed = compile_schema(R"({"type":"string","enum":["a",1,"b"]})");
  expect_accepts(typed, {R"("a")", R"("b")"});
  expect_rejects(typed, {"1"});
}

// ---- objects ----

TEST(JsonSchema, NestedObjectsInDeclarationOrder) {
  const Compiled c = compile_schema(R"({"type":"object","properties":{
      "name":{"type":"string"},
      "address":{"type":"object","properties":{"zip":{"type":"string"},"city":{"type":"string"}},
                 "required":["zip","city"]}},
      "required":["name","address"]})");
  expect_accepts(c, {R"({"name":"n","address":{"zip":"1","city":"c"}})",
                     R"({"name": "n", "address": {"zip": "1", "city": "c"}})"});
  expect_rejects(c, {R"({"address":{"zip":"1","city":"c"},"name":"n"})",
                     R"({"name":"n","address":{"city":"c","zip":"1"}})",
                     R"({"name":"n","address":{"zip":"1"}})",
                     R"({"name":"n","address":{"zip":"1","city":"c","x":1}})",
                     R"({"name":"n", "address":{"zip":"1","city":"c"}, "x":1})",
                     R"({ "name":"n","address":{"zip":"1","city":"c"}})"});
}

TEST(JsonSchema, AllPresenceCombinationsOfOptionalProperties) {
  const Compiled c = compile_schema(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
          "c":{"type":"integer"}}})");
  const std::vector<std::string> kvs = {R"("a":1)", R"("b":2)", R"("c":3)"};
  for (int mask = 0; mask < 8; ++mask) {
    std::string compact = "{", spaced = "{";
    for (int i = 0; i < 3; ++i) {
      if (!(mask & (1 << i))) continue;
      if (compact.size() > 1) compact += ",", spaced += ", ";
      compact += kvs[i];
      spaced += kvs[i].substr(0, 4) + " " + kvs[i].substr(4);
    }
    expect_accepts(c, {compact + "}", spaced + "}"});
  }
  expect_rejects(
      c, {R"({"a":1"b":2})", R"({"a":1,})", R"({,"a":1})", R"({"b":2,"a":1})", R"({"a":1,"a":1})",
          R"({"c":3,"b":2})", R"({"a":1,,"c":3})", R"({"d":4})", R"({"a":1 ,"b":2})"});
}

TEST(JsonSchema, RequiredAmongOptionalProperties) {
  const Compiled c = compile_schema(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
          "c":{"type":"integer"},"d":{"type":"integer"}},"required":["b","d"]})");
  expect_accepts(c, {R"({"b":2,"d":4})", R"({"a":1,"b":2,"d":4})", R"({"b":2,"c":3,"d":4})",
                     R"({"a":1, "b":2, "c":3, "d":4})"});
  expect_rejects(c, {R"({"a":1,"d":4})", R"({"b":2})", "{}", R"({"a":1,"b":2,"c":3})",
                     R"({"b":2,,"d":4})", R"({"b":2,"d":4,})", R"({"a":1"b":2,"d":4})"});
}

TEST(JsonSchema, OptionalPropertiesStayLinearInSize) {
  auto schema_with = [](int n) {
    Json props = Json::object();
    for (int i = 0; i < n; ++i) props[fmt::format("p{}", i)] = {{"type", "integer"}};
    return Json{{"type", "object"}, {"properties", props}}.dump();
  };
  const size_t size_20 = json_schema_to_regex(schema_with(20))->size();
  const size_t size_40 = json_schema_to_regex(schema_with(40))->size();
  EXPECT_LT(size_40, size_20 * 21 / 10);
  const Compiled c = compile_schema(schema_with(40));
  expect_accepts(c, {R"({"p3":1,"p17":2,"p39":3})", "{}", R"({"p0":0})"});
  expect_rejects(c, {R"({"p17":2,"p3":1})"});
}

TEST(JsonSchema, FreeFormObjects) {
  const Compiled any = compile_schema(R"({"type":"object"})");
  expect_accepts(any, {"{}", R"({"x":1, "y":[{"z":null}]})"});
  expect_rejects(any, {"[]", R"({"x":[[[1]]]})"});
  const Compiled ints =
      compile_schema(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  expect_accepts(ints, {R"({"a":1,"b":2})", "{}"});
  expect_rejects(ints, {R"({"a":"x"})"});
  const Compiled empty = compile_schema(R"({"type":"object","additionalProperties":false})");
  expect_accepts(empty, {"{}"});
  expect_rejects(empty, {R"({"a":1})"});
}

TEST(JsonSchema, PropertyNamesAreEscaped) {
  const Compiled c = compile_schema(
      R"({"type":"object","properties":{"a.b\"c":{"type":"integer"},"x/y":{"type":"null"}},
          "required":["a.b\"c","x/y"]})");
  expect_accepts(c, {R"({"a.b\"c":1,"x/y":null})"});
  expect_rejects(c, {R"({"aXb\"c":1,"x/y":null})"});
}

// ---- arrays ----

TEST(JsonSchema, ArraysWithMinAndMaxItems) {
  const Compiled one_to_three =
      compile_schema(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
  expect_accepts(one_to_three, {"[1]", "[1,2,3]", "[1, 2]"});
  expect_rejects(one_to_three, {"[]", "[1,2,3,4]", "[1,]", "[ 1]", "[1 ]", "[\"a\"]"});
  const Compiled any_count = compile_schema(R"({"type":"array","items":{"type":"string"}})");
  expect_accepts(any_count, {"[]", R"(["a"])", R"(["a", "b","c"])"});
  expect_rejects(any_count, {"[,]", R"(["a",])"});
  const Compiled at_least_two = compile_schema(R"({"type":"array","minItems":2})");
  expect_accepts(at_least_two, {"[1,\"x\"]", "[1,2,3,4,5]"});
  expect_rejects(at_least_two, {"[1]", "[]"});
  expect_accepts(compile_schema(R"({"type":"array","maxItems":0})"), {"[]"});
  expect_rejects(compile_schema(R"({"type":"array","maxItems":0})"), {"[1]"});
}

TEST(JsonSchema, PrefixItemsTuple) {
  const Compiled pair = compile_schema(
      R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})");
  expect_accepts(pair, {R"(["a",1])", R"(["a", 1])"});
  expect_rejects(pair, {R"(["a"])", R"(["a",1,2])", R"([1,"a"])", "[]"});
  const Compiled more = compile_schema(
      R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"integer"}})");
  expect_accepts(more, {R"(["a"])", R"(["a",1,2,3])"});
  expect_rejects(more, {R"(["a","b"])"});
}

// ---- combinators and references ----

TEST(JsonSchema, AnyOfOneOfAllOf) {
  for (std::string_view keyword : {"anyOf", "oneOf"}) {
    const Compiled c =
        compile_schema(std::string(R"({")") + std::string(keyword) +
                       R"(":[{"type":"integer"},{"type":"string","maxLength":2}],"title":"t"})");
    expect_accepts(c, {"5", R"("ab")"});
    expect_rejects(c, {R"("abc")", "1.5", "null"});
  }
  const Compiled all = compile_schema(R"({"allOf":[{"type":"boolean"}],"description":"d"})");
  expect_accepts(all, {"true"});
  expect_rejects(all, {"1"});
}

TEST(JsonSchema, RefsIntoDefsAndDefinitions) {
  const Compiled c = compile_schema(R"({
      "$defs":{"Point":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},
                        "required":["x","y"]},
               "a/b~c":{"enum":["odd name"]}},
      "definitions":{"Color":{"enum":["red","green"]}},
      "type":"object",
      "properties":{"p":{"$ref":"#/$defs/Point"},"c":{"$ref":"#/definitions/Color"},
                    "o":{"$ref":"#/$defs/a~1b~0c"}},
      "required":["p","c","o"]})");
  expect_accepts(c, {R"({"p":{"x":1,"y":2},"c":"red","o":"odd name"})"});
  expect_rejects(c, {R"({"p":{"x":1},"c":"red","o":"odd name"})",
                     R"({"p":{"x":1,"y":2},"c":"blue","o":"odd name"})"});
}

// Recursive $refs (rules the automaton calls): tests/sampling/json_recursion_test.cpp.

// ---- strings ----

TEST(JsonSchema, StringPatternAndLengths) {
  const Compiled pattern = compile_schema(R"({"type":"string","pattern":"^[a-z]+\\d$"})");
  expect_accepts(pattern, {R"("abc1")"});
  expect_rejects(pattern, {R"("abc")", R"("1")", "abc1"});
  const Compiled alternatives = compile_schema(R"({"type":"string","pattern":"cat|dog"})");
  expect_accepts(alternatives, {R"("cat")", R"("dog")"});
  expect_rejects(alternatives, {R"("cat|dog")", R"("ca")", R"("cat")" + std::string("x")});
  const Compiled dollar = compile_schema(R"({"type":"string","pattern":"a\\$"})");
  expect_accepts(dollar, {R"("a$")"});
  const Compiled lengths = compile_schema(R"({"type":"string","minLength":2,"maxLength":3})");
  expect_accepts(lengths, {R"("ab")", R"("abc")", R"("a\nb")", R"("\u00e9\"")"});
  expect_rejects(lengths, {R"("a")", R"("abcd")", R"("")", R"("a\n\nb")"});
}

TEST(JsonSchema, StringFormats) {
  const Compiled date = compile_schema(R"({"type":"string","format":"date"})");
  expect_accepts(date, {R"("2024-02-29")", R"("1999-12-31")"});
  expect_rejects(date, {R"("2024-13-01")", R"("24-01-01")", R"("2024-01-32")", "2024-01-01"});
  const Compiled time = compile_schema(R"({"type":"string","format":"time"})");
  expect_accepts(time, {R"("12:34:56Z")", R"("23:59:60.123+05:30")"});
  expect_rejects(time, {R"("24:00:00Z")", R"("12:34:56")", R"("12:60:00Z")"});
  const Compiled date_time = compile_schema(R"({"type":"string","format":"date-time"})");
  expect_accepts(date_time, {R"("2024-01-02T03:04:05Z")", R"("2024-01-02T03:04:05.5-08:00")"});
  expect_rejects(date_time, {R"("2024-01-02 03:04:05Z")", R"("2024-01-02")"});
  const Compiled uuid = compile_schema(R"({"type":"string","format":"uuid"})");
  expect_accepts(uuid, {R"("123e4567-e89b-12d3-a456-426614174000")"});
  expect_rejects(
      uuid, {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  const Compiled email = compile_schema(R"({"type":"string","format":"email"})");
  expect_accepts(email, {R"("a.b@example.com")", R"("x+y@mail.co.uk")"});
  expect_rejects(email, {R"("a@b")", R"("@x.com")", R"("a b@x.com")", R"("a@-x.com")"});
}

// ---- errors ----

TEST(JsonSchema, ErrorsNameTheKeywordAndItsPath) {
  std::string m =
      error_of(R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":5}}})");
  EXPECT_NE(m.find("'multipleOf'"), std::string::npos) << m;
  EXPECT_NE(m.find("/properties/age/multipleOf"), std::string::npos) << m;
  m = error_of(R"({"type":"string","foo":1})");
  EXPECT_NE(m.find("keyword 'foo' at #/foo is not supported"), std::string::npos) << m;
  m = error_of(R"({"type":"array","items":{"type":"string","uniqueItems":true}})");
  EXPECT_NE(m.find("#/items/uniqueItems"), std::string::npos) << m;
  m = error_of(R"({"type":"number","multipleOf":2})");
  EXPECT_NE(m.find("'multipleOf'"), std::string::npos) << m;
  m = error_of(R"({"type":"string","format":"ipv4"})");
  EXPECT_NE(m.find("#/format"), std::string::npos) << m;
}

TEST(JsonSchema, MalformedAndBadValues) {
  EXPECT_NE(error_of(R"({"type":"string")").find("malformed JSON"), std::string::npos);
  // Nesting past 128 in the schema text is refused before nlohmann recurses into it.
  EXPECT_NE(error_of("{\"const\":" + std::string(16000, '[') + std::string(16000, ']') + "}")
                .find("nest more than 128"),
            std::string::npos);
  // A number past double's range is nlohmann's out_of_range, not a parse_error (found by fuzzing).
  EXPECT_NE(error_of(R"({"const":1E1000000})").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of("false").find("false"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"object","properties":{"a":false}})").find("#/properties/a"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":5})").find("'type' at #/type"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"str"})").find("'type'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":[]})").find("'type'"), std::string::npos);
  EXPECT_NE(error_of("3").find("must be an object or a boolean"), std::string::npos);
  EXPECT_NE(error_of(R"({"anyOf":{}})").find("'anyOf'"), std::string::npos);
  EXPECT_NE(error_of(R"({"enum":[]})").find("'enum'"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"other.json#/a"})").find("'$ref'"), std::string::npos);
  EXPECT_NE(error_of(R"({"allOf":[{"type":"string"},{"maxLength":3}]})").find("'allOf'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","minLength":3,"maxLength":2})").find("'minLength'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","maxLength":5000})").find("'maxLength'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":"array","minItems":-1})").find("'minItems'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"array","prefixItems":[{}],"minItems":2})").find("'minItems'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":"array","items":[{}]})").find("'items'"), std::string::npos);
  std::string deep = "{}";
  for (int i = 0; i < 200; ++i) deep = R"({"items":)" + deep + "}";
  EXPECT_NE(error_of(deep).find("more than 128"), std::string::npos);
}

TEST(JsonSchema, ConstraintsThatCannotBeCombinedAreErrors) {
  EXPECT_NE(
      error_of(R"({"type":"string","pattern":"a+","minLength":2})").find("cannot be combined"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"anyOf":[{"type":"string"}],"type":"string"})").find("cannot be combined"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"enum":["a"],"maxLength":3})").find("cannot be combined"),
            std::string::npos);
  std::string m =
      error_of(R"({"type":"object","properties":{"a":{}},"additionalProperties":true})");
  EXPECT_NE(m.find("'additionalProperties'"), std::string::npos) << m;
  EXPECT_NE(
      error_of(R"({"type":"object","properties":{"a":{}},"required":[1]})").find("'required'"),
      std::string::npos);
  m = error_of(R"({"type":"object","properties":{"a":{}},"required":["b"]})");
  EXPECT_NE(m.find("#/required"), std::string::npos) << m;
}

TEST(JsonSchema, TooLargeRegexIsAnError) {
  const std::string schema = R"({"type":"object","properties":{"a":{},"b":{}}})";
  const std::string m = error_of(schema, 1000);
  EXPECT_NE(m.find("max_regex_bytes"), std::string::npos) << m;
  EXPECT_TRUE(json_schema_to_regex(schema).ok());
  // Definitions that each use the one below twice: 2^16 copies of the bottom one.
  Json defs = Json::object();
  defs["d0"] = {{"type", "string"}, {"format", "uuid"}};
  for (int i = 1; i <= 16; ++i) {
    const std::string below = fmt::format("#/$defs/d{}", i - 1);
    defs[fmt::format("d{}", i)] = {{"prefixItems", {{{"$ref", below}}, {{"$ref", below}}}}};
  }
  error_of(Json{{"$defs", defs}, {"$ref", "#/$defs/d16"}}.dump());
}

// ---- randomized: generated documents of a schema all match its regex ----

class DocumentGenerator {
 public:
  explicit DocumentGenerator(uint32_t seed) : rng_(seed) {}

  bool coin() { return rng_() % 2 == 0; }
  int below(int n) { return static_cast<int>(rng_() % n); }

  Json string() {
    static const std::vector<std::string> kPieces = {
        "a", "Z", "0", " ", "\"", "\\", "\n", "/", "\xC3\xA9", "\x01", "\t", "{", "]", ":"};
    std::string s;
    for (int n = below(5); n > 0; --n) s += kPieces[below(kPieces.size())];
    return s;
  }
  Json integer() { return below(3) == 0 ? Json(0) : Json(below(2000) - 1000); }
  Json number() {
    static const std::vector<double> kNumbers = {0.0, -0.25, 1.5, 1e-5, 3e20, -7.0, 123.456};
    return below(3) == 0 ? integer() : Json(kNumbers[below(kNumbers.size())]);
  }

  // A person as the schema in RandomDocumentsOfAPersonSchema: optional properties at random.
  Json person() {
    static const std::vector<std::string> kKinds = {"a", "b.c", "d\"e"};
    Json p = Json::object();
    p["name"] = string();
    p["age"] = integer();
    if (coin()) p["score"] = number();
    if (coin()) {
      Json tags = Json::array();
      for (int n = below(4); n > 0; --n) tags.push_back(string());
      p["tags"] = tags;
    }
    if (coin()) p["kind"] = kKinds[below(kKinds.size())];
    if (coin()) {
      Json address = {{"city", string()}};
      if (coin()) address["zip"] = coin() ? string() : Json(nullptr);
      p["address"] = address;
    }
    if (coin()) p["flag"] = coin();
    return p;
  }

  // Separators with a space after each ',' and ':' (always, or at random).
  std::string spaced_dump(const Json& j, bool random) {
    auto ws = [&] { return !random || coin() ? " " : ""; };
    std::string out;
    if (j.is_object()) {
      for (const auto& item : j.items()) {
        out += out.empty() ? "{" : std::string(",") + ws();
        out += Json(item.key()).dump() + ":" + ws() + spaced_dump(item.value(), random);
      }
      return out.empty() ? "{}" : out + "}";
    }
    if (j.is_array()) {
      for (const Json& v : j)
        out += (out.empty() ? "[" : std::string(",") + ws()) + spaced_dump(v, random);
      return out.empty() ? "[]" : out + "]";
    }
    return j.dump();
  }

 private:
  std::mt19937 rng_;
};

void expect_all_forms_accepted(const Compiled& c, DocumentGenerator& gen, const Json& doc) {
  expect_accepts(c, {doc.dump(), gen.spaced_dump(doc, false), gen.spaced_dump(doc, true)});
}

TEST(JsonSchema, RandomDocumentsOfAPersonSchema) {
  const Compiled c = compile_schema(R"({"type":"object","properties":{
      "name":{"type":"string"},
      "age":{"type":"integer"},
      "score":{"type":"number"},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":3},
      "kind":{"enum":["a","b.c","d\"e"]},
      "address":{"type":"object","properties":{"city":{"type":"string"},
                 "zip":{"type":["string","null"]}},"required":["city"]},
      "flag":{"type":"boolean"}},
    "required":["name","age"]})");
  DocumentGenerator gen(1234);
  for (int i = 0; i < 300; ++i) {
    Json doc = gen.person();
    ASSERT_LT(doc.dump().size(), 300u);
    expect_all_forms_accepted(c, gen, doc);
    if (HasFailure()) return;
  }
}

TEST(JsonSchema, RandomDocumentsOfAnArrayOfAlternatives) {
  const Compiled c = compile_schema(R"({"type":"array","maxItems":4,"items":{"anyOf":[
      {"type":"object","properties":{"n":{"type":"number"},"s":{"type":"string"}}},
      {"type":"array","items":{"type":"integer","minimum":0},"minItems":1,"maxItems":2},
      {"type":"null"}]}})");
  DocumentGenerator gen(99);
  for (int i = 0; i < 300; ++i) {
    Json doc = Json::array();
    for (int n = gen.below(5); n > 0; --n) {
      const int pick = gen.below(3);
      if (pick == 0) {
        Json o = Json::object();
        if (gen.coin()) o["n"] = gen.number();
        if (gen.coin()) o["s"] = gen.string();
        doc.push_back(o);
      } else if (pick == 1) {
        Json a = Json::array({gen.below(50)});
        if (gen.coin()) a.push_back(gen.below(1000));
        doc.push_back(a);
      } else {
        doc.push_back(nullptr);
      }
    }
    expect_all_forms_accepted(c, gen, doc);
    if (HasFailure()) return;
  }
}

TEST(JsonSchema, RandomDocumentsOfAnyValue) {
  const Compiled c = compile_schema("{}");
  DocumentGenerator gen(7);
  // Values nested at most three containers deep.
  std::function<Json(int)> value = [&](int depth) -> Json {
    const int pick = gen.below(depth > 0 ? 7 : 5);
    if (pick == 0) return gen.string();
    if (pick == 1) return gen.number();
    if (pick == 2) return gen.coin();
    if (pick == 3) return nullptr;
    if (pick == 4) return gen.integer();
    Json container = pick == 5 ? Json::object() : Json::array();
    for (int n = gen.below(3); n > 0; --n) {
      if (pick == 5) {
        container[gen.string().get<std::string>()] = value(depth - 1);
      } else {
        container.push_back(value(depth - 1));
      }
    }
    return container;
  };
  for (int i = 0; i < 300; ++i) {
    const Json doc = value(3);
    if (doc.dump().size() > 250) continue;
    expect_all_forms_accepted(c, gen, doc);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace kvsplit::sampling

namespace kvsplit::sampling {
namespace {

// Hostile schemas are refused quickly and without building huge regexes.
TEST(JsonSchema, LongTuplesAreSizedAsTheyGrow) {
  nlohmann::json defs = {{"l0", {{"type", "string"}, {"maxLength", 5}}}};
  for (int i = 1; i < 5; ++i) {
    nlohmann::json any = nlohmann::json::array();
    for (int k = 0; k < 8; ++k) any.push_back({{"$ref", "#/$defs/l" + std::to_string(i - 1)}});
    defs["l" + std::to_string(i)] = {{"anyOf", any}};
  }
  const nlohmann::json item = {{"$ref", "#/$defs/l4"}};
  const nlohmann::json schema = {
      {"$defs", defs}, {"type", "array"}, {"prefixItems", std::vector<nlohmann::json>(1400, item)}};
  StatusOr<std::string> rx = json_schema_to_regex(schema.dump());
  ASSERT_FALSE(rx.ok());
  EXPECT_NE(rx.status().message().find("larger than max_regex_bytes"), std::string::npos)
      << rx.status().message();
}

TEST(JsonSchema, APatternCannotCloseItsStringGroup) {
  StatusOr<std::string> rx = json_schema_to_regex(
      R"({"type":"object","properties":{"p":{"type":"string","pattern":"x)|.*|(y"}}})");
  ASSERT_FALSE(rx.ok());
  EXPECT_NE(rx.status().message().find("'pattern'"), std::string::npos) << rx.status().message();
  EXPECT_TRUE(json_schema_to_regex(R"({"type":"string","pattern":"^(a|b)+$"})").ok());
}

}  // namespace
}  // namespace kvsplit::sampling
