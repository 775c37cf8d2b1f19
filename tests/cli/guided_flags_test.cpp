// `kvsplit generate --guided-regex | --guided-choice | --guided-json | --json-object |
// --guided-grammar`
// (src/common/guided_flags.h), parsed in-process as the tool parses them (strict_options): each
// flag sets its kind and text, at most one is given, --guided-json / --guided-grammar @PATH read
// the file. And the
// binary itself refuses two at once and a missing file (exit 2) before it loads a model.
#include "common/guided_flags.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "common/cli_options.h"
#include "test_util.h"

namespace kvsplit::cli {
namespace {

using Kind = GuidedDecoding::Kind;

struct Parsed {
  std::string error;  // CLI11's message; "" when the flags parsed
  StatusOr<GuidedDecoding> guided = GuidedDecoding{};
};

// Parses `args` as `kvsplit generate` does (a positional prompt beside, strict_options).
Parsed parse(std::vector<std::string> args) {
  CLI::App app;
  std::string prompt;
  GuidedFlags f;
  app.add_option("prompt", prompt);
  add_guided_options(&app, f);
  strict_options(app);
  args.insert(args.begin(), "kvsplit");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Parsed p;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    p.error = e.what();
    return p;
  }
  p.guided = guided_from_flags(app, f);
  return p;
}

TEST(GuidedFlags, EachFlagSetsItsKind) {
  Parsed p = parse({});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok());
  EXPECT_EQ(p.guided->kind, Kind::kNone);
  EXPECT_FALSE(p.guided->on());

  p = parse({"--guided-regex", "[0-9]{3}-[a-z]{2}"});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok()) << p.guided.status().to_string();
  EXPECT_EQ(p.guided->kind, Kind::kRegex);
  EXPECT_EQ(p.guided->spec, "[0-9]{3}-[a-z]{2}");
  EXPECT_TRUE(p.guided->choices.empty());

  // One choice per use, in order; a word after the flag's value is the prompt, not a choice.
  p = parse({"--guided-choice", "yes", "--guided-choice", "no way", "--guided-choice", "maybe",
             "prompt text"});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok());
  EXPECT_EQ(p.guided->kind, Kind::kChoice);
  EXPECT_EQ(p.guided->choices, (std::vector<std::string>{"yes", "no way", "maybe"}));
  EXPECT_TRUE(p.guided->spec.empty());

  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}}})";
  p = parse({"--guided-json", schema});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok());
  EXPECT_EQ(p.guided->kind, Kind::kJsonSchema);
  EXPECT_EQ(p.guided->spec, schema);

  p = parse({"--json-object"});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok());
  EXPECT_EQ(p.guided->kind, Kind::kJsonObject);
  EXPECT_TRUE(p.guided->spec.empty());

  const std::string gbnf = "root ::= \"(\" root \")\" | \"x\"";
  p = parse({"--guided-grammar", gbnf});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok());
  EXPECT_EQ(p.guided->kind, Kind::kGrammar);
  EXPECT_EQ(p.guided->spec, gbnf);
}

TEST(GuidedFlags, AtMostOneIsGiven) {
  const std::vector<std::vector<std::string>> pairs = {
      {"--guided-regex", "a", "--guided-choice", "b"},
      {"--guided-regex", "a", "--guided-json", "{}"},
      {"--guided-regex", "a", "--json-object"},
      {"--guided-choice", "a", "--guided-json", "{}"},
      {"--guided-choice", "a", "--json-object"},
      {"--json-object", "--guided-json", "{}"},
      {"--guided-grammar", "root ::= \"a\"", "--guided-regex", "a"},
      {"--guided-grammar", "root ::= \"a\"", "--guided-choice", "a"},
      {"--guided-grammar", "root ::= \"a\"", "--guided-json", "{}"},
      {"--guided-grammar", "root ::= \"a\"", "--json-object"}};
  for (const auto& args : pairs) {
    const Parsed p = parse(args);
    EXPECT_NE(p.error.find("excludes"), std::string::npos) << args[0] << ": " << p.error;
  }
  // An empty value is refused as for every text flag (strict_options), not taken as "none".
  EXPECT_NE(parse({"--guided-regex", ""}).error, "");
  EXPECT_NE(parse({"--guided-choice", ""}).error, "");
}

TEST(GuidedFlags, AtPathReadsTheSchemaFromThatFile) {
  testing::TempDir dir;
  const std::string path = dir.file("schema.json");
  const std::string schema =
      "{\n  \"type\": \"array\",\n  \"items\": {\"enum\": [\"x\", \"y\"]}\n}\n";
  std::ofstream(path) << schema;
  Parsed p = parse({"--guided-json", "@" + path});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok()) << p.guided.status().to_string();
  EXPECT_EQ(p.guided->kind, Kind::kJsonSchema);
  EXPECT_EQ(p.guided->spec, schema);

  // A missing file: NotFound (exit 2) naming the flag and the path.
  p = parse({"--guided-json", "@" + dir.file("missing.json")});
  ASSERT_EQ(p.error, "");
  ASSERT_FALSE(p.guided.ok());
  EXPECT_EQ(p.guided.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(p.guided.status().message().rfind(
                "--guided-json: cannot open '" + dir.file("missing.json") + "'", 0),
            0u)
      << p.guided.status().message();
  p = parse({"--guided-json", "@"});
  ASSERT_FALSE(p.guided.ok());
  EXPECT_NE(p.guided.status().message().find("@ needs a file name"), std::string::npos);
  // A directory opens but does not read.
  p = parse({"--guided-json", "@" + dir.path().string()});
  ASSERT_FALSE(p.guided.ok());
  EXPECT_EQ(p.guided.status().message().rfind("--guided-json: cannot read", 0), 0u)
      << p.guided.status().message();
  // Read no further than a schema may be: a larger file is refused (no /dev/zero fills memory).
  std::ofstream(dir.file("big.json")) << std::string(kMaxGuidedSpecBytes + 1, ' ');
  p = parse({"--guided-json", "@" + dir.file("big.json")});
  ASSERT_FALSE(p.guided.ok());
  EXPECT_EQ(p.guided.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.guided.status().message().find("is larger than 32768 bytes"), std::string::npos)
      << p.guided.status().message();
  p = parse({"--guided-json", "@/dev/zero"});
  ASSERT_FALSE(p.guided.ok());
  EXPECT_NE(p.guided.status().message().find("is larger than"), std::string::npos);
  // Exactly the limit is read whole (its size is validate's to judge, not the reader's).
  std::ofstream(dir.file("full.json")) << std::string(kMaxGuidedSpecBytes, ' ');
  p = parse({"--guided-json", "@" + dir.file("full.json")});
  ASSERT_TRUE(p.guided.ok()) << p.guided.status().to_string();
  EXPECT_EQ(p.guided->spec.size(), kMaxGuidedSpecBytes);
}

TEST(GuidedFlags, GuidedGrammarAtPathReadsTheGrammarFromThatFile) {
  testing::TempDir dir;
  const std::string path = dir.file("list.gbnf");
  const std::string gbnf = "# a list\nroot ::= item (\", \" item)*\nitem ::= [a-z]+\n";
  std::ofstream(path) << gbnf;
  Parsed p = parse({"--guided-grammar", "@" + path});
  ASSERT_EQ(p.error, "");
  ASSERT_TRUE(p.guided.ok()) << p.guided.status().to_string();
  EXPECT_EQ(p.guided->kind, Kind::kGrammar);
  EXPECT_EQ(p.guided->spec, gbnf);
  p = parse({"--guided-grammar", "@" + dir.file("missing.gbnf")});
  ASSERT_FALSE(p.guided.ok());
  EXPECT_EQ(p.guided.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(p.guided.status().message().rfind("--guided-grammar: cannot open", 0), 0u)
      << p.guided.status().message();
}

// The binary: the same refusals, exit 2, before any model is loaded (a model path that does not
// exist would be the error otherwise).
TEST(GuidedFlags, TheToolRefusesTwoFlagsAndAMissingFile) {
  const std::string gen = "generate --model /nonexistent/model.bin --prompt x ";
  testing::RunResult r = testing::run(gen + "--guided-regex a --json-object");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
  r = testing::run(gen + "--guided-json @/nonexistent/schema.json");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--guided-json: cannot open '/nonexistent/schema.json'"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace kvsplit::cli
