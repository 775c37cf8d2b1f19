// The spatial cut's shard group in the KV pool: placement of a spread table's pages in chunks
// (preferred shard, the next one with room when it is full), the group's free blocks, release on
// every shard, swap in onto the group, and the migration hook (kv/migrate.h) from another shard
// or from the host tier, byte-exact and all or nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "forwarding_backend.h"
#include "kv/kv_pool.h"
#include "kv/migrate.h"
#include "kv/swap.h"
#include "shard_group_fixture.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

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

TEST(ShardGroup, ReleaseTailFreesTheTailPagesOnTheirShards) {
  Group g(3, 8, 2 * kBlock);
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 12 * kBlock));
  g.pool->release_tail(t, 5 * kBlock + 1);  // 6 pages kept: shards 0 0 1 1 2 2
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.pages.size(), 6u);
  EXPECT_EQ(g.pool->used_blocks(), 6);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(g.pool->shard(s).allocator().num_used(), 2) << s;
  ASSERT_TRUE(g.pool->reserve(t, 8 * kBlock));  // grows again where the placement says
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 0, 1, 1, 2, 2, 0, 0}));
  g.pool->release(t);
  EXPECT_EQ(g.pool->used_blocks(), 0);
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
  // More shards than sharded attention merges (Backend::kMaxMergeParts): refused here, not at
  // every forward pass.
  Group h(1, 4, kBlock);
  std::vector<std::unique_ptr<backend::Backend>> many;
  for (int s = 0; s < backend::Backend::kMaxMergeParts; ++s)
    many.push_back(std::move(backend::create_backend("cpu", 1)).value());
  const Status too_many = h.pool->add_shards(std::move(many), kBlock);
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("at most 16 shards"), std::string::npos) << too_many.message();
}

// A peer whose pool cannot be made (its device memory runs out) leaves the group as it was: no
// shard added half, so the pool can be grouped again.
TEST(ShardGroup, AddShardsIsAllOrNothing) {
  class NoMemory final : public kvsplit::testing::ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;
    StatusOr<void*> alloc(size_t) override { return resource_exhausted("no device memory"); }
  };
  Group g(1, 4, kBlock);
  std::vector<std::unique_ptr<backend::Backend>> peers;
  peers.push_back(std::move(backend::create_backend("cpu", 1)).value());
  peers.push_back(std::make_unique<NoMemory>(std::move(backend::create_backend("cpu", 1)).value()));
  EXPECT_EQ(g.pool->add_shards(std::move(peers), kBlock).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(g.pool->num_shards(), 1);
  std::vector<std::unique_ptr<backend::Backend>> good;
  good.push_back(std::move(backend::create_backend("cpu", 1)).value());
  ASSERT_TRUE(g.pool->add_shards(std::move(good), kBlock).ok());
  EXPECT_EQ(g.pool->num_shards(), 2);
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

// max_pages: the first pages that can move, wherever they are in the range (the KV cache
// manager's migrate_to_shard asked for the table's first pages, which may already be there).
TEST(ShardGroup, MigrateAtMostMaxPagesOfThoseThatCanMove) {
  Group g(3, 8, kBlock);
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 6 * kBlock));
  ASSERT_EQ(g.shards_of(t), (std::vector<int>{0, 1, 2, 0, 1, 2}));
  g.fill(t, 5);
  const std::vector<float> before = g.read(t);
  auto moved = migrate_pages(*g.pool, t, 0, 6, 0, nullptr, /*max_pages=*/2);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_EQ(*moved, 2);  // pages 1 and 2 (page 0 is on shard 0 already)
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 0, 0, 0, 1, 2}));
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
  g.pool->release(t);
  g.pool->release(filler);
  EXPECT_EQ(g.pool->used_blocks(), 0);
}

// A table spread over 2-4 shards swaps out of every shard into the home host tier and back in,
// byte-exact on every layer (the last page partial); every shard's blocks are free meanwhile.
TEST(ShardedSwap, RoundTripThroughTheHostTierIsByteExactOnEveryShard) {
  for (int shards = 2; shards <= 4; ++shards) {
    for (int chunk : {kBlock, 2 * kBlock, 3 * kBlock}) {
      SCOPED_TRACE("shards " + std::to_string(shards) + " chunk " + std::to_string(chunk));
      Group g(shards, 6, chunk, /*host_pages=*/16);
      BlockTable t;
      t.spread = true;
      ASSERT_TRUE(g.pool->reserve(t, 9 * kBlock - 3));  // 9 pages, the last partial
      g.fill(t, 100 + shards + chunk);
      const std::vector<float> before = g.read(t);
      const std::vector<int> placed = g.shards_of(t);
      EXPECT_EQ(t.shards_used(), std::min(shards, (9 * kBlock + chunk - 1) / chunk));
      EXPECT_TRUE(t.sharded());
      SwapStats ss;
      auto out = swap_out(*g.pool, t, &ss);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ASSERT_TRUE(*out);
      EXPECT_EQ(ss.swaps_out, 1);
      EXPECT_EQ(ss.pages_out, 9);
      EXPECT_EQ(ss.bytes_out, 9 * g.pool->bytes_per_block());
      for (int s = 0; s < shards; ++s) EXPECT_EQ(g.pool->shard(s).allocator().num_used(), 0);
      EXPECT_EQ(g.pool->host_allocator().num_used(), 9);
      EXPECT_EQ(swapped_pages(t), 9);
      EXPECT_FALSE(t.sharded());  // nothing on a device
      // Meanwhile another spread table overwrites every freed block.
      BlockTable other;
      other.spread = true;
      ASSERT_TRUE(g.pool->reserve(other, shards * 6 * kBlock));
      g.fill(other, 7);
      g.pool->release(other);
      auto in = swap_in(*g.pool, t, &ss);
      ASSERT_TRUE(in.ok()) << in.status().to_string();
      ASSERT_TRUE(*in);
      EXPECT_EQ(g.read(t), before);
      EXPECT_EQ(g.shards_of(t), placed);  // an empty group places them as reserve() did
      EXPECT_EQ(g.pool->host_allocator().num_used(), 0);
      EXPECT_EQ(g.pool->used_blocks(), 9);
      g.pool->release(t);
      g.expect_all_free();
    }
  }
}

// Swapped back in, pages go where the group has room now, which may not be where they were.
TEST(ShardedSwap, SwapInPlacesPagesWhereTheGroupHasRoom) {
  Group g(3, 4, kBlock, /*host_pages=*/8);
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 6 * kBlock - 1));
  g.fill(t, 3);
  const std::vector<float> before = g.read(t);
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 1, 2, 0, 1, 2}));
  SwapStats ss;
  ASSERT_TRUE(*swap_out(*g.pool, t, &ss));
  // Shard 1 fills up meanwhile.
  BlockTable filler;
  ASSERT_TRUE(g.pool->reserve(filler, 4 * kBlock));  // home first: shard 0
  ASSERT_TRUE(migrate_pages(*g.pool, filler, 0, 4, 1).ok());
  EXPECT_EQ(g.pool->shard(1).allocator().num_free(), 0);
  ASSERT_TRUE(*swap_in(*g.pool, t, &ss));
  EXPECT_EQ(g.read(t), before);
  for (int s : g.shards_of(t)) EXPECT_NE(s, 1);
  EXPECT_EQ(g.pool->shard(0).allocator().num_used() + g.pool->shard(2).allocator().num_used(), 6);
  g.pool->release(t);
  g.pool->release(filler);
  g.expect_all_free();
}

// Host tier too small: the whole sharded table goes to one disk record and back, with and
// without a prefetch.
TEST(ShardedSwap, RoundTripThroughTheDiskTierWithAndWithoutPrefetch) {
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch");
    Group g(4, 3, 2 * kBlock, /*host_pages=*/2);
    g.attach_disk();
    BlockTable t;
    t.spread = true;
    ASSERT_TRUE(g.pool->reserve(t, 10 * kBlock - 2));
    g.fill(t, 55);
    const std::vector<float> before = g.read(t);
    EXPECT_EQ(t.shards_used(), 4);
    SwapStats ss;
    auto out = swap_out(*g.pool, t, &ss);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_TRUE(*out);
    EXPECT_EQ(ss.to_disk, 1);
    EXPECT_NE(t.disk_record, 0u);
    EXPECT_EQ(g.pool->used_blocks(), 0);
    EXPECT_EQ(g.pool->host_allocator().num_used(), 0);
    EXPECT_EQ(g.disk->stats().records, 1);
    BlockTable other;
    other.spread = true;
    ASSERT_TRUE(g.pool->reserve(other, 12 * kBlock));
    g.fill(other, 9);
    g.pool->release(other);
    SwapPrefetch pf;
    if (prefetch) {
      auto started = start_prefetch(*g.pool, t, &pf, &ss);
      ASSERT_TRUE(started.ok() && *started);
    }
    auto in = swap_in(*g.pool, t, &ss, prefetch ? &pf : nullptr);
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    ASSERT_TRUE(*in);
    EXPECT_EQ(g.read(t), before);
    EXPECT_EQ(ss.from_disk, 1);
    EXPECT_EQ(ss.prefetch_hits + ss.prefetch_misses, 1);
    EXPECT_EQ(pf.record, 0u);
    EXPECT_EQ(t.shards_used(), 4);
    g.pool->release(t);
    g.expect_all_free();
  }
}

// The host tier's prefetch of a sharded table: its blocks are placed over the group as the
// swap-in places them (each page's preferred shard, or the next with room), one fenced batch per
// shard on that shard's copy thread, and the swap-in that uses them is bit-exact and places the
// pages there; a dropped one gives every shard its blocks back.
TEST(ShardedSwap, HostPrefetchPlacesOnTheGroupAndIsBitExact) {
  backend::BackendOptions async;
  async.async_copies = true;
  async.fenced_copy_delay_us = 20000;  // in flight when the swap-in comes: a miss
  for (bool drop : {false, true}) {
    SCOPED_TRACE(drop ? "dropped, then swapped in without it" : "used by the swap-in");
    Group g(3, 4, kBlock, /*host_pages=*/8, async);
    BlockTable t;
    t.spread = true;
    ASSERT_TRUE(g.pool->reserve(t, 6 * kBlock - 1));
    g.fill(t, 31);
    const std::vector<float> before = g.read(t);
    SwapStats ss;
    ASSERT_TRUE(*swap_out(*g.pool, t, &ss));
    EXPECT_EQ(g.pool->used_blocks(), 0);
    auto started = start_host_prefetch(*g.pool, t, 12, &ss);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    ASSERT_TRUE(*started);
    std::vector<int> shards;
    for (const PendingRestore& r : t.swap_prefetch) shards.push_back(r.shard);
    EXPECT_EQ(shards, (std::vector<int>{0, 1, 2, 0, 1, 2}));
    for (int s = 0; s < 3; ++s) EXPECT_EQ(g.pool->shard(s).allocator().num_used(), 2);
    if (drop) {
      drop_host_prefetch(*g.pool, t, &ss);
      EXPECT_EQ(ss.host_prefetch_dropped, 1);
      EXPECT_EQ(g.pool->used_blocks(), 0);
      EXPECT_EQ(g.pool->host_allocator().num_used(), 6);
    }
    auto in = swap_in(*g.pool, t, &ss);
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    ASSERT_TRUE(*in);
    EXPECT_EQ(g.read(t), before);
    EXPECT_EQ(g.shards_of(t), (std::vector<int>{0, 1, 2, 0, 1, 2}));
    EXPECT_EQ(ss.host_prefetch_hits + ss.host_prefetch_misses, 1);
    if (!drop) {
      EXPECT_EQ(ss.host_prefetch_misses, 1);  // waited for the delayed copies
    }
    EXPECT_EQ(g.pool->host_allocator().num_used(), 0);
    g.pool->release(t);
    g.expect_all_free();
  }
}

// A swap-in the group lacks blocks for is refused, changes nothing and leaks nothing; it runs
// once the blocks are back.
TEST(ShardedSwap, SwapInRefusedWhenTheGroupLacksBlocksAndNothingLeaks) {
  Group g(2, 4, kBlock, /*host_pages=*/8);
  BlockTable t;
  t.spread = true;
  ASSERT_TRUE(g.pool->reserve(t, 5 * kBlock));
  g.fill(t, 12);
  const std::vector<float> before = g.read(t);
  SwapStats ss;
  ASSERT_TRUE(*swap_out(*g.pool, t, &ss));
  const std::vector<PageEntry> pages = t.pages;
  BlockTable filler;
  filler.spread = true;
  ASSERT_TRUE(g.pool->reserve(filler, 4 * kBlock));  // 4 of 8 left: 5 needed
  auto in = swap_in(*g.pool, t, &ss);
  ASSERT_TRUE(in.ok());
  EXPECT_FALSE(*in);
  EXPECT_EQ(ss.refused_no_blocks, 1);
  EXPECT_EQ(g.pool->used_blocks(), 4);  // only the filler's
  EXPECT_EQ(g.pool->host_allocator().num_used(), 5);
  ASSERT_EQ(t.pages.size(), pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(t.pages[i].location, PageLocation::kHost);
    EXPECT_EQ(t.pages[i].original, pages[i].original);
    EXPECT_EQ(t.blocks[i], -1);
  }
  g.pool->release(filler);
  ASSERT_TRUE(*swap_in(*g.pool, t, &ss));
  EXPECT_EQ(g.read(t), before);
  EXPECT_TRUE(t.sharded());
  // Swapped out again and released while out: the host slots come back too.
  ASSERT_TRUE(*swap_out(*g.pool, t, &ss));
  EXPECT_EQ(g.pool->host_allocator().num_used(), 5);
  g.pool->release(t);
  g.expect_all_free();
}

// A swap-in that cannot place every page changes nothing, the prefix cache included: with host
// pages {0, 3, 4} (pages 1-2 migrated back) it places two runs, and before it checked the total
// first, the run [0] took the only evictable cached page, the run [3, 4] found nothing, and the
// rollback freed that block: the cached page was gone though the swap-in was refused.
TEST(ShardedSwap, ARefusedSwapInOfSeveralRunsKeepsTheCachedPages) {
  Group g(1, 6, kBlock, /*host_pages=*/8);
  g.pool->enable_prefix_cache();
  BlockTable t;
  ASSERT_TRUE(g.pool->reserve(t, 5 * kBlock));
  g.fill(t, 13);
  SwapStats ss;
  ASSERT_TRUE(*swap_out(*g.pool, t, &ss));
  ASSERT_EQ(*migrate_pages(*g.pool, t, 1, 3, 0), 2);  // host pages now 0, 3 and 4
  BlockTable cached;
  ASSERT_TRUE(g.pool->reserve(cached, kBlock));
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  g.pool->cache_prefix(cached, /*salt=*/7, tokens, 1);
  g.pool->release(cached);  // held by the cache only: evictable
  BlockTable filler;
  ASSERT_TRUE(g.pool->reserve(filler, 3 * kBlock));  // every free block
  ASSERT_EQ(g.pool->available_blocks(), 1);
  ASSERT_EQ(g.pool->prefix_pages().device, 1);
  auto in = swap_in(*g.pool, t, &ss);
  ASSERT_TRUE(in.ok());
  EXPECT_FALSE(*in);
  EXPECT_EQ(g.pool->prefix_pages().device, 1) << "the refused swap-in evicted a cached page";
  EXPECT_EQ(swapped_pages(t), 3);
  g.pool->release(filler);
  g.pool->release(t);
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
