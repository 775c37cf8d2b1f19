#include "sched/swap_cost.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <vector>

#include "forwarding_backend.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "test_util.h"

namespace kvsplit::sched {
namespace {

TEST(SwapCost, AutoPicksTheCheaperPrediction) {
  SwapCosts c;
  c.d2h_bytes_per_s = 1e9;
  c.h2d_bytes_per_s = 2e9;
  c.prefill_tokens_per_s = 1000;
  // 10 MB: 10 ms out + 5 ms in = 15 ms; 100 tokens at 1000/s = 100 ms.
  SwapChoice s = choose_swap(SwapMode::kAuto, c, 10'000'000, 100);
  EXPECT_TRUE(s.swap);
  EXPECT_NEAR(s.swap_ms, 15.0, 1e-9);
  EXPECT_NEAR(s.recompute_ms, 100.0, 1e-9);
  // 10 tokens: 10 ms of prefill beats 15 ms of copies.
  s = choose_swap(SwapMode::kAuto, c, 10'000'000, 10);
  EXPECT_FALSE(s.swap);
  EXPECT_NEAR(s.recompute_ms, 10.0, 1e-9);
}

TEST(SwapCost, OverridesAndUnmeasuredCosts) {
  SwapCosts c;
  c.d2h_bytes_per_s = c.h2d_bytes_per_s = 1e6;
  c.prefill_tokens_per_s = 1e6;
  EXPECT_TRUE(choose_swap(SwapMode::kAlways, c, 1'000'000'000, 1).swap);
  EXPECT_FALSE(choose_swap(SwapMode::kNever, c, 1, 1'000'000).swap);
  // Nothing measured yet: swap (recompute always redoes the work).
  EXPECT_TRUE(choose_swap(SwapMode::kAuto, SwapCosts{}, 1 << 20, 16).swap);
}

// A swap that goes to the disk tier is priced with the disk's bandwidths (plus the host link
// where the backend stages through host memory), not as a host-tier copy.
TEST(SwapCost, ADiskSwapIsPricedWithTheDiskBandwidth) {
  SwapCosts c;
  c.d2h_bytes_per_s = c.h2d_bytes_per_s = 10e9;
  c.disk_write_bytes_per_s = 100e6;
  c.disk_read_bytes_per_s = 200e6;
  c.prefill_tokens_per_s = 1000;
  // 10 MB: host 1 + 1 ms; disk 100 + 50 ms. Recompute of 50 tokens: 50 ms.
  SwapChoice host = choose_swap(SwapMode::kAuto, c, 10'000'000, 50, SwapTier::kHost);
  EXPECT_TRUE(host.swap);
  EXPECT_EQ(host.tier, SwapTier::kHost);
  EXPECT_NEAR(host.swap_ms, 2.0, 1e-9);
  SwapChoice disk = choose_swap(SwapMode::kAuto, c, 10'000'000, 50, SwapTier::kDisk);
  EXPECT_FALSE(disk.swap);
  EXPECT_EQ(disk.tier, SwapTier::kDisk);
  EXPECT_NEAR(disk.swap_ms, 150.0, 1e-9);
  // 200 tokens (200 ms) make the disk worth it.
  EXPECT_TRUE(choose_swap(SwapMode::kAuto, c, 10'000'000, 200, SwapTier::kDisk).swap);
  // Staged through a pageable host buffer: its measured copies add to the disk's.
  c.disk_staging_d2h_bytes_per_s = c.disk_staging_h2d_bytes_per_s = 1e9;
  EXPECT_NEAR(choose_swap(SwapMode::kAuto, c, 10'000'000, 200, SwapTier::kDisk).swap_ms, 170.0,
              1e-9);
  // Written behind: the swap-out costs the copy into the staging buffer (the host tier's rate,
  // 1 ms), not the disk write (100 + 10 ms); the swap-in still reads the disk (50 + 10 ms).
  SwapCosts behind = c;
  behind.disk_write_behind = true;
  EXPECT_NEAR(choose_swap(SwapMode::kAuto, behind, 10'000'000, 200, SwapTier::kDisk).swap_ms, 61.0,
              1e-9);
  EXPECT_TRUE(choose_swap(SwapMode::kAuto, behind, 10'000'000, 62, SwapTier::kDisk).swap);
  EXPECT_FALSE(choose_swap(SwapMode::kAuto, c, 10'000'000, 62, SwapTier::kDisk).swap);
  // The disk unmeasured: swap (as for any unmeasured cost).
  SwapCosts no_disk = c;
  no_disk.disk_write_bytes_per_s = no_disk.disk_read_bytes_per_s = 0;
  const SwapChoice unpriced = choose_swap(SwapMode::kAuto, no_disk, 10'000'000, 1, SwapTier::kDisk);
  EXPECT_TRUE(unpriced.swap);
  EXPECT_FALSE(unpriced.priced);
  EXPECT_EQ(unpriced.swap_ms, 0);  // not the host tier's figure
  EXPECT_TRUE(disk.priced);
  // kAlways / kNever are not priced away.
  EXPECT_TRUE(choose_swap(SwapMode::kAlways, c, 10'000'000, 1, SwapTier::kDisk).swap);
  EXPECT_FALSE(choose_swap(SwapMode::kNever, c, 1, 1'000'000, SwapTier::kDisk).swap);
}

// swap_tier follows kv::swap_out: the host tier while it has room for the pages, else the disk
// tier when there is one; the disk probe measures it and leaves it empty.
TEST(SwapCost, SwapTierAndTheDiskProbe) {
  auto cpu = backend::create_backend("cpu", 1);
  ASSERT_TRUE(cpu.ok());
  kv::KvPoolConfig cfg;
  cfg.num_blocks = 8;
  cfg.block_size = 16;
  const kv::KvShape shape{2, 2, 8};
  cfg.host_bytes = 4 * kv::KvPool::block_bytes(cfg, shape);  // 4 host slots
  auto pool = kv::KvPool::create(**cpu, cfg, shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_EQ(swap_tier(**pool, 4), SwapTier::kHost);
  EXPECT_EQ(swap_tier(**pool, 5), SwapTier::kHost);  // no disk: swap_out refuses, host it is
  SwapCosts costs;
  EXPECT_FALSE(measure_disk_swap_bandwidth(**pool, &costs));  // no disk tier
  EXPECT_EQ(costs.disk_write_bytes_per_s, 0);
  testing::TempDir dir;
  kv::DiskTierConfig dc;
  dc.path = dir.path().string();
  dc.capacity_bytes = 64 << 20;
  dc.extent_bytes = 1 << 20;
  auto disk = kv::DiskTier::open(dc);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  (*pool)->attach_disk(std::move(disk).value());
  EXPECT_EQ(swap_tier(**pool, 4), SwapTier::kHost);
  EXPECT_EQ(swap_tier(**pool, 5), SwapTier::kDisk);
  ASSERT_TRUE(measure_disk_swap_bandwidth(**pool, &costs));
  EXPECT_GT(costs.disk_write_bytes_per_s, 0);
  EXPECT_GT(costs.disk_read_bytes_per_s, 0);
  EXPECT_EQ(costs.disk_staging_d2h_bytes_per_s, 0);  // the CPU backend swaps to disk in place
  EXPECT_EQ(costs.disk_staging_h2d_bytes_per_s, 0);
  EXPECT_FALSE(costs.disk_write_behind);  // the pool's own setting, off by default
  (*pool)->set_disk_write_behind(true);
  ASSERT_TRUE(measure_disk_swap_bandwidth(**pool, &costs));
  EXPECT_TRUE(costs.disk_write_behind);
  const kv::DiskTierStats st = (*pool)->disk()->stats();
  EXPECT_EQ(st.writes, 8);  // two probes
  EXPECT_EQ(st.reads, 8);
  EXPECT_EQ(st.records, 0);
  EXPECT_EQ(st.extents_used, 0);
}

// Before every read the tier submits, counts the pages of its range the page cache holds
// (mincore over a mapping of the records' file).
class ResidencyIo final : public kv::BlockIo {
 public:
  struct Count {
    std::atomic<int64_t> resident{0}, pages{0};
  };
  ResidencyIo(std::unique_ptr<kv::BlockIo> inner, std::shared_ptr<Count> count)
      : inner_(std::move(inner)), count_(std::move(count)) {}
  std::shared_ptr<kv::IoCompletion> submit(kv::IoRequest r) override {
    if (r.op == kv::IoOp::kRead) {
      const int64_t page = ::sysconf(_SC_PAGESIZE);
      const int64_t begin = r.offset / page * page;
      const size_t len = static_cast<size_t>(r.offset + r.bytes() - begin);
      void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, r.fd, begin);
      if (map != MAP_FAILED) {
        std::vector<unsigned char> in((len + page - 1) / page);
        if (::mincore(map, len, in.data()) == 0) {
          for (unsigned char c : in) count_->resident += c & 1;
          count_->pages += static_cast<int64_t>(in.size());
        }
        ::munmap(map, len);
      }
    }
    return inner_->submit(std::move(r));
  }
  kv::IoBackend backend() const override { return inner_->backend(); }

 private:
  std::unique_ptr<kv::BlockIo> inner_;
  std::shared_ptr<Count> count_;
};

// A swapped record is read back after other work has had the page cache: the probe reads what it
// wrote cold, or a buffered tier's reads would price memory copies (warm 2.2-6.0 GB/s against
// 0.85-1.0 cold on the dev VM).
TEST(SwapCost, TheDiskProbeReadsCold) {
  auto cpu = backend::create_backend("cpu", 1);
  ASSERT_TRUE(cpu.ok());
  kv::KvPoolConfig cfg;
  cfg.num_blocks = 8;
  cfg.block_size = 16;
  auto pool = kv::KvPool::create(**cpu, cfg, kv::KvShape{2, 2, 8});
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  testing::TempDir dir;
  auto count = std::make_shared<ResidencyIo::Count>();
  kv::DiskTierConfig dc;
  dc.path = dir.path().string();
  dc.capacity_bytes = 64 << 20;
  dc.extent_bytes = 1 << 20;
  dc.io.wrap = [count](std::unique_ptr<kv::BlockIo> inner) -> std::unique_ptr<kv::BlockIo> {
    return std::make_unique<ResidencyIo>(std::move(inner), count);
  };
  auto disk = kv::DiskTier::open(dc);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  ASSERT_FALSE((*disk)->stats().direct_io);  // buffered: the page cache serves warm reads
  // Where the page cache cannot be dropped (tmpfs), cold and warm are the same.
  std::vector<std::byte> bytes(2 << 20, std::byte{7});
  const std::span<const std::byte> src(bytes);
  auto id = (*disk)->write_sync({&src, 1}, kv::RecordKey{1, 1});
  ASSERT_TRUE(id.ok());
  (*disk)->drop_cache();
  const std::span<std::byte> dst(bytes);
  ASSERT_TRUE((*disk)->read_sync(*id, {&dst, 1}, kv::RecordKey{1, 1}).ok());
  ASSERT_TRUE((*disk)->free(*id).ok());
  if (count->resident > 0) GTEST_SKIP() << "the page cache of " << dir.path() << " stays";
  count->pages = 0;
  (*pool)->attach_disk(std::move(disk).value());
  SwapCosts costs;
  ASSERT_TRUE(measure_disk_swap_bandwidth(**pool, &costs));
  EXPECT_GT(costs.disk_read_bytes_per_s, 0);
  EXPECT_EQ((*pool)->disk()->stats().reads, 1 + 4);
  EXPECT_EQ(count->pages, 4 * (1 << 20) / ::sysconf(_SC_PAGESIZE));  // four 1 MiB records
  EXPECT_EQ(count->resident, 0) << "of " << count->pages << " pages read";
}

// Counts the calls measure_copy_bandwidth makes.
class CountingBackend : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  StatusOr<void*> alloc_host(size_t bytes) override {
    ++host_allocs;
    return ForwardingBackend::alloc_host(bytes);
  }
  void free_host(void* p) override {
    ++host_frees;
    ForwardingBackend::free_host(p);
  }
  Status copy_batch_async(CopyDir dir, const CopyRange* c, size_t n) override {
    ++(dir == CopyDir::kDeviceToHost ? batches_d2h : batches_h2d);
    return ForwardingBackend::copy_batch_async(dir, c, n);
  }
  Status copy_d2h(void* d, const void* s, size_t n) override {
    ++plain_copies;
    return ForwardingBackend::copy_d2h(d, s, n);
  }
  Status copy_h2d(void* d, const void* s, size_t n) override {
    ++plain_copies;
    return ForwardingBackend::copy_h2d(d, s, n);
  }
  int host_allocs = 0, host_frees = 0, batches_d2h = 0, batches_h2d = 0, plain_copies = 0;
};

// The start-up measurement copies as a swap does: host memory from alloc_host (pinned on CUDA)
// and batched copies, never a pageable buffer through the plain copies.
TEST(SwapCost, BandwidthIsMeasuredOnTheSwapPath) {
  auto cpu = backend::create_backend("cpu", 1);
  ASSERT_TRUE(cpu.ok());
  CountingBackend be(std::move(cpu).value());
  kv::KvPoolConfig cfg;
  cfg.num_blocks = 4;
  cfg.block_size = 16;
  auto pool = kv::KvPool::create(be, cfg, kv::KvShape{2, 2, 8});
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  be.host_allocs = be.host_frees = be.plain_copies = 0;
  SwapCosts costs;
  ASSERT_TRUE(measure_copy_bandwidth(**pool, &costs));
  EXPECT_GT(costs.d2h_bytes_per_s, 0);
  EXPECT_GT(costs.h2d_bytes_per_s, 0);
  EXPECT_EQ(be.host_allocs, 1);
  EXPECT_EQ(be.host_frees, 1);
  EXPECT_EQ(be.batches_d2h, 3);
  EXPECT_EQ(be.batches_h2d, 3);
  EXPECT_EQ(be.plain_copies, 0);
}

TEST(SwapCost, Ewma) {
  EXPECT_DOUBLE_EQ(ewma(0, 10, 0.2), 10);  // first sample
  EXPECT_DOUBLE_EQ(ewma(10, 20, 0.25), 12.5);
}

}  // namespace
}  // namespace kvsplit::sched
