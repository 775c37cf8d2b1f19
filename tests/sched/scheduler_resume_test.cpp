// Scheduler: resumptions (swap-ins and restarts by recompute) admitted in one plan. Each leaves
// the block its next token needs free, and a later one in the same plan (or a later step, while
// the first one's recompute runs) fits only beside those blocks: otherwise it took the block the
// earlier one decodes into and was preempted by that one's first decode, its recompute or copy
// thrown away (the ping-pong next_token_room is there to stop).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "scheduler_test_util.h"

namespace kvsplit::sched {
namespace {

// Block size 4, a pool of 8 with 4 free: running sequence 0 holds 2 blocks and ends within them.
SchedSeq steady_running() {
  SchedSeq a = running(0, /*computed=*/6, /*blocks=*/2);
  a.final_positions = 7;
  return a;
}

SchedSeq restart(int id, int target) {
  SchedSeq s = waiting(id, target);
  s.restart = true;
  return s;
}

// The step after: `resumed` (8 positions, its 2 pages full) decodes; `other` too when it was
// started in the first step, else it still waits.
SchedulerOutput next_step(const Scheduler& sched, const SchedulerOutput& first, SchedSeq other) {
  SchedSeq a = steady_running();
  a.num_computed = 7;
  SchedSeq resumed = running(1, /*computed=*/8, /*blocks=*/2);
  resumed.final_positions = 40;
  std::vector<SchedSeq> run = {a, resumed}, wait;
  const bool started = std::any_of(first.prefill.begin(), first.prefill.end(),
                                   [&](const PrefillChunk& c) { return c.id == other.id; });
  if (started) {
    SchedSeq r = running(other.id, other.target, 2);
    r.final_positions = 40;
    run.push_back(r);
  } else {
    wait.push_back(other);
  }
  return sched.schedule({run, wait, {}, first.free_blocks_after, /*total=*/8, /*step=*/6});
}

TEST(SchedulerResume, TwoRestartsInOnePlanLeaveTheFirstOnesNextTokenBlockFree) {
  const Scheduler sched(config(64, true));
  const std::vector<SchedSeq> run = {steady_running()};
  // Restart 1 (older): 8 positions, 2 blocks, and a third for its next token. Restart 2: 7
  // positions, 2 blocks. Both fit the 4 free blocks, but not beside restart 1's next token.
  const SchedSeq r2 = restart(2, 7);
  const std::vector<SchedSeq> wait = {restart(1, 8), r2};
  const SchedulerOutput first = sched.schedule({run, wait, {}, /*free=*/4, 8, /*step=*/5});
  EXPECT_EQ(first.prefill.size(), 1u);  // restart 2 waits
  EXPECT_EQ(first.free_blocks_after, 2);
  // Restart 1 decodes into its third block, and nobody is preempted for it.
  const SchedulerOutput second = next_step(sched, first, r2);
  EXPECT_TRUE(second.preempted.empty());
  const auto grown = std::find_if(second.decode.begin(), second.decode.end(),
                                  [](const DecodeRow& d) { return d.id == 1; });
  ASSERT_NE(grown, second.decode.end());
  EXPECT_EQ(grown->new_blocks, 1);
}

TEST(SchedulerResume, ARestartAfterASwapInLeavesTheSwapInsNextTokenBlockFree) {
  const Scheduler sched(config(64, true));
  const std::vector<SchedSeq> run = {steady_running()};
  // Swapped out by its own growth at a page boundary: 8 positions on 2 host pages.
  SchedSeq s = waiting(1, /*target=*/8, /*computed=*/8, /*blocks=*/2);
  s.held_blocks = 0;
  s.swapped_pages = 2;
  const SchedSeq r2 = restart(2, 7);
  const std::vector<SchedSeq> wait = {s, r2};
  const SchedulerOutput first = sched.schedule({run, wait, {}, /*free=*/4, 8, /*step=*/5});
  EXPECT_EQ(first.swap_in.size(), 1u);
  EXPECT_TRUE(first.prefill.empty());  // the restart waits
  EXPECT_EQ(first.free_blocks_after, 2);
  EXPECT_TRUE(next_step(sched, first, r2).preempted.empty());
}

// A restart whose recompute runs over several steps keeps its next token's block free from the
// restarts behind it in every step, not only in the one it started in.
TEST(SchedulerResume, ARestartInProgressKeepsItsNextTokenBlock) {
  const Scheduler sched(config(64, true));
  const std::vector<SchedSeq> run = {steady_running()};
  SchedSeq r1 = restart(1, 8);
  r1.num_computed = 4;  // half recomputed: its 2 blocks reserved, its next token's not
  r1.num_blocks = 2;
  const std::vector<SchedSeq> wait = {r1, restart(2, 7)};
  const SchedulerOutput out = sched.schedule({run, wait, {}, /*free=*/2, 8, /*step=*/5});
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 1);
  EXPECT_EQ(out.free_blocks_after, 2);
  // With a block more, restart 2 fits beside it.
  const SchedulerOutput room = sched.schedule({run, wait, {}, /*free=*/3, 9, /*step=*/5});
  EXPECT_EQ(room.prefill.size(), 2u);
}

}  // namespace
}  // namespace kvsplit::sched
