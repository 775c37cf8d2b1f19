// The spatial cut in the engine: each worker's KV pool is a shard group; a sequence spread over it
// produces exactly the tokens of the unsharded engine (the stories260K goldens, both modes),
// including when one shard could not hold it; a prompt longer than one shard's pool is refused
// without shards and served with them; every shard's blocks come back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

struct SpatialCase {
  ServingMode mode;
  int shards;
  int chunk;
};

class EngineSpatial : public ::testing::TestWithParam<SpatialCase> {};

// Two blocks (32 tokens) per shard: a 64-position golden needs at least two shards, so every
// golden below runs spread over the group.
TEST_P(EngineSpatial, GoldensTokenExactWithSmallShards) {
  KVSPLIT_REQUIRE_MODELS();
  const SpatialCase& p = GetParam();
  EngineConfig cfg = testing::stories_config(p.mode);
  cfg.kv_blocks_per_worker = 2;
  cfg.block_size = 16;
  cfg.spatial.shards = p.shards;
  cfg.spatial.spatial_chunk_size = p.chunk;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  for (int free : initial) EXPECT_EQ(free, 2 * p.shards);
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

INSTANTIATE_TEST_SUITE_P(
    ShardsAndChunks, EngineSpatial,
    ::testing::Values(SpatialCase{ServingMode::kColocated, 2, 16},
                      SpatialCase{ServingMode::kColocated, 3, 32},
                      SpatialCase{ServingMode::kColocated, 4, 48},
                      SpatialCase{ServingMode::kDisaggregated, 2, 32},
                      SpatialCase{ServingMode::kDisaggregated, 3, 16},
                      SpatialCase{ServingMode::kDisaggregated, 4, 48}),
    [](const ::testing::TestParamInfo<SpatialCase>& info) {
      return std::string(info.param.mode == ServingMode::kColocated ? "colocated" : "disagg") +
             "_" + std::to_string(info.param.shards) + "shards_chunk" +
             std::to_string(info.param.chunk);
    });

Request long_request() {
  Request r;
  r.request_id = "long";
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int32_t>(i * 7 % 500);
  r.prompt_token_ids = prompt;
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 42;
  r.sampling.max_tokens = 30;
  r.sampling.ignore_eos = true;
  return r;
}

// 8 blocks (128 tokens) per worker: a 200-token prompt does not fit one; with three such shards
// it is served, with the tokens of an engine whose single pool holds it (seeded sampling).
TEST(EngineSpatialCapacity, LongPromptNeedsShards) {
  KVSPLIT_REQUIRE_MODELS();
  for (ServingMode mode : {ServingMode::kColocated, ServingMode::kDisaggregated}) {
    SCOPED_TRACE(mode == ServingMode::kColocated ? "colocated" : "disaggregated");
    EngineConfig cfg = testing::stories_config(mode);
    cfg.kv_blocks_per_worker = 8;
    {
      auto engine = Engine::create(cfg);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      auto h = (*engine)->submit(long_request());
      if (h.ok()) {  // refused at admission or finished with the same code
        Collected c = collect(*h);
        EXPECT_EQ(c.final_event.status.code(), StatusCode::kResourceExhausted)
            << c.final_event.status.to_string();
      } else {
        EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted) << h.status().to_string();
      }
    }
    std::vector<int32_t> want;
    {
      EngineConfig big = cfg;
      big.kv_blocks_per_worker = 64;
      auto engine = Engine::create(big);
      ASSERT_TRUE(engine.ok());
      auto h = (*engine)->submit(long_request());
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      Collected c = collect(*h);
      ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      want = c.tokens;
      ASSERT_EQ(want.size(), 30u);
    }
    cfg.spatial.shards = 3;
    cfg.spatial.spatial_chunk_size = 64;
    auto engine = Engine::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    auto h = (*engine)->submit(long_request());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    Collected c = collect(*h);
    ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens, want);
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  }
}

// min_context: short sequences stay on the home shard, long ones are spread; both exact.
TEST(EngineSpatialCapacity, MinContextSpreadsOnlyLongSequences) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 8;
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.spatial.min_context = 100;  // the 64-position goldens stay home; the long request spreads
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  auto h = (*engine)->submit(long_request());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Collected c = collect(*h);
  EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
  EXPECT_EQ(c.tokens.size(), 30u);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

TEST(EngineSpatialConfig, BadValuesNameTheField) {
  EngineConfig cfg;
  cfg.model = "synthetic:stories260k";
  cfg.spatial.shards = 17;
  auto e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("spatial.shards"), std::string::npos)
      << e.status().to_string();
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 24;  // not a multiple of 16
  e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("spatial.spatial_chunk_size"), std::string::npos)
      << e.status().to_string();
  cfg.spatial.spatial_chunk_size = 32;
  cfg.kv_policy = KvPolicy::kSemantic;
  e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("spatial.shards"), std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace kvsplit
