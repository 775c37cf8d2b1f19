// The prefix cache over a shard group in the engine: a prompt spread over three shards is cached
// on every shard that holds its pages, so the same tenant's next request reuses the whole prompt,
// not only its first chunk, with the tokens of an engine without shards or cache. With a host or
// disk tier, the pages two other tenants' prompts push off the shards spill to the home tier and
// come back from it onto the shards. Every block is available afterwards.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

enum class Tier { kNone, kHost, kDisk };

// 200 tokens: 13 pages of 16, more than the 8 of one shard's pool.
Request long_prompt(const std::string& tenant, uint32_t salt, int max_tokens) {
  Request r;
  r.tenant = tenant;
  for (int k = 0; k < 200; ++k)
    r.prompt_token_ids.push_back(3 + static_cast<int32_t>((k * 7 + salt * 131) % 480));
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 42;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

int64_t pools_sum(const Engine& engine, int64_t PoolStats::*field) {
  int64_t n = 0;
  for (const PoolStats& p : engine.stats().pools) n += p.*field;
  return n;
}

class EnginePrefixShard : public ::testing::TestWithParam<std::tuple<ServingMode, Tier>> {};

TEST_P(EnginePrefixShard, ASpreadPromptIsReusedWholeFromEveryShard) {
  KVSPLIT_REQUIRE_MODELS();
  const auto [mode, tier] = GetParam();
  kvsplit::testing::TempDir dir;
  EngineConfig cfg = testing::stories_config(mode);
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 8;
  cfg.spatial.shards = 3;
  cfg.spatial.spatial_chunk_size = 32;
  EngineConfig ref_cfg = cfg;  // one pool that holds the whole request, no cache
  ref_cfg.kv_blocks_per_worker = 64;
  ref_cfg.spatial.shards = 1;
  cfg.prefix_cache = true;
  if (tier == Tier::kHost) cfg.temporal.host_capacity_mb = 1;  // ~50 pages of stories260K
  if (tier == Tier::kDisk) {
    cfg.temporal.disk_path = dir.path().string();
    cfg.temporal.disk_capacity_mb = 16;
  }
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  auto ref_engine = Engine::create(ref_cfg);
  ASSERT_TRUE(ref_engine.ok()) << ref_engine.status().to_string();
  const Collected want = collect(*(*ref_engine)->submit(long_prompt("t", 0, 30)));
  ASSERT_TRUE(want.final_event.status.ok()) << want.final_event.status.to_string();

  const Collected first = collect(*(*engine)->submit(long_prompt("t", 0, 30)));
  ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
  EXPECT_EQ(first.tokens, want.tokens);
  EXPECT_EQ(first.final_event.usage.cached_tokens, 0);
  if (tier != Tier::kNone) {
    // Two other tenants' prompts: the second needs blocks the first one's and t's cached pages
    // hold, and t's are the least recently used.
    for (uint32_t f = 1; f <= 2; ++f) {
      const Collected c = collect(*(*engine)->submit(long_prompt("f" + std::to_string(f), f, 2)));
      ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      EXPECT_EQ(c.final_event.usage.cached_tokens, 0);
    }
  }
  const Collected again = collect(*(*engine)->submit(long_prompt("t", 0, 30)));
  ASSERT_TRUE(again.final_event.status.ok()) << again.final_event.status.to_string();
  EXPECT_EQ(again.tokens, want.tokens);
  // Every whole page of the prompt but the one holding its last token: 12 pages, on all three
  // shards (one chunk is two pages).
  EXPECT_EQ(again.final_event.usage.cached_tokens, 192);
  // The workers publish their counters after the step: wait for them.
  int64_t from_tier = 0;
  for (int k = 0; k < 200; ++k) {
    from_tier = pools_sum(**engine, &PoolStats::kv_prefix_hits_host) +
                pools_sum(**engine, &PoolStats::kv_prefix_hits_disk);
    if (pools_sum(**engine, &PoolStats::kv_prefix_hits) >= 192 &&
        (tier == Tier::kNone || from_tier >= 192))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pools_sum(**engine, &PoolStats::kv_prefix_hits), 192);
  EXPECT_EQ(pools_sum(**engine, &PoolStats::kv_prefix_spill_faults), 0);
  // Without a tier the pages stayed on their shards; with one they all came back from it.
  EXPECT_EQ(from_tier, tier == Tier::kNone ? 0 : 192);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  // What is left on the home tiers is the caches' spilled pages, every shard's counted.
  for (int k = 0; k < 200; ++k) {
    bool settled = true;
    for (const sched::WorkerSnapshot& w : (*engine)->worker_snapshots())
      settled = settled && w.kv_host_slots_used == w.pool.kv_prefix_pages_host &&
                w.kv_disk_records == w.pool.kv_prefix_pages_disk;
    if (settled) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const sched::WorkerSnapshot& w : (*engine)->worker_snapshots()) {
    EXPECT_EQ(w.kv_host_slots_used, w.pool.kv_prefix_pages_host) << w.pool.name;
    EXPECT_EQ(w.kv_disk_records, w.pool.kv_prefix_pages_disk) << w.pool.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    ModesAndTiers, EnginePrefixShard,
    ::testing::Combine(::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                       ::testing::Values(Tier::kNone, Tier::kHost, Tier::kDisk)),
    [](const auto& info) {
      const Tier t = std::get<1>(info.param);
      return std::string(std::get<0>(info.param) == ServingMode::kColocated ? "Colocated"
                                                                            : "Disaggregated") +
             (t == Tier::kNone   ? "DeviceOnly"
              : t == Tier::kHost ? "Host"
                                 : "Disk");
    });

}  // namespace
}  // namespace kvsplit
