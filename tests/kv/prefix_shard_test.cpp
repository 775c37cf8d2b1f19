// The prefix cache over a shard group (kv-cuts.md "Prefix cache" under the spatial cut): every
// shard caches the pages on its device, a lookup walks the prompt from shard to shard and leaves
// each hit where it is cached, a peer's evicted pages spill to the home shard's host tier and
// come back byte-exact, and the home tier's users reclaim the peers' spilled pages too.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/kv_pool.h"
#include "kv/migrate.h"
#include "kv/prefix_cache.h"
#include "kv/swap.h"
#include "shard_group_fixture.h"

namespace kvsplit::kv {
namespace {

std::vector<int32_t> prompt(int pages, int32_t first = 1) {
  std::vector<int32_t> t(static_cast<size_t>(pages * kBlock + 1));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// The first `pages` pages of `t`'s KV (every layer), as Group::read gives them.
std::vector<float> head(Group& g, const BlockTable& t, int pages) {
  std::vector<float> all = g.read(t);
  all.resize(static_cast<size_t>(pages * kLayers * g.floats()));
  return all;
}

TEST(PrefixShard, ASpreadPromptIsCachedOnEveryShardAndHitWhereItLies) {
  Group g(2, 16, 2 * kBlock);     // chunks of two pages
  g.pool->enable_prefix_cache();  // after add_shards: the peer gets its cache here
  ASSERT_NE(g.pool->shard_prefix_cache(1), nullptr);
  const uint64_t salt = PrefixCache::salt_of("tenant");
  const std::vector<int32_t> tokens = prompt(8);
  BlockTable a;
  a.spread = true;
  ASSERT_TRUE(g.pool->reserve(a, static_cast<int>(tokens.size())));
  EXPECT_EQ(g.shards_of(a), (std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1, 0}));
  g.fill(a, 11);
  const std::vector<float> want = head(g, a, 8);
  g.pool->cache_prefix(a, salt, tokens, 8);
  EXPECT_EQ(g.pool->shard_prefix_cache(0)->size(), 4);
  EXPECT_EQ(g.pool->shard_prefix_cache(1)->size(), 4);
  g.pool->release(a);
  EXPECT_EQ(g.pool->used_blocks(), 8);         // the caches hold the prompt's pages
  EXPECT_EQ(g.pool->available_blocks(), 32);   // all of them evictable
  EXPECT_EQ(g.pool->releasable_blocks(a), 0);  // released: nothing left

  // A spread sequence takes all 8 pages where they lie; a plain one too (pages on the peer).
  for (bool spread : {true, false}) {
    BlockTable b;
    b.spread = spread;
    EXPECT_EQ(g.pool->share_prefix(b, salt, tokens, 8), 8);
    EXPECT_EQ(g.shards_of(b), (std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1}));
    EXPECT_EQ(g.read(b), want);
    // Held besides only by the caches, on either shard: evictable once released.
    EXPECT_EQ(g.pool->releasable_blocks(b), 8);
    ASSERT_TRUE(g.pool->reserve(b, static_cast<int>(tokens.size())));
    EXPECT_EQ(b.pages.back().shard, 0);
    g.pool->release(b);
  }
  const PrefixCacheStats st = g.pool->prefix_stats();
  EXPECT_EQ(st.lookups, 2);  // one per prompt: the home cache counts them
  EXPECT_EQ(st.lookup_pages, 16);
  EXPECT_EQ(st.hit_pages, 16);
  EXPECT_EQ(g.pool->shard_prefix_cache(1)->stats().hit_pages, 8);

  // Another tenant shares nothing on any shard.
  BlockTable other;
  EXPECT_EQ(g.pool->share_prefix(other, PrefixCache::salt_of("other"), tokens, 8), 0);
  // Filling the whole group evicts the cached pages of both shards (no tier below: dropped).
  BlockTable all;
  ASSERT_TRUE(g.pool->reserve(all, 32 * kBlock));
  EXPECT_EQ(g.pool->prefix_pages().total, 0);
  g.pool->release(all);
  g.expect_all_free();
}

// The home shard's cache may hold a prompt's first pages and a peer's the rest: the walk goes on
// from cache to cache, and a page cached on one shard is only touched, never cached again on
// another, when a sequence that took it caches its prompt.
TEST(PrefixShard, TheWalkCrossesShardsAndAPageIsCachedOnce) {
  Group g(2, 16, 4 * kBlock);  // chunks of four pages
  g.pool->enable_prefix_cache();
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> tokens = prompt(8);
  BlockTable a;  // not spread: its four pages at home
  ASSERT_TRUE(g.pool->reserve(a, 4 * kBlock + 1));
  g.fill(a, 3);
  g.pool->cache_prefix(a, salt, tokens, 4);
  g.pool->release(a);
  BlockTable b;
  b.spread = true;
  ASSERT_EQ(g.pool->share_prefix(b, salt, tokens, 8), 4);
  ASSERT_TRUE(g.pool->reserve(b, static_cast<int>(tokens.size())));
  EXPECT_EQ(g.shards_of(b), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 0}));
  g.fill(b, 5);  // the shared pages 0-3 too: c must read what b's pages hold
  const std::vector<float> want = head(g, b, 8);
  g.pool->cache_prefix(b, salt, tokens, 8);
  EXPECT_EQ(g.pool->shard_prefix_cache(0)->size(), 4);  // pages 0-3, touched only
  EXPECT_EQ(g.pool->shard_prefix_cache(1)->size(), 4);  // pages 4-7
  g.pool->release(b);
  BlockTable c;  // not spread: takes the peer's pages as they are
  EXPECT_EQ(g.pool->share_prefix(c, salt, tokens, 8), 8);
  EXPECT_EQ(g.shards_of(c), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(g.read(c), want);
  EXPECT_TRUE(c.sharded());
  g.pool->release(c);
  // A prompt cut short: only the whole pages it has are looked up.
  BlockTable d;
  EXPECT_EQ(g.pool->share_prefix(d, salt, std::span(tokens).first(6 * kBlock + 2), 8), 6);
  g.pool->release(d);
  g.pool->shard_prefix_cache(0)->clear(g.pool->shard(0).allocator());
  g.pool->shard_prefix_cache(1)->clear(g.pool->shard(1).allocator());
  g.expect_all_free();
}

// A peer's evicted pages spill to the home host tier and come back byte-exact onto the peer; the
// home tier's other users (swap, the semantic cut's originals) reclaim the peers' pages too.
TEST(PrefixShard, APeersPagesSpillToTheHomeHostTierAndComeBackByteExact) {
  Group g(2, 4, 2 * kBlock, /*host_pages=*/8);
  g.pool->enable_prefix_cache();
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> tokens = prompt(4);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    BlockTable a;
    a.spread = true;
    ASSERT_TRUE(g.pool->reserve(a, 4 * kBlock));
    ASSERT_EQ(g.shards_of(a), (std::vector<int>{0, 0, 1, 1}));
    g.fill(a, 17 + round);
    const std::vector<float> want = g.read(a);
    g.pool->cache_prefix(a, salt, tokens, 4);
    g.pool->release(a);
    // Eight pages fill both shards, evicting the two cached pages of each.
    BlockTable x;
    ASSERT_TRUE(g.pool->reserve(x, 8 * kBlock));
    EXPECT_EQ(g.pool->prefix_pages().host, 4);
    EXPECT_EQ(g.pool->shard_prefix_cache(1)->pages_host(), 2);
    EXPECT_EQ(g.pool->host_allocator().num_used(), 4);
    g.pool->release(x);
    BlockTable b;
    b.spread = true;
    ASSERT_EQ(g.pool->share_prefix(b, salt, tokens, 4), 4);
    EXPECT_EQ(g.shards_of(b), (std::vector<int>{0, 0, 1, 1}));  // back onto their shards
    EXPECT_EQ(g.read(b), want);
    EXPECT_EQ(g.pool->host_allocator().num_used(), 0);  // the slots are free again
    EXPECT_EQ(g.pool->shard_prefix_cache(1)->stats().hit_pages_host, 2 * (round + 1));
    g.pool->release(b);
    // Spill them again, then let swap take every host slot: the peer's pages give way too.
    ASSERT_TRUE(g.pool->reserve(x, 8 * kBlock));
    EXPECT_EQ(g.pool->available_host_slots(), 8);
    auto slots = g.pool->allocate_host_slots(8);
    ASSERT_TRUE(slots.has_value());
    EXPECT_EQ(g.pool->prefix_pages().host, 0);
    EXPECT_GE(g.pool->shard_prefix_cache(1)->stats().reclaimed, 2);
    for (int32_t s : *slots) g.pool->host_allocator().decref(s);
    g.pool->release(x);
  }
  g.expect_all_free();
}

// With a disk tier below, a peer's page goes on to disk and is read back onto the peer.
TEST(PrefixShard, APeersPagesGoOnToTheDiskTierAndComeBack) {
  Group g(2, 4, 2 * kBlock, /*host_pages=*/0);
  g.attach_disk();
  g.pool->enable_prefix_cache();
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> tokens = prompt(4);
  BlockTable a;
  a.spread = true;
  ASSERT_TRUE(g.pool->reserve(a, 4 * kBlock));
  g.fill(a, 29);
  const std::vector<float> want = g.read(a);
  g.pool->cache_prefix(a, salt, tokens, 4);
  g.pool->release(a);
  BlockTable x;
  ASSERT_TRUE(g.pool->reserve(x, 8 * kBlock));  // every block of the group
  g.pool->shard_prefix_cache(0)->wait_spills();
  g.pool->shard_prefix_cache(1)->wait_spills();
  EXPECT_EQ(g.pool->prefix_pages().disk, 4);
  EXPECT_EQ(g.disk->stats().records, 4);
  g.pool->release(x);
  BlockTable b;
  b.spread = true;
  ASSERT_EQ(g.pool->share_prefix(b, salt, tokens, 4), 4);
  EXPECT_EQ(g.shards_of(b), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(g.read(b), want);
  EXPECT_EQ(g.pool->prefix_stats().hit_pages_disk, 4);
  g.pool->release(b);
  // Spilled again, every cache's records give way to a record that needs all but one extent:
  // the home cache's two alone would not make the room.
  ASSERT_TRUE(g.pool->reserve(x, 8 * kBlock));
  g.pool->shard_prefix_cache(0)->wait_spills();
  g.pool->shard_prefix_cache(1)->wait_spills();
  ASSERT_EQ(g.disk->stats().records, 4);
  const DiskTierStats ds = g.disk->stats();
  g.pool->make_disk_room((ds.extents_total - 1) * ds.extent_bytes);
  EXPECT_EQ(g.disk->stats().records, 1);
  EXPECT_EQ(g.pool->shard_prefix_cache(0)->pages_disk(), 0);  // the home's go first
  EXPECT_EQ(g.pool->shard_prefix_cache(1)->pages_disk(), 1);
  // A record that could never fit takes nothing.
  g.pool->make_disk_room((ds.extents_total + 1) * ds.extent_bytes);
  EXPECT_EQ(g.disk->stats().records, 1);
  g.pool->release(x);
  g.pool->shard_prefix_cache(0)->clear(g.pool->shard(0).allocator());
  g.pool->shard_prefix_cache(1)->clear(g.pool->shard(1).allocator());
  g.expect_all_free();
}

// A spread table `a` of the prompt's `pages` full pages, filled from `seed` and cached; false when
// the group had no room for it.
[[nodiscard]] bool cache_spread_prompt(Group& g, BlockTable* a, uint64_t salt,
                                       const std::vector<int32_t>& tokens, int pages,
                                       uint32_t seed) {
  a->spread = true;
  if (!g.pool->reserve(*a, pages * kBlock)) return false;
  g.fill(*a, seed);
  g.pool->cache_prefix(*a, salt, tokens, pages);
  return true;
}

// Migrating onto a peer whose blocks are all held by its prefix cache (idle, evictable) evicts
// them as placing a page there does; it was refused with "shard 1 has 0 free blocks" although the
// group counted them available.
TEST(PrefixShard, MigratingOntoAPeerEvictsItsIdleCachedPages) {
  Group g(2, 4, kBlock);  // chunks of one page
  g.pool->enable_prefix_cache();
  BlockTable a;
  ASSERT_TRUE(cache_spread_prompt(g, &a, PrefixCache::salt_of("tenant"), prompt(8), 8, 3));
  g.pool->release(a);
  ASSERT_EQ(g.pool->shard(1).allocator().num_free(), 0);  // all cached
  BlockTable t;                                           // home only
  ASSERT_TRUE(g.pool->reserve(t, kBlock));  // evicts one of the home shard's cached pages
  g.fill(t, 9);
  const std::vector<float> before = g.read(t);
  auto moved = migrate_pages(*g.pool, t, 0, 1, 1);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  EXPECT_EQ(*moved, 1);
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{1}));
  EXPECT_EQ(g.read(t), before);
  g.pool->release(t);
}

// A prompt computed again on the home shard alone (no lookup: all its pages on shard 0) while the
// group's caches hold it spread: each page stays cached once, where it is (the home cache took
// the pages the peer holds a second time, wasting blocks and double-counting them).
TEST(PrefixShard, APageAnotherShardCachesIsNotCachedTwice) {
  Group g(2, 16, kBlock);  // chunks of one page
  g.pool->enable_prefix_cache();
  const uint64_t salt = PrefixCache::salt_of("tenant");
  const std::vector<int32_t> tokens = prompt(8);
  BlockTable a;
  ASSERT_TRUE(cache_spread_prompt(g, &a, salt, tokens, 8, 5));
  BlockTable b;  // home only, computed without a lookup
  ASSERT_TRUE(g.pool->reserve(b, 8 * kBlock));
  ASSERT_EQ(g.shards_of(b), std::vector<int>(8, 0));
  g.fill(b, 5);
  g.pool->cache_prefix(b, salt, tokens, 8);
  EXPECT_EQ(g.pool->shard_prefix_cache(0)->size(), 4);
  EXPECT_EQ(g.pool->shard_prefix_cache(1)->size(), 4);
  g.pool->release(a);
  g.pool->release(b);
  EXPECT_EQ(g.pool->used_blocks(), 8);  // one block per cached page
}

// A host prefetch takes free blocks only (its budget counts those): with the home shard's blocks
// all held by idle cached pages and the peer's free, its pages go to the peer and the home cache
// keeps every prompt page (they were evicted for a sequence that had not resumed yet).
TEST(PrefixShard, AHostPrefetchEvictsNoCachedPage) {
  Group g(2, 4, kBlock, /*host_pages=*/8);
  g.pool->enable_prefix_cache();
  BlockTable t;  // home only, swapped out to the host tier
  ASSERT_TRUE(g.pool->reserve(t, 2 * kBlock));
  g.fill(t, 4);
  const std::vector<float> before = g.read(t);
  SwapStats ss;
  ASSERT_TRUE(*swap_out(*g.pool, t, &ss));
  BlockTable c;  // fills the home shard with a cached prompt
  ASSERT_TRUE(g.pool->reserve(c, 4 * kBlock));
  ASSERT_EQ(g.shards_of(c), std::vector<int>(4, 0));
  g.fill(c, 6);
  g.pool->cache_prefix(c, PrefixCache::salt_of("tenant"), prompt(4), 4);
  g.pool->release(c);
  ASSERT_EQ(g.pool->shard_prefix_cache(0)->size(), 4);
  const int budget =
      g.pool->shard(0).allocator().num_free() + g.pool->shard(1).allocator().num_free();
  auto started = start_host_prefetch(*g.pool, t, budget, &ss);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  ASSERT_TRUE(*started);
  EXPECT_EQ(g.pool->shard_prefix_cache(0)->size(), 4);
  auto in = swap_in(*g.pool, t, &ss);
  ASSERT_TRUE(in.ok() && *in);
  EXPECT_EQ(g.shards_of(t), (std::vector<int>{1, 1}));
  EXPECT_EQ(g.read(t), before);
  g.pool->release(t);
}

}  // namespace
}  // namespace kvsplit::kv
