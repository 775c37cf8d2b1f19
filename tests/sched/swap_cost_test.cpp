#include "sched/swap_cost.h"

#include <gtest/gtest.h>

#include <memory>

#include "forwarding_backend.h"
#include "kv/kv_pool.h"

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
