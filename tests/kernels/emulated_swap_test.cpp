// Swapping to the disk tier through a host staging buffer: the path of backends whose device
// memory the tier cannot address (CUDA; here the emulated kernel backend, which reports kCuda).
// The CPU backend's pages are written and read in place (tests/kv/swap_test.cpp SwapDisk.*); this
// runs the same round trip and the same fault through the staging copies.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "emulated_backend.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "kv/swap.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

using kernels::KvPrecision;

constexpr int kLayers = 3, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

struct StagedPool {
  EmulatedKernelBackend be;
  std::unique_ptr<kv::KvPool> pool;
  TempDir dir;
  kv::DiskTier* disk = nullptr;

  explicit StagedPool(int blocks) {
    kv::KvPoolConfig c;
    c.num_blocks = blocks;
    c.block_size = kBlock;
    c.host_bytes = 0;  // no host tier: every swap goes to disk
    const kv::KvShape shape{kLayers, kKvHeads, kHeadDim};
    pool = std::move(kv::KvPool::create(be, c, shape)).value();
    kv::DiskTierConfig d;
    d.path = dir.path().string();
    d.extent_bytes = 4096;
    d.capacity_bytes = 64 * d.extent_bytes;
    auto t = kv::DiskTier::open(d);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    disk = t->get();
    pool->attach_disk(std::move(t).value());
  }
  int64_t floats() const { return pool->page_layer_bytes(KvPrecision::kFull) / 4; }
  void fill(const kv::BlockTable& t, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    for (int l = 0; l < kLayers; ++l)
      for (int32_t b : t.blocks) {
        float* p = reinterpret_cast<float*>(pool->full_page(l, b));
        for (int64_t i = 0; i < floats(); ++i) p[i] = n(rng);
      }
  }
  std::vector<float> read(const kv::BlockTable& t) {
    std::vector<float> out;
    for (int32_t b : t.blocks)
      for (int l = 0; l < kLayers; ++l) {
        const float* p = reinterpret_cast<const float*>(pool->full_page(l, b));
        out.insert(out.end(), p, p + floats());
      }
    return out;
  }
};

TEST(EmulatedSwapDisk, StagedRoundTripIsBitExactAndAFaultGivesTheBlocksBack) {
  StagedPool p(8);
  ASSERT_NE(p.disk, nullptr);
  ASSERT_EQ(p.be.kind(), backend::DeviceKind::kCuda);  // the staging path
  kv::BlockTable t;
  ASSERT_TRUE(p.pool->reserve(t, 3 * kBlock + 2));  // 4 pages, the last partial
  p.fill(t, 21);
  const std::vector<float> before = p.read(t);
  kv::SwapStats st;
  auto out = kv::swap_out(*p.pool, t, &st);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_TRUE(*out);
  EXPECT_EQ(st.to_disk, 1);
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  kv::BlockTable other;  // the freed blocks are reused and overwritten meanwhile
  ASSERT_TRUE(p.pool->reserve(other, 8 * kBlock));
  p.fill(other, 77);
  p.pool->release(other);
  auto in = kv::swap_in(*p.pool, t, &st);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_TRUE(*in);
  EXPECT_EQ(p.read(t), before);
  EXPECT_EQ(st.from_disk, 1);
  EXPECT_EQ(p.disk->stats().records, 0);

  // Out again, then a corrupt read: kDataLoss, the blocks it took given back, the pages still
  // on disk (the caller recomputes), and release frees the record.
  ASSERT_TRUE(*kv::swap_out(*p.pool, t, &st));
  p.disk->set_fault_hook(kv::inject_next(kv::IoOp::kRead, kv::InjectedFault::kCorrupt, 1));
  auto bad = kv::swap_in(*p.pool, t, &st);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status().to_string();
  EXPECT_EQ(p.pool->allocator().num_used(), 0);
  EXPECT_EQ(kv::swapped_pages(t), 4);
  p.pool->release(t);
  EXPECT_EQ(p.disk->stats().records, 0);
  EXPECT_EQ(p.disk->stats().extents_used, 0);
}

}  // namespace
}  // namespace kvsplit::testing
