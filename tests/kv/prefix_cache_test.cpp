#include "kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "disk_write_gate.h"
#include "kv/kv_pool.h"
#include "kv/swap.h"
#include "test_util.h"

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

// A page shared by a sequence leaves the evictable pages and comes back to them, at its own
// recency, when the sequence lets it go (the allocator reports the count crossing 1).
TEST(PrefixCache, APageSharedAndLetGoReturnsToTheEvictableOrderAtItsRecency) {
  BlockAllocator alloc(8);
  PrefixCache cache(kBlock);
  const uint64_t s = PrefixCache::salt_of("");
  const std::vector<int32_t> t1 = tokens(4, 1), t2 = tokens(4, 100), t3 = tokens(4, 200);
  auto b1 = *alloc.allocate(1), b2 = *alloc.allocate(1), b3 = *alloc.allocate(1);
  cache.insert(s, t1, b1, 1, alloc);
  cache.insert(s, t2, b2, 1, alloc);
  cache.insert(s, t3, b3, 1, alloc);
  EXPECT_EQ(cache.evictable(alloc), 0);  // each owner holds its page
  alloc.decref(b1[0]);
  alloc.decref(b2[0]);
  alloc.decref(b3[0]);
  EXPECT_EQ(cache.evictable(alloc), 3);
  EXPECT_TRUE(cache.index_consistent());
  // A sequence shares t1 (the oldest): t2 is now the least recently used evictable page; t1,
  // touched by the lookup, is the most recent one.
  auto shared = cache.lookup(s, t1, 1);
  ASSERT_EQ(shared, b1);
  alloc.incref(b1[0]);
  EXPECT_EQ(cache.evictable(alloc), 2);
  EXPECT_TRUE(cache.index_consistent());
  EXPECT_EQ(cache.evict(1, alloc), 1);
  EXPECT_FALSE(cache.holds(b2[0]));
  alloc.decref(b1[0]);  // the sequence ends
  EXPECT_EQ(cache.evictable(alloc), 2);
  EXPECT_TRUE(cache.index_consistent());
  EXPECT_EQ(cache.evict(1, alloc), 1);
  EXPECT_FALSE(cache.holds(b3[0]));  // older than t1's lookup
  EXPECT_TRUE(cache.holds(b1[0]));
  cache.clear(alloc);
  EXPECT_EQ(alloc.num_used(), 0);
}

// ---- spilling down the tiers (a pool with a host tier and / or a disk tier) ----

constexpr int kLayers = 2;
const KvShape kShape{kLayers, 1, 8};  // f32: 256 bytes per page per layer, 512 per page

struct TieredPool {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KvPool> pool;
  std::optional<kvsplit::testing::TempDir> dir;
};

// A pool of `blocks` device pages, `host_slots` host-tier slots and, with `disk`, a disk tier.
TieredPool tiered(int blocks, int host_slots, bool disk) {
  TieredPool t;
  t.be = std::move(backend::create_backend("cpu", 1)).value();
  KvPoolConfig c;
  c.num_blocks = blocks;
  c.block_size = kBlock;
  c.host_bytes = int64_t{host_slots} * KvPool::block_bytes(c, kShape);
  t.pool = std::move(KvPool::create(*t.be, c, kShape)).value();
  t.pool->enable_prefix_cache();
  if (disk) {
    t.dir.emplace();
    const Status st = t.pool->open_disk_tier(t.dir->path().string(), int64_t{4} << 20);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return t;
}

float* page_layer(KvPool& pool, int layer, int32_t block) {
  return reinterpret_cast<float*>(static_cast<std::byte*>(pool.layer(layer).data) +
                                  int64_t{block} *
                                      pool.page_layer_bytes(kernels::KvPrecision::kFull));
}

// Fills every layer of `block` with values derived from `seed`.
void fill(KvPool& pool, int32_t block, float seed) {
  const int64_t n = pool.page_layer_bytes(kernels::KvPrecision::kFull) / 4;
  for (int l = 0; l < kLayers; ++l)
    for (int64_t i = 0; i < n; ++i) page_layer(pool, l, block)[i] = seed + 0.001f * i + 100.f * l;
}

// Every layer of `block`'s bytes.
std::vector<float> read(KvPool& pool, int32_t block) {
  const int64_t n = pool.page_layer_bytes(kernels::KvPrecision::kFull) / 4;
  std::vector<float> out;
  for (int l = 0; l < kLayers; ++l)
    out.insert(out.end(), page_layer(pool, l, block), page_layer(pool, l, block) + n);
  return out;
}

// A sequence caches `pages` pages of `t` (with distinct KV) and ends; returns each page's KV.
std::vector<std::vector<float>> cache_and_end(KvPool& pool, uint64_t salt,
                                              const std::vector<int32_t>& t, int pages) {
  BlockTable a;
  EXPECT_TRUE(pool.reserve(a, static_cast<int>(t.size())));
  std::vector<std::vector<float>> kv;
  for (int i = 0; i < pages; ++i) {
    fill(pool, a.blocks[i], 1.f + i + 0.5f * static_cast<float>(salt % 7));
    kv.push_back(read(pool, a.blocks[i]));
  }
  pool.cache_prefix(a, salt, t, pages);
  pool.release(a);
  return kv;
}

// Takes every device block (evicting the cache's pages) and scribbles over them, then frees them;
// then waits for the spills' disk writes (asynchronous) so the tiers are settled.
void force_out(KvPool& pool, bool settle = true) {
  BlockTable c;
  ASSERT_TRUE(pool.reserve(c, pool.allocator().num_blocks() * kBlock));
  for (int32_t b : c.blocks) fill(pool, b, -7.f);
  pool.release(c);
  if (settle) pool.prefix_cache()->wait_spills();
}

TEST(PrefixCacheSpill, EvictedPagesSpillToTheHostTierAndComeBackBitExact) {
  TieredPool tp = tiered(4, 8, false);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool);
  const PrefixCache& pc = *pool.prefix_cache();
  EXPECT_EQ(pc.stats().spilled_host, 3);
  EXPECT_EQ(pc.stats().evicted, 0);
  EXPECT_EQ(pc.pages_host(), 3);
  EXPECT_EQ(pool.host_allocator().num_used(), 3);
  EXPECT_EQ(pool.allocator().num_used(), 0);
  EXPECT_EQ(pool.available_blocks(), 4);
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]) << "page " << i;
  EXPECT_EQ(pc.stats().hit_pages_host, 3);
  EXPECT_EQ(pc.stats().hit_pages, 3);
  EXPECT_EQ(pc.pages_host(), 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  // Back on the device and shared: the cache and b hold each block.
  EXPECT_EQ(pool.allocator().refcount(b.blocks[0]), 2);
  pool.release(b);
  pool.prefix_cache()->clear(pool.allocator());
  EXPECT_EQ(pool.allocator().num_used(), 0);
}

TEST(PrefixCacheSpill, AFullHostTierPushesItsOldestPagesToDiskAndEveryTierComesBackBitExact) {
  TieredPool tp = tiered(4, 1, true);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool);
  const PrefixCache& pc = *pool.prefix_cache();
  // Deepest first: pages 2 and 1 went to the host slot and on to disk; page 0 holds the slot.
  EXPECT_EQ(pc.stats().spilled_host, 3);
  EXPECT_EQ(pc.stats().spilled_disk, 2);
  EXPECT_EQ(pc.pages_host(), 1);
  EXPECT_EQ(pc.pages_disk(), 2);
  EXPECT_EQ(pool.disk()->stats().records, 2);
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]) << "page " << i;
  EXPECT_EQ(pc.stats().hit_pages_host, 1);
  EXPECT_EQ(pc.stats().hit_pages_disk, 2);
  EXPECT_EQ(pool.disk()->stats().records, 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  pool.release(b);
}

TEST(PrefixCacheSpill, WithoutAHostTierPagesGoStraightToDisk) {
  TieredPool tp = tiered(4, 0, true);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool);
  EXPECT_EQ(pool.prefix_cache()->pages_disk(), 3);
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]) << "page " << i;
  EXPECT_EQ(pool.prefix_cache()->stats().hit_pages_disk, 3);
  pool.release(b);
}

// Making room for a record the disk cannot take even without the cache's records keeps them (they
// were all dropped, and the write failed anyway); room the cache can give is taken from it.
TEST(PrefixCacheSpill, DiskRoomDropsTheCachesRecordsOnlyWhenThatMakesEnoughRoom) {
  TieredPool tp = tiered(4, 0, true);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  cache_and_end(pool, s, tokens(13), 3);
  force_out(pool);
  ASSERT_EQ(pool.prefix_cache()->pages_disk(), 3);
  DiskTier& disk = *pool.disk();
  const int64_t extent = disk.stats().extent_bytes;
  const int64_t total = disk.stats().extents_total;
  ASSERT_EQ(disk.stats().extents_used, 3);  // one extent per page record
  // Another record takes every free extent.
  std::vector<std::byte> other(static_cast<size_t>((total - 3) * extent), std::byte{1});
  const std::span<const std::byte> one(other);
  ASSERT_TRUE(disk.write_sync({&one, 1}, RecordKey{9, 9}).ok());
  ASSERT_EQ(disk.stats().extents_used, total);
  pool.make_disk_room(4 * extent);  // 4 extents: the cache's 3 are not enough
  EXPECT_EQ(pool.prefix_cache()->pages_disk(), 3);
  pool.make_disk_room(2 * extent);  // 2: two of the cache's records go, least recently used first
  EXPECT_EQ(pool.prefix_cache()->pages_disk(), 1);
  EXPECT_EQ(disk.stats().extents_total - disk.stats().extents_used, 2);
}

TEST(PrefixCacheSpill, AnotherTenantNeverReadsASpilledPage) {
  TieredPool tp = tiered(4, 1, true);
  KvPool& pool = *tp.pool;
  const uint64_t a = PrefixCache::salt_of("a"), b = PrefixCache::salt_of("b");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, a, t, 3);
  force_out(pool);
  const int64_t reads = pool.disk()->stats().reads;
  BlockTable tb;
  EXPECT_EQ(pool.share_prefix(tb, b, t, 3), 0);  // the same tokens, another tenant
  EXPECT_TRUE(tb.blocks.empty());
  EXPECT_EQ(pool.disk()->stats().reads, reads);    // not even read
  EXPECT_EQ(pool.host_allocator().num_used(), 1);  // A's page still there, untouched
  EXPECT_EQ(pool.prefix_cache()->pages_disk(), 2);
  // A still gets its own pages back.
  BlockTable ta;
  ASSERT_EQ(pool.share_prefix(ta, a, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, ta.blocks[i]), kv[i]);
  pool.release(ta);
}

TEST(PrefixCacheSpill, ACorruptDiskRecordIsNeverServedAndEndsTheLookup) {
  TieredPool tp = tiered(4, 0, true);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool);
  ASSERT_EQ(pool.prefix_cache()->pages_disk(), 3);
  // The second read (page 1) comes back with a flipped byte.
  int reads = 0;
  pool.disk()->set_fault_hook([&](IoOp op) -> std::optional<InjectedFault> {
    if (op == IoOp::kRead && ++reads == 2) return InjectedFault::kCorrupt;
    return std::nullopt;
  });
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 1);  // page 0 only: the lookup ends at page 1
  EXPECT_EQ(read(pool, b.blocks[0]), kv[0]);
  const PrefixCache& pc = *pool.prefix_cache();
  EXPECT_EQ(pc.stats().restore_faults, 1);
  EXPECT_EQ(pc.stats().hit_pages, 1);
  EXPECT_EQ(pool.disk()->stats().fault_count(DiskFault::kChecksum), 1);
  // Page 1's entry and record are gone; page 2 stays on disk; no block was kept for either.
  EXPECT_EQ(pc.pages_disk(), 1);
  EXPECT_EQ(pool.disk()->stats().records, 1);
  EXPECT_EQ(pool.allocator().num_used(), 1);
  pool.disk()->set_fault_hook(nullptr);
  BlockTable again;
  EXPECT_EQ(pool.share_prefix(again, s, t, 3), 1);  // page 1 is recomputed, never read again
  pool.release(again);
  pool.release(b);
}

TEST(PrefixCacheSpill, AFailedStoreIsNeverVisible) {
  for (InjectedFault f :
       {InjectedFault::kIoError, InjectedFault::kShortIo, InjectedFault::kNoSpace}) {
    TieredPool tp = tiered(4, 0, true);
    KvPool& pool = *tp.pool;
    const uint64_t s = PrefixCache::salt_of("a");
    const std::vector<int32_t> t = tokens(13);
    const auto kv = cache_and_end(pool, s, t, 3);
    // The first spill (page 2, the deepest) fails its write.
    pool.disk()->set_fault_hook(inject_next(IoOp::kWrite, f, 1));
    force_out(pool);
    const PrefixCache& pc = *pool.prefix_cache();
    EXPECT_EQ(pc.stats().spill_faults, 1);
    EXPECT_EQ(pc.stats().spilled_disk, 2);
    EXPECT_EQ(pc.stats().evicted, 1);
    EXPECT_EQ(pc.size(), 2);
    EXPECT_EQ(pool.disk()->stats().records, 2);  // the failed write left nothing
    BlockTable b;
    EXPECT_EQ(pool.share_prefix(b, s, t, 3), 2);  // page 2 is not found, never read
    for (int i = 0; i < 2; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]);
    EXPECT_EQ(pc.stats().restore_faults, 0);
    pool.release(b);
  }
}

TEST(PrefixCacheSpill, SwapAndSemanticOriginalsReclaimSpilledHostPagesFirst) {
  TieredPool tp = tiered(4, 3, true);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool);
  ASSERT_EQ(pool.prefix_cache()->pages_host(), 3);
  EXPECT_EQ(pool.host_allocator().num_free(), 0);
  EXPECT_EQ(pool.available_host_slots(), 3);  // the cache's pages give way
  // A sequence of 3 pages swaps out: it takes the host slots; the cache's pages move to disk.
  BlockTable seq;
  ASSERT_TRUE(pool.reserve(seq, 12));
  SwapStats st;
  auto done = swap_out(pool, seq, &st);
  ASSERT_TRUE(done.ok() && *done);
  EXPECT_EQ(st.to_disk, 0);  // the host tier, not the disk
  // The slots were free at once (the pages' bytes went into the spills' buffers).
  EXPECT_EQ(pool.prefix_cache()->pages_spilling() + pool.prefix_cache()->pages_disk(), 3);
  pool.prefix_cache()->wait_spills();
  EXPECT_EQ(pool.prefix_cache()->pages_host(), 0);
  EXPECT_EQ(pool.prefix_cache()->pages_disk(), 3);
  EXPECT_EQ(pool.prefix_cache()->stats().reclaimed, 3);
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]);
  pool.release(b);
  pool.release(seq);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
}

TEST(PrefixCacheSpill, SwapReclaimsTheCachesDiskRecordsWhenTheDiskIsFull) {
  auto be = std::move(backend::create_backend("cpu", 1)).value();
  KvPoolConfig c;
  c.num_blocks = 4;
  c.block_size = kBlock;
  auto pool = std::move(KvPool::create(*be, c, kShape)).value();
  pool->enable_prefix_cache();
  kvsplit::testing::TempDir dir;
  // Room for exactly 3 one-extent records: the cache's 3 pages fill it.
  ASSERT_TRUE(pool->open_disk_tier(dir.path().string(), 3 * 4096).ok());
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  cache_and_end(*pool, s, t, 3);
  force_out(*pool);
  ASSERT_EQ(pool->prefix_cache()->pages_disk(), 3);
  BlockTable seq;
  ASSERT_TRUE(pool->reserve(seq, 4));
  SwapStats st;
  auto done = swap_out(*pool, seq, &st);
  ASSERT_TRUE(done.ok() && *done);
  EXPECT_EQ(st.to_disk, 1);
  EXPECT_EQ(pool->prefix_cache()->pages_disk(), 2);  // the least recently used gave way
  pool->release(seq);
  pool->prefix_cache()->clear(pool->allocator());
  EXPECT_EQ(pool->disk()->stats().records, 0);
}

TEST(PrefixCacheSpill, ClearLeavesNoBlockHostSlotOrDiskRecord) {
  TieredPool tp = tiered(4, 1, true);
  KvPool& pool = *tp.pool;
  const std::vector<int32_t> t = tokens(13), u = tokens(13, 500);
  cache_and_end(pool, PrefixCache::salt_of("a"), t, 3);
  force_out(pool);
  cache_and_end(pool, PrefixCache::salt_of("b"), u, 2);  // two on the device
  const PrefixCache& pc = *pool.prefix_cache();
  EXPECT_EQ(pc.pages_device(), 2);
  EXPECT_EQ(pc.pages_host(), 1);
  EXPECT_EQ(pc.pages_disk(), 2);
  EXPECT_EQ(pool.host_allocator().num_used(), pc.pages_host());
  EXPECT_EQ(pool.disk()->stats().records, pc.pages_disk());
  pool.prefix_cache()->clear(pool.allocator());
  EXPECT_EQ(pc.size(), 0);
  EXPECT_EQ(pool.allocator().num_used(), 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  EXPECT_EQ(pool.disk()->stats().records, 0);
  EXPECT_EQ(pool.disk()->stats().extents_used, 0);
}

TEST(PrefixCacheSpill, RecomputingASpilledPageBringsItBackToTheDevice) {
  TieredPool tp = tiered(4, 4, false);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  cache_and_end(pool, s, t, 3);
  force_out(pool);
  ASSERT_EQ(pool.prefix_cache()->pages_host(), 3);
  BlockTable a;
  ASSERT_TRUE(pool.reserve(a, 13));
  pool.cache_prefix(a, s, t, 3);  // computed again (e.g. a lookup that stopped short)
  EXPECT_EQ(pool.prefix_cache()->pages_host(), 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  EXPECT_EQ(pool.prefix_cache()->size(), 3);
  pool.release(a);
  EXPECT_EQ(pool.available_blocks(), 4);
}

// ---- asynchronous spills: writes held in flight by a gate around the tier's I/O backend ----

// A pool as tiered() makes, whose disk tier's writes pass through `gate`.
TieredPool gated(int blocks, int host_slots, const std::shared_ptr<WriteGate>& gate) {
  TieredPool t = tiered(blocks, host_slots, false);
  t.dir.emplace();
  DiskTierConfig dc;
  dc.path = t.dir->path().string();
  dc.capacity_bytes = int64_t{4} << 20;
  dc.extent_bytes = 4096;  // one page record (512 + 64 + key) per extent
  dc.io.wrap = [gate](std::unique_ptr<BlockIo> io) -> std::unique_ptr<BlockIo> {
    return std::make_unique<GatedIo>(std::move(io), gate);
  };
  auto disk = DiskTier::open(dc);
  EXPECT_TRUE(disk.ok()) << disk.status().to_string();
  t.pool->attach_disk(std::move(disk).value());
  return t;
}

TEST(PrefixCacheSpillAsync, TheEvictingAllocationDoesNotWaitForTheWrite) {
  auto gate = std::make_shared<WriteGate>();
  TieredPool tp = gated(4, 0, gate);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  cache_and_end(pool, s, t, 3);
  gate->close();
  force_out(pool, /*settle=*/false);  // returns with the three writes held in flight
  const PrefixCache& pc = *pool.prefix_cache();
  EXPECT_EQ(gate->num_held(), 3);
  EXPECT_EQ(pc.spills_in_flight(), 3);
  EXPECT_EQ(pc.pages_spilling(), 3);
  EXPECT_EQ(pc.pages_disk(), 0);  // no entry names a record before its write completed
  EXPECT_EQ(pc.stats().spilled_disk, 0);
  EXPECT_EQ(pool.disk()->stats().records, 3);  // being written
  EXPECT_EQ(pool.allocator().num_used(), 0);   // the blocks were free at once
  EXPECT_EQ(pool.prefix_cache()->poll_spills(), 0);
  gate->open();
  EXPECT_EQ(pool.prefix_cache()->poll_spills(), 3);
  EXPECT_EQ(pc.pages_spilling(), 0);
  EXPECT_EQ(pc.pages_disk(), 3);
  EXPECT_EQ(pc.stats().spilled_disk, 3);
  pool.prefix_cache()->clear(pool.allocator());
  EXPECT_EQ(pool.disk()->stats().records, 0);
}

TEST(PrefixCacheSpillAsync, ALookupDuringTheWriteIsServedFromTheSpillsBufferNeverTheRecord) {
  for (int host_slots : {0, 1}) {
    auto gate = std::make_shared<WriteGate>();
    TieredPool tp = gated(4, host_slots, gate);
    KvPool& pool = *tp.pool;
    const uint64_t s = PrefixCache::salt_of("a");
    const std::vector<int32_t> t = tokens(13);
    const auto kv = cache_and_end(pool, s, t, 3);
    gate->close();
    force_out(pool, /*settle=*/false);
    const PrefixCache& pc = *pool.prefix_cache();
    // With one host slot, pages 2 and 1 passed through it on their way to disk: the slot was
    // free again at once (its bytes copied into the spill), so page 0 holds it.
    EXPECT_EQ(pc.pages_host(), host_slots);
    EXPECT_EQ(pc.pages_spilling(), 3 - host_slots);
    EXPECT_EQ(pool.host_allocator().num_used(), host_slots);
    BlockTable b;
    ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]) << "page " << i;
    EXPECT_EQ(pool.disk()->stats().reads, 0);  // not one read of a record being written
    EXPECT_EQ(pc.stats().hit_pages_spilling, 3 - host_slots);
    EXPECT_EQ(pc.stats().hit_pages_host, host_slots);      // from the slot
    EXPECT_EQ(pc.stats().hit_pages_disk, 3 - host_slots);  // on their way to disk
    EXPECT_EQ(pc.pages_device(), 3);
    // The writes go on for records nobody names; each is freed as it completes.
    EXPECT_EQ(pc.spills_in_flight(), 3 - host_slots);
    gate->open();
    pool.prefix_cache()->poll_spills();
    EXPECT_EQ(pc.spills_in_flight(), 0);
    EXPECT_EQ(pool.disk()->stats().records, 0);
    EXPECT_EQ(pool.disk()->stats().extents_used, 0);
    EXPECT_EQ(pc.pages_disk(), 0);
    pool.release(b);
    pool.prefix_cache()->clear(pool.allocator());
    EXPECT_EQ(pool.allocator().num_used(), 0);
    EXPECT_EQ(pool.host_allocator().num_used(), 0);
  }
}

TEST(PrefixCacheSpillAsync, AWriteThatFailsInFlightIsNeverVisibleAndFreesItsRecord) {
  auto gate = std::make_shared<WriteGate>();
  TieredPool tp = gated(4, 0, gate);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  // The first spill (page 2, the deepest) is cut short by the kernel, after the gate.
  pool.disk()->set_fault_hook(inject_next(IoOp::kWrite, InjectedFault::kShortIo, 1));
  gate->close();
  force_out(pool, /*settle=*/false);
  const PrefixCache& pc = *pool.prefix_cache();
  EXPECT_EQ(pc.pages_spilling(), 3);
  EXPECT_EQ(pc.stats().spill_faults, 0);  // not known yet
  gate->open();
  pool.prefix_cache()->poll_spills();
  EXPECT_EQ(pc.stats().spill_faults, 1);
  EXPECT_EQ(pc.stats().evicted, 1);
  EXPECT_EQ(pc.size(), 2);
  EXPECT_EQ(pc.pages_disk(), 2);
  EXPECT_EQ(pool.disk()->stats().records, 2);  // the failed one left nothing
  EXPECT_EQ(pool.disk()->stats().fault_count(DiskFault::kShortIo), 1);
  BlockTable b;
  EXPECT_EQ(pool.share_prefix(b, s, t, 3), 2);  // page 2 is not found, never read
  for (int i = 0; i < 2; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]);
  EXPECT_EQ(pc.stats().restore_faults, 0);
  pool.release(b);
}

TEST(PrefixCacheSpillAsync, ClearAndDestructionWaitForTheWritesAndLeakNothing) {
  for (bool destroy : {false, true}) {
    auto gate = std::make_shared<WriteGate>();
    TieredPool tp = gated(4, 1, gate);
    KvPool& pool = *tp.pool;
    cache_and_end(pool, PrefixCache::salt_of("a"), tokens(13), 3);
    gate->close();
    force_out(pool, /*settle=*/false);
    ASSERT_EQ(pool.prefix_cache()->spills_in_flight(), 2);
    // The writes complete a little later, on another thread, while clear() or the pool's
    // destruction waits for them.
    std::thread opener([gate] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gate->open();
    });
    if (destroy) {
      tp.pool.reset();  // the cache goes first and frees its records; the tier then checks that
                        // no op is unfinished (it aborts otherwise)
    } else {
      pool.prefix_cache()->clear(pool.allocator());
      EXPECT_EQ(pool.prefix_cache()->spills_in_flight(), 0);
      EXPECT_EQ(pool.allocator().num_used(), 0);
      EXPECT_EQ(pool.host_allocator().num_used(), 0);
      EXPECT_EQ(pool.disk()->stats().records, 0);
      EXPECT_EQ(pool.disk()->stats().extents_used, 0);
    }
    opener.join();
    EXPECT_EQ(gate->num_held(), 0);
  }
}

TEST(PrefixCacheSpillAsync, SynchronousSpillsNameTheRecordBeforeTheAllocationReturns) {
  TieredPool tp = tiered(4, 0, true);
  KvPool& pool = *tp.pool;
  pool.prefix_cache()->set_async_spills(false);
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool, /*settle=*/false);
  const PrefixCache& pc = *pool.prefix_cache();
  EXPECT_EQ(pc.spills_in_flight(), 0);
  EXPECT_EQ(pc.pages_disk(), 3);
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]);
  EXPECT_EQ(pc.stats().hit_pages_disk, 3);
  pool.release(b);
}

TEST(PrefixCacheSpillAsync, SwapGetsSpilledHostSlotsAtOnceAndRoomTakenByWritesInFlight) {
  auto gate = std::make_shared<WriteGate>();
  TieredPool tp = gated(4, 3, gate);
  KvPool& pool = *tp.pool;
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(13);
  const auto kv = cache_and_end(pool, s, t, 3);
  force_out(pool);
  ASSERT_EQ(pool.prefix_cache()->pages_host(), 3);
  gate->close();
  // A sequence of 3 pages swaps out to the host tier: the cache's pages leave their slots for
  // disk writes that are still held, and the swap does not wait for them.
  BlockTable seq;
  ASSERT_TRUE(pool.reserve(seq, 12));
  SwapStats st;
  auto done = swap_out(pool, seq, &st);
  ASSERT_TRUE(done.ok() && *done);
  EXPECT_EQ(st.to_disk, 0);
  EXPECT_EQ(pool.prefix_cache()->pages_spilling(), 3);
  EXPECT_EQ(gate->num_held(), 3);
  gate->open();
  BlockTable b;
  ASSERT_EQ(pool.share_prefix(b, s, t, 3), 3);  // polls first: the pages are on disk now
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read(pool, b.blocks[i]), kv[i]);
  EXPECT_EQ(pool.prefix_cache()->stats().hit_pages_disk, 3);
  pool.release(b);
  pool.release(seq);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  EXPECT_EQ(pool.disk()->stats().records, 0);
}

// Random traffic over every tier (sequences caching, sharing and holding prompts with common
// prefixes for two tenants, allocations that evict, spill-ahead, swap and disk reclaiming): after
// every operation the indices hold exactly what a scan of the cache would pick, the evictable
// count is the cached blocks no one else holds, the reclaimable host slots are the cache's host
// pages, and at the end nothing is left on any tier.
TEST(PrefixCacheIndex, RandomTrafficKeepsTheIndicesEqualToAScan) {
  TieredPool tp = tiered(12, 5, true);
  KvPool& pool = *tp.pool;
  PrefixCache& pc = *pool.prefix_cache();
  pool.set_prefix_free_target(3);
  std::mt19937 gen(20261204);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  const uint64_t salts[2] = {PrefixCache::salt_of("a"), PrefixCache::salt_of("b")};
  // Prompts of 1-4 pages over a few shared stems, so chains share and diverge.
  auto prompt = [&](int pages) {
    std::vector<int32_t> t(static_cast<size_t>(pages) * kBlock + 1);
    const int stem = uniform(0, 3);
    const int branch = uniform(0, 2);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<int32_t>(i < kBlock ? stem * 100 + i : stem * 100 + branch * 10000 + i);
    return t;
  };
  std::vector<BlockTable> held;
  auto check = [&](int op, const char* what) {
    ASSERT_TRUE(pc.index_consistent()) << "op " << op << " " << what;
    int sole = 0;
    for (int32_t b = 0; b < pool.allocator().num_blocks(); ++b)
      sole += pc.holds(b) && pool.allocator().refcount(b) == 1;
    ASSERT_EQ(pc.evictable(pool.allocator()), sole) << "op " << op << " " << what;
    ASSERT_EQ(pc.reclaimable_host(), pc.pages_host() + pc.landings_in_flight())
        << "op " << op << " " << what;
  };
  for (int op = 0; op < 3000; ++op) {
    const uint64_t salt = salts[uniform(0, 1)];
    switch (uniform(0, 7)) {
      case 0:
      case 1: {  // a sequence shares what is cached, computes the rest, caches it, maybe holds on
        const std::vector<int32_t> t = prompt(uniform(1, 4));
        BlockTable a;
        const int pages = static_cast<int>(t.size()) / kBlock;
        pool.share_prefix(a, salt, t, pages);
        if (!pool.reserve(a, static_cast<int>(t.size()))) {
          pool.release(a);
          check(op, "refused reserve");
          break;
        }
        pool.cache_prefix(a, salt, t, pages);
        if (held.size() < 3 && uniform(0, 1) == 0)
          held.push_back(std::move(a));
        else
          pool.release(a);
        check(op, "cache");
        break;
      }
      case 2:  // a held sequence ends
        if (!held.empty()) {
          const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(held.size()) - 1));
          pool.release(held[i]);
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        }
        check(op, "release");
        break;
      case 3: {  // a large allocation evicts (and spills)
        BlockTable c;
        if (pool.reserve(c, uniform(1, 10) * kBlock)) pool.release(c);
        check(op, "evicting reserve");
        break;
      }
      case 4:
        pool.spill_prefix_ahead();
        check(op, "spill ahead");
        break;
      case 5:
        pool.poll_prefix_spills();
        check(op, "poll");
        break;
      case 6: {  // swap or a semantic original wants host slots
        auto slots = pool.allocate_host_slots(uniform(1, 3));
        if (slots)
          for (int32_t sl : *slots) pool.host_allocator().decref(sl);
        check(op, "host slots");
        break;
      }
      case 7:
        pool.make_disk_room(static_cast<int64_t>(uniform(1, 4)) *
                            pool.disk()->stats().extent_bytes);
        check(op, "disk room");
        break;
    }
  }
  EXPECT_GT(pc.stats().spilled_host, 0);
  EXPECT_GT(pc.stats().spilled_disk, 0);
  EXPECT_GT(pc.stats().hit_pages_host + pc.stats().hit_pages_disk, 0);
  EXPECT_GT(pc.stats().ahead_started, 0);
  EXPECT_GT(pc.stats().reclaimed, 0);
  for (BlockTable& t : held) pool.release(t);
  pc.clear(pool.allocator());
  EXPECT_EQ(pool.allocator().num_used(), 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
  EXPECT_EQ(pool.disk()->stats().records, 0);
}

}  // namespace
}  // namespace kvsplit::kv
