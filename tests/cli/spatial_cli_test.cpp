// `kvsplit generate` with the spatial cut: --spatial-shards, --spatial-chunk-size,
// --spatial-min-context and --spatial-communicator, and the --json fields "shards" (the shards a
// sequence's KV used) and "communicator" (the shard group's).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_run.h"

namespace kvsplit::testing {
namespace {

const std::string kBatch =
    " --prompt 'Once upon a time' --prompt 'The dog' --prompt 'Lily went'"
    " --max-tokens 100 --temperature 0.8 --seed 9 --ignore-eos --json";

std::vector<nlohmann::json> generate(const std::string& extra) {
  RunResult r = run("generate " + stories_model_flags() + kBatch + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json_lines(r.out);
}

TEST(CliSpatial, ShardedKeepsTheTokensAndReportsShards) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<nlohmann::json> ref = generate("");
  ASSERT_EQ(ref.size(), 3u);
  for (const auto& l : ref) EXPECT_EQ(l["shards"], 1);
  for (int shards : {2, 3, 4}) {
    const std::vector<nlohmann::json> got =
        generate(" --spatial-shards " + std::to_string(shards) + " --spatial-chunk-size 32");
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i]["output_token_ids"], ref[i]["output_token_ids"]) << shards << " " << i;
      // ~104 positions in chunks of 32 tokens: four chunks, so every shard holds some.
      EXPECT_EQ(got[i]["shards"], shards) << i;
    }
  }
  // min_context above every sequence: nothing is spread.
  const std::vector<nlohmann::json> home =
      generate(" --spatial-shards 2 --spatial-chunk-size 32 --spatial-min-context 1000");
  ASSERT_EQ(home.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(home[i]["output_token_ids"], ref[i]["output_token_ids"]);
    EXPECT_EQ(home[i]["shards"], 1);
  }
}

// The semantic cut over shards: every shard's originals go to the home host tier, so it is sized
// for the whole group (sized for one shard, demotions were refused once it filled: 8 instead of
// the unsharded run's 18 here).
TEST(CliSpatial, SemanticCutDemotesAsMuchOverShards) {
  KVSPLIT_REQUIRE_MODELS();
  auto demotions = [](const std::string& extra) {
    RunResult r = run("generate " + stories_model_flags() +
                      " --prompt 'Once upon a time' --max-tokens 180 --temperature 0"
                      " --block-size 16 --swap never --kv-policy semantic --semantic-threshold 0.99"
                      " --recent-tokens 16 --score-interval 1 --demote-after-steps 1"
                      " --recall-threshold 1" +
                      extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.err.find("demotions ");
    EXPECT_NE(at, std::string::npos) << r.err;
    return at == std::string::npos ? -1 : std::atoi(r.err.c_str() + at + 10);
  };
  const int alone = demotions(" --kv-blocks 12");
  EXPECT_GT(alone, 0);
  EXPECT_EQ(demotions(" --spatial-shards 3 --spatial-chunk-size 16 --kv-blocks 4"
                      " --spatial-min-context 0"),
            alone);
}

TEST(CliSpatial, CommunicatorFlag) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<nlohmann::json> ref = generate("");
  ASSERT_EQ(ref.size(), 3u);
  EXPECT_FALSE(ref[0].contains("communicator"));  // no shard group
  // CPU shards: auto and in_process both exchange in-process, with the same tokens.
  for (const char* mode : {"auto", "in_process"}) {
    const std::vector<nlohmann::json> got = generate(
        " --spatial-shards 2 --spatial-chunk-size 32 --spatial-communicator " + std::string(mode));
    ASSERT_EQ(got.size(), ref.size()) << mode;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i]["output_token_ids"], ref[i]["output_token_ids"]) << mode << " " << i;
      EXPECT_EQ(got[i]["communicator"], "in-process") << mode;
    }
  }
  // nccl on CPU shards: an error naming the flag and why, never a fallback.
  RunResult r = run("generate " + stories_model_flags() + kBatch +
                    " --spatial-shards 2 --spatial-communicator nccl");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spatial-communicator"), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("not a CUDA backend") != std::string::npos ||
              r.err.find("built without NCCL") != std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = run("generate " + stories_model_flags() + kBatch + " --spatial-communicator mpi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spatial-communicator"), std::string::npos) << r.err;
}

// The prefix cache over shards: a shared prompt prefix spread over two shards in chunks of one
// page is reused whole, as many cached tokens as without shards (before every shard cached its
// own pages, only the first chunk's were), with the same tokens.
TEST(CliSpatial, PrefixCacheReusesThePagesOfEveryShard) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sunshine. One day, she saw a big dog in the park and";
  const std::string batch = " --prompt '" + shared + " run' --prompt '" + shared +
                            " sing' --prompt '" + shared +
                            " swim' --max-tokens 20 --temperature 0.8 --seed 3 --json"
                            " --block-size 16 --prefix-cache on";
  auto cached = [&](const std::string& extra, std::vector<nlohmann::json>* lines) {
    RunResult r = run("generate " + stories_model_flags() + batch + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    *lines = json_lines(r.out);
    std::vector<int> c;
    for (const auto& l : *lines) c.push_back(l["cached_tokens"].get<int>());
    return c;
  };
  std::vector<nlohmann::json> ref, got;
  const std::vector<int> alone = cached("", &ref);
  const std::vector<int> sharded =
      cached(" --spatial-shards 2 --spatial-chunk-size 16 --spatial-min-context 0", &got);
  ASSERT_EQ(ref.size(), 3u);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(alone[0], 0);
  EXPECT_GE(alone[1], 48);  // three pages or more: on both shards below
  EXPECT_EQ(sharded, alone);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i]["output_token_ids"], ref[i]["output_token_ids"]) << i;
    EXPECT_EQ(got[i]["shards"], 2) << i;
  }
}

TEST(CliSpatial, BadFlagsAreClearErrors) {
  KVSPLIT_REQUIRE_MODELS();
  RunResult r = run("generate " + stories_model_flags() + kBatch +
                    " --spatial-shards 2 --spatial-chunk-size 24");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("multiple of the block size"), std::string::npos) << r.err;
  r = run("generate " + stories_model_flags() + kBatch + " --spatial-shards 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spatial-shards"), std::string::npos) << r.err;
  // A prompt longer than one pool: refused alone, served over shards.
  const std::string longp = " --prompt '" + std::string(300, 'a') + "' --max-tokens 10 --json";
  r = run("generate " + stories_model_flags() + longp + " --kv-blocks 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("KV pool exhausted"), std::string::npos) << r.err;
  r = run("generate " + stories_model_flags() + longp +
          " --kv-blocks 8 --spatial-shards 4 --spatial-chunk-size 64");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace kvsplit::testing
