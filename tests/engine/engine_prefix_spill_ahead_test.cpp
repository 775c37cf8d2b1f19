// kv.prefix_spill_ahead_blocks in the engine (EngineConfig::prefix_spill_ahead_blocks,
// docs/kv-tiers.md "Spill-ahead"): with it set, the prefix cache's pages go to the host tier at the
// end of the steps, with no allocation asking for the room (the pool is far from full), and the
// next request of the same prompt hits them there with the same tokens; with 0 the pages stay on
// the device and nothing is spilled.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

// 72 prompt tokens: 4 full pages of 16 that the cache keeps.
Request prefix_req() {
  Request r;
  r.tenant = "t";
  for (int k = 0; k < 72; ++k) r.prompt_token_ids.push_back(10 + (k * 7) % 400);
  r.sampling.max_tokens = 8;
  r.sampling.temperature = 0.f;
  return r;
}

struct Counters {
  int64_t spills_host = 0, spills_disk = 0, pages_host = 0, hits = 0, hits_host = 0, faults = 0;
};

Counters counters(const EngineStats& s) {
  Counters c;
  for (const PoolStats& p : s.pools) {
    c.spills_host += p.kv_prefix_spills_host;
    c.spills_disk += p.kv_prefix_spills_disk;
    c.pages_host += p.kv_prefix_pages_host;
    c.hits += p.kv_prefix_hits;
    c.hits_host += p.kv_prefix_hits_host;
    c.faults += p.kv_prefix_spill_faults;
  }
  return c;
}

class EnginePrefixSpillAhead
    : public ::testing::TestWithParam<std::tuple<ServingMode, int32_t /*spill-ahead blocks*/>> {};

TEST_P(EnginePrefixSpillAhead, PagesGoToTheHostTierBetweenStepsOnlyWhenSet) {
  KVSPLIT_REQUIRE_MODELS();
  const auto [mode, ahead] = GetParam();
  EngineConfig cfg = testing::stories_config(mode);
  cfg.prefix_cache = true;
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 32;  // one request holds at most 6 of them: never short of blocks
  cfg.temporal.host_capacity_mb = 1;
  cfg.prefix_spill_ahead_blocks = ahead;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);

  const Collected first = collect(*(*engine)->submit(prefix_req()));
  ASSERT_FALSE(first.timed_out);
  ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
  if (ahead > 0) {
    // The step that ended the request released its pages to the cache and then copied them to
    // the host tier (synchronous copies on the CPU backend): the counters show it once published.
    // Disaggregated, the prefill worker takes its pages back from the handoff in a step that
    // plans nothing, and spills them in that idle step; its pool is the one the next request's
    // prompt meets.
    const std::string pool = mode == ServingMode::kColocated ? "colocated-0" : "prefill-0";
    EXPECT_TRUE(testing::wait_for_stats(**engine,
                                        [&](const EngineStats& s) {
                                          for (const PoolStats& p : s.pools)
                                            if (p.name == pool) return p.kv_prefix_pages_host >= 4;
                                          return false;
                                        }))
        << pool << " pages on the host tier: " << counters((*engine)->stats()).pages_host;
  } else {
    ASSERT_TRUE(testing::pools_back_to(**engine, initial));
  }
  const Collected again = collect(*(*engine)->submit(prefix_req()));
  ASSERT_FALSE(again.timed_out);
  ASSERT_TRUE(again.final_event.status.ok()) << again.final_event.status.to_string();
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.final_event.usage.cached_tokens, 64);
  ASSERT_TRUE(testing::pools_back_to(**engine, initial));
  // The hit's counters are published after its step, maybe after its final event.
  ASSERT_TRUE(testing::wait_for_stats(**engine,
                                      [](const EngineStats& s) { return counters(s).hits >= 64; }));
  const Counters c = counters((*engine)->stats());
  EXPECT_EQ(c.faults, 0);
  EXPECT_EQ(c.spills_disk, 0);
  if (ahead > 0) {
    EXPECT_GE(c.spills_host, 4);
    // The whole prefix came back from the host tier (the prefill or colocated worker's; a
    // disaggregated decode worker's cache shares the handoff's pages on its device).
    EXPECT_GE(c.hits_host, 64);
  } else {
    EXPECT_EQ(c.spills_host, 0);  // no allocation ever needed the cache's blocks
    EXPECT_EQ(c.pages_host, 0);
    EXPECT_EQ(c.hits_host, 0);  // every hit on the device
  }
}

INSTANTIATE_TEST_SUITE_P(ModesAndTargets, EnginePrefixSpillAhead,
                         ::testing::Combine(::testing::Values(ServingMode::kColocated,
                                                              ServingMode::kDisaggregated),
                                            ::testing::Values(0, 32)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == ServingMode::kColocated
                                                  ? "Colocated"
                                                  : "Disaggregated") +
                                  "Ahead" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace kvsplit
