// `kvsplit tokenize`: the tokenizer vectors through --input-jsonl (HF ids by default, plain-text
// ids with --special-as-text), text arguments, --json, --no-special, and exit status 2 with a
// message naming the fault for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

using Ids = std::vector<int32_t>;

std::string tokenizers(const std::string& rel) { return model_path("tokenizers/" + rel); }

#define REQUIRE_TOKENIZERS()                                               \
  do {                                                                     \
    if (!std::filesystem::exists(tokenizers("gpt2/tokenizer.json")))       \
      GTEST_SKIP() << tokenizers("") << " not found (set KVSPLIT_MODELS)"; \
  } while (0)

// Every vector of the three tokenizers, by default and with --special-as-text. The path is the
// tokenizer.json, or for Qwen2 the directory holding it.
TEST(CliTokenize, ReproducesTheVectorFiles) {
  REQUIRE_TOKENIZERS();
  for (const char* name : {"gpt2", "qwen2", "llama2"}) {
    const std::string vectors = tokenizers(std::string(name) + "/encode_shared.jsonl");
    const std::string path = std::string(name) == "qwen2"
                                 ? tokenizers(name)
                                 : tokenizers(std::string(name) + "/tokenizer.json");
    const auto want = read_jsonl(vectors);
    ASSERT_EQ(want.size(), 60u);
    for (bool as_text : {false, true}) {
      RunResult r = run("tokenize --tokenizer " + quote(path) + " --input-jsonl " + quote(vectors) +
                        (as_text ? " --special-as-text" : ""));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const auto got = json_lines(r.out);
      ASSERT_EQ(got.size(), want.size()) << name;
      for (size_t i = 0; i < want.size(); ++i) {
        const auto& w = want[i];
        const auto& ids =
            !as_text && w.contains("hf_tokenizers_ids") ? w["hf_tokenizers_ids"] : w["ids"];
        EXPECT_EQ(got[i]["ids"], ids) << name << " line " << i + 1 << ": " << w["text"];
        EXPECT_EQ(got[i]["text"], w["text"]);
        EXPECT_EQ(got[i]["source"], w["source"]);  // other fields are kept
      }
    }
  }
}

TEST(CliTokenize, TextArgumentsJsonAndNoSpecial) {
  REQUIRE_TOKENIZERS();
  const std::string gpt2 = tokenizers("gpt2/tokenizer.json");
  RunResult r = run("tokenize --tokenizer " + quote(gpt2) + " 'Hello world' '<|endoftext|> hi'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 995\n50256 23105\n");

  const std::string llama = tokenizers("llama2/tokenizer.json");
  r = run("tokenize --json --tokenizer " + quote(llama) + " 'Hello' ''");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["text"], "Hello");
  EXPECT_EQ(lines[0]["ids"], (Ids{1, 15043}));
  EXPECT_EQ(lines[1]["ids"], (Ids{1}));

  r = run("tokenize --no-special --tokenizer " + quote(llama) + " 'Hello'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15043\n");

  // llama2.c tokenizer.bin: run.c's encoding (BOS, special-token text as plain text).
  r = run("tokenize --tokenizer " + quote(tokenizers("llama2/tokenizer.bin")) +
          " '<s> Hello </s>'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 529 29879 29958 15043 1533 29879 29958\n");
}

TEST(CliTokenize, BadInputExitsWithTwo) {
  REQUIRE_TOKENIZERS();
  TempDir dir;
  const std::string gpt2 = tokenizers("gpt2/tokenizer.json");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name), std::ios::binary) << text;
    return dir.file(name);
  };
  // A bad JSON line: the message names the file and the line.
  std::string in = write("in.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"\n");
  RunResult r = run("tokenize --tokenizer " + quote(gpt2) + " --input-jsonl " + quote(in));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(in + ":3:"), std::string::npos) << r.err;
  in = write("notext.jsonl", "{\"txt\": \"a\"}\n");
  r = run("tokenize --tokenizer " + quote(gpt2) + " --input-jsonl " + quote(in));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(":1: expected a string field \"text\""), std::string::npos) << r.err;
  r = run("tokenize --tokenizer " + quote(gpt2) + " --input-jsonl " + quote(dir.file("none")));
  EXPECT_EQ(r.exit_code, 2);
  // A line nested past the JSON depth limit (writing it back recursed until the stack ran out:
  // SIGSEGV) and a key given twice (the last was kept) are refused, naming the line.
  in = write("deep.jsonl", "{\"text\": \"a\", \"x\": " + std::string(100000, '[') +
                               std::string(100000, ']') + "}\n");
  r = run("tokenize --tokenizer " + quote(gpt2) + " --input-jsonl " + quote(in));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(":1: bad JSON: nested deeper than"), std::string::npos) << r.err;
  in = write("dup.jsonl", "{\"text\": \"a\", \"text\": \"b\"}\n");
  r = run("tokenize --tokenizer " + quote(gpt2) + " --input-jsonl " + quote(in));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(":1: duplicate key 'text'"), std::string::npos) << r.err;

  // A missing or malformed tokenizer names the file (and the field).
  r = run("tokenize --tokenizer " + quote(dir.file("nope.json")) + " x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(dir.file("nope.json")), std::string::npos) << r.err;
  const std::string bad = write("bad.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
  r = run("tokenize --tokenizer " + quote(bad) + " x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(bad + ": field model.type: value 'Unigram'"), std::string::npos) << r.err;

  // Nothing to encode, or both kinds of input.
  r = run("tokenize --tokenizer " + quote(gpt2));
  EXPECT_EQ(r.exit_code, 2);
  r = run("tokenize --tokenizer " + quote(gpt2) + " x --input-jsonl " + quote(in));
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace kvsplit::testing
