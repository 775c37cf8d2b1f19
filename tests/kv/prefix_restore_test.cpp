// Restoring a long cached prefix from the disk tier: page buffers are bounded
// (PrefixCache::kMaxRestoresInFlight reads in flight, buffers reused), and a buffer that cannot be
// allocated ends the lookup there as a miss, keeping the entry and its record.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "forwarding_backend.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "kv/prefix_cache.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

constexpr int kBlock = 4;
const KvShape kShape{2, 1, 8};  // f32: 512 bytes per page

// The CPU backend, counting its live host allocations (Backend::alloc_host: the prefix cache's
// page buffers) and their peak; `fail` refuses new ones.
class HostCounting final : public testing::ForwardingBackend {
 public:
  HostCounting() : ForwardingBackend(std::move(backend::create_backend("cpu", 1)).value()) {}
  StatusOr<void*> alloc_host(size_t bytes) override {
    if (fail) return resource_exhausted("test: no host memory");
    peak = std::max(peak, ++live);
    return ForwardingBackend::alloc_host(bytes);
  }
  void free_host(void* p) override {
    --live;
    ForwardingBackend::free_host(p);
  }
  int live = 0, peak = 0;
  bool fail = false;
};

struct DiskPool {
  HostCounting be;
  testing::TempDir dir;
  std::unique_ptr<KvPool> pool;

  // `blocks` device pages, no host tier, a disk tier of 16 MiB.
  explicit DiskPool(int blocks) {
    KvPoolConfig c;
    c.num_blocks = blocks;
    c.block_size = kBlock;
    pool = std::move(KvPool::create(be, c, kShape)).value();
    pool->enable_prefix_cache();
    const Status st = pool->open_disk_tier(dir.path().string(), int64_t{16} << 20);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }

  // Caches `pages` pages of `t` (page i's floats all i + 1), then evicts them all to disk.
  void cache_on_disk(uint64_t salt, const std::vector<int32_t>& t, int pages) {
    BlockTable a;
    ASSERT_TRUE(pool->reserve(a, pages * kBlock));
    for (int i = 0; i < pages; ++i) set(a.blocks[i], static_cast<float>(i + 1));
    pool->cache_prefix(a, salt, t, pages);
    pool->release(a);
    BlockTable all;
    ASSERT_TRUE(pool->reserve(all, pool->allocator().num_blocks() * kBlock));
    for (int32_t b : all.blocks) set(b, -7.f);
    pool->release(all);
    pool->prefix_cache()->wait_spills();
    ASSERT_EQ(pool->prefix_cache()->pages_disk(), pages);
  }
  void set(int32_t block, float v) {
    for (int l = 0; l < kShape.num_layers; ++l) {
      float* p = reinterpret_cast<float*>(pool->full_page(l, block));
      std::fill(p, p + pool->page_layer_bytes(kernels::KvPrecision::kFull) / 4, v);
    }
  }
  // True when every layer of `block` holds `v`.
  bool holds(int32_t block, float v) {
    for (int l = 0; l < kShape.num_layers; ++l) {
      const float* p = reinterpret_cast<const float*>(pool->full_page(l, block));
      const int64_t n = pool->page_layer_bytes(kernels::KvPrecision::kFull) / 4;
      if (!std::all_of(p, p + n, [v](float x) { return x == v; })) return false;
    }
    return true;
  }
};

std::vector<int32_t> tokens(int n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 1);
  return t;
}

// Every page of a 40-page prefix comes back from disk, bit-exact, with at most
// kMaxRestoresInFlight page buffers in use at once (before: one per page, 40).
TEST(PrefixRestore, ALongPrefixComesBackWithBoundedBuffers) {
  constexpr int kPages = 40;
  DiskPool p(kPages + 8);
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(kPages * kBlock + 1);
  p.cache_on_disk(s, t, kPages);
  const int before = p.be.live;  // the cache keeps finished spills' buffers for reuse
  p.be.peak = before;
  BlockTable b;
  ASSERT_EQ(p.pool->share_prefix(b, s, t, kPages), kPages);
  for (int i = 0; i < kPages; ++i) EXPECT_TRUE(p.holds(b.blocks[i], i + 1.f)) << "page " << i;
  const PrefixCacheStats& st = p.pool->prefix_cache()->stats();
  EXPECT_EQ(st.hit_pages_disk, kPages);
  EXPECT_EQ(st.restore_faults, 0);
  EXPECT_LE(p.be.peak - before, PrefixCache::kMaxRestoresInFlight);
  EXPECT_LE(p.be.live, PrefixCache::kMaxSpillsInFlight);  // kept for reuse, no more
  EXPECT_EQ(p.pool->disk()->stats().records, 0);
  p.pool->release(b);
}

// A page buffer that cannot be allocated is host memory, not a bad record: the lookup stops
// there (a miss from that page on), and the entry and its record stay for a later lookup (before:
// a restore fault, the entry dropped and its record freed).
TEST(PrefixRestore, NoBufferEndsTheLookupAndKeepsTheEntries) {
  DiskPool p(8);
  p.pool->prefix_cache()->set_async_spills(false);  // the cache keeps exactly one buffer
  const uint64_t s = PrefixCache::salt_of("a");
  const std::vector<int32_t> t = tokens(3 * kBlock + 1);
  p.cache_on_disk(s, t, 3);
  p.be.fail = true;
  BlockTable b;
  ASSERT_EQ(p.pool->share_prefix(b, s, t, 3), 1);  // page 0 in the kept buffer, then none
  EXPECT_TRUE(p.holds(b.blocks[0], 1.f));
  const PrefixCache& pc = *p.pool->prefix_cache();
  EXPECT_EQ(pc.stats().restore_faults, 0);
  EXPECT_EQ(pc.stats().evicted, 0);
  EXPECT_EQ(pc.pages_disk(), 2);
  EXPECT_EQ(p.pool->disk()->stats().records, 2);
  EXPECT_EQ(p.pool->allocator().num_used(), 1);  // page 0 (cache and b); no block kept for 1
  p.pool->release(b);
  p.be.fail = false;
  BlockTable again;
  ASSERT_EQ(p.pool->share_prefix(again, s, t, 3), 3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(p.holds(again.blocks[i], i + 1.f)) << "page " << i;
  EXPECT_EQ(pc.stats().hit_pages_disk, 3);
  EXPECT_EQ(p.pool->disk()->stats().records, 0);
  p.pool->release(again);
}

}  // namespace
}  // namespace kvsplit::kv
