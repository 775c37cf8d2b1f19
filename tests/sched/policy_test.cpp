#include "sched/policy.h"

#include <gtest/gtest.h>

#include <numeric>

namespace kvsplit::sched {
namespace {

int sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(PrefillChunks, FairShareUnderBudget) {
  const std::vector<int> remaining = {1000, 1000, 10};
  const std::vector<int> c = plan_prefill_chunks(remaining, 96, 16);
  EXPECT_EQ(sum(c), 96);
  EXPECT_EQ(c[2], 10);         // the short prompt finishes this step
  EXPECT_EQ(c[0] + c[1], 86);  // the long ones split the rest
  EXPECT_LE(std::abs(c[0] - c[1]), 16);
}

TEST(PrefillChunks, NeverExceedsRemainingOrBudget) {
  for (int budget : {1, 7, 16, 100, 512}) {
    for (int min_chunk : {1, 16, 64}) {
      const std::vector<int> remaining = {5, 300, 0, 17, 64};
      const std::vector<int> c = plan_prefill_chunks(remaining, budget, min_chunk);
      ASSERT_EQ(c.size(), remaining.size());
      EXPECT_LE(sum(c), budget);
      for (size_t i = 0; i < c.size(); ++i) EXPECT_LE(c[i], remaining[i]);
      EXPECT_EQ(sum(c), std::min(budget, sum(remaining)));  // work-conserving
    }
  }
}

TEST(PrefillChunks, MinChunkGoesToTheFirstInOrder) {
  const std::vector<int> c = plan_prefill_chunks(std::vector<int>{100, 100, 100}, 32, 16);
  EXPECT_EQ(c, (std::vector<int>{16, 16, 0}));
  EXPECT_TRUE(plan_prefill_chunks(std::vector<int>{}, 32, 16).empty());
  EXPECT_EQ(plan_prefill_chunks(std::vector<int>{10}, 0, 16), std::vector<int>{0});
}

TEST(Preemption, LowestPriorityThenYoungest) {
  std::vector<PriorityKey> c = {{5, 1}, {0, 2}, {0, 7}, {3, 9}};
  EXPECT_EQ(choose_preemption_victim(c), 2);
  c = {{1, 4}};
  EXPECT_EQ(choose_preemption_victim(c), 0);
  EXPECT_EQ(choose_preemption_victim({}), -1);
  EXPECT_TRUE(serves_before({1, 10}, {0, 1}));
  EXPECT_TRUE(serves_before({0, 1}, {0, 2}));
  EXPECT_FALSE(serves_before({0, 2}, {0, 2}));
}

TEST(DecodeWorker, LeastKvLoadIncludingIncoming) {
  std::vector<DecodeLoad> w(3);
  for (auto& l : w) l.kv_blocks_total = 100;
  w[0].kv_blocks_free = 50;
  w[1].kv_blocks_free = 80;
  w[2].kv_blocks_free = 90;
  w[2].kv_blocks_incoming = 30;  // effectively 40% used
  EXPECT_EQ(choose_decode_worker(w), 1);
  w[1].kv_blocks_incoming = 30;  // 50% -> worker 2 wins
  EXPECT_EQ(choose_decode_worker(w), 2);
  w[2].kv_blocks_incoming = 40;  // tie at 50%: fewer running wins, then lowest index
  w[0].kv_blocks_free = 50;
  w[1].running = 3;
  w[2].running = 1;
  w[0].running = 2;
  EXPECT_EQ(choose_decode_worker(w), 2);
  EXPECT_EQ(choose_decode_worker({}), -1);
}

}  // namespace
}  // namespace kvsplit::sched
