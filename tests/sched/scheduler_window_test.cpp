// The Scheduler with a sliding window (SchedulerConfig::kv_window): a prompt's pages are reserved
// chunk by chunk, a target longer than the pool is not refused while a chunk's pages fit beside
// what the sequence holds, and a chunk never outgrows the blocks reserved for it. Without a
// window nothing changes (scheduler_test.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "sched/scheduler.h"
#include "sched/scheduler_test_util.h"

namespace kvsplit::sched {
namespace {

SchedulerConfig windowed(int max_batch_tokens, int window, int max_chunk = 0) {
  SchedulerConfig c = config(max_batch_tokens, /*colocated=*/true);
  c.kv_window = window;
  c.max_chunk_tokens = max_chunk;
  return c;
}

TEST(SchedulerWindow, PagesAreReservedForTheChunkNotTheWholePrompt) {
  // A 400-token prompt (100 blocks of 4) in a pool of 20: refused whole, reserved by chunk.
  const std::vector<SchedSeq> wait = {waiting(10, 400)};
  SchedulerInput in{{}, wait, {}, /*free=*/20, /*total=*/20, /*step=*/1};
  const SchedulerOutput whole = Scheduler(config(16, true)).schedule(in);
  ASSERT_EQ(whole.never_fit.size(), 1u);
  EXPECT_TRUE(whole.prefill.empty());

  const SchedulerOutput out = Scheduler(windowed(16, /*window=*/8)).schedule(in);
  EXPECT_TRUE(out.never_fit.empty());
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].tokens, 16);
  EXPECT_EQ(out.prefill[0].new_blocks, 4);  // 16 tokens: 4 blocks, not 100
  EXPECT_EQ(out.free_blocks_after, 16);

  // Later chunks add what they reach beyond the table: 200 computed in 50 slots, of which it
  // still holds 3 (the rest were dropped behind the window).
  SchedSeq mid = waiting(10, 400, /*computed=*/200, /*blocks=*/50);
  mid.held_blocks = 3;
  const std::vector<SchedSeq> mids = {mid};
  SchedulerInput later{{}, mids, {}, /*free=*/17, /*total=*/20, /*step=*/2};
  const SchedulerOutput next = Scheduler(windowed(16, 8)).schedule(later);
  ASSERT_EQ(next.prefill.size(), 1u);
  EXPECT_EQ(next.prefill[0].tokens, 16);
  EXPECT_EQ(next.prefill[0].new_blocks, 4);
  // The last chunk reaches the target only: 8 tokens, 2 blocks.
  SchedSeq tail = waiting(10, 400, /*computed=*/392, /*blocks=*/98);
  tail.held_blocks = 3;
  const std::vector<SchedSeq> tails = {tail};
  SchedulerInput end{{}, tails, {}, 17, 20, 3};
  const SchedulerOutput last = Scheduler(windowed(16, 8)).schedule(end);
  ASSERT_EQ(last.prefill.size(), 1u);
  EXPECT_EQ(last.prefill[0].tokens, 8);
  EXPECT_EQ(last.prefill[0].new_blocks, 2);
  EXPECT_TRUE(last.prefill[0].last);
}

TEST(SchedulerWindow, AChunkStaysWithinTheRoomLeftAndNoRoomAtAllNeverFits) {
  // It holds 18 of 20 blocks: the next chunk gets 2 blocks' worth (8 tokens), not 16.
  SchedSeq w = waiting(10, 400, /*computed=*/100, /*blocks=*/25);
  w.held_blocks = 18;
  std::vector<SchedSeq> ws = {w};
  SchedulerInput in{{}, ws, {}, /*free=*/2, /*total=*/20, 1};
  const SchedulerOutput out = Scheduler(windowed(16, 64)).schedule(in);
  EXPECT_TRUE(out.never_fit.empty());
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].tokens, 8);
  EXPECT_EQ(out.prefill[0].new_blocks, 2);
  // Holding the whole pool with more to compute: it can never fit.
  ws[0].held_blocks = 20;
  SchedulerInput full{{}, ws, {}, /*free=*/0, /*total=*/20, 1};
  const SchedulerOutput none = Scheduler(windowed(16, 64)).schedule(full);
  ASSERT_EQ(none.never_fit.size(), 1u);
  EXPECT_TRUE(none.prefill.empty());
}

// A handoff from a prefill worker that dropped its prompt's first pages behind the window needs
// blocks for the pages it brings only: 100 tokens (25 pages of 4) of which 22 were dropped take
// 3 blocks, and 1 more for its first decode token (position 100 opens page 25).
TEST(SchedulerWindow, AHandoffNeedsBlocksOnlyForThePagesInsideTheWindow) {
  SchedulerConfig c = windowed(16, 8);
  c.decode_in_budget = false;
  const std::vector<SchedHandoff> whole = {{1000, 0, 0, /*num_tokens=*/100}};
  SchedulerInput in{{}, {}, whole, /*free=*/10, /*total=*/10, 1};
  const SchedulerOutput refused = Scheduler(c).admit_handoffs(in);
  ASSERT_EQ(refused.never_fit.size(), 1u);  // 25 pages in a pool of 10
  EXPECT_TRUE(refused.admitted.empty());
  const std::vector<SchedHandoff> windowed_off = {{1000, 0, 0, 100, /*dropped=*/22}};
  in.handoffs = windowed_off;
  const SchedulerOutput out = Scheduler(c).admit_handoffs(in);
  EXPECT_TRUE(out.never_fit.empty());
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_EQ(out.admitted[0].blocks, 3);
  EXPECT_EQ(out.free_blocks_after, 7);
  // With 3 free it waits: its first decode token needs a fourth.
  in.free_blocks = 3;
  const SchedulerOutput wait = Scheduler(c).admit_handoffs(in);
  EXPECT_TRUE(wait.admitted.empty());
  EXPECT_EQ(wait.handoff_wait, HandoffWait::kNoBlocks);
}

TEST(SchedulerWindow, ChunkCapAndPromptAdmission) {
  const SchedulerConfig c = windowed(64, 8, /*max_chunk=*/24);
  EXPECT_EQ(c.chunk_cap(), 24);
  EXPECT_EQ(c.prefill_reach(0, 400), 24);
  EXPECT_EQ(c.prefill_reach(390, 400), 400);
  EXPECT_FALSE(c.shares_prefix(400));  // a long prompt reserves by chunk: no cached pages
  EXPECT_TRUE(c.shares_prefix(24));
  EXPECT_EQ(config(64, true).prefill_reach(0, 400), 400);
  // A new prompt is admitted when its first chunk's blocks fit (6 of 24 tokens), not all 100.
  const Scheduler s(c);
  EXPECT_TRUE(s.can_admit_prompt(400, /*free=*/6, /*total=*/20, /*running=*/0, /*owned=*/0));
  EXPECT_FALSE(s.can_admit_prompt(400, /*free=*/5, 20, 0, 0));
  EXPECT_FALSE(Scheduler(config(64, true)).can_admit_prompt(400, 20, 20, 0, 0));
}

// Prompts that hold every block between them still progress inside the pages they hold: each
// waited for a whole chunk's pages (need > free), nobody decoded, and the worker hung for good.
TEST(SchedulerWindow, PromptsHoldingEveryBlockProgressInsideTheirPages) {
  // Window 8, blocks of 4, a 16-token chunk cap; three 80-token prompts hold all 12 blocks.
  const std::vector<SchedSeq> wait = {waiting(1, 80, /*computed=*/8, /*blocks=*/4),
                                      waiting(2, 80, 4, 4), waiting(3, 80, 4, 4)};
  SchedulerInput in{{}, wait, {}, /*free=*/0, /*total=*/12, /*step=*/1};
  const SchedulerOutput out = Scheduler(windowed(16, /*window=*/8)).schedule(in);
  EXPECT_TRUE(out.never_fit.empty());
  ASSERT_FALSE(out.prefill.empty());
  int tokens = 0;
  for (const PrefillChunk& p : out.prefill) {
    EXPECT_EQ(p.new_blocks, 0) << p.id;  // nothing free: only the pages it holds
    const SchedSeq& w = wait[static_cast<size_t>(p.id - 1)];
    EXPECT_LE(w.num_computed + p.tokens, w.num_blocks * 4) << p.id;
    tokens += p.tokens;
  }
  EXPECT_GT(tokens, 0);
  EXPECT_EQ(out.free_blocks_after, 0);

  // With one block free, the first in service order takes it and the others only their pages.
  in.free_blocks = 1;
  const SchedulerOutput one = Scheduler(windowed(16, 8)).schedule(in);
  int taken = 0;
  for (const PrefillChunk& p : one.prefill) {
    if (p.id != 1) {
      EXPECT_EQ(p.new_blocks, 0) << p.id;
    }
    taken += p.new_blocks;
  }
  EXPECT_LE(taken, 1);
  // Without a window nothing changes: a prompt waits for its whole target's blocks.
  const SchedulerOutput plain = Scheduler(config(16, true)).schedule(in);
  EXPECT_TRUE(plain.prefill.empty());
}

}  // namespace
}  // namespace kvsplit::sched
