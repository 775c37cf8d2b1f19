#include "kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/kv_pool.h"

namespace kvsplit::kv {
namespace {

constexpr int kBlock = 4;

std::vector<int32_t> tokens(int n, int32_t first = 1) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(PrefixCache, ChainedLookupStopsAtTheFirstDifferentPage) {
  BlockAllocator alloc(16);
  PrefixCache cache(kBlock);
  const uint64_t salt = PrefixCache::salt_of("tenant-a");
  const std::vector<int32_t> t = tokens(12);
  auto blocks = *alloc.allocate(3);
  EXPECT_EQ(cache.insert(salt, t, blocks, 3, alloc), 3);
  EXPECT_EQ(alloc.refcount(blocks[0]), 2);  // the owner's and the cache's
  EXPECT_EQ(cache.lookup(salt, t, 3), blocks);
  EXPECT_EQ(cache.lookup(salt, t, 2), std::vector<int32_t>(blocks.begin(), blocks.begin() + 2));
  // The same second page after a different first page: not a hit (the hash is chained).
  std::vector<int32_t> u = t;
  u[0] = 99;
  EXPECT_TRUE(cache.lookup(salt, u, 3).empty());
  std::vector<int32_t> w = t;
  w[9] = 99;  // third page differs
  EXPECT_EQ(cache.lookup(salt, w, 3).size(), 2u);
  // Inserting the same pages again (another sequence's blocks) caches nothing new.
  auto other = *alloc.allocate(3);
  EXPECT_EQ(cache.insert(salt, t, other, 3, alloc), 0);
  EXPECT_EQ(alloc.refcount(other[0]), 1);
  EXPECT_EQ(cache.stats().hit_pages, 3 + 2 + 0 + 2);
}

TEST(PrefixCache, TenantsNeverSharePages) {
  BlockAllocator alloc(16);
  PrefixCache cache(kBlock);
  const uint64_t a = PrefixCache::salt_of("tenant-a"), b = PrefixCache::salt_of("tenant-b");
  EXPECT_NE(a, b);
  const std::vector<int32_t> t = tokens(8);
  auto blocks = *alloc.allocate(2);
  cache.insert(a, t, blocks, 2, alloc);
  EXPECT_TRUE(cache.lookup(b, t, 2).empty());
  EXPECT_EQ(cache.lookup(a, t, 2).size(), 2u);
  // B caches its own copy; each tenant then hits only its own blocks.
  auto bblocks = *alloc.allocate(2);
  EXPECT_EQ(cache.insert(b, t, bblocks, 2, alloc), 2);
  EXPECT_EQ(cache.lookup(b, t, 2), bblocks);
  EXPECT_EQ(cache.lookup(a, t, 2), blocks);
}

TEST(PrefixCache, EvictsOnlyPagesNobodyElseHoldsLeastRecentlyUsedFirst) {
  BlockAllocator alloc(8);
  PrefixCache cache(kBlock);
  const uint64_t s = PrefixCache::salt_of("");
  const std::vector<int32_t> t1 = tokens(4, 1), t2 = tokens(4, 100), t3 = tokens(4, 200);
  auto b1 = *alloc.allocate(1), b2 = *alloc.allocate(1), b3 = *alloc.allocate(1);
  cache.insert(s, t1, b1, 1, alloc);
  cache.insert(s, t2, b2, 1, alloc);
  cache.insert(s, t3, b3, 1, alloc);
  alloc.decref(b1[0]);  // the sequences end; b3's owner keeps it
  alloc.decref(b2[0]);
  EXPECT_EQ(cache.evictable(alloc), 2);
  cache.lookup(s, t1, 1);  // t1 is now more recent than t2
  EXPECT_EQ(cache.evict(1, alloc), 1);
  EXPECT_FALSE(cache.holds(b2[0]));  // the least recently used
  EXPECT_TRUE(cache.holds(b1[0]));
  EXPECT_EQ(cache.evict(5, alloc), 1);  // b3 is still held by its owner
  EXPECT_TRUE(cache.holds(b3[0]));
  alloc.decref(b3[0]);
  cache.clear(alloc);
  EXPECT_EQ(alloc.num_used(), 0);
}

TEST(PrefixCache, PoolCountsEvictablePagesAsAvailableAndEvictsOnReserve) {
  auto be = std::move(backend::create_backend("cpu", 1)).value();
  KvPoolConfig c;
  c.num_blocks = 4;
  c.block_size = kBlock;
  auto pool = std::move(KvPool::create(*be, c, KvShape{1, 1, 8})).value();
  pool->enable_prefix_cache();
  const uint64_t s = PrefixCache::salt_of("x");
  const std::vector<int32_t> t = tokens(13);
  BlockTable a;
  ASSERT_TRUE(pool->reserve(a, 13));  // 4 blocks
  pool->cache_prefix(a, s, t, 3);
  EXPECT_EQ(pool->available_blocks(), 0);
  EXPECT_EQ(pool->releasable_blocks(a), 4);  // 3 become evictable, 1 free
  // A second sequence with the same prompt shares 3 pages while `a` runs.
  BlockTable b;
  EXPECT_EQ(pool->share_prefix(b, s, t, 3), 3);
  EXPECT_EQ(pool->releasable_blocks(a), 1);  // its shared pages stay held by b
  pool->release(a);
  EXPECT_EQ(pool->available_blocks(), 1);
  pool->release(b);
  EXPECT_EQ(pool->available_blocks(), 4);  // 1 free + 3 evictable
  EXPECT_EQ(pool->allocator().num_free(), 1);
  BlockTable c2;
  ASSERT_TRUE(pool->reserve(c2, 16));  // evicts the 3 cached pages
  EXPECT_EQ(pool->prefix_cache()->size(), 0);
  pool->release(c2);
  EXPECT_EQ(pool->allocator().num_used(), 0);
}

}  // namespace
}  // namespace kvsplit::kv
