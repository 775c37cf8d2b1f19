// sched::StepCostModel: the fit of a step's forward time against its tokens that sizes the
// time-based fair-prefill cap (pools.max_chunk_ms).
#include "sched/step_cost.h"

#include <gtest/gtest.h>

#include <limits>

namespace kvsplit::sched {
namespace {

TEST(StepCostModel, RecoversAFixedAndAPerTokenPartFromStepsOfDifferentSizes) {
  StepCostModel m;
  EXPECT_FALSE(m.ready());
  EXPECT_EQ(m.tokens_within(100.0), 0);  // nothing measured: no promise
  // A GPU-like step: 20 ms whatever it carries, plus 0.01 ms per token.
  for (int i = 0; i < 40; ++i) {
    const int tokens = i % 2 ? 8 : 512;
    m.observe(tokens, 20.0 + 0.01 * tokens);
  }
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.fixed_ms(), 20.0, 1e-6);
  EXPECT_NEAR(m.ms_per_token(), 0.01, 1e-9);
  EXPECT_NEAR(m.tokens_within(30.0), 1000, 1);  // (30 - 20) / 0.01
  EXPECT_EQ(m.tokens_within(19.0), 0);          // not even the fixed part fits
}

TEST(StepCostModel, RecentStepsOutweighOldOnes) {
  StepCostModel m;
  for (int i = 0; i < 50; ++i) m.observe(i % 2 ? 16 : 256, 1.0 * (i % 2 ? 16 : 256));
  EXPECT_NEAR(m.ms_per_token(), 1.0, 1e-6);
  // Tokens got dearer (late in a long prefill): after 100 more steps the fit follows.
  for (int i = 0; i < 100; ++i) m.observe(i % 2 ? 16 : 256, 2.0 * (i % 2 ? 16 : 256));
  EXPECT_NEAR(m.ms_per_token(), 2.0, 0.02);
  EXPECT_NEAR(m.tokens_within(100.0), 50, 1);
}

TEST(StepCostModel, WithoutSpreadTheWholeTimeIsPerToken) {
  StepCostModel m;
  for (int i = 0; i < 10; ++i) m.observe(64, 32.0);  // one size only: no intercept to see
  EXPECT_EQ(m.fixed_ms(), 0.0);
  EXPECT_NEAR(m.ms_per_token(), 0.5, 1e-9);
  EXPECT_EQ(m.tokens_within(16.0), 32);
  // A fit with a negative slope (noise) falls back the same way instead of promising any size.
  StepCostModel noisy;
  for (int i = 0; i < 10; ++i) noisy.observe(i % 2 ? 16 : 256, i % 2 ? 30.0 : 10.0);
  EXPECT_EQ(noisy.fixed_ms(), 0.0);
  EXPECT_GT(noisy.ms_per_token(), 0.0);
  EXPECT_LT(noisy.tokens_within(100.0), std::numeric_limits<int>::max());
}

TEST(StepCostModel, IgnoresEmptyAndBrokenSamples) {
  StepCostModel m;
  m.observe(0, 5.0);
  m.observe(10, -1.0);
  m.observe(10, std::numeric_limits<double>::quiet_NaN());
  m.observe(10, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(m.ready());
  EXPECT_EQ(m.ms_per_token(), 0.0);
}

}  // namespace
}  // namespace kvsplit::sched
