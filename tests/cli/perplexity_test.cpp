// `kvsplit perplexity` and the KV-cut flags of `kvsplit generate`: the full-KV figure of
// recall-llama's README, prefill/decode agreement, a cut that never acts changing nothing, the
// baselines' accounting, and errors that name the flag or the line.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_run.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

std::string recall_args() {
  return "perplexity --model " + quote(model_path("recall-llama")) + " --jsonl " +
         quote(data_path("recall_eval_docs.jsonl")) + " --json --threads 1";
}

nlohmann::json ppl(const std::string& extra) {
  RunResult r = run(recall_args() + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  EXPECT_EQ(lines.size(), 1u) << r.out;
  return lines.empty() ? nlohmann::json::object() : lines[0];
}

// The aggressive ladder of docs/kv-cuts.md "Recall at a quantized rung" (block 8, recent 8, T
// 0.99, recall threshold 1) evicting below `evict`.
std::string evicting_ladder(const std::string& evict) {
  return "--prefill 16 --block-size 8 --kv-policy semantic --recent-tokens 8 --semantic-threshold "
         "0.99 --recall-threshold 1 --score-interval 1 --demote-after-steps 1 --evict-threshold " +
         evict;
}

TEST(PerplexityCli, FullKvMatchesTheReferenceAndDecodeMatchesPrefill) {
  KVSPLIT_REQUIRE_MODELS();
  const nlohmann::json whole = ppl("");
  for (const char* key : {"tokens", "nll", "ppl", "avg_resident_kv_fraction",
                          "peak_resident_kv_fraction", "demotions", "evictions", "recalls"}) {
    EXPECT_TRUE(whole.contains(key)) << key;
  }
  // recall-llama's README: mean NLL 0.2646 with full KV (HF transformers), every token but each
  // document's first scored.
  EXPECT_NEAR(whole["nll"].get<double>(), 0.2646, 5e-4);
  EXPECT_NEAR(whole["ppl"].get<double>(), std::exp(whole["nll"].get<double>()), 1e-9);
  // Fed one token per decode step after a 16-token prefill: the same numbers (batch-invariant
  // kernels), and nothing resident but full pages.
  const nlohmann::json stepped = ppl("--prefill 16");
  EXPECT_EQ(stepped["tokens"], whole["tokens"]);
  EXPECT_NEAR(stepped["nll"].get<double>(), whole["nll"].get<double>(), 1e-6);
  EXPECT_EQ(stepped["avg_resident_kv_fraction"].get<double>(), 1.0);
  EXPECT_GT(stepped["decode_steps"].get<int>(), 5000);
}

TEST(PerplexityCli, SemanticCutWithZeroThresholdsChangesNothing) {
  KVSPLIT_REQUIRE_MODELS();
  const nlohmann::json full = ppl("--prefill 16");
  const nlohmann::json cut = ppl(
      "--prefill 16 --kv-cache-compression semantic_v2 --semantic-threshold 0 --evict-threshold 0 "
      "--recall-threshold 1 --score-interval 1");
  EXPECT_EQ(cut["policy"], "semantic");
  EXPECT_GT(cut["scored_steps"].get<int>(), 5000);
  EXPECT_EQ(cut["demotions"].get<int>(), 0);
  EXPECT_EQ(cut["evictions"].get<int>(), 0);
  EXPECT_EQ(cut["nll"].get<double>(), full["nll"].get<double>());
}

TEST(PerplexityCli, PoliciesFreeKvAndCountWhatTheyDid) {
  KVSPLIT_REQUIRE_MODELS();
  const double full = ppl("--prefill 16")["nll"].get<double>();
  const nlohmann::json streaming =
      ppl("--prefill 16 --kv-policy streaming --sink-tokens 4 --recent-tokens 32");
  EXPECT_GT(streaming["evictions"].get<int>(), 0);
  EXPECT_EQ(streaming["demotions"].get<int>(), 0);
  EXPECT_EQ(streaming["recalls"].get<int>(), 0);
  EXPECT_LT(streaming["avg_resident_kv_fraction"].get<double>(), 0.6);
  EXPECT_GT(streaming["nll"].get<double>(), full);  // the pairs are gone when the keys repeat
  const nlohmann::json semantic = ppl("--prefill 16 --kv-policy semantic --recent-tokens 32");
  EXPECT_GT(semantic["demotions"].get<int>(), 0);
  // Pages per rung (averages over the decode steps): some below full; streaming's dropped pages
  // count as evicted; full KV holds full pages only.
  const nlohmann::json& rungs = semantic["avg_pages"];
  EXPECT_GT(rungs["full"].get<double>(), 0.0);
  EXPECT_GT(rungs["int8"].get<double>() + rungs["int4"].get<double>(), 0.0);
  EXPECT_GT(streaming["avg_pages"]["evicted"].get<double>(), 0.0);
  EXPECT_EQ(ppl("--prefill 16")["avg_pages"]["int8"].get<double>(), 0.0);
  EXPECT_LT(semantic["avg_resident_kv_fraction"].get<double>(), 1.0);
  EXPECT_LE(semantic["peak_resident_kv_fraction"].get<double>(), 1.0);
  const nlohmann::json h2o =
      ppl("--prefill 16 --kv-policy h2o --recent-tokens 32 --heavy-tokens 32");
  EXPECT_GT(h2o["evictions"].get<int>(), 0);
  EXPECT_EQ(h2o["demotions"].get<int>(), 0);
  // Without --prefill a cut still acts: every token of a window is fed as generation.
  const nlohmann::json plain = ppl("--kv-policy streaming --sink-tokens 4 --recent-tokens 32");
  const nlohmann::json one =
      ppl("--prefill 1 --kv-policy streaming --sink-tokens 4 --recent-tokens 32");
  EXPECT_GT(plain["evictions"].get<int>(), 0);
  EXPECT_EQ(plain["decode_steps"], one["decode_steps"]);
  EXPECT_EQ(plain["nll"].get<double>(), one["nll"].get<double>());
}

// Evictions that the loose bound keeps calling back (evict threshold 0.8 on recall-llama): recalled
// at int4, and at most one per step by the highest bound, they hold less KV than recalled at
// full precision without a limit.
TEST(PerplexityCli, QuantizedAndTopKRecallsHoldLessKv) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string ladder = evicting_ladder("0.8");
  const nlohmann::json full = ppl(ladder);
  const nlohmann::json int4 = ppl(ladder + " --recall-precision int4");
  const nlohmann::json top1 = ppl(ladder + " --recall-precision int4 --max-recalls-per-step 1");
  EXPECT_GT(full["recalls"].get<int>(), 0);
  EXPECT_EQ(full["recalls_quantized"].get<int>(), 0);
  EXPECT_GT(int4["recalls_quantized"].get<int>(), 0);
  EXPECT_LE(int4["recalls_quantized"].get<int>(), int4["recalls"].get<int>());
  // Each quantized recall is judged at most once: on to full (confirmed) or evicted again (cold).
  EXPECT_GT(int4["recalls_cold"].get<int>(), 0);
  EXPECT_LE(int4["recalls_confirmed"].get<int>() + int4["recalls_cold"].get<int>(),
            int4["recalls_quantized"].get<int>());
  // A recalled page's next score replaces its relevance (PageEntry::rescore): 618 of 10,437 were
  // confirmed on 2026-12-06; averaged with the value it had when evicted, 23 of 11,031 were.
  EXPECT_GT(int4["recalls_confirmed"].get<int>() * 30, int4["recalls_quantized"].get<int>());
  EXPECT_LT(top1["recalls"].get<int>(), int4["recalls"].get<int>());
  EXPECT_LT(int4["avg_resident_kv_fraction"].get<double>(),
            full["avg_resident_kv_fraction"].get<double>());
  EXPECT_LT(top1["avg_resident_kv_fraction"].get<double>(),
            int4["avg_resident_kv_fraction"].get<double>());
  EXPECT_GT(top1["avg_pages"]["evicted"].get<double>(), full["avg_pages"]["evicted"].get<double>());
}

// --score-interval N: the first decode step of each sequence is scored, then every N-th, and the
// ladder acts on those steps only.
TEST(PerplexityCli, ScoreIntervalScoresEveryNthDecodeStep) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string base =
      "--prefill 16 --block-size 8 --kv-policy semantic --recent-tokens 8 --semantic-threshold "
      "0.99 --recall-threshold 1 --demote-after-steps 1 --evict-threshold 0 ";
  const nlohmann::json every = ppl(base + "--score-interval 1");
  const nlohmann::json fourth = ppl(base + "--score-interval 4");
  const int steps = fourth["decode_steps"].get<int>(), windows = fourth["windows"].get<int>();
  EXPECT_EQ(every["scored_steps"].get<int>(), every["decode_steps"].get<int>());
  ASSERT_GT(windows, 0);
  // Per sequence ceil(n / 4) of its n steps: between steps / 4 and steps / 4 + one per sequence.
  EXPECT_GE(fourth["scored_steps"].get<int>() * 4, steps);
  EXPECT_LE(fourth["scored_steps"].get<int>() * 4, steps + 3 * windows);
  EXPECT_GT(fourth["demotions"].get<int>(), 0);
}

// Key summaries in parts (--summary-parts): each part's bound is at most the whole page's, so
// fewer evicted pages clear the recall threshold and are called back for nothing, at the same NLL.
TEST(PerplexityCli, SummariesInPartsRecallLess) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string ladder = evicting_ladder("0.5");
  const nlohmann::json one = ppl(ladder);
  const nlohmann::json two = ppl(ladder + " --summary-parts 2");
  const nlohmann::json four = ppl(ladder + " --summary-parts 4");
  ASSERT_GT(one["recalls"].get<int>(), 100);
  EXPECT_LT(two["recalls"].get<int>(), one["recalls"].get<int>() * 3 / 4);
  EXPECT_LT(four["recalls"].get<int>(), two["recalls"].get<int>());
  EXPECT_GT(four["avg_pages"]["evicted"].get<double>(), one["avg_pages"]["evicted"].get<double>());
  for (const nlohmann::json* j : {&two, &four}) {
    EXPECT_NEAR((*j)["nll"].get<double>(), one["nll"].get<double>(), 0.005);
  }
}

TEST(PerplexityCli, GenerateWithTheCutAtZeroThresholdsMatchesTheGolden) {
  KVSPLIT_REQUIRE_MODELS();
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  const auto& c = cases[0];
  const int n = c["steps"].get<int>() - static_cast<int>(c["prompt_token_ids"].size()) + 1;
  for (const std::string cut :
       {"--kv-policy semantic --semantic-threshold 0 --evict-threshold 0 --score-interval 1",
        "--kv-cache-compression semantic_v2 --semantic-threshold 0 --evict-threshold 0 "
        "--prefill 2"}) {
    RunResult r = run("generate --model " + quote(model_path("stories260K.bin")) + " --tokenizer " +
                      quote(model_path("tok512.bin")) + " --prompt " + quote(c["prompt"]) +
                      " --max-tokens " + std::to_string(n) + " --temperature 0 --json " + cut);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["output_token_ids"], c["output_token_ids"]) << cut;
  }
}

// A --ctx above the model's context (recall-llama: 512) runs windows of the context, and stderr
// says so (it was capped silently); a --ctx within it says nothing.
TEST(PerplexityCli, CtxBeyondTheContextIsCappedAndSaysSo) {
  KVSPLIT_REQUIRE_MODELS();
  const nlohmann::json at = ppl("--ctx 512");
  RunResult r = run(recall_args() + " --ctx 100000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--ctx 100000 exceeds the model's context of 512: windows of 512 tokens"),
            std::string::npos)
      << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_EQ(lines[0]["tokens"], at["tokens"]);
  EXPECT_EQ(lines[0]["nll"], at["nll"]);
  r = run(recall_args() + " --ctx 512");
  EXPECT_EQ(r.err.find("exceeds"), std::string::npos) << r.err;
}

TEST(PerplexityCli, BadInputIsAnErrorNamingIt) {
  KVSPLIT_REQUIRE_MODELS();
  auto expect_error = [](const std::string& args, const std::string& needle) {
    RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  };
  expect_error(recall_args() + " --semantic-threshold 1.5", "--semantic-threshold");
  expect_error(recall_args() + " --evict-threshold 0.3", "--evict-threshold");
  expect_error(recall_args() + " --recent-tokens -4", "--recent-tokens");
  expect_error(recall_args() + " --recall-precision int2", "--recall-precision");
  expect_error(recall_args() + " --kv-policy semantic --max-recalls-per-step -1",
               "--max-recalls-per-step");
  expect_error(recall_args() + " --kv-cache-compression semantic_v2 --kv-policy h2o", "conflicts");
  expect_error(recall_args() + " --kv-cache-compression none --kv-policy semantic",
               "--kv-cache-compression none conflicts with --kv-policy semantic");
  expect_error(recall_args() + " --kv-policy lru", "--kv-policy");
  expect_error(recall_args() + " --kv-policy semantic --block-size 8 --summary-parts 3",
               "--summary-parts 3 must divide --block-size 8");
  expect_error(recall_args() + " --kv-policy semantic --summary-parts 0", "--summary-parts");
  expect_error("perplexity --model " + quote(model_path("recall-llama")),
               "exactly one of --text FILE and --jsonl FILE");
  TempDir tmp;
  const std::string bad = tmp.file("bad.jsonl");
  { std::ofstream(bad) << "{\"text\": \"one two\"}\n{\"txt\": 3}\n"; }
  expect_error("perplexity --model " + quote(model_path("recall-llama")) + " --jsonl " + quote(bad),
               "bad.jsonl:2:");
  // A key given twice is refused (the last "text" was scored, silently).
  { std::ofstream(bad) << "{\"text\": \"one two\", \"text\": \"three\"}\n"; }
  expect_error("perplexity --model " + quote(model_path("recall-llama")) + " --jsonl " + quote(bad),
               "bad.jsonl:1: duplicate key 'text'");
  expect_error("perplexity --model " + quote(model_path("recall-llama")) + " --text /nonexistent",
               "/nonexistent");
  // llama2.c's tokenizer ends text at a NUL (run.c): the rest would go unscored, so it is refused.
  const std::string nul = tmp.file("nul.txt");
  { std::ofstream(nul) << std::string("Once upon a time\0 there was", 28); }
  expect_error("perplexity " + stories_model_flags() + " --text " + quote(nul),
               "a NUL byte at offset 16");
  { std::ofstream(bad) << "{\"text\": \"one\\u0000two\"}\n"; }
  expect_error("perplexity " + stories_model_flags() + " --jsonl " + quote(bad),
               "bad.jsonl:1: text: a NUL byte at offset 3");
}

}  // namespace
}  // namespace kvsplit::testing
