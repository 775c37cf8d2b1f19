#include "sched/swap_cost.h"

#include <gtest/gtest.h>

namespace kvsplit::sched {
namespace {

TEST(SwapCost, AutoPicksTheCheaperPrediction) {
  SwapCosts c;
  c.d2h_bytes_per_s = 1e9;
  c.h2d_bytes_per_s = 2e9;
  c.prefill_tokens_per_s = 1000;
  // 10 MB: 10 ms out + 5 ms in = 15 ms; 100 tokens at 1000/s = 100 ms.
  SwapChoice s = choose_swap(SwapMode::kAuto, c, 10'000'000, 100);
  EXPECT_TRUE(s.swap);
  EXPECT_NEAR(s.swap_ms, 15.0, 1e-9);
  EXPECT_NEAR(s.recompute_ms, 100.0, 1e-9);
  // 10 tokens: 10 ms of prefill beats 15 ms of copies.
  s = choose_swap(SwapMode::kAuto, c, 10'000'000, 10);
  EXPECT_FALSE(s.swap);
  EXPECT_NEAR(s.recompute_ms, 10.0, 1e-9);
}

TEST(SwapCost, OverridesAndUnmeasuredCosts) {
  SwapCosts c;
  c.d2h_bytes_per_s = c.h2d_bytes_per_s = 1e6;
  c.prefill_tokens_per_s = 1e6;
  EXPECT_TRUE(choose_swap(SwapMode::kAlways, c, 1'000'000'000, 1).swap);
  EXPECT_FALSE(choose_swap(SwapMode::kNever, c, 1, 1'000'000).swap);
  // Nothing measured yet: swap (recompute always redoes the work).
  EXPECT_TRUE(choose_swap(SwapMode::kAuto, SwapCosts{}, 1 << 20, 16).swap);
}

TEST(SwapCost, Ewma) {
  EXPECT_DOUBLE_EQ(ewma(0, 10, 0.2), 10);  // first sample
  EXPECT_DOUBLE_EQ(ewma(10, 20, 0.25), 12.5);
}

}  // namespace
}  // namespace kvsplit::sched
