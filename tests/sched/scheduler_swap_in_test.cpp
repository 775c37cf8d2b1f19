// Scheduler: a swapped-out sequence resumes only with room for the sequences served before it to
// reach their last position, as a restart by recompute does; otherwise their growth paused it
// again at once, before it decoded a token, for two copies each round (to disk maybe).
#include <gtest/gtest.h>

#include <vector>

#include "scheduler_test_util.h"

namespace kvsplit::sched {
namespace {

TEST(SchedulerSwapIn, ASwapInLeavesRoomForTheGrowthOfTheSequencesAheadOfIt) {
  const Scheduler sched(config(64, true));
  SchedSeq ahead = running(0, /*computed=*/8, /*blocks=*/2);  // a third block this step
  ahead.final_positions = 16;                                 // and a fourth to its end
  SchedSeq b = waiting(1, /*target=*/7, /*computed=*/7, /*blocks=*/2);
  b.held_blocks = 0;
  b.swapped_pages = 2;  // 7 positions: its pages hold its next token too
  const std::vector<SchedSeq> run = {ahead}, wait = {b};
  // 3 free, 2 after the step's growth: its 2 pages fit, but then the sequence ahead cannot grow
  // to its end without pausing it again.
  const SchedulerOutput tight = sched.schedule({run, wait, {}, /*free=*/3, 12, /*step=*/1});
  EXPECT_TRUE(tight.swap_in.empty());
  const SchedulerOutput room = sched.schedule({run, wait, {}, /*free=*/4, 12, /*step=*/1});
  ASSERT_EQ(room.swap_in.size(), 1u);
  EXPECT_EQ(room.swap_in[0].id, 1);
  // A sequence served after it does not hold it back.
  SchedSeq behind = ahead;
  behind.id = 2;
  behind.arrival = 9;
  const std::vector<SchedSeq> run_behind = {behind};
  EXPECT_EQ(sched.schedule({run_behind, wait, {}, 3, 12, 1}).swap_in.size(), 1u);
}

}  // namespace
}  // namespace kvsplit::sched
