// Swapping to the disk tier through a host staging buffer: the path of backends whose device
// memory the tier cannot address (CUDA; here the emulated kernel backend, which reports kCuda).
// The staging (a swap's, a prefix-cache spill's) is the backend's host memory, reused.
// The CPU backend's pages are written and read in place (tests/kv/swap_test.cpp SwapDisk.*); this
// runs the same round trip and the same fault through the staging copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "emulated_backend.h"
#include "forwarding_backend.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "kv/prefix_cache.h"
#include "kv/swap.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

using kernels::KvPrecision;

constexpr int kLayers = 3, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

// Every page of `t` (all layers, page after page) as f32 values: the pool's full pages.
std::vector<float> read_pages(const kv::KvPool& pool, const kv::BlockTable& t) {
  const int64_t floats = pool.page_layer_bytes(KvPrecision::kFull) / 4;
  std::vector<float> out;
  for (int32_t b : t.blocks)
    for (int l = 0; l < kLayers; ++l) {
      const float* p = reinterpret_cast<const float*>(pool.full_page(l, b));
      out.insert(out.end(), p, p + floats);
    }
  return out;
}

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
  std::vector<float> read(const kv::BlockTable& t) { return read_pages(*pool, t); }
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

// An emulated kernel backend that counts its host allocations (Backend::alloc_host); `fail`
// refuses them.
class CountingHost final : public ForwardingBackend {
 public:
  CountingHost() : ForwardingBackend(std::make_unique<EmulatedKernelBackend>()) {}
  StatusOr<void*> alloc_host(size_t bytes) override {
    ++allocs;
    if (fail) return resource_exhausted("test: no host memory");
    return ForwardingBackend::alloc_host(bytes);
  }
  int allocs = 0;
  bool fail = false;
};

// A pool of `blocks` pages on `be` with no host tier and a disk tier of 64 extents under `dir`.
std::unique_ptr<kv::KvPool> disk_pool(backend::Backend& be, int blocks, const TempDir& dir) {
  kv::KvPoolConfig c;
  c.num_blocks = blocks;
  c.block_size = kBlock;
  auto pool =
      std::move(kv::KvPool::create(be, c, kv::KvShape{kLayers, kKvHeads, kHeadDim})).value();
  kv::DiskTierConfig d;
  d.path = dir.path().string();
  d.extent_bytes = 4096;
  d.capacity_bytes = 64 * d.extent_bytes;
  pool->attach_disk(std::move(kv::DiskTier::open(d)).value());
  return pool;
}

// The staged disk swap-in, with and without a read started ahead: the record is read into the
// backend's host memory (Backend::alloc_host: pinned on CUDA, so the copies to the device run at
// the link's speed) and that buffer is kept as the pool's spare, so the next swap-in allocates
// nothing. Bit-exact either way.
TEST(EmulatedSwapDisk, SwapInStagesInTheBackendsHostMemoryAndReusesIt) {
  CountingHost be;
  TempDir dir;
  std::unique_ptr<kv::KvPool> pool = disk_pool(be, 8, dir);
  kv::BlockTable t;
  ASSERT_TRUE(pool->reserve(t, 4 * kBlock));
  const int64_t floats = pool->page_layer_bytes(KvPrecision::kFull) / 4;
  std::vector<float> want;
  for (int32_t b : t.blocks)
    for (int l = 0; l < kLayers; ++l) {
      float* p = reinterpret_cast<float*>(pool->full_page(l, b));
      for (int64_t i = 0; i < floats; ++i) p[i] = static_cast<float>(b * 1000 + l * 100 + i);
      want.insert(want.end(), p, p + floats);
    }
  auto read = [&] { return read_pages(*pool, t); };
  kv::SwapStats st;
  for (bool ahead : {false, true}) {
    for (bool spare : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ahead " << ahead << " spare " << spare);
      ASSERT_TRUE(*kv::swap_out(*pool, t, &st));  // no host tier: to disk, staged
      // Without the spare (held here), the swap-in takes host memory from the backend; with it,
      // none.
      std::optional<std::pair<kv::KvPool::HostBuffer, int64_t>> held;
      if (!spare) {
        auto h = pool->take_staging(1);
        ASSERT_TRUE(h.ok());
        held = std::move(h).value();
      }
      const int before = be.allocs;
      kv::SwapPrefetch pf;
      if (ahead) {
        auto started = kv::start_prefetch(*pool, t, &pf, &st);
        ASSERT_TRUE(started.ok() && *started) << started.status().to_string();
      }
      auto in = kv::swap_in(*pool, t, &st, ahead ? &pf : nullptr);
      ASSERT_TRUE(in.ok() && *in) << in.status().to_string();
      EXPECT_EQ(read(), want);
      EXPECT_EQ(be.allocs, before + (spare ? 0 : 1));
    }
  }
  EXPECT_EQ(st.from_disk, 4);
  pool->release(t);
}

// A staging buffer the swap-in cannot get is host memory, not the disk: the Status says so, no
// disk fault is counted, the blocks go back and the record stays, read bit-exact once memory is
// there (before: counted in disk_faults, as a bad record).
TEST(EmulatedSwapDisk, NoStagingBufferIsNoDiskFaultAndKeepsTheRecord) {
  CountingHost be;
  TempDir dir;
  std::unique_ptr<kv::KvPool> pool = disk_pool(be, 8, dir);
  kv::BlockTable t;
  ASSERT_TRUE(pool->reserve(t, 3 * kBlock));
  for (int32_t b : t.blocks)
    for (int l = 0; l < kLayers; ++l) {
      float* p = reinterpret_cast<float*>(pool->full_page(l, b));
      std::fill(p, p + pool->page_layer_bytes(KvPrecision::kFull) / 4, b + 0.5f * l);
    }
  const std::vector<float> want = read_pages(*pool, t);
  kv::SwapStats st;
  ASSERT_TRUE(*kv::swap_out(*pool, t, &st));
  auto spare = pool->take_staging(1);  // held: the swap-in must allocate
  ASSERT_TRUE(spare.ok());
  be.fail = true;
  kv::SwapPrefetch pf;
  EXPECT_FALSE(kv::start_prefetch(*pool, t, &pf, &st).ok());  // no buffer: not started
  auto in = kv::swap_in(*pool, t, &st, &pf);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kResourceExhausted) << in.status().to_string();
  EXPECT_NE(in.status().message().find("no staging buffer"), std::string::npos);
  EXPECT_EQ(st.disk_faults, 0);
  EXPECT_EQ(pool->allocator().num_used(), 0);
  EXPECT_EQ(kv::swapped_pages(t), 3);
  EXPECT_EQ(pool->disk()->stats().records, 1);
  be.fail = false;
  in = kv::swap_in(*pool, t, &st, &pf);
  ASSERT_TRUE(in.ok() && *in) << in.status().to_string();
  EXPECT_EQ(read_pages(*pool, t), want);
  EXPECT_EQ(st.from_disk, 1);
  EXPECT_EQ(pool->disk()->stats().records, 0);
  pool->release(t);
}

// The prefix cache's disk spills and their restores stage a page in the backend's host memory
// too (pinned on CUDA: the copy kernel takes it), one buffer reused from spill to spill; the page
// comes back byte-exact.
TEST(EmulatedPrefixSpill, DiskSpillsStageInTheBackendsHostMemoryAndReuseIt) {
  CountingHost be;
  TempDir dir;
  std::unique_ptr<kv::KvPool> pool = disk_pool(be, 2, dir);
  pool->enable_prefix_cache();
  kv::PrefixCache& cache = *pool->prefix_cache();
  std::vector<int32_t> tokens(kBlock + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i + 2);
  kv::BlockTable t;
  ASSERT_TRUE(pool->reserve(t, kBlock));
  const int64_t floats = pool->page_layer_bytes(KvPrecision::kFull) / 4;
  std::vector<float> want;
  for (int l = 0; l < kLayers; ++l) {
    float* p = reinterpret_cast<float*>(pool->full_page(l, t.blocks[0]));
    for (int64_t i = 0; i < floats; ++i) p[i] = static_cast<float>(l * 1000 + i);
    want.insert(want.end(), p, p + floats);
  }
  pool->cache_prefix(t, 0, tokens, 1);
  pool->release(t);
  const int before = be.allocs;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    kv::BlockTable x;  // both blocks: the cached page goes to disk (no host tier)
    ASSERT_TRUE(pool->reserve(x, 2 * kBlock));
    cache.wait_spills();
    ASSERT_EQ(cache.pages_disk(), 1);
    pool->release(x);
    kv::BlockTable u;
    ASSERT_EQ(pool->share_prefix(u, 0, tokens, 1), 1);
    EXPECT_EQ(read_pages(*pool, u), want);
    pool->release(u);
  }
  EXPECT_EQ(cache.stats().spilled_disk, 3);
  EXPECT_EQ(cache.stats().hit_pages_disk, 3);
  // The spill's buffer, and the restore's read buffer (taken while the spill's is in flight
  // or kept): backend host memory, allocated in the first round only.
  EXPECT_GE(be.allocs, before + 1);
  EXPECT_LE(be.allocs, before + 2);
  const int after = be.allocs;
  kv::BlockTable x;
  ASSERT_TRUE(pool->reserve(x, 2 * kBlock));
  cache.wait_spills();
  EXPECT_EQ(be.allocs, after);
  pool->release(x);
  cache.clear(pool->allocator());
}

// Swapping to the host tier: the batches of page copies go through the copy kernel (as on
// CudaBackend, where the tier is pinned and mapped), byte-exact both ways, partial last page
// included; the copy engines' path (kDma) gives the same bytes.
TEST(EmulatedSwapHost, CopyKernelRoundTripIsBitExact) {
  for (const bool prefetch : {false, true})
    for (const auto method :
         {backend::Backend::BatchCopyMethod::kAuto, backend::Backend::BatchCopyMethod::kKernel,
          backend::Backend::BatchCopyMethod::kDma}) {
      SCOPED_TRACE(static_cast<int>(method));
      SCOPED_TRACE(prefetch ? "host prefetch" : "swap-in copies");
      EmulatedKernelBackend be;
      be.set_batch_copy_method(method);
      kv::KvPoolConfig c;
      c.num_blocks = 8;
      c.block_size = kBlock;
      const kv::KvShape shape{kLayers, kKvHeads, kHeadDim};
      c.host_bytes = 6 * kv::KvPool::block_bytes(c, shape);
      auto pool = std::move(kv::KvPool::create(be, c, shape)).value();
      const int64_t floats = pool->page_layer_bytes(KvPrecision::kFull) / 4;
      ASSERT_EQ(pool->page_layer_bytes(KvPrecision::kFull) % 16, 0);
      auto fill = [&](const kv::BlockTable& t, uint32_t seed) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> n(0.f, 1.f);
        for (int l = 0; l < kLayers; ++l)
          for (int32_t b : t.blocks) {
            float* p = reinterpret_cast<float*>(pool->full_page(l, b));
            for (int64_t i = 0; i < floats; ++i) p[i] = n(rng);
          }
      };
      auto read = [&](const kv::BlockTable& t) { return read_pages(*pool, t); };
      kv::BlockTable t;
      ASSERT_TRUE(pool->reserve(t, 4 * kBlock + 3));  // 5 pages, the last partial
      fill(t, 5);
      const std::vector<float> before = read(t);
      kv::SwapStats st;
      auto out = kv::swap_out(*pool, t, &st);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ASSERT_TRUE(*out);
      EXPECT_EQ(kv::swapped_pages(t), 5);
      EXPECT_EQ(pool->allocator().num_used(), 0);
      kv::BlockTable other;  // the freed blocks are overwritten meanwhile
      ASSERT_TRUE(pool->reserve(other, 8 * kBlock));
      fill(other, 6);
      pool->release(other);
      if (prefetch) {  // the host tier's prefetch: blocks reserved, the copy queued (fenced) ahead
        auto started = kv::start_host_prefetch(*pool, t, 8, &st);
        ASSERT_TRUE(started.ok()) << started.status().to_string();
        ASSERT_TRUE(*started);
        EXPECT_EQ(kv::host_prefetch_blocks(t), 5);
        EXPECT_EQ(pool->allocator().num_used(), 5);
      }
      auto in = kv::swap_in(*pool, t, &st);
      ASSERT_TRUE(in.ok()) << in.status().to_string();
      ASSERT_TRUE(*in);
      EXPECT_EQ(read(t), before);
      EXPECT_EQ(st.swaps_out, 1);
      EXPECT_EQ(st.swaps_in, 1);
      EXPECT_EQ(st.host_prefetch_hits, prefetch ? 1 : 0);  // the copy had landed (fence 0)
      EXPECT_EQ(kv::host_prefetch_blocks(t), 0);
      EXPECT_EQ(be.kernel_batches(), method == backend::Backend::BatchCopyMethod::kDma ? 0 : 2);
      pool->release(t);
      EXPECT_EQ(pool->allocator().num_used(), 0);
      EXPECT_EQ(pool->host_allocator().num_used(), 0);
    }
}

}  // namespace
}  // namespace kvsplit::testing
