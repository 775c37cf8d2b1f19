// Prefix cache spill-ahead (PrefixCache::spill_ahead, KvPool::spill_prefix_ahead): between steps
// the cache's least recently used pages start their device->host copy as fenced batches on the
// CPU backend's copy thread; each block is freed only once its copy has landed, a page a sequence
// takes meanwhile stays on the device, a hit on a page spilled ahead comes back bit-exact from
// the host tier, and nothing leaks whatever ends the copy.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/kv_pool.h"
#include "kv/prefix_cache.h"

namespace kvsplit::kv {
namespace {

constexpr int kBlock = 4, kLayers = 2;
const KvShape kShape{kLayers, 1, 8};

struct Tiered {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KvPool> pool;
};

// `blocks` device pages, `slots` host slots, the prefix cache on, spill-ahead to `target` free
// blocks; fenced copies on the copy thread, each starting `delay_us` after it was queued.
Tiered tiered(int blocks, int slots, int target, int64_t delay_us) {
  Tiered t;
  backend::BackendOptions o;
  o.threads = 1;
  o.async_copies = true;
  o.fenced_copy_delay_us = delay_us;
  t.be = std::move(backend::create_backend("cpu", o)).value();
  KvPoolConfig c;
  c.num_blocks = blocks;
  c.block_size = kBlock;
  c.host_bytes = int64_t{slots} * KvPool::block_bytes(c, kShape);
  c.prefix_free_target = target;
  t.pool = std::move(KvPool::create(*t.be, c, kShape)).value();
  t.pool->enable_prefix_cache();
  return t;
}

std::vector<int32_t> prompt(int pages, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(pages) * kBlock);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<float> page_bytes(KvPool& pool, int32_t block) {
  const int64_t n = pool.page_layer_bytes(kernels::KvPrecision::kFull) / 4;
  std::vector<float> out;
  for (int l = 0; l < kLayers; ++l) {
    const float* p = static_cast<const float*>(pool.layer(l).data) + block * n;
    out.insert(out.end(), p, p + n);
  }
  return out;
}

// A sequence computes `pages` pages of `t` (distinct KV), caches them and ends. Returns the KV.
std::vector<std::vector<float>> cache_and_end(KvPool& pool, const std::vector<int32_t>& t,
                                              int pages, float seed) {
  BlockTable table;
  EXPECT_TRUE(pool.reserve(table, pages * kBlock));
  const int64_t n = pool.page_layer_bytes(kernels::KvPrecision::kFull) / 4;
  std::vector<std::vector<float>> kv;
  for (int i = 0; i < pages; ++i) {
    for (int l = 0; l < kLayers; ++l) {
      float* p = static_cast<float*>(pool.layer(l).data) + table.blocks[i] * n;
      for (int64_t j = 0; j < n; ++j) p[j] = seed + i + 0.01f * static_cast<float>(j) + 50.f * l;
    }
    kv.push_back(page_bytes(pool, table.blocks[i]));
  }
  pool.cache_prefix(table, 7, t, pages);
  pool.release(table);
  return kv;
}

TEST(PrefixSpillAhead, BlocksAreFreedOnlyOnceTheirCopiesLandAndHitsAreBitExact) {
  // Each copy held 1 s: the checks below while they are in flight run long before they land,
  // however slowly this thread runs (the second spill_prefix_ahead polls the landings).
  Tiered t = tiered(/*blocks=*/8, /*slots=*/8, /*target=*/4, /*delay_us=*/1'000'000);
  const std::vector<int32_t> a = prompt(3, 1), b = prompt(3, 1000);
  const auto kv_a = cache_and_end(*t.pool, a, 3, 1.f);
  const auto kv_b = cache_and_end(*t.pool, b, 3, 9.f);
  PrefixCache& cache = *t.pool->prefix_cache();
  ASSERT_EQ(t.pool->allocator().num_free(), 2);  // 6 cached pages only the cache holds
  EXPECT_EQ(t.pool->spill_prefix_ahead(), 2);    // 2 more to reach 4 free: a's first pages (LRU)
  EXPECT_EQ(cache.landings_in_flight(), 2);
  EXPECT_EQ(t.pool->allocator().num_free(), 2);  // not before the copies land
  EXPECT_EQ(cache.pages_host(), 0);
  EXPECT_EQ(t.pool->spill_prefix_ahead(), 0);  // counting the copies in flight: enough
  EXPECT_EQ(cache.poll_landings(t.pool->allocator(), -1), 2);
  EXPECT_EQ(t.pool->allocator().num_free(), 4);
  EXPECT_EQ(cache.pages_host(), 2);
  EXPECT_EQ(cache.stats().ahead_spilled, 2);
  // a's pages come back from the host tier bit-exact; b's were never touched.
  BlockTable ta;
  ASSERT_EQ(t.pool->share_prefix(ta, 7, a, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(page_bytes(*t.pool, ta.blocks[i]), kv_a[i]) << i;
  EXPECT_EQ(cache.stats().hit_pages_host, 2);
  t.pool->release(ta);
  BlockTable tb;
  ASSERT_EQ(t.pool->share_prefix(tb, 7, b, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(page_bytes(*t.pool, tb.blocks[i]), kv_b[i]) << i;
  t.pool->release(tb);
  cache.clear(t.pool->allocator());
  EXPECT_EQ(t.pool->allocator().num_used(), 0);
  EXPECT_EQ(t.pool->host_allocator().num_used(), 0);
}

TEST(PrefixSpillAhead, APageTakenWhileItsCopyIsInFlightStaysOnTheDevice) {
  Tiered t = tiered(8, 8, 8, 50'000);
  const std::vector<int32_t> a = prompt(2, 1);
  cache_and_end(*t.pool, a, 2, 3.f);
  PrefixCache& cache = *t.pool->prefix_cache();
  EXPECT_EQ(t.pool->spill_prefix_ahead(), 2);
  BlockTable ta;  // a hit while the copies are in flight: device pages, as before
  ASSERT_EQ(t.pool->share_prefix(ta, 7, a, 2), 2);
  EXPECT_EQ(cache.stats().hit_pages_host, 0);
  EXPECT_EQ(cache.poll_landings(t.pool->allocator(), -1), 0);  // held: nothing freed
  EXPECT_EQ(cache.stats().ahead_kept, 2);
  EXPECT_EQ(cache.pages_host(), 0);
  EXPECT_EQ(t.pool->host_allocator().num_used(), 0);  // the slots went back
  t.pool->release(ta);
  cache.clear(t.pool->allocator());
  EXPECT_EQ(t.pool->allocator().num_used(), 0);
}

TEST(PrefixSpillAhead, AnAllocationFinishesCopiesInFlightFirstAndClearLeaksNothing) {
  Tiered t = tiered(6, 6, 6, 30'000);
  const std::vector<int32_t> a = prompt(3, 1), b = prompt(3, 500);
  cache_and_end(*t.pool, a, 3, 1.f);
  cache_and_end(*t.pool, b, 3, 2.f);
  PrefixCache& cache = *t.pool->prefix_cache();
  EXPECT_EQ(t.pool->allocator().num_free(), 0);
  EXPECT_EQ(t.pool->spill_prefix_ahead(), 6);
  // Needing 2 blocks now: the two oldest copies in flight are waited for, not new spills.
  auto got = t.pool->allocate_blocks(2);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(cache.stats().ahead_spilled, 2);
  EXPECT_EQ(cache.landings_in_flight(), 4);
  for (int32_t blk : *got) t.pool->allocator().decref(blk);
  cache.clear(t.pool->allocator());  // cancels the 4 in flight: waits, frees the slots
  EXPECT_EQ(cache.landings_in_flight(), 0);
  EXPECT_EQ(t.pool->allocator().num_used(), 0);
  EXPECT_EQ(t.pool->host_allocator().num_used(), 0);
}

TEST(PrefixSpillAhead, OffByDefaultAndWithoutAHostTier) {
  Tiered t = tiered(8, 0, 8, 0);
  cache_and_end(*t.pool, prompt(2, 1), 2, 1.f);
  EXPECT_EQ(t.pool->spill_prefix_ahead(), 0);  // no host slot to spill to
  Tiered u = tiered(8, 8, 0, 0);
  cache_and_end(*u.pool, prompt(2, 1), 2, 1.f);
  EXPECT_EQ(u.pool->spill_prefix_ahead(), 0);  // target 0: off
  EXPECT_EQ(u.pool->prefix_cache()->pages_host(), 0);
}

}  // namespace
}  // namespace kvsplit::kv
