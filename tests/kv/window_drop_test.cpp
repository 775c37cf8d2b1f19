// kv::drop_behind_window: the pages every layer's sliding window has passed go back to their pools
// with everything they hold (resident copy, host original, key summary), the prefix stays
// contiguous (a page in flight or off the device stops it), a page shared with the prefix cache
// stays cached, a windowed cache hit takes only the window's pages, and the pool is whole again
// after release.
#include <gtest/gtest.h>

#include <vector>

#include "kv/kv_pool.h"
#include "kv/page_ops.h"
#include "kv/page_pool_fixture.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;
using testing::kBlock;
using Fixture = testing::PagePoolFixture;

TEST(WindowDrop, FreesExactlyThePagesNoNextQueryReads) {
  Fixture f(/*host_pages=*/8, /*blocks=*/16);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 6 * kBlock + 1));  // 7 pages, the last one holds one token
  f.fill(t, 1);
  PageOpStats st;
  const int n = 6 * kBlock + 1;
  // The next query (position n) reads [n - W + 1, n]: with W = 2 * kBlock + 1 that starts at
  // 4 * kBlock + 1, so pages 0..3 end before it and page 4 is still read.
  EXPECT_EQ(drop_behind_window(*f.pool, t, n, 2 * kBlock + 1, &st), 4);
  EXPECT_EQ(t.window_dropped, 4);
  EXPECT_EQ(st.window_dropped, 4);
  EXPECT_EQ(st.evicted, 0);  // not the cut's evictions
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.blocks[i], -1) << i;
    EXPECT_FALSE(t.pages[i].resident()) << i;
  }
  EXPECT_TRUE(t.pages[4].resident());
  EXPECT_EQ(f.pool->allocator().num_used(), 3);
  EXPECT_TRUE(t.all_full()) << "pages behind the window do not make a table mixed";
  // A window two keys longer reaches back into page 3 (its last key, 15): page 3 stays.
  BlockTable u;
  ASSERT_TRUE(f.pool->reserve(u, n));
  EXPECT_EQ(drop_behind_window(*f.pool, u, n, 2 * kBlock + 3, &st), 3);
  EXPECT_EQ(f.pool->allocator().num_used(), 3 + 4);
  // Nothing more goes until the window moves on, and window 0 (a full layer) drops nothing.
  EXPECT_EQ(drop_behind_window(*f.pool, t, n, 2 * kBlock + 1, &st), 0);
  EXPECT_EQ(drop_behind_window(*f.pool, u, n + 8 * kBlock, 0, &st), 0);
  // Moving on by one page drops one more.
  EXPECT_EQ(drop_behind_window(*f.pool, t, n + kBlock, 2 * kBlock + 1, &st), 1);
  EXPECT_EQ(t.window_dropped, 5);
  f.pool->release(t);
  f.pool->release(u);
  EXPECT_EQ(t.window_dropped, 0);
  f.expect_all_free();
}

TEST(WindowDrop, FreesTheOriginalAndSummaryOfQuantizedAndEvictedPages) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 6 * kBlock));
  f.fill(t, 2);
  PageOpStats st;
  ASSERT_TRUE(apply_page_transitions(*f.pool, t, 6 * kBlock,
                                     {{{0, PageOp::kDemote, KvPrecision::kInt8},
                                       {1, PageOp::kDemote, KvPrecision::kInt4},
                                       {2, PageOp::kEvict, KvPrecision::kEvicted}}},
                                     &st)
                  .ok());
  ASSERT_EQ(f.pool->host_allocator().num_used(), 3);
  ASSERT_EQ(f.pool->summary_allocator().num_used(), 3);
  EXPECT_FALSE(t.all_full());
  // W = kBlock + 1 at 6 pages: the next query reads from 5 * kBlock, pages 0..4 go.
  EXPECT_EQ(drop_behind_window(*f.pool, t, 6 * kBlock, kBlock + 1, &st), 5);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->summary_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 0);
  EXPECT_EQ(f.pool->allocator().num_used(), 1);
  EXPECT_TRUE(t.all_full());  // what is left is one full page
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t.pages[i].original, -1) << i;
    EXPECT_EQ(t.pages[i].summary, -1) << i;
  }
  f.pool->release(t);
  f.expect_all_free();
}

TEST(WindowDrop, APageInFlightOrOffTheDeviceStopsTheDropUntilALaterCall) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 3);
  t.pages.resize(t.blocks.size());
  t.pages[1].restoring = true;  // a recall in flight: its copy still lands into a block
  PageOpStats st;
  EXPECT_EQ(drop_behind_window(*f.pool, t, 4 * kBlock, 1, &st), 1);  // page 0 only
  EXPECT_EQ(t.window_dropped, 1);
  t.pages[1].restoring = false;
  EXPECT_EQ(drop_behind_window(*f.pool, t, 4 * kBlock, 1, &st), 3);  // pages 1..3: the last
  EXPECT_EQ(t.window_dropped, 4);                                    // token's page too
  f.pool->release(t);
  f.expect_all_free();
}

TEST(WindowDrop, APageSharedWithThePrefixCacheStaysCached) {
  backend::BackendOptions o;
  o.threads = 1;
  auto be = std::move(backend::create_backend("cpu", o)).value();
  KvPoolConfig c;
  c.num_blocks = 8;
  c.block_size = kBlock;
  auto pool =
      std::move(KvPool::create(*be, c, KvShape{testing::kLayers, testing::kKvHeads, 8})).value();
  pool->enable_prefix_cache();
  std::vector<int32_t> tokens(4 * kBlock);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i + 7);
  BlockTable t;
  ASSERT_TRUE(pool->reserve(t, 4 * kBlock));
  pool->cache_prefix(t, 0, tokens, 4);
  ASSERT_EQ(pool->prefix_cache()->size(), 4);
  PageOpStats st;
  EXPECT_EQ(drop_behind_window(*pool, t, 4 * kBlock, kBlock + 1, &st), 3);
  // The cache keeps its pages (now only it holds them: evictable, nothing leaked).
  EXPECT_EQ(pool->prefix_cache()->size(), 4);
  EXPECT_EQ(pool->allocator().num_used(), 4);
  // Offering the table again touches the cached pages behind the window and adds nothing.
  pool->cache_prefix(t, 0, tokens, 4);
  EXPECT_EQ(pool->prefix_cache()->size(), 4);
  // A new sequence with the same prompt is served all four pages from the cache.
  BlockTable u;
  EXPECT_EQ(pool->share_prefix(u, 0, tokens, 4), 4);
  pool->release(u);
  pool->release(t);
  EXPECT_EQ(pool->available_blocks(), 8);
}

// A windowed prompt's cache hit takes only the pages the window of its end still reads: those
// behind are left where they are cached (on the host tier here, never brought back) and the table
// holds them as dropped. All or nothing: when a page the window reads cannot come back, nothing
// is taken.
TEST(WindowDrop, AWindowedHitTakesOnlyThePagesTheWindowReads) {
  Fixture f(/*host_pages=*/16, /*blocks=*/16);
  f.pool->enable_prefix_cache();
  std::vector<int32_t> tokens(10 * kBlock + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 * i + 1);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 10 * kBlock));
  f.fill(t, 5);
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 10; ++i) want.push_back(f.page(t, i));
  f.pool->cache_prefix(t, 0, tokens, 10);
  f.pool->release(t);
  const int window = 2 * kBlock + 1;  // the query at position 40 reads keys 32-40: pages 8, 9
  BlockTable u;
  EXPECT_EQ(f.pool->share_prefix(u, 0, tokens, 10, window), 10);
  ASSERT_EQ(u.blocks.size(), 10u);
  EXPECT_EQ(u.window_dropped, 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(u.blocks[i], -1) << i;
    EXPECT_EQ(u.pages[i].location, PageLocation::kEvicted) << i;
  }
  EXPECT_EQ(f.page(u, 8), want[8]);
  EXPECT_EQ(f.page(u, 9), want[9]);
  EXPECT_EQ(f.pool->prefix_stats().hit_pages, 10);  // every page is served, none computed
  EXPECT_EQ(f.pool->prefix_stats().lookups, 1);
  f.pool->release(u);
  EXPECT_EQ(f.pool->available_blocks(), 16);

  // Push every cached page to the host tier: a windowed hit brings back the window's two alone.
  BlockTable x;
  ASSERT_TRUE(f.pool->reserve(x, 16 * kBlock));
  ASSERT_EQ(f.pool->prefix_cache()->pages_host(), 10);
  f.pool->release(x);
  EXPECT_EQ(f.pool->share_prefix(u, 0, tokens, 10, window), 10);
  EXPECT_EQ(f.pool->prefix_stats().hit_pages_host, 2);
  EXPECT_EQ(f.pool->prefix_cache()->pages_host(), 8);  // the skipped pages stay where they were
  EXPECT_EQ(f.page(u, 8), want[8]);
  EXPECT_EQ(f.page(u, 9), want[9]);
  EXPECT_EQ(f.pool->allocator().num_used(), 2);
  f.pool->release(u);

  // Back on the host, and no free block for a restore: nothing is taken at all.
  ASSERT_TRUE(f.pool->reserve(x, 16 * kBlock));
  ASSERT_EQ(f.pool->prefix_cache()->pages_host(), 10);
  EXPECT_EQ(f.pool->share_prefix(u, 0, tokens, 10, window), 0);
  EXPECT_TRUE(u.blocks.empty());
  EXPECT_EQ(u.window_dropped, 0);
  EXPECT_EQ(f.pool->prefix_cache()->pages_host(), 10);
  f.pool->release(x);
  // A window wider than the hit takes every page, as without one.
  EXPECT_EQ(f.pool->share_prefix(u, 0, tokens, 10, 100 * kBlock), 10);
  EXPECT_EQ(u.window_dropped, 0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(f.page(u, i), want[i]) << i;
  f.pool->release(u);
  f.pool->prefix_cache()->clear(f.pool->allocator());
  EXPECT_EQ(f.pool->available_blocks(), 16);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
}

}  // namespace
}  // namespace kvsplit::kv
