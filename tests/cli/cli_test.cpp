// The kvsplit binary: generate --json against the goldens (one prompt and a batch), info, the
// default-model fallback, and clear errors with a non-zero exit status.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

std::string model_args(bool hf) {
  return hf ? "--model " + quote(model_path("stories260K-hf"))
            : "--model " + quote(model_path("stories260K.bin")) + " --tokenizer " +
                  quote(model_path("tok512.bin"));
}

TEST(CliTest, GenerateJsonMatchesGoldensOnePromptAndBatch) {
  KVSPLIT_REQUIRE_MODELS();
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  for (bool hf : {false, true}) {
    // One prompt per call (the 64-step cases).
    const auto& c = cases[0];
    const int n = c["steps"].get<int>() - static_cast<int>(c["prompt_token_ids"].size()) + 1;
    RunResult r = run("generate " + model_args(hf) + " --prompt " + quote(c["prompt"]) +
                      " --max-tokens " + std::to_string(n) + " --temperature 0 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0]["prompt"], c["prompt"]);
    EXPECT_EQ(lines[0]["prompt_token_ids"], c["prompt_token_ids"]);
    EXPECT_EQ(lines[0]["output_token_ids"], c["output_token_ids"]);
    EXPECT_EQ(lines[0]["finish_reason"], "length");
    EXPECT_FALSE(lines[0]["text"].get<std::string>().empty());
  }
  // The 256-step cases as one batch: one line per prompt, in order.
  std::string args = "generate " + model_args(false) + " --temperature 0 --json --max-tokens 252";
  std::vector<const nlohmann::json*> batch;
  for (const auto& c : cases) {
    if (c["steps"] == 256 && c["prompt_token_ids"].size() == 5) {
      args += " --prompt " + quote(c["prompt"]);
      batch.push_back(&c);
    }
  }
  ASSERT_EQ(batch.size(), 2u);
  RunResult r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(lines[i]["output_token_ids"], (*batch[i])["output_token_ids"]) << i;
  }
}

TEST(CliTest, StopsOnBosLikeRunC) {
  KVSPLIT_REQUIRE_MODELS();
  for (const auto& c : read_jsonl(model_path("golden/stories260K_greedy.jsonl"))) {
    if (c["stop_reason"] != "bos") continue;
    const int n = c["steps"].get<int>() - static_cast<int>(c["prompt_token_ids"].size()) + 1;
    RunResult r = run("generate " + model_args(true) + " --prompt " + quote(c["prompt"]) +
                      " --max-tokens " + std::to_string(n) + " -t 0 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["output_token_ids"], c["output_token_ids"]);
    EXPECT_EQ(lines[0]["output_token_ids"].back(), 1);
    EXPECT_EQ(lines[0]["finish_reason"], "stop");
  }
}

TEST(CliTest, InfoPrintsTheConfig) {
  KVSPLIT_REQUIRE_MODELS();
  RunResult r = run("info " + model_args(true));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dim"], 64);
  EXPECT_EQ(j["num_kv_heads"], 4);
  EXPECT_EQ(j["rope_style"], "half");
  EXPECT_EQ(j["layer_window"], nlohmann::json::array({0, 0, 0, 0, 0}));
  EXPECT_EQ(j["kv_window"], 0);
}

// A sliding window shows: the tiny Mistral checkpoint with its config's sliding_window set (the
// shipped one has none) has it on every layer.
TEST(CliTest, InfoPrintsTheSlidingWindow) {
  const std::filesystem::path src = models_dir() + "/hf-tiny/mistral-tiny";
  if (!std::filesystem::exists(src / "config.json")) GTEST_SKIP() << "no " << src;
  TempDir dir;
  const std::filesystem::path m = dir.path() / "mistral";
  std::filesystem::copy(src, m, std::filesystem::copy_options::recursive);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(m / "config.json"));
  cfg["sliding_window"] = 48;
  std::ofstream(m / "config.json") << cfg.dump();
  RunResult r = run("info --model " + m.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layer_window"], nlohmann::json::array({48, 48, 48}));
  EXPECT_EQ(j["kv_window"], 48);
}

TEST(CliTest, FallsBackToSyntheticAndSaysSo) {
  // Run two levels down in a fresh directory so that neither ./models nor ../shared/models exist.
  TempDir dir;
  const std::filesystem::path cwd = dir.path() / "a" / "b";
  std::filesystem::create_directories(cwd);
  RunResult r = run("generate --prompt hi --max-tokens 3 -t 0 --json",
                    "KVSPLIT_MODELS=" + dir.file("none"), cwd.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("synthetic:stories260k"), std::string::npos) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LE(lines[0]["output_token_ids"].size(), 3u);  // --max-tokens counts generated tokens
}

// Exit codes: 2 for every bad input (flags, files, prompts, unsupported models), 1 internal.
TEST(CliTest, BadInputsFailClearlyWithExitTwo) {
  RunResult r = run("generate --model /nonexistent/model.bin --prompt x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/model.bin"), std::string::npos) << r.err;

  r = run("generate --model synthetic:no-such-preset --prompt x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no-such-preset"), std::string::npos) << r.err;

  // An unsupported config.json setting: exit 2, naming the file, the field and the value.
  TempDir hf;
  std::ofstream(hf.file("config.json"))
      << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 32,
             "rope_scaling": {"type": "longrope", "factor": 4.0}})";
  r = run("generate --model " + quote(hf.path().string()) + " --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(
      r.err.find(hf.file("config.json") + ": rope_scaling.type = 'longrope' is not supported"),
      std::string::npos)
      << r.err;

  r = run("generate --no-such-flag");  // CLI11 would exit 109
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // One value per --stop: a stray word after it is an error, not a second stop string (which
  // ran an empty prompt, BOS alone, with exit 0).
  r = run("generate --model synthetic:stories260k --stop Lily 'Once upon a time'");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // One value per --prompt too: "--prompt Once upon" unquoted ran the two prompts "Once" and
  // "upon" with exit 0. Repeating the flag still gives a batch.
  r = run("generate --model synthetic:stories260k --prompt Once upon --max-tokens 2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--prompt \"Once upon\""), std::string::npos) << r.err;
  r = run("generate --model synthetic:stories260k -p Once -p upon --max-tokens 2 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json_lines(r.out).size(), 2u) << r.out;
  r = run("generate --model synthetic:stories260k --max-tokens 0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("max-tokens"), std::string::npos) << r.err;
  // top_k beyond the vocabulary (512): refused as the engine and the server refuse it, not run
  // as if top-k were off.
  r = run("generate --model synthetic:stories260k --prompt x --temperature 1 --top-k 600");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("top_k"), std::string::npos) << r.err;

  // Spatial shards with a windowed model: refused at start, as the engine refuses it (the run
  // failed midway once a sequence first overflowed onto a peer).
  r = run("generate --model synthetic:stories260k@window=32 --spatial-shards 2 --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("sliding-window attention"), std::string::npos) << r.err;

  // Not a regular file: refused at once (a FIFO used to hang, /dev/zero to grow without bound).
  r = run("generate --model /dev/zero --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("a character device"), std::string::npos) << r.err;

  // An unsupported architecture (kUnimplemented) is bad input too.
  TempDir dir;
  std::ofstream(dir.file("config.json")) << R"({"architectures": ["GPT2LMHeadModel"]})";
  r = run("generate --model " + dir.path().string() + " --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("GPT2LMHeadModel"), std::string::npos) << r.err;

  if (!have_models()) GTEST_SKIP() << "the model-backed cases need ../shared/models";
  r = run("generate --model " + model_path("stories260K.bin") +
          " --tokenizer /dev/zero --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("tokenizer /dev/zero: is a character device"), std::string::npos) << r.err;
  r = run("generate " + model_args(false) + " --prompt x --temperature -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;

  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += "dog ";
  r = run("generate " + model_args(false) + " --prompt " + quote(long_prompt));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("longer than the context"), std::string::npos) << r.err;
}

// A model whose activations overflow float32 (every weight finite: stories260K with its first
// attention norms at 1e30) gives NaN logits: generate (greedy and sampled) and perplexity fail
// naming the position (exit 1), never print token 0s or a NaN perplexity.
TEST(CliTest, NonFiniteLogitsAreAnError) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  std::ifstream in(model_path("stories260K.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const size_t first = 28 + size_t{512} * 64 * 4;  // rms_att, after the header and embedding
  ASSERT_GE(bytes.size(), first + 320 * 4);
  const float huge = 1e30f;
  for (size_t k = 0; k < 320; ++k) std::memcpy(bytes.data() + first + k * 4, &huge, 4);
  std::ofstream(dir.file("m.bin"), std::ios::binary) << bytes;
  std::ofstream(dir.file("t.txt")) << "Once upon a time there was a little dog.";
  const std::string model =
      " --model " + quote(dir.file("m.bin")) + " --tokenizer " + quote(model_path("tok512.bin"));
  // Guided too: a constraint must not read unusable logits as "nothing allowed, text complete".
  for (const char* args : {"generate --prompt Once --temperature 0",
                           "generate --prompt Once --temperature 0.8 --seed 1",
                           "generate --prompt Once --temperature 0 --guided-regex [a-z]+"}) {
    const RunResult r = run(std::string(args) + model);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("no usable logits (NaN or infinite) at position 1"), std::string::npos)
        << args << ": " << r.err;
  }
  const RunResult p = run("perplexity --text " + quote(dir.file("t.txt")) + model);
  EXPECT_EQ(p.exit_code, 1) << p.err;
  EXPECT_NE(p.err.find("no usable logits"), std::string::npos) << p.err;
}

// Integer flags are decimal (CLI11 alone read "010" as 8 and "0x20" as 32, and refused "08").
TEST(CliTest, IntegerFlagsAreDecimal) {
  KVSPLIT_REQUIRE_MODELS();
  for (const auto& [value, tokens] :
       {std::pair{"010", 10}, std::pair{"08", 8}, std::pair{"+3", 3}}) {
    RunResult r = run("generate " + model_args(false) + " --prompt Once --temperature 0 --json " +
                      "--ignore-eos --max-tokens " + value);
    ASSERT_EQ(r.exit_code, 0) << value << ": " << r.err;
    const auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0]["output_token_ids"].size(), static_cast<size_t>(tokens)) << value;
  }
  for (const char* bad : {"--kv-blocks 0x20", "--max-tokens 1e3", "--max-tokens 12abc"}) {
    RunResult r = run("generate " + model_args(false) + " --prompt Once " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("must be a decimal integer"), std::string::npos) << bad << ": " << r.err;
  }
}

// Values whose arithmetic would overflow are refused with a clear error, never an abort or a
// wrapped value: a pool of more blocks than KvPool takes (its bookkeeping alone aborted on
// bad_alloc), a split-K chunk near INT32_MAX, more threads than the bound.
TEST(CliTest, HugeSizesAreClearErrors) {
  KVSPLIT_REQUIRE_MODELS();
  RunResult r = run("generate " + model_args(false) + " --prompt Once --kv-blocks 2147483647");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("num_blocks 2147483647 is more than 67108864"), std::string::npos) << r.err;
  for (const char* bad : {"--split-chunk 2147483647", "--threads 100000"}) {
    r = run("generate " + model_args(false) + " --prompt Once " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
  }
}

// Flags this run does not read are accepted (a script may pass one set of flags to every variant
// of a run) and named on stderr; a synthetic model takes the --tokenizer given.
TEST(CliTest, FlagsTheRunDoesNotReadAreNamedOnStderr) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string gen = "generate " + model_args(false) + " --prompt Once --max-tokens 2 ";
  const struct {
    const char* flags;
    const char* warned;  // nullptr: no warning
  } cases[] = {
      {"--spatial-chunk-size 16", "--spatial-chunk-size: no effect without --spatial-shards > 1"},
      {"--spatial-shards 1 --spatial-communicator in_process", "--spatial-communicator: no effect"},
      {"--spatial-shards 2 --spatial-chunk-size 16", nullptr},
      {"--disk-write-behind off --disk-capacity-mb 8",
       "--disk-capacity-mb, --disk-write-behind: no effect without --disk-path"},
      {"--semantic-threshold 0.3 --sink-tokens 2",
       "--semantic-threshold, --sink-tokens: no effect with --kv-policy full"},
      {"--kv-policy semantic --semantic-threshold 0.3", nullptr},
      {"--kv-policy streaming --heavy-tokens 8",
       "--heavy-tokens: no effect with --kv-policy streaming"},
      {"--kv-policy h2o --heavy-tokens 8", nullptr},
      {"--kv-policy streaming --recent-tokens 16 --score-interval 2 --semantic-threshold 0.3",
       "--semantic-threshold, --score-interval: no effect with --kv-policy streaming"},
      {"--kv-policy h2o --score-interval 2 --evict-threshold 0.01",
       "--evict-threshold: no effect with --kv-policy h2o"},
      {"--kv-policy h2o --score-interval 2 --semantic-window 64 --recent-tokens 8", nullptr},
  };
  for (const auto& c : cases) {
    RunResult r = run(gen + c.flags);
    ASSERT_EQ(r.exit_code, 0) << c.flags << ": " << r.err;
    if (c.warned != nullptr)
      EXPECT_NE(r.err.find(c.warned), std::string::npos) << c.flags << ": " << r.err;
    else
      EXPECT_EQ(r.err.find("no effect"), std::string::npos) << c.flags << ": " << r.err;
  }
  // A synthetic model with a tokenizer file: the file's ids (llama2.c's, a few for the prompt),
  // not the byte stand-in's (one per byte).
  RunResult r = run("generate --model synthetic:stories260k --tokenizer " +
                    quote(model_path("tok512.bin")) + " --prompt 'Once upon a time' -n 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_LT(lines[0]["prompt_token_ids"].size(), 10u) << r.out;
  r = run("generate --model synthetic:stories260k --tokenizer /no/such/tokenizer.bin --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("/no/such/tokenizer.bin"), std::string::npos) << r.err;
}

// As llama2.c caps its steps at the context, a --max-tokens the context cannot hold generates what
// it leaves, and stderr says so with each prompt's cap (the server refuses such a request). Any
// value the flag takes is capped before it is checked: the largest int ran into max_tokens' bound
// (2^30) after the warning had said it was capped.
TEST(CliTest, MaxTokensBeyondTheContextStopsThereAndSaysSo) {
  KVSPLIT_REQUIRE_MODELS();
  for (const std::string n : {"1000", "2147483647"}) {
    RunResult r = run("generate " + model_args(false) + " --prompt Once --prompt " +
                      quote("Once upon a time there was") + " --max-tokens " + n +
                      " --temperature 0 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << r.out;
    std::string caps;
    for (size_t i = 0; i < lines.size(); ++i) {
      const size_t room = 512 - lines[i]["prompt_token_ids"].size() + 1;
      EXPECT_EQ(lines[i]["output_token_ids"].size(), room) << i;
      EXPECT_EQ(lines[i]["finish_reason"], "length") << i;
      caps += (i ? ", prompt " : "prompt ") + std::to_string(i) + " at most " +
              std::to_string(room) + " tokens";
    }
    EXPECT_NE(lines[0]["prompt_token_ids"].size(), lines[1]["prompt_token_ids"].size());
    EXPECT_NE(r.err.find("--max-tokens " + n +
                         " exceeds what the context of 512 leaves after the prompt in 2 of 2 "
                         "prompts, capped to what each prompt leaves: " +
                         caps + "\n"),
              std::string::npos)
        << r.err;
  }
  RunResult r = run("generate " + model_args(false) + " --prompt Once --max-tokens 8 --json");
  EXPECT_EQ(r.err.find("exceeds"), std::string::npos) << r.err;
  // Only the prompts whose room is exceeded are named.
  r = run("generate " + model_args(false) + " --prompt Once --prompt " +
          quote("Once upon a time there was") + " --max-tokens 508 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("in 1 of 2 prompts, capped to what each prompt leaves: prompt 1 at most "),
            std::string::npos)
      << r.err;
  // The default (256) is a cap, not a request: a prompt that leaves less room says nothing.
  std::string long_prompt;  // ~350 tokens of the 512-token context
  for (int i = 0; i < 35; ++i) long_prompt += "Once upon a time there was a dog. ";
  r = run("generate " + model_args(false) + " --prompt " + quote(long_prompt) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("exceeds"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvsplit::testing
