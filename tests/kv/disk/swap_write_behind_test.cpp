// Disk swap write-behind (kv/swap.h, swap_out; KvPool::SwapWrite): a disk swap-out frees its
// device blocks once the pages are staged and returns while the record is written. The writes are
// held in flight by a gate around the tier's I/O backend, so each state is reached on purpose:
// in flight at the swap-in (waited for), ended (the record read as any other), failed (the staging
// is the copy), released mid-write, and the cap on staged writes.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "disk_write_gate.h"
#include "kv/kv_pool.h"
#include "kv/page_pool_fixture.h"
#include "kv/swap.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

using testing::kBlock;

// A pool of `blocks` device pages and no host tier (every swap goes to disk), whose disk tier's
// writes pass through `gate`, with write-behind on.
struct GatedDiskPool : testing::PagePoolFixture {
  std::shared_ptr<WriteGate> gate = std::make_shared<WriteGate>();
  kvsplit::testing::TempDir dir;
  DiskTier* disk = nullptr;

  explicit GatedDiskPool(int blocks) : PagePoolFixture(/*host_pages=*/0, blocks, 0, 0) {
    DiskTierConfig dc;
    dc.path = dir.path().string();
    dc.extent_bytes = 4096;
    dc.capacity_bytes = 64 * dc.extent_bytes;
    dc.io.wrap = [g = gate](std::unique_ptr<BlockIo> io) -> std::unique_ptr<BlockIo> {
      return std::make_unique<GatedIo>(std::move(io), g);
    };
    auto t = DiskTier::open(dc);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    disk = t->get();
    pool->attach_disk(std::move(t).value());
    pool->set_disk_write_behind(true);
  }
  // Every page's bytes, in page order.
  std::vector<float> read(const BlockTable& t) {
    std::vector<float> out;
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      const std::vector<float> p = page(t, static_cast<int>(i));
      out.insert(out.end(), p.begin(), p.end());
    }
    return out;
  }
  // A table of 4 pages (the last partial), filled from `seed`, swapped out; returns its bytes.
  std::vector<float> swap_out_one(BlockTable& t, uint32_t seed, SwapStats* st) {
    EXPECT_TRUE(pool->reserve(t, 3 * kBlock + 1));
    fill(t, seed);
    std::vector<float> before = read(t);
    auto out = swap_out(*pool, t, st);
    EXPECT_TRUE(out.ok() && *out) << (out.ok() ? "refused" : out.status().to_string());
    EXPECT_NE(t.disk_record, 0u);
    return before;
  }
  // Every free device block is taken and overwritten, then freed again.
  void scribble() {
    BlockTable other;
    ASSERT_TRUE(pool->reserve(other, pool->allocator().num_free() * kBlock));
    fill(other, 999);
    pool->release(other);
  }
  void expect_nothing_left() {
    EXPECT_EQ(pool->allocator().num_used(), 0);
    EXPECT_TRUE(pool->swap_writes().empty());
    EXPECT_EQ(disk->stats().records, 0);
    EXPECT_EQ(disk->stats().extents_used, 0);
  }
};

// Waits (at most 10 s) until `done()`: the writer threads submit and finish on their own time.
template <class F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Opens `gate` after `ms` on its own thread (a swap-in or swap-out that waits for a held write).
std::thread open_later(const std::shared_ptr<WriteGate>& gate, int ms) {
  return std::thread([gate, ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    gate->open();
  });
}

TEST(SwapWriteBehind, TheSwapOutReturnsBeforeItsWriteAndTheSwapInReadsItBitExact) {
  GatedDiskPool p(8);
  SwapStats st;
  BlockTable t;
  p.gate->close();
  const std::vector<float> before = p.swap_out_one(t, 11, &st);
  EXPECT_EQ(st.to_disk, 1);
  EXPECT_EQ(st.write_behind, 1);
  ASSERT_TRUE(eventually([&] { return p.gate->num_held() == 1; }));  // being written
  EXPECT_EQ(p.pool->allocator().num_used(), 0);  // and the blocks are free already
  EXPECT_EQ(poll_swap_writes(*p.pool, &st), 0);
  ASSERT_EQ(p.pool->swap_writes().size(), 1u);
  // A read-ahead never reads a record before its write has ended.
  SwapPrefetch pf;
  EXPECT_FALSE(*start_prefetch(*p.pool, t, &pf, &st));
  EXPECT_EQ(st.prefetches, 0);
  p.scribble();
  p.gate->open();
  EXPECT_TRUE(eventually([&] { return poll_swap_writes(*p.pool, &st) == 1; }));
  EXPECT_TRUE(p.pool->swap_writes().empty());  // the record is the copy now
  EXPECT_EQ(st.disk_faults, 0);
  ASSERT_TRUE(*start_prefetch(*p.pool, t, &pf, &st));
  auto in = swap_in(*p.pool, t, &st, &pf);
  ASSERT_TRUE(in.ok() && *in) << (in.ok() ? "refused" : in.status().to_string());
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.from_disk, 1);
  EXPECT_EQ(st.write_behind_waits, 0);
  p.pool->release(t);
  p.expect_nothing_left();
}

TEST(SwapWriteBehind, ASwapInDuringTheWriteWaitsForItThenReadsTheRecord) {
  GatedDiskPool p(8);
  SwapStats st;
  BlockTable t;
  p.gate->close();
  const std::vector<float> before = p.swap_out_one(t, 12, &st);
  p.scribble();
  // Opened after 1 s: the swap-in below starts long before, however slowly this thread runs.
  std::thread opener = open_later(p.gate, 1000);
  auto in = swap_in(*p.pool, t, &st);  // waits for the held write
  opener.join();
  ASSERT_TRUE(in.ok() && *in) << (in.ok() ? "refused" : in.status().to_string());
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.write_behind_waits, 1);
  EXPECT_EQ(st.from_disk, 1);  // read back from the record, as without write-behind
  EXPECT_EQ(st.write_behind_rescues, 0);
  p.pool->release(t);
  p.expect_nothing_left();
}

TEST(SwapWriteBehind, AWriteThatFailsLeavesItsStagingAsTheCopyAndNothingIsRecomputed) {
  for (const InjectedFault fault :
       {InjectedFault::kIoError, InjectedFault::kNoSpace, InjectedFault::kShortIo}) {
    SCOPED_TRACE(static_cast<int>(fault));
    GatedDiskPool p(8);
    p.disk->set_fault_hook(inject_next(IoOp::kWrite, fault, 1));
    SwapStats st;
    BlockTable t;
    const std::vector<float> before = p.swap_out_one(t, 13, &st);
    // The write ends (failed) on the tier's I/O thread; the poll at a step boundary sees it.
    ASSERT_TRUE(eventually([&] { return poll_swap_writes(*p.pool, &st) == 1; }));
    EXPECT_EQ(st.disk_faults, 1);
    ASSERT_EQ(p.pool->swap_writes().size(), 1u);  // kept: the staging is the only copy
    EXPECT_EQ(p.disk->stats().records, 0);        // the tier freed the failed record
    EXPECT_EQ(poll_swap_writes(*p.pool, &st), 0);
    EXPECT_EQ(st.disk_faults, 1);  // counted once
    SwapPrefetch pf;
    EXPECT_FALSE(*start_prefetch(*p.pool, t, &pf, &st));  // nothing to read
    p.scribble();
    auto in = swap_in(*p.pool, t, &st, &pf);
    ASSERT_TRUE(in.ok() && *in) << (in.ok() ? "refused" : in.status().to_string());
    EXPECT_EQ(p.read(t), before);
    EXPECT_EQ(st.write_behind_rescues, 1);
    EXPECT_EQ(st.from_disk, 0);
    EXPECT_EQ(st.disk_faults, 1);
    EXPECT_EQ(t.disk_record, 0u);
    p.pool->release(t);
    p.expect_nothing_left();
  }
}

TEST(SwapWriteBehind, ReleaseDuringOrAfterTheWriteLeavesNothing) {
  GatedDiskPool p(8);
  SwapStats st;
  {
    // Released mid-write: the record cannot be freed yet; it is when the write ends.
    BlockTable t;
    p.gate->close();
    p.swap_out_one(t, 14, &st);
    ASSERT_TRUE(eventually([&] { return p.gate->num_held() == 1; }));
    p.pool->release(t);
    EXPECT_EQ(t.disk_record, 0u);
    EXPECT_EQ(p.disk->stats().records, 1);
    EXPECT_EQ(p.pool->swap_writes().size(), 1u);
    p.gate->open();
    EXPECT_TRUE(eventually([&] { return poll_swap_writes(*p.pool, &st) == 1; }));
    p.expect_nothing_left();
  }
  {
    // Released after a failed write: its staging goes with it.
    BlockTable t;
    p.disk->set_fault_hook(inject_next(IoOp::kWrite, InjectedFault::kIoError, 1));
    p.swap_out_one(t, 15, &st);
    ASSERT_TRUE(eventually([&] { return poll_swap_writes(*p.pool, &st) == 1; }));
    ASSERT_EQ(p.pool->swap_writes().size(), 1u);
    p.pool->release(t);
    p.expect_nothing_left();
  }
  {
    // The pool destroyed with a write held: it waits for the write and frees the record.
    GatedDiskPool q(8);
    BlockTable t;
    q.gate->close();
    q.swap_out_one(t, 16, &st);
    std::thread opener = open_later(q.gate, 20);
    q.pool.reset();  // waits for the write (ASan / TSan see what it leaves)
    opener.join();
    EXPECT_EQ(q.gate->num_held(), 0);
  }
}

TEST(SwapWriteBehind, AtTheCapTheOldestWriteIsWaitedForAndFailedOnesForceASynchronousWrite) {
  GatedDiskPool p(5 * 4);
  const int cap = KvPool::kMaxSwapWrites;
  SwapStats st;
  std::vector<BlockTable> t(static_cast<size_t>(cap) + 1);
  std::vector<std::vector<float>> before;
  // `cap` writes held in flight; the next swap-out waits for the oldest (opened meanwhile).
  p.gate->close();
  for (int i = 0; i < cap; ++i) before.push_back(p.swap_out_one(t[i], 20 + i, &st));
  ASSERT_TRUE(eventually([&] { return p.gate->num_held() == cap; }));
  std::thread opener = open_later(p.gate, 50);
  before.push_back(p.swap_out_one(t[cap], 20 + cap, &st));
  opener.join();
  EXPECT_EQ(st.write_behind, cap + 1);
  EXPECT_LE(static_cast<int>(p.pool->swap_writes().size()), cap);
  for (int i = 0; i <= cap; ++i) {
    auto in = swap_in(*p.pool, t[i], &st);
    ASSERT_TRUE(in.ok() && *in) << i;
    EXPECT_EQ(p.read(t[i]), before[i]) << i;
    p.pool->release(t[i]);
  }
  p.expect_nothing_left();
  // `cap` failed writes hold their staging (the only copies): the next swap-out is written
  // before it returns.
  p.disk->set_fault_hook(inject_next(IoOp::kWrite, InjectedFault::kIoError, cap));
  before.clear();
  SwapStats fs;
  for (int i = 0; i < cap; ++i) before.push_back(p.swap_out_one(t[i], 40 + i, &fs));
  ASSERT_TRUE(eventually([&] {
    poll_swap_writes(*p.pool, &fs);
    return fs.disk_faults == cap;
  }));
  ASSERT_EQ(static_cast<int>(p.pool->swap_writes().size()), cap);
  before.push_back(p.swap_out_one(t[cap], 40 + cap, &fs));
  EXPECT_EQ(fs.write_behind, cap);  // the last one was not staged
  EXPECT_EQ(p.pool->swap_write(t[cap].disk_record), nullptr);
  EXPECT_EQ(p.disk->stats().records, 1);
  for (int i = 0; i <= cap; ++i) {
    auto in = swap_in(*p.pool, t[i], &fs);
    ASSERT_TRUE(in.ok() && *in) << i;
    EXPECT_EQ(p.read(t[i]), before[i]) << i;
    p.pool->release(t[i]);
  }
  EXPECT_EQ(fs.write_behind_rescues, cap);
  EXPECT_EQ(fs.from_disk, 1);
  p.expect_nothing_left();
}

}  // namespace
}  // namespace kvsplit::kv
