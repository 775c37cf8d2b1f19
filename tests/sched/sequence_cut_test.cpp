// SequenceCut::split_budget: one device budget split between the full pool and the quantized
// arenas, the parts adding up to no more than the budget.
#include "sched/sequence_cut.h"

#include <gtest/gtest.h>

namespace kvsplit::sched {
namespace {

TEST(SequenceCutBudget, SplitsOneBudgetBetweenTheRungs) {
  const kv::KvShape shape{12, 12, 64};  // llama-110m
  kv::KvPoolConfig pc;
  pc.block_size = 16;
  const int64_t budget = int64_t{512} << 20;
  SemanticCutConfig sc;
  ASSERT_TRUE(SequenceCut::split_budget(sc, budget, 0.4, shape, &pc).ok());
  const int64_t full = kv::KvPool::block_bytes(pc, shape);
  const kernels::QuantPageLayout ql{12, 16, 64};
  const int64_t b8 = ql.bytes(kernels::KvPrecision::kInt8) * 12;
  const int64_t b4 = ql.bytes(kernels::KvPrecision::kInt4) * 12;
  const int64_t summary = int64_t{2} * 12 * 64 * 2 * 12;  // f16 min and max
  const int64_t used = pc.num_blocks * full + pc.int8_blocks * b8 + pc.int4_blocks * b4 +
                       int64_t{pc.summary_slots} * summary;
  EXPECT_LE(used, budget);
  EXPECT_GT(used, budget * 95 / 100);
  EXPECT_NEAR(static_cast<double>(pc.num_blocks * full) / budget, 0.6, 0.01);
  EXPECT_GT(pc.int4_blocks, pc.int8_blocks);
  EXPECT_EQ(pc.summary_slots, pc.int8_blocks + 2 * pc.int4_blocks);
  EXPECT_GT(pc.host_bytes, 0);
  // In pages of tokens, the same budget holds more once pages are quantized.
  EXPECT_GT(pc.num_blocks + pc.int8_blocks + pc.int4_blocks, budget / full);

  EXPECT_EQ(pc.summary_parts, 1);

  // Summaries in 4 parts take 4 times the bytes: the arenas hold fewer pages, the budget still
  // holds, and the pool is told the layout.
  SemanticCutConfig parts = sc;
  parts.summary_parts = 4;
  kv::KvPoolConfig pc4;
  pc4.block_size = 16;
  ASSERT_TRUE(SequenceCut::split_budget(parts, budget, 0.4, shape, &pc4).ok());
  EXPECT_EQ(pc4.summary_parts, 4);
  EXPECT_EQ(pc4.num_blocks, pc.num_blocks);
  EXPECT_LT(pc4.int8_blocks, pc.int8_blocks);
  EXPECT_LT(pc4.int4_blocks, pc.int4_blocks);
  const int64_t used4 = pc4.num_blocks * full + pc4.int8_blocks * b8 + pc4.int4_blocks * b4 +
                        int64_t{pc4.summary_slots} * summary * 4;
  EXPECT_LE(used4, budget);
  EXPECT_GT(used4, budget * 95 / 100);

  EXPECT_FALSE(SequenceCut::split_budget(sc, budget, 0.0, shape, &pc).ok());
  EXPECT_FALSE(SequenceCut::split_budget(sc, budget, 1.0, shape, &pc).ok());
  EXPECT_FALSE(SequenceCut::split_budget(sc, full, 0.5, shape, &pc).ok());  // under one page each
}

}  // namespace
}  // namespace kvsplit::sched
