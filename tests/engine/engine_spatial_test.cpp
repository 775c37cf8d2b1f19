// The spatial cut in the engine: each worker's KV pool is a shard group; a sequence spread over it
// produces exactly the tokens of the unsharded engine (the stories260K goldens, both modes),
// including when one shard could not hold it; a prompt longer than one shard's pool is refused
// without shards and served with them; every shard's blocks come back.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
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
  int64_t exchanged = 0;
  for (const PoolStats& ps : (*engine)->stats().pools) {
    EXPECT_EQ(ps.kv_shards, p.shards) << ps.name;
    EXPECT_EQ(ps.kv_pages_remote, 0) << ps.name;  // all released
    exchanged += ps.kv_shard_exchange_bytes;
  }
  EXPECT_GT(exchanged, 0);
}

INSTANTIATE_TEST_SUITE_P(ShardsAndChunks, EngineSpatial,
                         ::testing::Values(SpatialCase{ServingMode::kColocated, 2, 16},
                                           SpatialCase{ServingMode::kColocated, 3, 32},
                                           SpatialCase{ServingMode::kColocated, 4, 48},
                                           SpatialCase{ServingMode::kDisaggregated, 2, 32},
                                           SpatialCase{ServingMode::kDisaggregated, 3, 16},
                                           SpatialCase{ServingMode::kDisaggregated, 4, 48}),
                         [](const ::testing::TestParamInfo<SpatialCase>& info) {
                           return std::string(info.param.mode == ServingMode::kColocated
                                                  ? "colocated"
                                                  : "disagg") +
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

// The migration hook through the worker inbox: a held sequence's pages move to one shard, and
// it continues with exactly the tokens it produces without the move.
TEST(EngineSpatialMigrate, MigrateKvMovesPagesAndKeepsTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  // 16 blocks per shard; the request holds 19 to 32 pages, one page per chunk round robin, when
  // it is held: about a third per shard, so shard 2 cannot take them all but takes a few.
  cfg.kv_blocks_per_worker = 16;
  cfg.spatial.shards = 3;
  cfg.spatial.spatial_chunk_size = 16;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  Request r = long_request();
  r.tenant = "t";
  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int32_t>(i * 11 % 500);
  r.prompt_token_ids = prompt;
  r.sampling.max_tokens = 200;  // long enough that the hold lands while it decodes
  Collected alone = collect(*(*engine)->submit(r));
  ASSERT_TRUE(alone.final_event.status.ok()) << alone.final_event.status.to_string();
  auto send = [&](sched::WorkerCommand c) {
    auto f = (*engine)->send_command(0, std::move(c));
    EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    return f.get();
  };
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok());
  std::vector<int32_t> tokens;
  TokenEvent ev;
  while (tokens.size() < 5 && h->next(&ev, std::chrono::seconds(30)))
    tokens.insert(tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  sched::CommandReply rep = send(sched::SnapshotState{});
  ASSERT_EQ(rep.state.sequences.size(), 1u);
  EXPECT_EQ(rep.state.num_shards, 3);
  const std::vector<int> spread = rep.state.sequences[0].pages_per_shard;
  ASSERT_EQ(spread.size(), 3u);
  EXPECT_GT(spread[1], 0);  // one page per chunk: every shard holds some
  EXPECT_GT(spread[2], 0);
  rep = send(sched::MigrateKv{{"other", "long"}, 0, -1, 0});
  EXPECT_EQ(rep.status.code(), StatusCode::kNotFound);  // another tenant's request
  rep = send(sched::MigrateKv{{"t", "long"}, 0, -1, 7});
  EXPECT_EQ(rep.status.code(), StatusCode::kInvalidArgument) << rep.status.to_string();
  rep = send(sched::MigrateKv{{"t", "long"}, 0, -1, 2});
  EXPECT_EQ(rep.status.code(), StatusCode::kResourceExhausted) << rep.status.to_string();
  rep = send(sched::MigrateKv{{"t", "long"}, 0, 4, 2});  // the first four pages
  ASSERT_TRUE(rep.status.ok()) << rep.status.to_string();
  const std::vector<int> moved = rep.state.sequences[0].pages_per_shard;
  EXPECT_EQ(moved[0] + moved[1] + moved[2], spread[0] + spread[1] + spread[2]);
  EXPECT_GT(moved[2], spread[2]);
  EXPECT_GT(rep.state.migrated_pages, 0);
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected rest = collect(*h);
  ASSERT_TRUE(rest.final_event.status.ok()) << rest.final_event.status.to_string();
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, alone.tokens);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// SlaClass::spread overrides min_context: the same short request is spread for one class and
// stays home for the other (pages on shards other than home, seen while it is held).
TEST(EngineSpatialCapacity, ClassSpreadOverridesMinContext) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 32;
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.spatial.min_context = 1000;  // nothing is long enough by itself
  SlaClass wide;
  wide.name = "wide";
  wide.spread = true;
  cfg.sla_classes.push_back(wide);
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (const char* cls : {"default", "wide"}) {
    Request r;
    r.prompt = "Once upon a time";
    r.sla_class = cls;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 400;  // long enough that the hold lands while it decodes
    r.sampling.ignore_eos = true;
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok());
    std::vector<int32_t> tokens;
    TokenEvent ev;
    while (tokens.size() < 20 && h->next(&ev, std::chrono::seconds(30)))
      tokens.insert(tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
    auto f = (*engine)->send_command(0, sched::SnapshotState{});
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const sched::CommandReply rep = f.get();
    ASSERT_EQ(rep.state.sequences.size(), 1u);
    const std::vector<int>& pages = rep.state.sequences[0].pages_per_shard;
    ASSERT_EQ(pages.size(), 2u);
    if (std::string(cls) == "wide")
      EXPECT_GT(pages[1], 0) << cls;
    else
      EXPECT_EQ(pages[1], 0) << cls;
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    Collected rest = collect(*h);
    EXPECT_TRUE(rest.final_event.status.ok());
  }
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
