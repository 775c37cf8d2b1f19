// sched::blocks_needed (the CLI path's pool size): prompt + max_tokens - 1 positions per input,
// capped by the context, in whole blocks; saturated, never wrapped.
#include "sched/batch_generate.h"

#include <gtest/gtest.h>

#include <limits>

namespace kvsplit::sched {
namespace {

GenerationInput input(int prompt, int max_tokens) {
  GenerationInput in;
  in.prompt_ids.assign(static_cast<size_t>(prompt), 5);
  in.params.max_tokens = max_tokens;
  return in;
}

TEST(BlocksNeeded, WholeBlocksOfPromptPlusOutputCappedByTheContext) {
  // 10 + 7 - 1 = 16 positions: one block of 16; 17 + 1 - 1 = 17: two; 100 + 100 - 1 capped at 64.
  EXPECT_EQ(blocks_needed({input(10, 7)}, 16, 64), 1);
  EXPECT_EQ(blocks_needed({input(17, 1)}, 16, 64), 2);
  EXPECT_EQ(blocks_needed({input(100, 100)}, 16, 64), 4);
  EXPECT_EQ(blocks_needed({input(10, 7), input(17, 1)}, 16, 64), 3);
}

// 200 sequences of 2^24 positions in blocks of 1 token: 3.4e9 blocks. The sum wrapped (to a
// small or negative pool); it saturates, and KvPool::create refuses that many blocks clearly.
TEST(BlocksNeeded, SaturatesInsteadOfWrapping) {
  std::vector<GenerationInput> inputs(200, input(1, 1 << 24));
  EXPECT_EQ(blocks_needed(inputs, 1, 1 << 24), std::numeric_limits<int32_t>::max());
}

}  // namespace
}  // namespace kvsplit::sched
