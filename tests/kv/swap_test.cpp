#include "kv/swap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "forwarding_backend.h"
#include "kv/kv_pool.h"
#include "kv/migrate.h"
#include "kv/page_ops.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

constexpr int kLayers = 3, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

struct Pool {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KvPool> pool;

  // `options`: the CPU backend's (threads defaults to 1; async_copies and fenced_copy_delay_us
  // for host prefetches in flight). `wrap`: wraps that backend (fault injection); unset: none.
  Pool(int blocks, int host_pages, int quant_blocks = 0, backend::BackendOptions options = {},
       const std::function<std::unique_ptr<backend::Backend>(std::unique_ptr<backend::Backend>)>&
           wrap = nullptr) {
    if (options.threads <= 0) options.threads = 1;
    be = std::move(backend::create_backend("cpu", options)).value();
    if (wrap) be = wrap(std::move(be));
    KvPoolConfig c;
    c.num_blocks = blocks;
    c.block_size = kBlock;
    c.int8_blocks = quant_blocks;
    c.int4_blocks = quant_blocks;
    c.summary_slots = quant_blocks;
    c.host_bytes = host_pages * KvPool::block_bytes(c, KvShape{kLayers, kKvHeads, kHeadDim});
    pool = std::move(KvPool::create(*be, c, KvShape{kLayers, kKvHeads, kHeadDim})).value();
  }
  int64_t floats() const { return pool->page_layer_bytes(KvPrecision::kFull) / 4; }
  void fill(const BlockTable& t, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    for (int l = 0; l < kLayers; ++l)
      for (int32_t b : t.blocks) {
        float* p = static_cast<float*>(pool->layer(l).data) + b * floats();
        for (int64_t i = 0; i < floats(); ++i) p[i] = n(rng);
      }
  }
  // Every layer of every device page at full precision, in page order (-1 blocks skipped).
  std::vector<float> read(const BlockTable& t) {
    std::vector<float> out;
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      if (t.blocks[i] < 0 || (!t.pages.empty() && t.pages[i].precision != KvPrecision::kFull))
        continue;
      for (int l = 0; l < kLayers; ++l) {
        const float* p = static_cast<const float*>(pool->layer(l).data) + t.blocks[i] * floats();
        out.insert(out.end(), p, p + floats());
      }
    }
    return out;
  }
  void expect_all_free() {
    EXPECT_EQ(pool->allocator().num_used(), 0);
    EXPECT_EQ(pool->host_allocator().num_used(), 0);
    EXPECT_EQ(pool->summary_allocator().num_used(), 0);
    EXPECT_EQ(pool->arena_allocator(KvPrecision::kInt8).num_used(), 0);
    EXPECT_EQ(pool->arena_allocator(KvPrecision::kInt4).num_used(), 0);
  }
};

TEST(Swap, OutAndInIsBitExactAndFreesTheDeviceBlocks) {
  Pool p(8, 8);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock + 1));  // 4 pages, the last partial
  p.fill(t, 7);
  const std::vector<float> before = p.read(t);
  SwapStats st;
  auto out = swap_out(*p.pool, t, &st);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_TRUE(*out);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 4);
  EXPECT_EQ(swapped_pages(t), 4);
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    EXPECT_EQ(t.blocks[i], -1);
    EXPECT_EQ(t.pages[i].location, PageLocation::kHost);
    EXPECT_GE(t.pages[i].original, 0);
  }
  EXPECT_EQ(t.full_blocks(), 0);
  // Other sequences use (and overwrite) the freed blocks meanwhile.
  BlockTable other;
  ASSERT_TRUE(p.pool->reserve(other, 8 * kBlock));
  p.fill(other, 99);
  p.pool->release(other);

  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_TRUE(*in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(swapped_pages(t), 0);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(st.swaps_out, 1);
  EXPECT_EQ(st.swaps_in, 1);
  EXPECT_EQ(st.pages_out, 4);
  EXPECT_EQ(st.pages_in, 4);
  EXPECT_EQ(st.bytes_out, 4 * kLayers * p.pool->page_layer_bytes(KvPrecision::kFull));
  EXPECT_EQ(st.bytes_in, st.bytes_out);
  // A host-tier swap-in without a prefetch copies at the swap-in: a miss.
  EXPECT_EQ(st.host_prefetch_misses, 1);
  EXPECT_EQ(st.host_prefetch_hits, 0);
  p.pool->release(t);
  p.expect_all_free();
}

TEST(Swap, HostTierTooSmallRefusesAndChangesNothing) {
  Pool p(8, 3);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 4 * kBlock));
  p.fill(t, 3);
  const std::vector<int32_t> blocks = t.blocks;
  const std::vector<float> before = p.read(t);
  SwapStats st;
  auto out = swap_out(*p.pool, t, &st);
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(*out);
  EXPECT_EQ(st.refused_host_full, 1);
  EXPECT_EQ(st.swaps_out, 0);
  EXPECT_EQ(t.blocks, blocks);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  p.pool->release(t);
  p.expect_all_free();
}

TEST(Swap, InWithTooFewFreeBlocksRefusesAndKeepsTheHostCopy) {
  Pool p(4, 4);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock));
  p.fill(t, 5);
  const std::vector<float> before = p.read(t);
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  BlockTable hog;
  ASSERT_TRUE(p.pool->reserve(hog, 2 * kBlock));  // 2 of 4 blocks left: 3 are needed
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok());
  EXPECT_FALSE(*in);
  EXPECT_EQ(st.refused_no_blocks, 1);
  EXPECT_EQ(swapped_pages(t), 3);
  EXPECT_EQ(p.pool->allocator().num_used(), 2);
  p.pool->release(hog);
  ASSERT_TRUE(*swap_in(*p.pool, t, &st));
  EXPECT_EQ(p.read(t), before);
  p.pool->release(t);
  p.expect_all_free();
}

TEST(Swap, ReleaseWhileSwappedOutFreesTheHostSlots) {
  Pool p(8, 8);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 5 * kBlock));
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  EXPECT_EQ(p.pool->host_allocator().num_used(), 5);
  p.pool->release(t);  // a request cancelled while paused
  p.expect_all_free();
}

TEST(Swap, QuantizedAndEvictedPagesStayWhereTheyAre) {
  Pool p(8, 8, 8);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 4 * kBlock));
  p.fill(t, 11);
  PageOpStats ops;
  ASSERT_TRUE(apply_page_transitions(*p.pool, t, 4 * kBlock,
                                     std::vector<PageTransition>{
                                         {0, PageOp::kDemote, KvPrecision::kInt8},
                                         {1, PageOp::kEvict, KvPrecision::kInt8},
                                     },
                                     &ops)
                  .ok());
  const int32_t int8_block = t.blocks[0];
  const int32_t page0_original = t.pages[0].original, page1_original = t.pages[1].original;
  const std::vector<float> full_before = p.read(t);  // pages 2 and 3
  EXPECT_EQ(swappable_pages(t), 2);
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  EXPECT_EQ(st.pages_out, 2);
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);
  EXPECT_EQ(t.pages[0].location, PageLocation::kDevice);
  EXPECT_EQ(t.blocks[0], int8_block);
  EXPECT_EQ(t.pages[0].original, page0_original);
  EXPECT_EQ(t.pages[1].location, PageLocation::kEvicted);
  EXPECT_EQ(t.pages[1].original, page1_original);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  ASSERT_TRUE(*swap_in(*p.pool, t, &st));
  EXPECT_EQ(p.read(t), full_before);
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);
  EXPECT_EQ(t.blocks[0], int8_block);
  p.pool->release(t);
  p.expect_all_free();
}

// The disk tier below a full host tier: one record per swapped table, bit-exact, and faults that
// leave nothing behind.
struct DiskPool : Pool {
  testing::TempDir dir;
  DiskTier* disk = nullptr;
  explicit DiskPool(int blocks, int host_pages = 0, int64_t extents = 64)
      : Pool(blocks, host_pages) {
    DiskTierConfig c;
    c.path = dir.path().string();
    c.extent_bytes = 4096;
    c.capacity_bytes = extents * c.extent_bytes;
    auto t = DiskTier::open(c);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    disk = t->get();
    pool->attach_disk(std::move(t).value());
  }
};

TEST(SwapDisk, HostTierFullGoesToDiskAndBackBitExact) {
  DiskPool p(8, /*host_pages=*/1);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock + 2));  // 4 pages, the last partial
  p.fill(t, 21);
  const std::vector<float> before = p.read(t);
  SwapStats st;
  auto out = swap_out(*p.pool, t, &st);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_TRUE(*out);
  EXPECT_EQ(st.to_disk, 1);
  EXPECT_NE(t.disk_record, 0u);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(swapped_pages(t), 4);
  for (const PageEntry& e : t.pages) EXPECT_EQ(e.location, PageLocation::kDisk);
  EXPECT_EQ(p.disk->stats().records, 1);
  BlockTable other;  // the freed blocks are reused and overwritten meanwhile
  ASSERT_TRUE(p.pool->reserve(other, 8 * kBlock));
  p.fill(other, 77);
  p.pool->release(other);
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_TRUE(*in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.from_disk, 1);
  EXPECT_EQ(st.prefetch_misses, 1);  // read at the swap-in: nothing was read ahead
  EXPECT_EQ(st.prefetch_hits, 0);
  EXPECT_EQ(t.disk_record, 0u);
  EXPECT_EQ(p.disk->stats().records, 0);
  EXPECT_EQ(p.disk->stats().extents_used, 0);
  p.pool->release(t);
  p.expect_all_free();
}

TEST(SwapDisk, CorruptRecordIsAnErrorAndReleaseFreesIt) {
  DiskPool p(8);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 2 * kBlock));
  p.fill(t, 5);
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  p.disk->set_fault_hook(inject_next(IoOp::kRead, InjectedFault::kCorrupt, 1));
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kDataLoss) << in.status().to_string();
  EXPECT_EQ(st.disk_faults, 1);
  EXPECT_EQ(st.swaps_in, 0);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);  // the blocks it took were given back
  EXPECT_EQ(swapped_pages(t), 2);                // unchanged: the caller recomputes
  p.pool->release(t);
  EXPECT_EQ(p.disk->stats().records, 0);
  EXPECT_EQ(p.disk->stats().extents_used, 0);
  p.expect_all_free();
}

TEST(SwapDisk, FailedOrFullDiskWriteRefusesAndChangesNothing) {
  for (int fault = 0; fault < 3; ++fault) {
    // 0: ENOSPC injected, 1: EIO injected, 2: the tier's capacity (1 extent) too small.
    DiskPool p(8, 0, fault == 2 ? 1 : 64);
    if (fault == 0) p.disk->set_fault_hook(inject_next(IoOp::kWrite, InjectedFault::kNoSpace, 1));
    if (fault == 1) p.disk->set_fault_hook(inject_next(IoOp::kWrite, InjectedFault::kIoError, 1));
    BlockTable t;
    ASSERT_TRUE(p.pool->reserve(t, 4 * kBlock));
    p.fill(t, 9);
    const std::vector<int32_t> blocks = t.blocks;
    const std::vector<float> before = p.read(t);
    SwapStats st;
    auto out = swap_out(*p.pool, t, &st);
    ASSERT_TRUE(out.ok()) << fault << ": " << out.status().to_string();
    EXPECT_FALSE(*out) << fault;
    EXPECT_EQ(st.disk_faults, 1) << fault;
    EXPECT_EQ(t.blocks, blocks);
    EXPECT_EQ(t.disk_record, 0u);
    EXPECT_EQ(p.read(t), before);
    EXPECT_EQ(p.disk->stats().extents_used, 0) << fault;
    p.pool->release(t);
    p.expect_all_free();
  }
}

// A table partly in the host tier (a swap-out, then one page migrated back) is not split across
// host and disk when the host tier is full: swap_in reads a table from one tier, and read the host
// pages' slots as offsets into the record. The swap-out is refused; the pages come back bit-exact.
TEST(SwapDisk, ATablePartlyInTheHostTierDoesNotGoToDisk) {
  DiskPool p(8, /*host_pages=*/4);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock + 2));
  p.fill(t, 5);
  const std::vector<float> before = p.read(t);
  SwapStats st;
  auto out = swap_out(*p.pool, t, &st);
  ASSERT_TRUE(out.ok() && *out) << out.status().to_string();
  auto moved = migrate_pages(*p.pool, t, 0, 4, /*to_shard=*/0, nullptr, /*max_pages=*/1);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  ASSERT_EQ(*moved, 1);
  ASSERT_EQ(swapped_pages(t), 3);
  BlockTable other;  // takes the last host slot
  ASSERT_TRUE(p.pool->reserve(other, kBlock));
  auto filled = swap_out(*p.pool, other, &st);
  ASSERT_TRUE(filled.ok() && *filled);
  ASSERT_EQ(p.pool->host_allocator().num_free(), 0);

  out = swap_out(*p.pool, t, &st);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_FALSE(*out);
  EXPECT_EQ(t.disk_record, 0u);
  EXPECT_EQ(p.disk->stats().records, 0);
  EXPECT_EQ(swapped_pages(t), 3);
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok() && *in) << in.status().to_string();
  EXPECT_EQ(p.read(t), before);
  p.pool->release(t);
  p.pool->release(other);
  p.expect_all_free();
}

// One disk record per table: a table with a record is not swapped out again, not even to a host
// tier with room (swap_in reads a table from one tier).
TEST(SwapDisk, ATableWithARecordIsNotSwappedOutAgain) {
  DiskPool p(8, /*host_pages=*/1);
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 2 * kBlock));
  p.fill(t, 9);
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  const uint64_t record = t.disk_record;
  ASSERT_NE(record, 0u);
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock));  // a page on the device beside the record
  EXPECT_FALSE(*swap_out(*p.pool, t, &st));
  EXPECT_EQ(t.disk_record, record);
  EXPECT_EQ(p.disk->stats().records, 1);
  p.pool->release(t);
  EXPECT_EQ(p.disk->stats().records, 0);
}

// The semantic cut's transitions are refused on swapped-out pages (host or disk): a restore would
// read the swap slot, or the page's place in the disk record, as a host original.
TEST(SwapDisk, PageTransitionsOnSwappedOutPagesAreRefused) {
  DiskPool p(8, /*host_pages=*/4);
  BlockTable host, disk;
  ASSERT_TRUE(p.pool->reserve(host, 2 * kBlock));
  ASSERT_TRUE(p.pool->reserve(disk, 3 * kBlock));
  p.fill(host, 6);
  p.fill(disk, 7);
  const std::vector<float> before = p.read(host);
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, host, &st));  // 2 of the 4 host slots
  ASSERT_TRUE(*swap_out(*p.pool, disk, &st));  // 3 pages: the disk record
  ASSERT_NE(disk.disk_record, 0u);
  for (BlockTable* t : {&host, &disk}) {
    for (PageOp op : {PageOp::kRestore, PageOp::kDemote, PageOp::kEvict}) {
      const PageTransition tr{0, op,
                              op == PageOp::kEvict    ? KvPrecision::kEvicted
                              : op == PageOp::kDemote ? KvPrecision::kInt8
                                                      : KvPrecision::kFull};
      PageOpStats ops;
      const Status s = apply_page_transitions(*p.pool, *t, 2 * kBlock, {&tr, 1}, &ops);
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    }
  }
  EXPECT_EQ(p.pool->host_allocator().num_used(), 2);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  ASSERT_TRUE(*swap_in(*p.pool, host, &st));
  EXPECT_EQ(p.read(host), before);
  p.pool->release(host);
  p.pool->release(disk);
  p.expect_all_free();
}

// Swaps `t` (4 pages, filled) out to the disk tier of `p` (no host tier).
std::vector<float> swap_to_disk(DiskPool& p, BlockTable& t, SwapStats* st) {
  EXPECT_TRUE(p.pool->reserve(t, 3 * kBlock + 1));
  p.fill(t, 33);
  std::vector<float> before = p.read(t);
  auto out = swap_out(*p.pool, t, st);
  EXPECT_TRUE(out.ok() && *out);
  EXPECT_NE(t.disk_record, 0u);
  return before;
}

TEST(SwapPrefetch, ReadAheadSwapInIsBitExactAndAHit) {
  DiskPool p(8);
  BlockTable t;
  SwapStats st;
  const std::vector<float> before = swap_to_disk(p, t, &st);
  SwapPrefetch pf;
  auto started = start_prefetch(*p.pool, t, &pf, &st);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  ASSERT_TRUE(*started);
  EXPECT_EQ(st.prefetches, 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!prefetch_ready(*p.pool, pf) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_TRUE(prefetch_ready(*p.pool, pf));
  auto in = swap_in(*p.pool, t, &st, &pf);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_TRUE(*in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.prefetch_hits, 1);
  EXPECT_EQ(st.prefetch_misses, 0);
  EXPECT_EQ(st.from_disk, 1);
  EXPECT_EQ(pf.record, 0u);  // consumed
  EXPECT_EQ(p.disk->stats().records, 0);
  p.pool->release(t);
  p.expect_all_free();
  // Nothing to read ahead for a table without a disk record.
  EXPECT_FALSE(*start_prefetch(*p.pool, t, &pf, &st));
}

TEST(SwapPrefetch, SwapInRightAfterTheStartWaitsAndIsAMissOrAHit) {
  DiskPool p(8);
  BlockTable t;
  SwapStats st;
  const std::vector<float> before = swap_to_disk(p, t, &st);
  SwapPrefetch pf;
  ASSERT_TRUE(*start_prefetch(*p.pool, t, &pf, &st));
  auto in = swap_in(*p.pool, t, &st, &pf);  // the read may still be in flight: waited for
  ASSERT_TRUE(in.ok() && *in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.prefetch_hits + st.prefetch_misses, 1);
  p.pool->release(t);
  EXPECT_EQ(p.disk->stats().records, 0);
  p.expect_all_free();
}

TEST(SwapPrefetch, FaultDuringPrefetchIsAnErrorAndReleaseFreesEverything) {
  DiskPool p(8);
  BlockTable t;
  SwapStats st;
  swap_to_disk(p, t, &st);
  p.disk->set_fault_hook(inject_next(IoOp::kRead, InjectedFault::kCorrupt, 1));
  SwapPrefetch pf;
  ASSERT_TRUE(*start_prefetch(*p.pool, t, &pf, &st));
  auto in = swap_in(*p.pool, t, &st, &pf);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kDataLoss) << in.status().to_string();
  EXPECT_EQ(st.disk_faults, 1);
  EXPECT_EQ(st.prefetch_misses, 1);  // its data was no use: the caller recomputes
  EXPECT_EQ(st.prefetch_hits, 0);
  EXPECT_EQ(pf.record, 0u);
  EXPECT_EQ(swapped_pages(t), 4);                // unchanged
  EXPECT_EQ(p.pool->allocator().num_used(), 0);  // the blocks it took were given back
  p.pool->release(t);
  EXPECT_EQ(p.disk->stats().records, 0);
  EXPECT_EQ(p.disk->stats().extents_used, 0);
  p.expect_all_free();
}

TEST(SwapPrefetch, CancelDuringAPrefetchReleasesEverythingOnlyOnceTheReadIsDropped) {
  DiskPool p(8);
  {
    // The owner's order (sched::Worker::release_kv): drop the prefetch, then release.
    BlockTable t;
    SwapStats st;
    swap_to_disk(p, t, &st);
    auto pf = std::make_unique<SwapPrefetch>();
    ASSERT_TRUE(*start_prefetch(*p.pool, t, pf.get(), &st));
    pf.reset();  // waits for the read
    p.pool->release(t);
    EXPECT_EQ(p.disk->stats().records, 0);
    EXPECT_EQ(p.disk->stats().extents_used, 0);
    p.expect_all_free();
  }
  {
    // The other order would leak the record: it cannot be freed while read.
    BlockTable t;
    SwapStats st;
    swap_to_disk(p, t, &st);
    SwapPrefetch pf;
    ASSERT_TRUE(*start_prefetch(*p.pool, t, &pf, &st));
    const uint64_t record = t.disk_record;
    p.pool->release(t);
    EXPECT_EQ(p.disk->stats().records, 1);
    ASSERT_TRUE(p.disk->wait(pf.op).ok());
    EXPECT_TRUE(p.disk->free(record).ok());  // (cleanup)
    EXPECT_EQ(p.disk->stats().records, 0);
  }
}

// ---- The host tier's prefetch (start_host_prefetch): blocks reserved and the copy started a
// step ahead on the backend's copy thread (BackendOptions::async_copies). ----

backend::BackendOptions async_copies(int64_t delay_us = 0) {
  backend::BackendOptions o;
  o.async_copies = true;
  o.fenced_copy_delay_us = delay_us;
  return o;
}

// Swaps `t` (4 pages, the last partial, filled) out to the host tier of `p` and lets another
// table overwrite every freed block; returns the pages' bytes.
std::vector<float> swap_to_host(Pool& p, BlockTable& t, SwapStats* st) {
  EXPECT_TRUE(p.pool->reserve(t, 3 * kBlock + 1));
  p.fill(t, 61);
  std::vector<float> before = p.read(t);
  auto out = swap_out(*p.pool, t, st);
  EXPECT_TRUE(out.ok() && *out);
  EXPECT_EQ(t.disk_record, 0u);
  BlockTable other;
  EXPECT_TRUE(p.pool->reserve(other, p.pool->allocator().num_free() * kBlock));
  p.fill(other, 62);
  p.pool->release(other);
  return before;
}

TEST(SwapHostPrefetch, ALandedCopyIsAHitAndBitExact) {
  Pool p(8, 8, 0, async_copies());
  BlockTable t;
  SwapStats st;
  const std::vector<float> before = swap_to_host(p, t, &st);
  auto started = start_host_prefetch(*p.pool, t, 8, &st);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  ASSERT_TRUE(*started);
  EXPECT_EQ(st.host_prefetches, 1);
  EXPECT_EQ(host_prefetch_blocks(t), 4);
  EXPECT_EQ(p.pool->allocator().num_used(), 4);  // reserved a step early
  EXPECT_EQ(swapped_pages(t), 4);                // still on the host until the swap-in
  EXPECT_EQ(p.pool->host_allocator().num_used(), 4);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!host_prefetch_landed(*p.pool, t) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_TRUE(host_prefetch_landed(*p.pool, t));
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_TRUE(*in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.host_prefetch_hits, 1);
  EXPECT_EQ(st.host_prefetch_misses, 0);
  EXPECT_EQ(st.refused_no_blocks, 0);
  EXPECT_EQ(host_prefetch_blocks(t), 0);  // consumed
  EXPECT_EQ(p.pool->allocator().num_used(), 4);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  p.pool->release(t);
  p.expect_all_free();
}

// The copy is still in flight when the swap-in runs (a slow link: each fenced batch starts 1 s
// after it was queued, long after the swap-in however slowly this thread runs): the swap-in waits
// for it (a miss), the host slots are kept until it landed, and the pages are bit-exact.
TEST(SwapHostPrefetch, ACopyInFlightIsWaitedForAMissAndTheSlotsOutliveIt) {
  Pool p(8, 8, 0, async_copies(1'000'000));
  BlockTable t;
  SwapStats st;
  const std::vector<float> before = swap_to_host(p, t, &st);
  // Before the copy is queued: it cannot land before t0 + 1 s, so a swap-in that returned
  // earlier did not wait for it.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(*start_host_prefetch(*p.pool, t, 8, &st));
  EXPECT_FALSE(host_prefetch_landed(*p.pool, t));
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok() && *in);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.host_prefetch_hits, 0);
  EXPECT_EQ(st.host_prefetch_misses, 1);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  p.pool->release(t);
  p.expect_all_free();
}

// Dropping (the sequence was not resumed, or its blocks are needed): the copy is waited for, the
// blocks come back, the host copy stays and a later swap-in without a prefetch is bit-exact.
TEST(SwapHostPrefetch, DropFreesTheBlocksAndKeepsTheHostCopy) {
  Pool p(8, 8, 0, async_copies(50000));
  BlockTable t;
  SwapStats st;
  const std::vector<float> before = swap_to_host(p, t, &st);
  const std::vector<PageEntry> pages = t.pages;
  ASSERT_TRUE(*start_host_prefetch(*p.pool, t, 8, &st));
  EXPECT_EQ(p.pool->allocator().num_used(), 4);
  drop_host_prefetch(*p.pool, t, &st);
  EXPECT_EQ(st.host_prefetch_dropped, 1);
  EXPECT_EQ(host_prefetch_blocks(t), 0);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 4);
  ASSERT_EQ(t.pages.size(), pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(t.pages[i].location, PageLocation::kHost);
    EXPECT_EQ(t.pages[i].original, pages[i].original);
  }
  drop_host_prefetch(*p.pool, t, &st);  // none held: nothing happens, nothing counted
  EXPECT_EQ(st.host_prefetch_dropped, 1);
  // The freed blocks are overwritten before the swap-in copies the host pages back.
  BlockTable other;
  ASSERT_TRUE(p.pool->reserve(other, 8 * kBlock));
  p.fill(other, 63);
  p.pool->release(other);
  ASSERT_TRUE(*swap_in(*p.pool, t, &st));
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.host_prefetch_misses, 1);
  p.pool->release(t);
  p.expect_all_free();
}

// A request cancelled with its prefetch in flight: KvPool::release waits for the copy and frees
// the reserved blocks and the host slots.
TEST(SwapHostPrefetch, ReleaseWithACopyInFlightLeavesNothing) {
  Pool p(8, 8, 0, async_copies(50000));
  BlockTable t;
  SwapStats st;
  swap_to_host(p, t, &st);
  ASSERT_TRUE(*start_host_prefetch(*p.pool, t, 8, &st));
  EXPECT_FALSE(host_prefetch_landed(*p.pool, t));
  p.pool->release(t);
  EXPECT_TRUE(t.swap_prefetch.empty());
  p.expect_all_free();
}

// Refusals change nothing: more pages than the blocks it may take, more than the pool has free,
// a prefetch already held, nothing on the host tier.
TEST(SwapHostPrefetch, RefusalsChangeNothing) {
  Pool p(6, 8, 0, async_copies());
  BlockTable t;
  SwapStats st;
  swap_to_host(p, t, &st);
  EXPECT_FALSE(*start_host_prefetch(*p.pool, t, 3, &st));  // 4 pages, 3 allowed
  BlockTable hog;
  ASSERT_TRUE(p.pool->reserve(hog, 3 * kBlock));  // 3 of 6 free
  EXPECT_FALSE(*start_host_prefetch(*p.pool, t, 8, &st));
  EXPECT_EQ(p.pool->allocator().num_used(), 3);
  p.pool->release(hog);
  ASSERT_TRUE(*start_host_prefetch(*p.pool, t, 8, &st));
  EXPECT_FALSE(*start_host_prefetch(*p.pool, t, 8, &st));  // already held
  EXPECT_EQ(st.host_prefetches, 1);
  EXPECT_EQ(p.pool->allocator().num_used(), 4);
  ASSERT_TRUE(*swap_in(*p.pool, t, &st));
  EXPECT_FALSE(*start_host_prefetch(*p.pool, t, 8, &st));  // nothing on the host tier
  EXPECT_EQ(p.pool->allocator().num_used(), 4);
  p.pool->release(t);
  p.expect_all_free();
}

// The semantic cut's pages: quantized and evicted pages stay in their arenas / evicted; only the
// full-precision pages on the host tier are prefetched.
TEST(SwapHostPrefetch, QuantizedAndEvictedPagesStayPut) {
  Pool p(8, 8, 8, async_copies(20000));
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 4 * kBlock));
  p.fill(t, 17);
  PageOpStats ops;
  ASSERT_TRUE(apply_page_transitions(*p.pool, t, 4 * kBlock,
                                     std::vector<PageTransition>{
                                         {0, PageOp::kDemote, KvPrecision::kInt8},
                                         {1, PageOp::kEvict, KvPrecision::kInt8},
                                     },
                                     &ops)
                  .ok());
  const int32_t int8_block = t.blocks[0];
  const std::vector<float> full_before = p.read(t);  // pages 2 and 3
  SwapStats st;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  ASSERT_TRUE(*start_host_prefetch(*p.pool, t, 8, &st));
  ASSERT_EQ(host_prefetch_blocks(t), 2);
  EXPECT_EQ(t.swap_prefetch[0].page, 2);
  EXPECT_EQ(t.swap_prefetch[1].page, 3);
  EXPECT_EQ(p.pool->allocator().num_used(), 2);
  ASSERT_TRUE(*swap_in(*p.pool, t, &st));
  EXPECT_EQ(p.read(t), full_before);
  EXPECT_EQ(st.host_prefetch_hits + st.host_prefetch_misses, 1);
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);
  EXPECT_EQ(t.blocks[0], int8_block);
  EXPECT_EQ(t.pages[1].location, PageLocation::kEvicted);
  p.pool->release(t);
  p.expect_all_free();
}

// A backend whose first fence wait reports a failed copy (a CUDA copy-stream error), after the
// copy has in fact run; `on_fail` then lets the test spoil what it wrote.
class FailFirstFence : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  StatusOr<bool> wait_fence(uint64_t fence, int64_t timeout_us) override {
    if (fence == 0 || failed_) return ForwardingBackend::wait_fence(fence, timeout_us);
    failed_ = true;
    (void)ForwardingBackend::wait_fence(fence, -1);  // never left in flight
    if (on_fail) on_fail();
    return internal_error("injected: fenced copy failed");
  }
  std::function<void()> on_fail;

 private:
  bool failed_ = false;
};

// The swap-in copies the pages again, synchronously, into the same blocks: bit-exact although
// the failed copy's blocks hold garbage, a miss and a fault; nothing leaks.
TEST(SwapHostPrefetch, AFailedCopyIsRedoneAtTheSwapInNeverWrong) {
  FailFirstFence* ff = nullptr;
  Pool p(8, 8, 0, async_copies(), [&ff](std::unique_ptr<backend::Backend> in) {
    auto w = std::make_unique<FailFirstFence>(std::move(in));
    ff = w.get();
    return std::unique_ptr<backend::Backend>(std::move(w));
  });
  BlockTable t;
  SwapStats st;
  const std::vector<float> before = swap_to_host(p, t, &st);
  ASSERT_TRUE(*start_host_prefetch(*p.pool, t, 8, &st));
  ff->on_fail = [&] {
    for (const PendingRestore& r : t.swap_prefetch)
      for (int l = 0; l < kLayers; ++l) {
        float* d = static_cast<float*>(p.pool->layer(l).data) + r.block * p.floats();
        std::fill(d, d + p.floats(), -7.f);
      }
  };
  auto in = swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_TRUE(*in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.host_prefetch_faults, 1);
  EXPECT_EQ(st.host_prefetch_misses, 1);
  EXPECT_EQ(st.host_prefetch_hits, 0);
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  p.pool->release(t);
  p.expect_all_free();
}

// A backend whose batched copies in one direction fail (a copy-stream error), fenced or not.
class FailCopies : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  using CopyDir = backend::Backend::CopyDir;
  using CopyRange = backend::Backend::CopyRange;
  Status copy_batch_async(CopyDir dir, const CopyRange* c, size_t n) override {
    if (fail && dir == fail_dir) return internal_error("injected: copy failed");
    return ForwardingBackend::copy_batch_async(dir, c, n);
  }
  StatusOr<uint64_t> copy_batch_fenced(CopyDir dir, const CopyRange* c, size_t n) override {
    if (fail && dir == fail_dir) return internal_error("injected: fenced copy failed");
    return ForwardingBackend::copy_batch_fenced(dir, c, n);
  }
  bool fail = false;
  CopyDir fail_dir = CopyDir::kDeviceToHost;
};

// A failed copy gives back what the call took, the table unchanged: a swap-out's host slots, a
// host prefetch's blocks. Both work once the copies do.
TEST(SwapHostPrefetch, AFailedCopyGivesBackTheSlotsAndBlocksItTook) {
  FailCopies* fc = nullptr;
  Pool p(8, 8, 0, async_copies(), [&fc](std::unique_ptr<backend::Backend> in) {
    auto w = std::make_unique<FailCopies>(std::move(in));
    fc = w.get();
    return std::unique_ptr<backend::Backend>(std::move(w));
  });
  BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock + 1));
  p.fill(t, 71);
  const std::vector<float> before = p.read(t);
  SwapStats st;
  fc->fail = true;
  EXPECT_FALSE(swap_out(*p.pool, t, &st).ok());
  EXPECT_EQ(p.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(swapped_pages(t), 0);
  fc->fail = false;
  ASSERT_TRUE(*swap_out(*p.pool, t, &st));
  fc->fail = true;
  fc->fail_dir = FailCopies::CopyDir::kHostToDevice;
  EXPECT_FALSE(start_host_prefetch(*p.pool, t, 8, &st).ok());
  EXPECT_TRUE(t.swap_prefetch.empty());
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  fc->fail = false;
  ASSERT_TRUE(*swap_in(*p.pool, t, &st));
  EXPECT_EQ(p.read(t), before);
  p.pool->release(t);
  p.expect_all_free();
}

}  // namespace
}  // namespace kvsplit::kv
