// `kvsplit generate` with a device pool smaller than the batch needs: the temporal cut's flags
// (--kv-blocks, --swap, --temporal-step-size) and the --json fields cached_tokens,
// swapped_out_pages and recomputed_tokens.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_run.h"

namespace kvsplit::testing {
namespace {

const std::string kBatch =
    " --prompt 'Once upon a time' --prompt 'The dog' --prompt 'Lily went' --prompt 'A bird'"
    " --max-tokens 120 --temperature 0.8 --seed 5 --ignore-eos --json";

std::vector<nlohmann::json> generate(const std::string& extra) {
  RunResult r = run("generate " + stories_model_flags() + kBatch + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json_lines(r.out);
}

TEST(CliSwap, SwappingAndRecomputingKeepTheTokensOfAnUnboundedPool) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<nlohmann::json> ref = generate("");
  ASSERT_EQ(ref.size(), 4u);
  for (const auto& l : ref) {
    EXPECT_EQ(l["swapped_out_pages"], 0);
    EXPECT_EQ(l["recomputed_tokens"], 0);
    EXPECT_EQ(l["cached_tokens"], 0);
    // Effective KV (docs/kvm.md): every sequence held pages and computed tokens for a while.
    EXPECT_GT(l["effective_kv_byte_seconds"].get<double>(), 0);
    EXPECT_GT(l["kv_token_seconds"].get<double>(), 0);
  }
  // One step (the prompt and its only token): the pages it reserved count for that step (they
  // used to be accounted only after it, so a one-step request reported 0 bytes).
  RunResult one = run("generate " + stories_model_flags() +
                      " --prompt 'Once upon a time there was a little girl' --max-tokens 1 --json");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::vector<nlohmann::json> lines = json_lines(one.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_GT(lines[0]["effective_kv_byte_seconds"].get<double>(), 0);
  // 20 pages of 16 tokens for four sequences of up to 124 positions (32 pages): preemptions.
  int swapped = 0, recomputed = 0;
  for (const char* mode : {"always", "never"}) {
    for (int step_size : {1, 4}) {
      const std::vector<nlohmann::json> got =
          generate(std::string(" --kv-blocks 20 --swap ") + mode + " --temporal-step-size " +
                   std::to_string(step_size));
      ASSERT_EQ(got.size(), ref.size());
      int pages = 0, tokens = 0, preemptions = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(got[i]["output_token_ids"], ref[i]["output_token_ids"]) << mode << " " << i;
        pages += got[i]["swapped_out_pages"].get<int>();
        tokens += got[i]["recomputed_tokens"].get<int>();
        preemptions += got[i]["preemptions"].get<int>();
      }
      EXPECT_GT(preemptions, 0) << mode;
      if (std::string(mode) == "always") {
        EXPECT_GT(pages, 0);
        EXPECT_EQ(tokens, 0);  // every preemption was a swap: nothing recomputed
        swapped += pages;
      } else {
        EXPECT_EQ(pages, 0);
        EXPECT_GT(tokens, 0);
        recomputed += tokens;
      }
    }
  }
  EXPECT_GT(swapped, 0);
  EXPECT_GT(recomputed, 0);
}

// Recompute preemptions with the prefix cache on: each preempted sequence's full pages, the
// generated ones too, stay cached, and its restart takes back those still there. The tokens are
// the unbounded pool's; fewer positions are computed again than with the cache off (measured 110
// against 176).
TEST(CliSwap, ARecomputedSequenceTakesBackItsCachedPages) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<nlohmann::json> ref = generate("");
  int recomputed[2] = {0, 0};
  for (int cache = 0; cache < 2; ++cache) {
    const std::vector<nlohmann::json> got = generate(
        std::string(" --kv-blocks 20 --swap never --prefix-cache ") + (cache ? "on" : "off"));
    ASSERT_EQ(got.size(), ref.size());
    int preemptions = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i]["output_token_ids"], ref[i]["output_token_ids"]) << cache << " " << i;
      EXPECT_EQ(got[i]["cached_tokens"], 0);  // distinct prompts: no hit at admission
      recomputed[cache] += got[i]["recomputed_tokens"].get<int>();
      preemptions += got[i]["preemptions"].get<int>();
    }
    EXPECT_GT(preemptions, 0) << cache;
  }
  EXPECT_GT(recomputed[0], 0);
  EXPECT_LT(recomputed[1], recomputed[0] * 3 / 4);
}

TEST(CliSwap, DiskTierBelowTheHostTierKeepsTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<nlohmann::json> ref = generate("");
  TempDir dir;
  // No host tier: every swap goes to the disk tier.
  const std::vector<nlohmann::json> got =
      generate(" --kv-blocks 20 --swap always --host-capacity-mb 0 --disk-path " +
               quote(dir.path().string()));
  ASSERT_EQ(got.size(), ref.size());
  int pages = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i]["output_token_ids"], ref[i]["output_token_ids"]) << i;
    EXPECT_EQ(got[i]["recomputed_tokens"], 0);
    pages += got[i]["swapped_out_pages"].get<int>();
  }
  EXPECT_GT(pages, 0);
  // The same through O_DIRECT (records bypass the page cache): the same tokens, no recompute.
  const std::vector<nlohmann::json> direct =
      generate(" --kv-blocks 20 --swap always --host-capacity-mb 0 --disk-direct-io --disk-path " +
               quote(dir.path().string()));
  ASSERT_EQ(direct.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(direct[i]["output_token_ids"], ref[i]["output_token_ids"]) << i;
    EXPECT_EQ(direct[i]["recomputed_tokens"], 0);
  }
  // Written before each swap-out returns (--disk-write-behind off): the same tokens.
  const std::vector<nlohmann::json> sync = generate(
      " --kv-blocks 20 --swap always --host-capacity-mb 0 --disk-write-behind off "
      "--disk-path " +
      quote(dir.path().string()));
  ASSERT_EQ(sync.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(sync[i]["output_token_ids"], ref[i]["output_token_ids"]) << i;
    EXPECT_EQ(sync[i]["recomputed_tokens"], 0);
  }
  RunResult bad =
      run("generate " + stories_model_flags() + " -p hi -n 4 --disk-write-behind maybe");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--disk-write-behind"), std::string::npos) << bad.err;
  RunResult r = run("generate " + stories_model_flags() + " -p hi -n 4 --disk-path /proc/nope");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--disk-path"), std::string::npos) << r.err;
}

TEST(CliSwap, PrefixCacheSharesPagesAndKeepsTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string p =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sunshine. One day, she saw";
  const std::string batch = " -p " + quote(p + " a big dog") + " -p " + quote(p + " a cat") +
                            " -p " + quote(p + " a red ball") +
                            " -n 30 --temperature 0 --ignore-eos --json";
  RunResult off = run("generate " + stories_model_flags() + batch + " --prefix-cache off");
  RunResult on = run("generate " + stories_model_flags() + batch + " --prefix-cache on");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  ASSERT_EQ(on.exit_code, 0) << on.err;
  const auto a = json_lines(off.out), b = json_lines(on.out);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  int cached = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["output_token_ids"], a[i]["output_token_ids"]) << i;
    EXPECT_EQ(a[i]["cached_tokens"], 0);
    cached += b[i]["cached_tokens"].get<int>();
  }
  EXPECT_EQ(b[0]["cached_tokens"], 0);  // the first computes the shared prefix
  EXPECT_GT(cached, 0);
  EXPECT_EQ(cached % 16, 0);  // whole pages
}

TEST(CliSwap, BadTemporalFlagsFailClearly) {
  KVSPLIT_REQUIRE_MODELS();
  RunResult r = run("generate " + stories_model_flags() + " -p hi -n 4 --swap sometimes");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--swap"), std::string::npos) << r.err;
  r = run("generate " + stories_model_flags() + " -p hi -n 4 --temporal-step-size 0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--temporal-step-size"), std::string::npos) << r.err;
  // A pool too small for even one sequence is an error, not a hang.
  r = run("generate " + stories_model_flags() +
          " -p 'Once upon a time' -n 200 --kv-blocks 2 --swap always");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("KV pool exhausted"), std::string::npos) << r.err;
  r = run("generate " + stories_model_flags() + " -p hi -n 4 --prefix-cache maybe");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--prefix-cache"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvsplit::testing
