#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace kvsplit::kv {
namespace {

TEST(BlockAllocator, AllocatesDistinctIdsUntilExhausted) {
  BlockAllocator a(8);
  EXPECT_EQ(a.num_blocks(), 8);
  EXPECT_EQ(a.num_free(), 8);
  auto x = a.allocate(5);
  ASSERT_TRUE(x.has_value());
  ASSERT_EQ(x->size(), 5u);
  auto y = a.allocate(3);
  ASSERT_TRUE(y.has_value());
  std::set<int32_t> ids(x->begin(), x->end());
  ids.insert(y->begin(), y->end());
  EXPECT_EQ(ids.size(), 8u);
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), 7);
  for (int32_t id : ids) EXPECT_EQ(a.refcount(id), 1);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.num_used(), 8);
}

// The prefix cache's index of the pages only it holds rests on this: a watched block's count
// crossing 1 is reported (after the change), and nothing else is.
TEST(BlockAllocator, AWatchedBlockReportsEachCrossingOfOneAndNothingElse) {
  struct Log final : BlockWatcher {
    const BlockAllocator* a = nullptr;
    std::vector<std::pair<int32_t, int>> calls;  // (block, refcount seen)
    void on_sharing_changed(int32_t block) override {
      calls.emplace_back(block, a->refcount(block));
    }
  } log;
  BlockAllocator a(4);
  log.a = &a;
  a.set_watcher(&log);
  auto x = *a.allocate(2);
  a.watch(x[0], true);
  a.incref(x[0]);  // 1 -> 2
  a.incref(x[0]);  // 2 -> 3: no crossing
  a.incref(x[1]);  // not watched
  a.decref(x[0]);  // 3 -> 2
  a.decref(x[0]);  // 2 -> 1
  a.decref(x[1]);
  using Calls = std::vector<std::pair<int32_t, int>>;
  EXPECT_EQ(log.calls, (Calls{{x[0], 2}, {x[0], 1}}));
  a.watch(x[0], false);
  a.incref(x[0]);
  a.decref(x[0]);
  EXPECT_EQ(log.calls.size(), 2u);
  a.decref(x[0]);  // unwatched, it may be freed
  EXPECT_EQ(a.num_free(), 3);
  // A watched block freed is a bookkeeping bug: its watcher still names it.
  a.watch(x[1], true);
  EXPECT_DEATH(a.decref(x[1]), "watched block was freed");
}

TEST(BlockAllocator, ExhaustionReturnsNulloptAndChangesNothing) {
  BlockAllocator a(4);
  auto x = a.allocate(3);
  ASSERT_TRUE(x.has_value());
  EXPECT_FALSE(a.allocate(2).has_value());
  EXPECT_EQ(a.num_free(), 1);
  for (int32_t id : *x) EXPECT_EQ(a.refcount(id), 1);
  auto y = a.allocate(1);  // the last one is still there
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(std::count(x->begin(), x->end(), (*y)[0]), 0);
  EXPECT_FALSE(a.allocate(1).has_value());
  auto z = a.allocate(0);
  ASSERT_TRUE(z.has_value());
  EXPECT_TRUE(z->empty());
}

TEST(BlockAllocator, RefcountsFreeOnLastDecref) {
  BlockAllocator a(2);
  auto x = a.allocate(1);
  ASSERT_TRUE(x.has_value());
  const int32_t id = (*x)[0];
  a.incref(id);
  a.incref(id);
  EXPECT_EQ(a.refcount(id), 3);
  a.decref(id);
  a.decref(id);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.refcount(id), 1);
  a.decref(id);
  EXPECT_EQ(a.refcount(id), 0);
  EXPECT_EQ(a.num_free(), 2);
  // Freed ids are handed out again.
  auto y = a.allocate(2);
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(std::count(y->begin(), y->end(), id), 1);
}

TEST(BlockAllocator, EmptyAllocator) {
  BlockAllocator a(0);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_FALSE(a.allocate(1).has_value());
}

using BlockAllocatorDeathTest = ::testing::Test;

TEST(BlockAllocatorDeathTest, DoubleFreeAndBadIdsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        BlockAllocator a(2);
        auto x = a.allocate(1);
        a.decref((*x)[0]);
        a.decref((*x)[0]);
      },
      "double free");
  EXPECT_DEATH({ BlockAllocator(2).decref(2); }, "out of range");
  EXPECT_DEATH({ BlockAllocator(2).incref(-1); }, "out of range");
  EXPECT_DEATH({ BlockAllocator(2).incref(0); }, "free block");
}

TEST(BlockTable, BlocksFor) {
  EXPECT_EQ(BlockTable::blocks_for(0, 16), 0);
  EXPECT_EQ(BlockTable::blocks_for(1, 16), 1);
  EXPECT_EQ(BlockTable::blocks_for(16, 16), 1);
  EXPECT_EQ(BlockTable::blocks_for(17, 16), 2);
  EXPECT_EQ(BlockTable::blocks_for(5, 1), 5);
}

}  // namespace
}  // namespace kvsplit::kv
