// The prefix cache in the engine: a tenant's repeated prompt reuses its pages (same tokens,
// usage.cached_tokens > 0); another tenant with the same prompt shares nothing; every block is
// available again afterwards (cached pages are evictable).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

const char* kLong =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "sunshine. One day, she saw a big dog in the park and";

Request req(const std::string& tenant, const std::string& salt, int i) {
  Request r;
  r.tenant = tenant;
  r.cache_salt = salt;
  r.prompt = kLong;
  r.sampling.max_tokens = 24;
  r.sampling.temperature = i % 2 ? 0.7f : 0.f;
  r.sampling.seed = 3;
  return r;
}

class EnginePrefix : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EnginePrefix, SameTenantSharesOtherTenantsDoNot) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.prefix_cache = true;
  cfg.block_size = 16;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  EngineConfig plain = testing::stories_config(GetParam());
  auto ref_engine = Engine::create(plain);
  ASSERT_TRUE(ref_engine.ok());
  for (int i = 0; i < 2; ++i) {
    const Collected ref = collect(*(*ref_engine)->submit(req("a", "", i)));
    const Collected first = collect(*(*engine)->submit(req("a", "", i)));
    const Collected again = collect(*(*engine)->submit(req("a", "", i)));
    const Collected other = collect(*(*engine)->submit(req("b", "", i)));
    const Collected salted = collect(*(*engine)->submit(req("a", "s1", i)));
    // Tenant and salt are not run together: tenant "as" with salt "1" is not tenant "a" with "s1".
    const Collected spliced = collect(*(*engine)->submit(req("as", "1", i)));
    for (const Collected* c : {&first, &again, &other, &salted, &spliced}) {
      ASSERT_TRUE(c->final_event.status.ok()) << c->final_event.status.to_string();
      EXPECT_EQ(c->tokens, ref.tokens);
    }
    const int prompt = first.final_event.usage.prompt_tokens;
    EXPECT_EQ(again.final_event.usage.cached_tokens, (prompt - 1) / 16 * 16) << i;
    if (i == 0) {
      EXPECT_EQ(first.final_event.usage.cached_tokens, 0);
      EXPECT_EQ(other.final_event.usage.cached_tokens, 0);   // tenant b: nothing shared
      EXPECT_EQ(salted.final_event.usage.cached_tokens, 0);  // another cache_salt
      EXPECT_EQ(spliced.final_event.usage.cached_tokens, 0);
    }
  }
  // A request that ends on its first token still leaves its prompt pages in the cache.
  Request one = req("c", "", 0);
  one.sampling.max_tokens = 1;
  const Collected once = collect(*(*engine)->submit(one));
  const Collected twice = collect(*(*engine)->submit(one));
  ASSERT_TRUE(twice.final_event.status.ok());
  EXPECT_EQ(once.final_event.usage.cached_tokens, 0);
  EXPECT_EQ(twice.final_event.usage.cached_tokens,
            (twice.final_event.usage.prompt_tokens - 1) / 16 * 16);
  EXPECT_EQ(twice.tokens, once.tokens);
  const EngineStats s = (*engine)->stats();
  int64_t hits = 0, pages = 0;
  for (const PoolStats& p : s.pools) {
    hits += p.kv_prefix_hits;
    pages += p.kv_prefix_cache_pages;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(pages, 0);
  // Cached pages count as available: every pool is back to its size.
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

INSTANTIATE_TEST_SUITE_P(Modes, EnginePrefix,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

// Sequences preempted by recompute (no host or disk tier: nothing to swap to) restart through
// the prefix-cache lookup (Worker::schedule), on a colocated worker or a decode worker alike: the
// tokens are those of an engine without the cache, and every block is available afterwards. Whether
// a restart finds its pages still cached depends on the other sequences' growth meanwhile (thread
// timing); the deterministic check that it does is PrefixRecompute.ARestartReusesItsCachedPages
// (tests/e2e/swap_fault_test.cpp).
TEST_P(EnginePrefix, RecomputesUnderPressureKeepTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.prefix_cache = true;
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 14;  // one request needs 9 pages; four at once preempt
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  auto ref_engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(ref_engine.ok());
  auto make = [](int i) {
    Request r;
    r.tenant = "t";
    for (int k = 0; k < 40; ++k) r.prompt_token_ids.push_back(5 + (97 * i + 13 * k) % 490);
    r.sampling.max_tokens = 100;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.8f : 0.f;
    r.sampling.seed = 11 + i;
    return r;
  };
  // The four start together (held until pulled and, disaggregated, handed over), so they grow
  // together on every machine: four sequences on two decode workers put two on one, and two need
  // 18 pages of its 14.
  std::vector<RequestHandle> handles;
  {
    testing::StartTogether together(**engine, GetParam());
    for (int i = 0; i < 4; ++i) {
      auto h = (*engine)->submit(make(i));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      handles.push_back(std::move(h).value());
    }
    ASSERT_TRUE(together.release(4, 4));
  }
  for (int i = 0; i < 4; ++i) {
    const Collected got = collect(std::move(handles[i]));
    const Collected ref = collect(*(*ref_engine)->submit(make(i)));
    ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
    EXPECT_EQ(got.tokens, ref.tokens) << i;
    EXPECT_EQ(got.final_event.usage.cached_tokens, 0) << i;  // nothing cached at admission
  }
  const EngineStats st = (*engine)->stats();
  EXPECT_GT(st.preemptions, 0);
  // Every worker has a prefix cache, a decode worker too: there the preempted sequences' pages
  // (prompt and generated) were cached and their restarts looked them up (on whichever decode
  // workers preempted).
  int64_t queries = 0;
  for (const PoolStats& p : st.pools) {
    if (p.name.find("prefill") == std::string::npos) queries += p.kv_prefix_queries;
  }
  EXPECT_GT(queries, 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// Spilling: a device pool of 16 pages, so two other tenants' 200-token prompts push the shared
// 64-token prefix out to the host tier (or, without one, the disk tier) between two requests of
// the same tenant. The second request is swapped back in from that tier: the same tokens as with
// the cache off, cached_tokens = the whole prefix, the tier's hit counter moves; afterwards the
// host slots and disk records in use are exactly the cache's spilled pages.
enum class Tier { kHost, kDisk };

class EnginePrefixSpill : public ::testing::TestWithParam<std::tuple<ServingMode, Tier>> {};

Request shared_prefix_req(const std::string& tenant, int i, bool sampled) {
  Request r;
  r.tenant = tenant;
  for (int k = 0; k < 64; ++k) r.prompt_token_ids.push_back(10 + (k * 7) % 400);
  for (int k = 0; k < 8; ++k) r.prompt_token_ids.push_back(20 + 31 * i + k);
  r.sampling.max_tokens = 16;
  r.sampling.temperature = sampled ? 0.8f : 0.f;
  r.sampling.seed = 5;
  return r;
}

Request filler(const std::string& tenant, uint32_t seed) {
  Request r;
  r.tenant = tenant;
  std::mt19937 rng(seed);
  for (int k = 0; k < 200; ++k) r.prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % 480));
  r.sampling.max_tokens = 4;
  return r;
}

TEST_P(EnginePrefixSpill, APrefixSpilledBetweenRequestsHitsOnItsTierWithTheSameTokens) {
  KVSPLIT_REQUIRE_MODELS();
  const auto [mode, tier] = GetParam();
  kvsplit::testing::TempDir dir;
  EngineConfig cfg = testing::stories_config(mode);
  cfg.prefix_cache = true;
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 16;
  if (tier == Tier::kHost) {
    cfg.temporal.host_capacity_mb = 1;  // ~50 pages of stories260K
  } else {
    cfg.temporal.disk_path = dir.path().string();
    cfg.temporal.disk_capacity_mb = 16;
  }
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  auto ref_engine = Engine::create(testing::stories_config(mode));
  ASSERT_TRUE(ref_engine.ok());
  int64_t tier_hits = 0;
  for (int i = 0; i < 2; ++i) {
    const bool sampled = i == 1;
    const Collected ref0 = collect(*(*ref_engine)->submit(shared_prefix_req("t", 0, sampled)));
    const Collected ref1 = collect(*(*ref_engine)->submit(shared_prefix_req("t", 1, sampled)));
    const Collected first = collect(*(*engine)->submit(shared_prefix_req("t", 0, sampled)));
    for (const char* f : {"f1", "f2"}) {
      const Collected c = collect(*(*engine)->submit(filler(f + std::to_string(i), 7 + i)));
      ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    }
    const Collected again = collect(*(*engine)->submit(shared_prefix_req("t", 1, sampled)));
    ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
    ASSERT_TRUE(again.final_event.status.ok()) << again.final_event.status.to_string();
    EXPECT_EQ(first.tokens, ref0.tokens) << i;
    EXPECT_EQ(again.tokens, ref1.tokens) << i;
    EXPECT_EQ(again.final_event.usage.cached_tokens, 64) << i;
    // The workers publish their pool counters after the step; the request's final event can
    // arrive first (a prefill worker's counters in the disaggregated mode), so wait for them.
    int64_t hits = 0, spills = 0, faults = 0;
    for (int k = 0; k < 200; ++k) {
      hits = spills = faults = 0;
      for (const PoolStats& p : (*engine)->stats().pools) {
        hits += tier == Tier::kHost ? p.kv_prefix_hits_host : p.kv_prefix_hits_disk;
        spills += tier == Tier::kHost ? p.kv_prefix_spills_host : p.kv_prefix_spills_disk;
        faults += p.kv_prefix_spill_faults;
      }
      if (hits - tier_hits >= 64) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(faults, 0) << i;
    // The whole prefix came back from the lower tier (4 pages of 16 tokens each round).
    EXPECT_EQ(hits - tier_hits, 64) << i;
    EXPECT_GE(spills, 4 * (i + 1)) << i;
    tier_hits = hits;
  }
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  // Everything on the host and disk tiers is a spilled prefix-cache page, and accounted for.
  auto settled = [&] {
    for (const sched::WorkerSnapshot& w : (*engine)->worker_snapshots())
      if (w.kv_host_slots_used != w.pool.kv_prefix_pages_host ||
          w.kv_disk_records != w.pool.kv_prefix_pages_disk)
        return false;
    return true;
  };
  for (int k = 0; k < 200 && !settled(); ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  int64_t lower = 0;
  for (const sched::WorkerSnapshot& w : (*engine)->worker_snapshots()) {
    EXPECT_EQ(w.kv_host_slots_used, w.pool.kv_prefix_pages_host) << w.pool.name;
    EXPECT_EQ(w.kv_disk_records, w.pool.kv_prefix_pages_disk) << w.pool.name;
    EXPECT_EQ(w.pool.kv_pages_host, 0) << w.pool.name;  // no sequence left swapped out
    lower += w.pool.kv_prefix_pages_host + w.pool.kv_prefix_pages_disk;
  }
  EXPECT_GT(lower, 0);  // the fillers' and prefix's pages were spilled, not dropped
}

INSTANTIATE_TEST_SUITE_P(ModesAndTiers, EnginePrefixSpill,
                         ::testing::Combine(::testing::Values(ServingMode::kColocated,
                                                              ServingMode::kDisaggregated),
                                            ::testing::Values(Tier::kHost, Tier::kDisk)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == ServingMode::kColocated
                                                  ? "Colocated"
                                                  : "Disaggregated") +
                                  (std::get<1>(info.param) == Tier::kHost ? "Host" : "Disk");
                         });

}  // namespace
}  // namespace kvsplit
