#include "kv/kv_pool.h"

#include <gtest/gtest.h>

#include <limits>
#include <set>

namespace kvsplit::kv {
namespace {

std::unique_ptr<backend::Backend> cpu() {
  auto b = backend::create_backend("cpu", 1);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return std::move(b).value();
}

KvShape shape(int layers = 3, int kv_heads = 2, int head_dim = 8) {
  return KvShape{layers, kv_heads, head_dim};
}

TEST(KvPool, CreatesZeroedLayersWithTheRightGeometry) {
  auto be = cpu();
  KvPoolConfig cfg;
  cfg.num_blocks = 10;
  cfg.block_size = 4;
  auto pool = KvPool::create(*be, cfg, shape());
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  KvPool& p = **pool;
  EXPECT_EQ(p.allocator().num_blocks(), 10);
  EXPECT_EQ(p.allocator().num_free(), 10);
  EXPECT_EQ(p.block_size(), 4);
  EXPECT_EQ(p.bytes_per_block(), 3 * 2 * 2 * 4 * 8 * 4);
  std::set<void*> ptrs;
  for (int l = 0; l < 3; ++l) {
    const backend::LayerKv kv = p.layer(l);
    ASSERT_NE(kv.data, nullptr);
    ptrs.insert(kv.data);
    EXPECT_EQ(kv.num_blocks, 10);
    EXPECT_EQ(kv.num_kv_heads, 2);
    EXPECT_EQ(kv.block_size, 4);
    EXPECT_EQ(kv.head_dim, 8);
    EXPECT_EQ(kv.dtype, backend::DType::kF32);
    const float* f = static_cast<const float*>(kv.data);
    for (int i = 0; i < 10 * 2 * 2 * 4 * 8; ++i)
      ASSERT_EQ(f[i], 0.f) << "layer " << l << " elem " << i;
  }
  EXPECT_EQ(ptrs.size(), 3u);
}

TEST(KvPool, DerivesNumBlocksFromCapacity) {
  auto be = cpu();
  KvPoolConfig cfg;
  cfg.block_size = 16;
  const int64_t block_bytes = 3 * 2 * 2 * 16 * 8 * 4;
  cfg.capacity_bytes = block_bytes * 7 + block_bytes / 2;
  auto pool = KvPool::create(*be, cfg, shape());
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_EQ((*pool)->config().num_blocks, 7);
  EXPECT_EQ((*pool)->allocator().num_blocks(), 7);
  EXPECT_EQ((*pool)->bytes_per_block(), block_bytes);
}

TEST(KvPool, BadConfigIsInvalidArgument) {
  auto be = cpu();
  auto expect_invalid = [&](KvPoolConfig cfg, KvShape s, const char* what) {
    auto pool = KvPool::create(*be, cfg, s);
    ASSERT_FALSE(pool.ok()) << what;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(pool.status().message().find("KvPool"), std::string::npos) << what;
  };
  KvPoolConfig ok_cfg;
  ok_cfg.num_blocks = 4;
  KvPoolConfig c = ok_cfg;
  c.block_size = 0;
  expect_invalid(c, shape(), "block_size 0");
  expect_invalid(ok_cfg, shape(0), "no layers");
  expect_invalid(ok_cfg, shape(2, 0), "no kv heads");
  expect_invalid(ok_cfg, shape(2, 2, -8), "negative head_dim");
  c = ok_cfg;
  c.num_blocks = -1;
  expect_invalid(c, shape(), "negative num_blocks");
  c = ok_cfg;
  c.num_blocks = 0;
  c.capacity_bytes = 0;
  expect_invalid(c, shape(), "neither num_blocks nor capacity");
  c.capacity_bytes = 100;  // less than one block
  expect_invalid(c, shape(), "capacity below one block");
  // More blocks than a pool may have: refused before anything is allocated (2^31 blocks of
  // allocator bookkeeping alone used to abort the process).
  c.capacity_bytes = int64_t{16777216} << 20;  // kv.capacity_mb's largest value
  expect_invalid(c, shape(), "capacity of more than kMaxBlocks blocks");
  c = ok_cfg;
  c.num_blocks = KvPool::kMaxBlocks + 1;
  expect_invalid(c, shape(), "num_blocks above kMaxBlocks");
  c.num_blocks = std::numeric_limits<int32_t>::max();
  expect_invalid(c, shape(), "num_blocks INT32_MAX");
  c = ok_cfg;
  c.summary_parts = 0;
  expect_invalid(c, shape(), "summary_parts 0");
  c.summary_parts = 3;  // does not divide block_size 16
  expect_invalid(c, shape(), "summary_parts 3");
}

// Key summaries in parts: each summary slot holds summary_parts times the one-part bytes, and
// the pool's layout says so (the page ops and the attention read it from there).
TEST(KvPool, SummariesInPartsTakeThatManyTimesTheBytes) {
  auto be = cpu();
  KvPoolConfig c;
  c.num_blocks = 4;
  c.summary_slots = 3;
  auto one = KvPool::create(*be, c, shape());
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  c.summary_parts = 4;
  auto four = KvPool::create(*be, c, shape());
  ASSERT_TRUE(four.ok()) << four.status().to_string();
  EXPECT_EQ((*four)->summary_layer_bytes(), 4 * (*one)->summary_layer_bytes());
  EXPECT_EQ((*four)->quant_layout().summary_parts, 4);
  EXPECT_EQ((*one)->summary_layer_bytes(),
            int64_t{2} * shape().num_kv_heads * shape().head_dim * 2);  // f16 min and max
}

TEST(KvPool, ReserveIsAllOrNothingAndReleaseFreesEverything) {
  auto be = cpu();
  KvPoolConfig cfg;
  cfg.num_blocks = 5;
  cfg.block_size = 16;
  auto pool_or = KvPool::create(*be, cfg, shape());
  ASSERT_TRUE(pool_or.ok());
  KvPool& pool = **pool_or;

  BlockTable a;
  ASSERT_TRUE(pool.reserve(a, 33));  // 3 blocks
  EXPECT_EQ(a.blocks.size(), 3u);
  ASSERT_TRUE(pool.reserve(a, 20));  // already covered: no change
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(pool.allocator().num_free(), 2);

  BlockTable b;
  ASSERT_TRUE(pool.reserve(b, 1));
  const std::vector<int32_t> a_before = a.blocks;
  EXPECT_FALSE(pool.reserve(a, 48 + 17));  // needs 2 more, 1 free
  EXPECT_EQ(a.blocks, a_before);
  EXPECT_EQ(pool.allocator().num_free(), 1);
  ASSERT_TRUE(pool.reserve(a, 64));  // exactly one more fits
  EXPECT_EQ(pool.allocator().num_free(), 0);

  std::set<int32_t> ids(a.blocks.begin(), a.blocks.end());
  ids.insert(b.blocks.begin(), b.blocks.end());
  EXPECT_EQ(ids.size(), 5u);

  pool.release(a);
  EXPECT_TRUE(a.blocks.empty());
  pool.release(b);
  EXPECT_EQ(pool.allocator().num_free(), 5);
  EXPECT_EQ(pool.allocator().num_used(), 0);
}

TEST(KvPool, ReleaseTailKeepsTheBlocksForNumTokens) {
  auto be = cpu();
  KvPoolConfig cfg;
  cfg.num_blocks = 6;
  cfg.block_size = 8;
  auto pool_or = KvPool::create(*be, cfg, shape(1));
  ASSERT_TRUE(pool_or.ok());
  KvPool& pool = **pool_or;
  BlockTable a;
  ASSERT_TRUE(pool.reserve(a, 40));  // 5 blocks
  const std::vector<int32_t> before = a.blocks;
  pool.release_tail(a, 17);  // 3 blocks hold 17 tokens
  EXPECT_EQ(a.blocks, std::vector<int32_t>(before.begin(), before.begin() + 3));
  EXPECT_EQ(pool.allocator().num_free(), 3);
  pool.release_tail(a, 24);  // already within: no change
  EXPECT_EQ(a.blocks.size(), 3u);
  // A page shared with another table (a prefix-cache or fork reference) only loses a reference.
  BlockTable other;
  other.blocks.push_back(a.blocks[2]);
  pool.allocator().incref(a.blocks[2]);
  pool.release_tail(a, 16);
  EXPECT_EQ(a.blocks.size(), 2u);
  EXPECT_EQ(pool.allocator().refcount(other.blocks[0]), 1);
  pool.release_tail(a, 0);
  EXPECT_TRUE(a.blocks.empty());
  pool.release(other);
  EXPECT_EQ(pool.allocator().num_free(), 6);
}

TEST(KvPool, SharedBlocksSurviveUntilTheLastRelease) {
  auto be = cpu();
  KvPoolConfig cfg;
  cfg.num_blocks = 4;
  cfg.block_size = 8;
  auto pool_or = KvPool::create(*be, cfg, shape(1));
  ASSERT_TRUE(pool_or.ok());
  KvPool& pool = **pool_or;
  BlockTable parent;
  ASSERT_TRUE(pool.reserve(parent, 16));
  BlockTable child;  // a fork sharing the parent's first block
  child.blocks.push_back(parent.blocks[0]);
  pool.allocator().incref(parent.blocks[0]);
  ASSERT_TRUE(pool.reserve(child, 9));
  EXPECT_EQ(pool.allocator().refcount(parent.blocks[0]), 2);
  EXPECT_EQ(pool.allocator().num_used(), 3);
  pool.release(parent);
  EXPECT_EQ(pool.allocator().num_used(), 2);
  EXPECT_EQ(pool.allocator().refcount(child.blocks[0]), 1);
  pool.release(child);
  EXPECT_EQ(pool.allocator().num_free(), 4);
}

// A KV handoff's destination takes only the cached pages on its device (a lower tier's would be
// restored no faster than the source copies them), and knows beforehand which of them cost no
// block (a sequence holds them too).
TEST(KvPool, ShareDevicePrefixTakesDevicePagesOnlyAndCountsTheSharedOnes) {
  auto be = cpu();
  KvPoolConfig cfg;
  cfg.num_blocks = 10;
  cfg.block_size = 4;
  cfg.host_bytes = 4 * (3 * 2 * 2 * 4 * 8 * 4);  // 4 host slots
  auto pool = KvPool::create(*be, cfg, shape());
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  KvPool& p = **pool;
  p.enable_prefix_cache();
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  const uint64_t salt = PrefixCache::salt_of("t");
  BlockTable first;
  ASSERT_TRUE(p.reserve(first, 14));
  p.cache_prefix(first, salt, tokens, 3);
  EXPECT_EQ(p.shared_device_prefix_pages(salt, tokens, 3), 3);  // the first sequence holds them
  const std::vector<int32_t> blocks = first.blocks;
  p.release(first);
  EXPECT_EQ(p.shared_device_prefix_pages(salt, tokens, 3), 0);  // only the cache: idle
  BlockTable a;
  EXPECT_EQ(p.share_device_prefix(a, salt, tokens, 3), 3);
  EXPECT_EQ(a.blocks, std::vector<int32_t>(blocks.begin(), blocks.begin() + 3));
  EXPECT_EQ(p.shared_device_prefix_pages(salt, tokens, 3), 3);
  EXPECT_EQ(p.shared_device_prefix_pages(salt, tokens, 2), 2);
  EXPECT_EQ(p.shared_device_prefix_pages(PrefixCache::salt_of("u"), tokens, 3), 0);
  BlockTable other;
  EXPECT_EQ(p.share_device_prefix(other, PrefixCache::salt_of("u"), tokens, 3), 0);
  EXPECT_TRUE(other.blocks.empty());
  p.release(a);
  // The run of shared pages ends at the first idle one (an allocation may evict it).
  BlockTable one;
  EXPECT_EQ(p.share_device_prefix(one, salt, tokens, 1), 1);
  EXPECT_EQ(p.shared_device_prefix_pages(salt, tokens, 3), 1);
  p.release(one);
  // The deepest page spills to the host tier: a handoff takes the two before it and leaves it
  // there (nothing is restored).
  EXPECT_EQ(p.prefix_cache()->evict(1, p.allocator()), 1);
  ASSERT_EQ(p.prefix_cache()->pages_host(), 1);
  BlockTable b;
  EXPECT_EQ(p.share_device_prefix(b, salt, tokens, 3), 2);
  EXPECT_EQ(p.prefix_cache()->pages_host(), 1);
  EXPECT_EQ(p.shared_device_prefix_pages(salt, tokens, 3), 2);
  p.release(b);
  p.prefix_cache()->clear(p.allocator());
  EXPECT_EQ(p.allocator().num_free(), 10);
}

}  // namespace
}  // namespace kvsplit::kv
