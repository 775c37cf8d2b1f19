// The spatial cut's shard group in the KV pool: placement of a spread table's pages in chunks
// (preferred shard, the next one with room when it is full), the group's free blocks, release on
// every shard, swap in onto the group, and the migration hook (kv/migrate.h) from another shard
// or from the host tier, byte-exact and all or nothing.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "kv/kv_pool.h"
#include "kv/migrate.h"
#include "kv/swap.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

struct Group {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KvPool> pool;

  Group(int shards, int blocks, int chunk, int host_pages = 0) {
    be = std::move(backend::create_backend("cpu", 1)).value();
    KvPoolConfig c;
    c.num_blocks = blocks;
    c.block_size = kBlock;
    c.host_bytes = host_pages * KvPool::block_bytes(c, KvShape{kLayers, kKvHeads, kHeadDim});
    pool = std::move(KvPool::create(*be, c, KvShape{kLayers, kKvHeads, kHeadDim})).value();
    std::vector<std::unique_ptr<backend::Backend>> peers;
    for (int s = 1; s < shards; ++s) {
      backend::BackendOptions o;
      o.threads = 1;
      o.device = s;
      peers.push_back(std::move(backend::create_backend("cpu", o)).value());
    }
    if (shards > 1) EXPECT_TRUE(pool->add_shards(std::move(peers), chunk).ok());
  }
  int64_t floats() const { return pool->page_layer_bytes(KvPrecision::kFull) / 4; }
  float* page(const BlockTable& t, size_t i, int l) {
    const int s = t.pages.empty() ? 0 : t.pages[i].shard;
    return static_cast<float*>(pool->shard(s).layer(l).data) + t.blocks[i] * floats();
  }
  void fill(const BlockTable& t, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    for (size_t i = 0; i < t.blocks.size(); ++i)
      for (int l = 0; l < kLayers; ++l)
        for (int64_t j = 0; j < floats(); ++j) page(t, i, l)[j] = n(rng);
  }
  std::vector<float> read(const BlockTable& t) {
    std::vector<float> out;
    for (size_t i = 0; i < t.blocks.size(); ++i)
      for (int l = 0; l < kLayers; ++l)
        out.insert(out.end(), page(t, i, l), page(t, i, l) + floats());
    return out;
  }
  std::vector<int> shards_of(const BlockTable& t) {
    std::vector<int> s;
    for (const PageEntry& p : t.pages) s.push_back(p.shard);
    return s;
  }
};

TEST(ShardGroup, SpreadTablesGoRoundRobinInChunks) {
  Group g(3, 8, 2 * kBlock);  // chunks of two pages
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 12 * kBlock));
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.shards_used(), 3);
  EXPECT_TRUE(t.sharded());
  EXPECT_EQ(g.pool->total_blocks(), 24);
  EXPECT_EQ(g.pool->available_blocks(), 12);
  EXPECT_EQ(g.pool->used_blocks(), 12);
  EXPECT_EQ(g.pool->releasable_blocks(t), 12);
  g.pool->release(t);
  EXPECT_EQ(g.pool->used_blocks(), 0);
  EXPECT_TRUE(t.spread);  // a property of the sequence: kept
}

TEST(ShardGroup, HomeFirstUntilFullThenTheNextShard) {
  Group g(2, 4, kBlock);
  BlockTable home, other;
  ASSERT_TRUE(g.pool->reserve(home, 3 * kBlock));
  EXPECT_FALSE(home.sharded());
  ASSERT_TRUE(g.pool->reserve(other, 3 * kBlock));  // one block left at home
  EXPECT_EQ(g.shards_of(other), (std::vector<int>{0, 1, 1}));
  BlockTable none;
  EXPECT_FALSE(g.pool->reserve(none, 3 * kBlock));  // 2 free in the group: nothing taken
  EXPECT_TRUE(none.blocks.empty());
  EXPECT_EQ(g.pool->available_blocks(), 2);
  g.pool->release(home);
  g.pool->release(other);
  EXPECT_EQ(g.pool->used_blocks(), 0);
}

TEST(ShardGroup, PlacementFallsBackWhenThePreferredShardIsFull) {
  Group g(2, 2, kBlock);  // one page per chunk
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 4 * kBlock));
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 1, 0, 1}));
  g.pool->release(t);
  BlockTable a;
  ASSERT_TRUE(g.pool->reserve(a, kBlock));  // home takes one
  ASSERT_TRUE(g.pool->reserve(t, 3 * kBlock));
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 1, 1}));
  g.pool->release(t);
  g.pool->release(a);
  EXPECT_EQ(g.pool->used_blocks(), 0);
}

TEST(ShardGroup, AddShardsRefusesBadArguments) {
  Group g(1, 4, kBlock);
  std::vector<std::unique_ptr<backend::Backend>> peers;
  peers.push_back(std::move(backend::create_backend("cpu", 1)).value());
  EXPECT_EQ(g.pool->add_shards(std::move(peers), kBlock + 1).code(), StatusCode::kInvalidArgument);
  BlockTable t;
  ASSERT_TRUE(g.pool->reserve(t, kBlock));
  std::vector<std::unique_ptr<backend::Backend>> more;
  more.push_back(std::move(backend::create_backend("cpu", 1)).value());
  EXPECT_EQ(g.pool->add_shards(std::move(more), kBlock).code(), StatusCode::kFailedPrecondition);
  g.pool->release(t);
}

TEST(ShardGroup, MigrateBetweenShardsIsByteExact) {
  Group g(3, 8, kBlock);
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 6 * kBlock - 1));  // partial last page
  g.fill(t, 7);
  const std::vector<float> before = g.read(t);
  MigrateStats st;
  auto moved = migrate_pages(*g.pool, t, 0, 4, 2, &st);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_EQ(*moved, 3);  // page 2 already was on shard 2
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{2, 2, 2, 2, 1, 2}));
  EXPECT_EQ(g.read(t), before);
  EXPECT_EQ(st.pages, 3);
  EXPECT_EQ(st.bytes, 3 * g.pool->bytes_per_block());
  EXPECT_EQ(g.pool->shard(0).allocator().num_used(), 0);  // the old blocks were freed
  EXPECT_EQ(g.pool->shard(2).allocator().num_used(), 5);
  // Back home: the table is no longer sharded once every page is there.
  ASSERT_TRUE(migrate_pages(*g.pool, t, 0, 6, 0).ok());
  EXPECT_FALSE(t.sharded());
  EXPECT_EQ(g.read(t), before);
  g.pool->release(t);
  EXPECT_EQ(g.pool->used_blocks(), 0);
}

TEST(ShardGroup, MigrateFromTheHostTierAndSwapInOntoTheGroup) {
  Group g(2, 6, kBlock, /*host_pages=*/8);
  BlockTable t;  // home only: swappable
  ASSERT_TRUE(g.pool->reserve(t, 5 * kBlock));
  g.fill(t, 11);
  const std::vector<float> before = g.read(t);
  SwapStats ss;
  auto out = swap_out(*g.pool, t, &ss);
  ASSERT_TRUE(out.ok() && *out);
  EXPECT_EQ(g.pool->host_allocator().num_used(), 5);
  auto moved = migrate_pages(*g.pool, t, 1, 3, 1);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_EQ(*moved, 2);
  EXPECT_EQ(g.pool->host_allocator().num_used(), 3);
  EXPECT_EQ(t.pages[1].location, PageLocation::kDevice);
  EXPECT_EQ(t.pages[1].shard, 1);
  EXPECT_EQ(swapped_pages(t), 3);
  // Fill home so the swap-in must place pages on shard 1 too.
  BlockTable filler;
  ASSERT_TRUE(g.pool->reserve(filler, 5 * kBlock));
  auto in = swap_in(*g.pool, t, &ss);
  ASSERT_TRUE(in.ok() && *in) << (in.ok() ? "refused" : in.status().to_string());
  EXPECT_EQ(g.read(t), before);
  EXPECT_EQ(g.pool->host_allocator().num_used(), 0);
  EXPECT_TRUE(t.sharded());
  // A sharded table is not swapped out (counted), and stays as it is.
  auto again = swap_out(*g.pool, t, &ss);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_EQ(ss.refused_sharded, 1);
  g.pool->release(t);
  g.pool->release(filler);
  EXPECT_EQ(g.pool->used_blocks(), 0);
}

TEST(ShardGroup, MigrateIsAllOrNothingAndChecksItsArguments) {
  Group g(2, 3, kBlock);
  BlockTable t;
  ASSERT_TRUE(g.pool->reserve(t, 3 * kBlock));  // all home
  BlockTable u;
  ASSERT_TRUE(g.pool->reserve(u, 2 * kBlock));  // shard 1 keeps one free block
  const auto pages = g.shards_of(t);
  auto full = migrate_pages(*g.pool, t, 0, 3, 1);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(g.shards_of(t), pages);
  EXPECT_EQ(g.pool->used_blocks(), 5);
  EXPECT_EQ(migrate_pages(*g.pool, t, 0, 4, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(migrate_pages(*g.pool, t, 2, 1, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(migrate_pages(*g.pool, t, 0, 1, 2).status().code(), StatusCode::kInvalidArgument);
  auto one = migrate_pages(*g.pool, t, 2, 3, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 1);
  g.pool->release(t);
  g.pool->release(u);
  EXPECT_EQ(g.pool->used_blocks(), 0);
}

}  // namespace
}  // namespace kvsplit::kv
