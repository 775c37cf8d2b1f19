// The decode worker's prefix cache in a KV handoff (disaggregated mode): the leading pages of a
// prompt that the decode pool holds on the device are shared, not copied from the prefill worker
// again; the tokens are those of an engine without the cache; another tenant shares nothing; the
// shared pages take no room, so a decode pool too small for every copy admits every sequence;
// every block is available afterwards.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"

namespace kvsplit {
namespace {

using sched::TestHold;
using testing::collect;
using testing::Collected;
using testing::wait_for_stats;

constexpr int kBlock = 16;
constexpr int kPrompt = 100;  // 6 full pages and 4 tokens

std::vector<int32_t> prompt_ids() {
  std::mt19937 rng(11);
  std::vector<int32_t> ids(kPrompt);
  for (int32_t& t : ids) t = 3 + static_cast<int32_t>(rng() % 500);
  return ids;
}

Request req(const std::string& tenant, int i) {
  Request r;
  r.tenant = tenant;
  r.prompt_token_ids = prompt_ids();
  r.sampling.max_tokens = 20;
  r.sampling.temperature = i % 2 ? 0.8f : 0.f;
  r.sampling.seed = 5;
  return r;
}

EngineConfig config(bool prefix_cache) {
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 1;  // every handoff to the same decode pool
  cfg.block_size = kBlock;
  cfg.prefix_cache = prefix_cache;
  return cfg;
}

// A copy: callers pass a temporary EngineStats.
PoolStats decode_pool(const EngineStats& s) {
  for (const PoolStats& p : s.pools)
    if (p.name == "decode-0") return p;
  ADD_FAILURE() << "no decode-0 pool";
  return {};
}

TEST(EngineHandoffCache, ARepeatedPromptIsCopiedOnceAndKeepsTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  auto ref = Engine::create(config(false));
  auto engine = EngineImpl::create(config(true));
  ASSERT_TRUE(ref.ok() && engine.ok());
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  const int64_t pages = (kPrompt + kBlock - 1) / kBlock;  // handed off per request
  const int64_t full = kPrompt / kBlock;                  // of those, cacheable
  int64_t want_copied = 0, want_cached = 0;
  for (int i = 0; i < 2; ++i) {  // greedy, then seeded sampling
    const Collected want = collect(*(*ref)->submit(req("a", i)));
    ASSERT_TRUE(want.final_event.status.ok()) << want.final_event.status.to_string();
    for (const char* tenant : {"a", "a", "b", "a"}) {
      const Collected got = collect(*e.submit(req(tenant, i)));
      ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
      EXPECT_EQ(got.tokens, want.tokens) << tenant << " " << i;
      // Tenant a's prompt reaches the decode cache with its first request (of the greedy pass);
      // tenant b's with its own, and shares nothing with a's.
      const bool first_of_tenant = i == 0 && (tenant == std::string("b") || want_copied == 0);
      want_cached += first_of_tenant ? 0 : full;
      want_copied += first_of_tenant ? pages : pages - full;
      const PoolStats d = decode_pool(e.stats());
      EXPECT_EQ(d.handoff_pages_cached, want_cached) << tenant << " " << i;
      EXPECT_EQ(d.handoff_pages_copied, want_copied) << tenant << " " << i;
    }
  }
  const PoolStats d = decode_pool(e.stats());
  EXPECT_GE(d.kv_prefix_hits, want_cached * kBlock);  // the lookups count on the decode pool
  EXPECT_GT(d.kv_prefix_cache_pages, 0);
  // The reference engine copies every page.
  const PoolStats rd = decode_pool((*ref)->stats());
  EXPECT_EQ(rd.handoff_pages_cached, 0);
  EXPECT_EQ(rd.handoff_pages_copied, 2 * pages);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

// The decode pool held before its forward pass: the offers are admitted and their pages taken,
// no step runs. Submits `n` requests and waits until the decode pool runs `running` of them and
// holds the others as offers waiting for room. Returns its blocks in use then (-1: not within
// 60 s).
int decode_blocks_used(EngineImpl& e, int n, int running, std::vector<RequestHandle>* handles) {
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
  for (int i = 0; i < n; ++i) {
    auto h = e.submit(req("a", 0));
    EXPECT_TRUE(h.ok());
    if (h.ok()) handles->push_back(std::move(*h));
  }
  const bool there = wait_for_stats(e, [&](const EngineStats& s) {
    const PoolStats d = decode_pool(s);
    return d.running == running && d.waiting == n - running;
  });
  const PoolStats d = decode_pool(e.stats());
  return there ? d.kv_blocks_total - d.kv_blocks_free : -1;
}

TEST(EngineHandoffCache, SharedPagesTakeNoRoomSoASmallDecodePoolAdmitsMore) {
  KVSPLIT_REQUIRE_MODELS();
  constexpr int kSeqs = 4;
  const int pages = (kPrompt + kBlock - 1) / kBlock;
  const int full = kPrompt / kBlock;
  // Room for every sequence when they share their full prompt pages (one spare block each), for
  // two without the cache.
  const int blocks = full + kSeqs * (pages - full + 1);
  ASSERT_EQ(blocks / pages, 2);
  for (const bool cache : {true, false}) {
    EngineConfig cfg = config(cache);
    cfg.kv_blocks_per_worker = blocks;
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok());
    EngineImpl& e = **engine;
    const std::vector<int> initial = testing::free_blocks(e);
    std::vector<RequestHandle> handles;
    const int used = decode_blocks_used(e, kSeqs, cache ? kSeqs : 2, &handles);
    // With the cache: one copy of the full pages and each sequence's own last page. Without:
    // two whole copies, the other two offers wait for room.
    EXPECT_EQ(used, cache ? full + kSeqs * (pages - full) : 2 * pages) << cache;
    e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kNone);
    for (RequestHandle& h : handles) {
      const Collected c = collect(std::move(h));
      ASSERT_FALSE(c.timed_out);
      EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      EXPECT_EQ(c.tokens.size(), 20u);
    }
    EXPECT_TRUE(testing::pools_back_to(e, initial)) << cache;
  }
}

// Cache-aware routing: with two decode workers, an offer goes to the one its prefill worker sent
// the prompt's pages before, although the other is less loaded, since there it needs 1 block
// instead of 7; without the cache, or with cache_aware_handoffs off, it goes to the less loaded
// one.
TEST(EngineHandoffCache, AnOfferGoesToTheDecodeWorkerThatHoldsItsPrompt) {
  KVSPLIT_REQUIRE_MODELS();
  for (const int mode : {0, 1, 2}) {  // cache-aware, by load, no cache
    const bool cache = mode == 0;
    EngineConfig cfg = config(mode != 2);
    cfg.cache_aware_handoffs = mode == 0;
    cfg.num_decode_workers = 2;
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok());
    EngineImpl& e = **engine;
    const std::vector<int> initial = testing::free_blocks(e);
    // Both decode workers idle: decode-0 (the lowest index) gets the prompt first.
    const Collected first = collect(*e.submit(req("a", 0)));
    ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
    // decode-0 has published its state after the request (idle, every block available).
    ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& s) {
      const PoolStats d = decode_pool(s);
      return d.running == 0 && d.kv_blocks_free == d.kv_blocks_total;
    }));
    // Another tenant's request now runs on decode-0, held before its forward pass (3 blocks).
    e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
    Request other = req("c", 0);
    other.prompt_token_ids.resize(40);
    auto busy = e.submit(other);
    ASSERT_TRUE(busy.ok());
    auto decode_running = [](const EngineStats& s, const char* name) {
      for (const PoolStats& p : s.pools)
        if (p.name == name) return p.running;
      return -1;
    };
    ASSERT_TRUE(wait_for_stats(
        e, [&](const EngineStats& s) { return decode_running(s, "decode-0") == 1; }));
    auto again = e.submit(req("a", 0));
    ASSERT_TRUE(again.ok());
    const char* want = cache ? "decode-0" : "decode-1";
    EXPECT_TRUE(wait_for_stats(e, [&](const EngineStats& s) {
      return decode_running(s, want) == (cache ? 2 : 1);
    })) << want;
    const EngineStats s = e.stats();
    EXPECT_EQ(s.pools[0].handoffs_to_cached, cache ? 1 : 0) << s.pools[0].name;
    EXPECT_EQ(decode_pool(s).handoff_pages_cached, cache ? kPrompt / kBlock : 0);
    e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kNone);
    const Collected c = collect(std::move(*again));
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens, first.tokens);
    EXPECT_TRUE(collect(std::move(*busy)).final_event.status.ok());
    EXPECT_TRUE(testing::pools_back_to(e, initial)) << mode;
  }
}

// A cancel storm over handoffs that share cached pages on the decode pool: every block returns.
TEST(EngineHandoffCache, CancelledSharersLeaveEveryPoolEmpty) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(config(true));
  ASSERT_TRUE(engine.ok());
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  std::mt19937 rng(3);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 60; ++i) {
    Request r = req(i % 3 == 0 ? "b" : "a", i);
    r.sampling.max_tokens = 40;
    auto h = e.submit(r);
    ASSERT_TRUE(h.ok());
    handles.push_back(std::move(*h));
    if (rng() % 2) e.cancel(r.tenant, handles.back());
  }
  for (RequestHandle& h : handles) {
    const Collected c = collect(std::move(h));
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.finals, 1);
  }
  EXPECT_GT(decode_pool(e.stats()).handoff_pages_cached, 0);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

}  // namespace
}  // namespace kvsplit
