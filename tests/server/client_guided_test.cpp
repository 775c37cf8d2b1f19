// kvsplit-client --guided-choice / --guided-regex / --guided-grammar against the real server on
// stories260K: the text is exactly one of the choices, or matches the expression whole, greedy and
// sampled, and ends on the model's EOS (finish_reason STOP) once the language allows nothing more.
// The server's refusals, naming the field, and the client's own refusals of the guided flags (exit
// 2, no server needed).
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

struct Completion {
  std::string text;
  std::string finish_reason;
};

// The completions of a `kvsplit-client --json` answer (one at the top level, or a choices array).
std::vector<Completion> completions_of(const std::string& json_out) {
  const nlohmann::json j = nlohmann::json::parse(json_out, nullptr, false);
  std::vector<Completion> out;
  if (!j.is_object()) return out;
  auto one = [&](const nlohmann::json& c) {
    out.push_back({c.value("text", std::string("<no text>")), c.value("finish_reason", "")});
  };
  if (j.contains("choices")) {
    for (const auto& c : j["choices"]) one(c);
  } else {
    one(j);
  }
  return out;
}

// Needs the engine side of guided decoding: without it the text is the model's free story.
TEST(ClientGuided, TheTextIsOneChoiceOrMatchesTheExpression) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  ServerProcess server({"--model", model_path("stories260K.bin")}, dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  const std::string client = std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server " +
                             server.address() + " --json --max-tokens 32 ";

  // Greedy and sampled (8 completions, seeds 7..14), after a prompt the constraint suits and one
  // it does not.
  const std::vector<std::string> samplings = {"--temperature 0 ",
                                              "--temperature 1 --seed 7 --n 8 "};
  const std::vector<std::string> prompts = {"'The weather today was'", "'Once upon a time'", "x"};
  const std::vector<std::string> choices = {"sunny", "rainy", "a big storm"};
  for (const std::string& sampling : samplings) {
    for (const std::string& prompt : prompts) {
      const std::string args = sampling +
                               "--guided-choice sunny --guided-choice rainy "
                               "--guided-choice 'a big storm' " +
                               prompt;
      const auto [code, out] = run_command(client + args);
      ASSERT_EQ(code, 0) << args << ": " << out;
      const std::vector<Completion> got = completions_of(out);
      ASSERT_FALSE(got.empty()) << out;
      for (const Completion& c : got) {
        EXPECT_NE(std::find(choices.begin(), choices.end(), c.text), choices.end())
            << args << ": '" << c.text << "'";
        EXPECT_EQ(c.finish_reason, "FINISH_REASON_STOP") << args << ": " << out;
      }
    }
  }

  const std::regex pattern("[0-9]{3}-[a-z]{2}");
  for (const std::string& sampling : samplings) {
    for (const std::string& prompt : prompts) {
      const std::string args = sampling + "--guided-regex '[0-9]{3}-[a-z]{2}' " + prompt;
      const auto [code, out] = run_command(client + args);
      ASSERT_EQ(code, 0) << args << ": " << out;
      const std::vector<Completion> got = completions_of(out);
      ASSERT_FALSE(got.empty()) << out;
      for (const Completion& c : got) {
        EXPECT_TRUE(std::regex_match(c.text, pattern)) << args << ": '" << c.text << "'";
        EXPECT_EQ(c.finish_reason, "FINISH_REASON_STOP") << args << ": " << out;
      }
    }
  }
}

// A language no regex has (n '(' then 'x' then n ')'), from a grammar file: a finished text is a
// string of it, one cut by max_tokens a prefix of one.
TEST(ClientGuided, TheTextIsAStringOfTheGrammar) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  ServerProcess server({"--model", model_path("stories260K.bin")}, dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  {
    std::ofstream gbnf(dir.file("nest.gbnf"));
    gbnf << "# nested\nroot ::= \"(\" root \")\" | x\nx ::= \"x\"\n";
  }
  const std::string client = std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server " +
                             server.address() + " --json --max-tokens 24 --guided-grammar @" +
                             dir.file("nest.gbnf") + " ";
  auto check = [](const Completion& c) {
    const size_t open = c.text.find_first_not_of('(');
    const bool whole = open != std::string::npos && c.text[open] == 'x' &&
                       c.text.substr(open + 1) == std::string(open, ')');
    if (c.finish_reason == "FINISH_REASON_STOP") return whole;
    if (open == std::string::npos) return true;  // only '(' so far
    const std::string rest = c.text.substr(open + 1);
    return c.text[open] == 'x' && rest.size() <= open &&
           rest.find_first_not_of(')') == std::string::npos;
  };
  for (const std::string sampling : {"--temperature 0 ", "--temperature 1 --seed 5 --n 8 "}) {
    const auto [code, out] = run_command(client + sampling + "'Once upon a time'");
    ASSERT_EQ(code, 0) << sampling << ": " << out;
    const std::vector<Completion> got = completions_of(out);
    ASSERT_FALSE(got.empty()) << out;
    size_t stopped = 0;
    for (const Completion& c : got) {
      EXPECT_TRUE(check(c)) << sampling << ": '" << c.text << "' " << c.finish_reason;
      stopped += c.finish_reason == "FINISH_REASON_STOP" ? 1 : 0;
    }
    EXPECT_GT(stopped, 0u) << out;  // some text ends: EOS is allowed once it is whole
  }
}

// What the server refuses comes back INVALID_ARGUMENT naming the field (exit 1): the schema of a
// --guided-json @file reached it as the file's text.
TEST(ClientGuided, ServerRefusalsNameTheField) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  ServerProcess server({"--model", model_path("stories260K.bin")}, dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  const std::string client = std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server " +
                             server.address() + " --max-tokens 8 ";
  {
    std::ofstream schema(dir.file("schema.json"));
    schema << "{\"type\": \"obj";  // not JSON
  }
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--guided-regex '[a-' 'x'", "INVALID_ARGUMENT: guided.regex: "},
           {"--guided-json @" + dir.file("schema.json") + " 'x'",
            "INVALID_ARGUMENT: guided.json_schema: "},
           {"--guided-grammar 'root ::= root \"a\" | \"a\"' 'x'",
            "INVALID_ARGUMENT: guided.grammar: grammar: left recursion"},
           {"--json-object --ignore-eos 'x'", "INVALID_ARGUMENT: ignore_eos: "}}) {
    const auto [code, out] = run_command(client + args);
    EXPECT_EQ(code, 1) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
}

TEST(ClientGuided, MalformedFlagsAreUsageErrors) {
  TempDir dir;
  const std::string client =
      std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server 127.0.0.1:1 ";
  {
    std::ofstream big(dir.file("big.json"));
    big << std::string(32 * 1024 + 1, ' ');
  }
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--guided-regex a --guided-choice b 'x'", "excludes"},
           {"--guided-choice a --json-object 'x'", "excludes"},
           {"--guided-json '{}' --guided-regex a 'x'", "excludes"},
           {"--json-object --guided-json '{}' 'x'", "excludes"},
           {"--guided-regex '' 'x'", "--guided-regex"},
           {"--guided-json @" + dir.file("missing.json") + " 'x'",
            "--guided-json: cannot open '" + dir.file("missing.json") + "'"},
           {"--guided-json @ 'x'", "@ needs a file name"},
           {"--guided-json @" + dir.file("big.json") + " 'x'", "is larger than 32768 bytes"},
           {"--info --guided-choice a", "--guided-choice is for a generation"},
           {"--stats --json-object", "--json-object is for a generation"}}) {
    const auto [code, out] = run_command(client + args);
    EXPECT_EQ(code, 2) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
}

}  // namespace
}  // namespace kvsplit::testing
