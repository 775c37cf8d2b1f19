// The thread-free Scheduler on plain structs: budget split, preemption order and reasons, waiting
// handoffs, an empty pool, a sequence longer than the pool.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "sched/scheduler_test_util.h"
#include "sched/swap_predictor.h"

namespace kvsplit::sched {
namespace {

TEST(Scheduler, ColocatedDecodeTokensCountAgainstTheBudget) {
  const std::vector<SchedSeq> run = {running(0, 5, 2), running(1, 6, 2), running(2, 7, 2)};
  const std::vector<SchedSeq> wait = {waiting(10, 100), waiting(11, 100)};
  SchedulerInput in{run, wait, {}, /*free=*/100, /*total=*/200, /*step=*/1};
  const SchedulerOutput colo = Scheduler(config(23, true)).schedule(in);
  ASSERT_EQ(colo.decode.size(), 3u);
  EXPECT_EQ(colo.num_tokens(), 23);  // 3 decode + 20 prefill
  ASSERT_EQ(colo.prefill.size(), 2u);
  EXPECT_EQ(colo.prefill[0].tokens + colo.prefill[1].tokens, 20);
  // A min chunk each, then the rest to the least remaining (a tie: the first in service order).
  EXPECT_EQ(colo.prefill[0].tokens, 16);
  // Whole-target reservation when a prompt starts: 100 tokens = 25 blocks each.
  EXPECT_EQ(colo.prefill[0].new_blocks, 25);
  EXPECT_EQ(colo.free_blocks_after, 100 - 50);

  // A prefill worker: decode tokens do not count; and the budget never drops under min_chunk.
  const SchedulerOutput pre = Scheduler(config(23, false)).schedule(in);
  EXPECT_EQ(pre.num_tokens(), 3 + 23);
  const SchedulerOutput tight = Scheduler(config(2, true, /*min_chunk=*/8)).schedule(in);
  EXPECT_EQ(tight.num_tokens(), 3 + 8);
}

TEST(Scheduler, DecodeGrowthPreemptsLowestPriorityThenYoungest) {
  // Every running sequence sits at a block boundary (4 tokens in 1 block): each needs one more.
  const std::vector<SchedSeq> run = {
      running(0, 4, 1, /*priority=*/5, /*arrival=*/10), running(1, 4, 1, 0, 11),
      running(2, 4, 1, 0, 12),  // the youngest of the lowest priority: the first victim
      running(3, 4, 1, 9, 13)};
  SchedulerInput in{run, {}, {}, /*free=*/1, /*total=*/8, 1};
  const SchedulerOutput out = Scheduler(config(64, true)).schedule(in);
  // Service order 3 (p9), 0 (p5), 1, 2. 3 takes the free block; 0 needs one: victim 2 (freed 1);
  // 1 needs one: the only candidates left are 1 itself -> preempted.
  ASSERT_EQ(out.preempted.size(), 2u);
  EXPECT_EQ(out.preempted[0].id, 2);
  EXPECT_EQ(out.preempted[0].reason, PreemptReason::kDecodeGrowth);
  EXPECT_EQ(out.preempted[0].for_id, 0);
  EXPECT_EQ(out.preempted[0].freed_blocks, 1);
  EXPECT_EQ(out.preempted[1].id, 1);
  EXPECT_EQ(out.preempted[1].for_id, 1);
  ASSERT_EQ(out.decode.size(), 2u);
  EXPECT_EQ(out.decode[0].id, 3);
  EXPECT_EQ(out.decode[1].id, 0);
  EXPECT_EQ(out.free_blocks_after, 1);  // 1's block, freed with nothing left to grow
  EXPECT_STREQ(preempt_reason_name(out.preempted[0].reason), "decode growth");
}

// A stalled sequence (its consumer has not read its events) gets no decode row: nobody is
// preempted for its growth, and it is the first victim of others' needs whatever its priority
// or age (it holds blocks and will not decode).
TEST(Scheduler, AStalledSequenceGrowsNotAndYieldsItsBlocks) {
  std::vector<SchedSeq> run = {running(0, 4, 1, /*priority=*/9), running(1, 4, 1, 0)};
  run[0].stalled = true;
  SchedulerInput in{run, {}, {}, /*free=*/0, /*total=*/2, 1};
  SchedulerOutput out = Scheduler(config(64, true)).schedule(in);
  // 1 needs a block and none is free: 0 is served first but stalled, so it yields its block.
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 0);
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 1);
  // Waiting work of equal priority, no time slice: a stalled run still yields to it.
  run = {running(0, 4, 1, 0)};
  run[0].stalled = true;
  const std::vector<SchedSeq> wait = {waiting(10, 4)};
  SchedulerInput win{run, wait, {}, /*free=*/0, /*total=*/1, 1};
  out = Scheduler(config(64, true)).schedule(win);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 0);
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 10);
  // Not stalled, 0 (priority 9, served first) takes 1's block for its own growth.
  run = {running(0, 4, 1, /*priority=*/9), running(1, 4, 1, 0)};
  in.running = run;
  out = Scheduler(config(64, true)).schedule(in);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 1);
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 0);
  // A stalled lower-priority sequence is the victim of a higher one's growth.
  run = {running(0, 4, 1, /*priority=*/9), running(1, 4, 1, 0)};
  run[1].stalled = true;
  in.running = run;
  out = Scheduler(config(64, true)).schedule(in);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 1);
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 0);
  // Free blocks or not, a stalled sequence takes none for a token it will not decode.
  run = {running(0, 4, 1)};
  run[0].stalled = true;
  out = Scheduler(config(64, true)).schedule({run, {}, {}, /*free=*/2, /*total=*/4, 1});
  EXPECT_TRUE(out.decode.empty());
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(out.free_blocks_after, 2);
}

TEST(Scheduler, OlderSequencesNeverGiveWayToYoungerOnes) {
  // Equal priority: the older (smaller arrival) keeps its blocks, the younger is preempted.
  const std::vector<SchedSeq> run = {running(0, 8, 2, 0, 2), running(1, 8, 2, 0, 1)};
  SchedulerInput in{run, {}, {}, 0, 4, 1};
  const SchedulerOutput out = Scheduler(config(64, true)).schedule(in);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 0);  // arrival 2: younger
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 1);
}

TEST(Scheduler, HandoffWaitsForBlocksAndPreemptsOnlyLowerPriorities) {
  const std::vector<SchedSeq> run = {running(0, 3, 1, /*priority=*/0), running(1, 3, 1, 0)};
  const std::vector<SchedHandoff> equal = {{20, 0, 30, /*num_tokens=*/8}};
  SchedulerInput in{run, {}, equal, /*free=*/1, /*total=*/4, 1};
  SchedulerOutput out = Scheduler(config(64, false)).schedule(in);
  EXPECT_TRUE(out.admitted.empty());  // equal priority: waits (back-pressure), no preemption
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoBlocks);
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(out.decode.size(), 2u);

  const std::vector<SchedHandoff> higher = {{20, 5, 30, 8}};
  in.handoffs = higher;
  out = Scheduler(config(64, false)).schedule(in);
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_EQ(out.admitted[0].blocks, 2);
  // The admitted handoff decodes in the same step, served first (priority 5): 8 tokens in 2
  // blocks, it needs a third for its next token, so admission makes room for 3 and both
  // lower-priority sequences give theirs up, the younger first.
  ASSERT_EQ(out.preempted.size(), 2u);
  EXPECT_EQ(out.preempted[0].id, 1);
  EXPECT_EQ(out.preempted[1].id, 0);
  for (const auto& p : out.preempted) {
    EXPECT_EQ(p.reason, PreemptReason::kHandoff);
    EXPECT_EQ(p.for_id, 20);
    EXPECT_EQ(p.for_priority, 5);
  }
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 20);
  EXPECT_EQ(out.decode[0].new_blocks, 1);
  EXPECT_EQ(out.free_blocks_after, 0);
}

// A handoff is admitted only with the block its own first decode needs: with exactly its pages
// free and nobody who may yield (equal priority), it waits instead of being copied in and then
// preempting itself for its next token in the same step.
TEST(Scheduler, HandoffWaitsForItsOwnNextTokensBlock) {
  const std::vector<SchedSeq> run = {running(0, 3, 1, /*priority=*/0)};
  const std::vector<SchedHandoff> h = {{20, 0, 30, /*num_tokens=*/8}};  // 2 full pages
  SchedulerInput in{run, {}, h, /*free=*/2, /*total=*/8, 1};
  SchedulerOutput out = Scheduler(config(64, false)).schedule(in);
  EXPECT_TRUE(out.admitted.empty());
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoBlocks);
  EXPECT_TRUE(out.preempted.empty());
  in.free_blocks = 3;
  out = Scheduler(config(64, false)).schedule(in);
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.decode.size(), 2u);
  // 7 positions (a partial last page): the 2 pages are all it needs.
  const std::vector<SchedHandoff> partial = {{20, 0, 30, 7}};
  in.handoffs = partial;
  in.free_blocks = 2;
  out = Scheduler(config(64, false)).schedule(in);
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_TRUE(out.preempted.empty());
}

// Pages a handoff shares with running sequences (the destination's prefix cache holds them on
// the device) need no room: admitted with only its own pages free. Whether it fits the pool at
// all still counts every page.
TEST(Scheduler, AHandoffsSharedPagesNeedNoRoom) {
  // 14 positions: 3 full pages and a partial one; its next token fits the partial page.
  std::vector<SchedHandoff> h = {{20, 0, 30, /*num_tokens=*/14}};
  SchedulerInput in{{}, {}, h, /*free=*/1, /*total=*/8, 1};
  SchedulerOutput out = Scheduler(config(64, false)).schedule(in);
  EXPECT_TRUE(out.admitted.empty());
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoBlocks);
  h[0].shared_pages = 3;
  out = Scheduler(config(64, false)).schedule(in);
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_EQ(out.admitted[0].blocks, 1);
  EXPECT_EQ(out.free_blocks_after, 0);
  // 40 positions are 10 pages: more than the pool, however many of them are shared.
  h[0] = {20, 0, 30, 40, 0, /*shared_pages=*/5};
  out = Scheduler(config(64, false)).schedule(in);
  EXPECT_EQ(out.never_fit, (std::vector<int>{20}));
}

// A pass discounts shared pages or preempts, never both: a victim's held blocks count the pages
// it shares with the cache alone, which an offer admitted with a discount then pays for.
TEST(Scheduler, AHandoffPassDiscountsSharedPagesOrPreemptsNotBoth) {
  // A (priority 0) holds 2 blocks; 2 are free. Offer 20 shares 3 of its 4 pages; offer 21 brings
  // 2 full pages and needs a third for its next token, which only preempting A can give.
  const std::vector<SchedSeq> run = {running(0, 7, 2, /*priority=*/0)};
  std::vector<SchedHandoff> h = {{20, 5, 30, 14, 0, /*shared_pages=*/3}, {21, 5, 31, 8}};
  SchedulerInput in{run, {}, h, /*free=*/2, /*total=*/12, 1};
  SchedulerOutput out = Scheduler(config(64, false)).schedule(in);
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_EQ(out.admitted[0].id, 20);
  EXPECT_EQ(out.admitted[0].blocks, 1);
  EXPECT_TRUE(out.preempted.empty());  // 21 waits a step rather than preempt after a discount
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoBlocks);
  // The other order: 21 preempts A, and then 20 gets no discount (it would need 4 blocks, 2
  // are left, and no one else may yield): it waits.
  std::swap(h[0], h[1]);
  out = Scheduler(config(64, false)).schedule(in);
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_EQ(out.admitted[0].id, 21);
  EXPECT_EQ(out.admitted[0].blocks, 2);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 0);
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoBlocks);
}

TEST(Scheduler, HandoffWaitsBehindPreemptedSequencesAndForASlot) {
  const std::vector<SchedSeq> wait = {waiting(0, 12, 0, /*blocks=*/0, /*priority=*/3)};
  const std::vector<SchedHandoff> h = {{20, 3, 30, 4}, {21, 9, 31, 4}};
  SchedulerInput in{{}, wait, h, 10, 10, 1};
  SchedulerOutput out = Scheduler(config(64, false)).schedule(in);
  EXPECT_TRUE(out.admitted.empty());  // no overtaking: 21 (priority 9) waits behind 20
  EXPECT_EQ(out.handoff_wait, HandoffWait::kPreemptedFirst);

  SchedulerConfig one_slot = config(64, false);
  one_slot.max_num_seqs = 1;
  out = Scheduler(one_slot).schedule(in);
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoSlot);
  EXPECT_TRUE(out.admitted.empty());

  // Sequences the worker owns but does not list (waiting behind their readers) take slots too.
  SchedulerConfig two_slots = config(64, false);
  two_slots.max_num_seqs = 2;
  const std::vector<SchedHandoff> one = {{21, 9, 31, 4}};
  SchedulerInput listed{{}, {}, one, 10, 10, 1};
  EXPECT_EQ(Scheduler(two_slots).schedule(listed).admitted.size(), 1u);
  listed.unlisted = 2;
  out = Scheduler(two_slots).schedule(listed);
  EXPECT_EQ(out.handoff_wait, HandoffWait::kNoSlot);
  EXPECT_TRUE(out.admitted.empty());
}

TEST(Scheduler, EmptyPoolPreemptsTheGrowingSequenceItself) {
  // 7 (older) holds the other block and needs no new one; 0 must grow and only has itself.
  const std::vector<SchedSeq> run = {running(0, 4, 1, 0, 9), running(7, 2, 1, 0, 1)};
  const std::vector<SchedSeq> wait = {waiting(1, 4)};
  SchedulerInput in{run, wait, {}, /*free=*/0, /*total=*/2, 1};
  const SchedulerOutput out = Scheduler(config(64, true)).schedule(in);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 0);
  EXPECT_EQ(out.preempted[0].for_id, 0);
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 7);
  // Its freed block lets the waiting prompt start in the same step.
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 1);
  EXPECT_TRUE(out.prefill[0].last);
  EXPECT_EQ(out.free_blocks_after, 0);

  // Nothing runs, nothing waits: an empty step.
  const SchedulerOutput idle = Scheduler(config(64, true)).schedule({{}, {}, {}, 0, 0, 1});
  EXPECT_EQ(idle.num_tokens(), 0);
}

TEST(Scheduler, SequenceLongerThanThePoolNeverFitsAndBlocksNothing) {
  const std::vector<SchedSeq> wait = {waiting(0, 100), waiting(1, 8)};
  const std::vector<SchedHandoff> h = {{20, 0, 30, 200}};
  SchedulerInput in{{}, wait, h, /*free=*/10, /*total=*/10, 1};
  const SchedulerOutput out = Scheduler(config(64, false)).schedule(in);
  EXPECT_EQ(out.never_fit, (std::vector<int>{20, 0}));
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 1);

  // A running sequence that filled the whole pool cannot grow: reported, nobody preempted (a
  // recompute would fill the pool again and loop forever).
  const std::vector<SchedSeq> run = {running(5, 40, 10), running(6, 3, 1)};
  const SchedulerOutput full = Scheduler(config(64, true)).schedule({run, {}, {}, 0, 10, 1});
  EXPECT_EQ(full.never_fit, (std::vector<int>{5}));
  EXPECT_TRUE(full.preempted.empty());
  ASSERT_EQ(full.decode.size(), 1u);
  EXPECT_EQ(full.decode[0].id, 6);
}

TEST(Scheduler, PrefillRoundRobinWithinPriorityAndNoOvertakingOnReservation) {
  // 2 already started (hold their blocks); 3 is new and does not fit; 4 would fit but must not
  // overtake 3; started ones keep running.
  const std::vector<SchedSeq> wait = {waiting(2, 40, 8, 10, 0, /*last_step=*/7), waiting(3, 40),
                                      waiting(4, 4), waiting(5, 40, 8, 10, 0, /*last_step=*/3)};
  SchedulerInput in{{}, wait, {}, /*free=*/5, /*total=*/40, 8};
  const SchedulerOutput out = Scheduler(config(8, false, 4)).schedule(in);
  ASSERT_EQ(out.prefill.size(), 2u);
  EXPECT_EQ(out.prefill[0].id, 5);  // served longest ago first
  EXPECT_EQ(out.prefill[1].id, 2);
  EXPECT_EQ(out.prefill[0].new_blocks, 0);
  EXPECT_EQ(out.free_blocks_after, 5);
}

TEST(Scheduler, FairPrefillAdmitsShortPromptsAheadOfALongOnesRemainingChunks) {
  // A long prompt in progress (served last step, its blocks held) and three short new prompts.
  // The short ones get their whole prompt this step; the long one yields to them entirely.
  const std::vector<SchedSeq> run = {running(1, 9, 3), running(2, 9, 3)};
  const std::vector<SchedSeq> wait = {waiting(10, 400, 100, 100, 0, /*last_step=*/7),
                                      waiting(11, 12), waiting(12, 16), waiting(13, 12)};
  SchedulerInput in{run, wait, {}, /*free=*/100, /*total=*/300, /*step=*/8};
  SchedulerConfig c = config(128, /*colocated=*/true, /*min_chunk=*/4);
  c.max_chunk_tokens = 16;
  const SchedulerOutput out = Scheduler(c).schedule(in);
  ASSERT_EQ(out.decode.size(), 2u);  // decode rows first
  ASSERT_EQ(out.prefill.size(), 3u);
  // Listed least remaining first; every short prompt completes.
  EXPECT_EQ(out.prefill[0].id, 11);
  EXPECT_EQ(out.prefill[1].id, 13);
  EXPECT_EQ(out.prefill[2].id, 12);
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(out.prefill[k].last) << k;
  EXPECT_EQ(out.prefill[2].tokens, 16);
  EXPECT_EQ(out.num_tokens(), 2 + 12 + 12 + 16);  // 42 of 128 tokens used
  // The same long prompt after kMaxPrefillYieldSteps steps without a chunk: starving, it moves
  // by its min chunk beside them.
  const SchedulerOutput late =
      Scheduler(c).schedule({run, wait, {}, 100, 300, 8 + kMaxPrefillYieldSteps});
  ASSERT_EQ(late.prefill.size(), 4u);
  EXPECT_EQ(late.prefill[3].id, 10);
  EXPECT_EQ(late.prefill[3].tokens, 4);
  EXPECT_EQ(late.prefill[3].start, 100);
  EXPECT_EQ(late.num_tokens(), 2 + 12 + 12 + 16 + 4);
  // With only decode rows beside it, the long prompt gets max_chunk_tokens.
  const std::vector<SchedSeq> alone = {wait[0]};
  const SchedulerOutput out2 = Scheduler(c).schedule({run, alone, {}, 100, 300, 8});
  ASSERT_EQ(out2.prefill.size(), 1u);
  EXPECT_EQ(out2.prefill[0].tokens, 16);
  EXPECT_EQ(out2.num_tokens(), 2 + 16);
  // Alone on the worker (no decode rows, no other prompt) the cap holds too: a request arriving
  // during the step would wait for all of it.
  const SchedulerOutput out3 = Scheduler(c).schedule({{}, alone, {}, 100, 300, 8});
  ASSERT_EQ(out3.prefill.size(), 1u);
  EXPECT_EQ(out3.prefill[0].tokens, 16);
  c.max_chunk_tokens = 0;  // no cap: the whole budget
  EXPECT_EQ(Scheduler(c).schedule({{}, alone, {}, 100, 300, 8}).prefill[0].tokens, 128);

  // Short prompts that would fill the whole budget: the long prompt still moves by a min chunk
  // once it is starving (no chunk for more than kMaxPrefillYieldSteps steps, or never served),
  // and waits while it is not.
  std::vector<SchedSeq> many = {waiting(10, 400, 100, 100, 0, /*last_step=*/7)};
  for (int i = 0; i < 8; ++i) many.push_back(waiting(20 + i, 12));
  SchedulerConfig tight = config(40, /*colocated=*/false, /*min_chunk=*/4);
  tight.max_chunk_tokens = 16;
  const int64_t step = 51;
  for (int64_t last : {int64_t{-1}, int64_t{7}, step - kMaxPrefillYieldSteps - 1, step - 1}) {
    many[0].last_prefill_step = last;
    const SchedulerOutput o = Scheduler(tight).schedule({{}, many, {}, 100, 300, step});
    const auto it = std::find_if(o.prefill.begin(), o.prefill.end(),
                                 [](const PrefillChunk& p) { return p.id == 10; });
    const bool starving = step - last > kMaxPrefillYieldSteps;
    if (starving) {
      ASSERT_NE(it, o.prefill.end()) << last;
      EXPECT_EQ(it->tokens, 4);
    } else {
      EXPECT_EQ(it, o.prefill.end()) << last;
    }
    EXPECT_EQ(o.num_tokens(), 40) << last;  // the short prompts take what it leaves
  }
}

TEST(Scheduler, FairPrefillKeepsPriorities) {
  // A high-priority long prompt gets its chunk (up to the cap) before a low-priority short one
  // gets more than its min chunk.
  const std::vector<SchedSeq> wait = {waiting(1, 12, 0, 0, /*priority=*/0),
                                      waiting(2, 400, 0, 0, /*priority=*/5)};
  SchedulerConfig c = config(32, /*colocated=*/false, /*min_chunk=*/4);
  c.max_chunk_tokens = 24;
  const SchedulerOutput out = Scheduler(c).schedule({{}, wait, {}, 200, 300, 1});
  ASSERT_EQ(out.prefill.size(), 2u);
  EXPECT_EQ(out.prefill[0].id, 2);  // the higher priority first
  EXPECT_EQ(out.prefill[0].tokens, 24);
  EXPECT_EQ(out.prefill[1].id, 1);
  EXPECT_EQ(out.prefill[1].tokens, 8);
}

// A restart (preempted by recompute before) starts only when the running sequences served before
// it can also grow to their final positions; a younger running sequence's growth, a first prompt
// and an unknown final length do not hold it back.
TEST(Scheduler, RestartWaitsForTheGrowthOfSequencesServedBeforeIt) {
  // Block size 4. Sequence 0 (older) holds 2 blocks and may reach 24 positions: 4 more blocks.
  std::vector<SchedSeq> run = {running(0, 7, 2)};
  run[0].final_positions = 24;
  SchedSeq restart = waiting(5, /*target=*/12);  // 3 blocks to recompute
  restart.restart = true;
  {
    // 6 free: 3 for the restart + 4 for sequence 0's growth do not fit, so it waits, and so
    // does the younger prompt behind it (no overtaking on reservation).
    const std::vector<SchedSeq> wait = {restart, waiting(6, 4)};
    SchedulerInput in{run, wait, {}, /*free=*/6, /*total=*/8, /*step=*/1};
    const SchedulerOutput out = Scheduler(config(64, true)).schedule(in);
    EXPECT_TRUE(out.prefill.empty());
    EXPECT_EQ(out.free_blocks_after, 6);
  }
  {
    // 7 free: 3 + 4 fit, but its 12 positions fill their last page, so the token it decodes
    // next needs a 4th block of its own: it waits.
    const std::vector<SchedSeq> wait = {restart};
    SchedulerInput in{run, wait, {}, /*free=*/7, /*total=*/9, /*step=*/1};
    EXPECT_TRUE(Scheduler(config(64, true)).schedule(in).prefill.empty());
  }
  {
    // 8 free: it fits beside sequence 0's growth and its own next token, and starts.
    const std::vector<SchedSeq> wait = {restart};
    SchedulerInput in{run, wait, {}, /*free=*/8, /*total=*/10, /*step=*/1};
    const SchedulerOutput out = Scheduler(config(64, true)).schedule(in);
    ASSERT_EQ(out.prefill.size(), 1u);
    EXPECT_EQ(out.prefill[0].id, 5);
    EXPECT_EQ(out.free_blocks_after, 5);
  }
  {
    // The same sequence on its first prompt is not held back.
    SchedSeq first = restart;
    first.restart = false;
    const std::vector<SchedSeq> wait = {first};
    SchedulerInput in{run, wait, {}, /*free=*/6, /*total=*/8, /*step=*/1};
    EXPECT_EQ(Scheduler(config(64, true)).schedule(in).prefill.size(), 1u);
  }
  {
    // A younger running sequence's growth is not reserved for; nor an unknown final length
    // (4 free: its 3 blocks and its next token's).
    std::vector<SchedSeq> younger = {running(9, 7, 2)};
    younger[0].final_positions = 24;
    std::vector<SchedSeq> unknown = {running(0, 7, 2)};
    const std::vector<SchedSeq> wait = {restart};
    for (const auto* r : {&younger, &unknown}) {
      SchedulerInput in{*r, wait, {}, /*free=*/4, /*total=*/6, /*step=*/1};
      EXPECT_EQ(Scheduler(config(64, true)).schedule(in).prefill.size(), 1u);
    }
  }
}

TEST(Scheduler, CanAdmitPromptKeepsAWatermarkForGrowth) {
  const Scheduler s(config(64, true));
  EXPECT_TRUE(s.can_admit_prompt(16, 4, 400, /*running=*/0, /*owned=*/0));  // 4 blocks, no one runs
  EXPECT_FALSE(s.can_admit_prompt(16, 4, 400, 1, 1));  // watermark max(1, 400 / 100) = 4
  EXPECT_TRUE(s.can_admit_prompt(16, 8, 400, 1, 1));
  EXPECT_FALSE(s.can_admit_prompt(16, 4, 8, 1, 1));  // under 100 blocks: a watermark of 1
  EXPECT_TRUE(s.can_admit_prompt(16, 5, 8, 1, 1));
  EXPECT_FALSE(s.can_admit_prompt(1, 100, 400, 0, 16));  // no slot
}

}  // namespace
}  // namespace kvsplit::sched

namespace kvsplit::sched {
namespace {

TEST(Scheduler, PagesACutMovedOutOfThePoolNeitherCountNorFree) {
  // 5's table has 10 pages but holds only 2 full-pool blocks (the rest quantized or evicted): it
  // grows past the pool's 10 blocks; 6 (younger) is preempted for it and frees its 1 block only.
  SchedSeq cut = running(5, 40, 10, 0, 1);
  cut.held_blocks = 2;
  SchedSeq young = running(6, 3, 1, 0, 9);
  young.held_blocks = 1;
  const std::vector<SchedSeq> run = {cut, young};
  const SchedulerOutput out = Scheduler(config(64, true)).schedule({run, {}, {}, 0, 10, 1});
  EXPECT_TRUE(out.never_fit.empty());
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 6);
  EXPECT_EQ(out.preempted[0].freed_blocks, 1);
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 5);
  EXPECT_EQ(out.free_blocks_after, 0);
}

SchedSeq swapped(int id, int computed, int pages, int64_t resume_step, int32_t priority = 0) {
  SchedSeq s = waiting(id, computed, computed, pages, priority);
  s.held_blocks = 0;
  s.swapped_pages = pages;
  s.resume_step = resume_step;
  return s;
}

TEST(Scheduler, SwappedSequenceResumesFromItsResumeStepWithoutPrefill) {
  // 3 swapped pages (10 tokens of KV); resume step 5.
  const std::vector<SchedSeq> wait = {swapped(1, 10, 3, 5)};
  const Scheduler sched(config(64, true));
  const std::vector<SchedSeq> run = {running(0, 8, 2)};
  const SchedulerOutput early = sched.schedule({run, wait, {}, 8, 16, /*step=*/4});
  EXPECT_TRUE(early.swap_in.empty());
  EXPECT_TRUE(early.prefill.empty());
  EXPECT_EQ(early.free_blocks_after, 7);  // the running sequence grew by a block
  // Nothing else runs: steps would not advance, so it resumes at once.
  const SchedulerOutput idle = sched.schedule({{}, wait, {}, 8, 16, /*step=*/4});
  ASSERT_EQ(idle.swap_in.size(), 1u);
  // Nor do they when every running sequence is stalled behind its reader (no decode row): it
  // resumes at once, or it would wait for a step that never comes.
  std::vector<SchedSeq> stalled = run;
  stalled[0].stalled = true;
  const SchedulerOutput behind = sched.schedule({stalled, wait, {}, 8, 16, /*step=*/4});
  ASSERT_EQ(behind.swap_in.size(), 1u);
  EXPECT_EQ(behind.swap_in[0].id, 1);
  const SchedulerOutput now = sched.schedule({{}, wait, {}, 8, 8, /*step=*/5});
  ASSERT_EQ(now.swap_in.size(), 1u);
  EXPECT_EQ(now.swap_in[0].id, 1);
  EXPECT_EQ(now.swap_in[0].blocks, 3);
  EXPECT_TRUE(now.prefill.empty());  // its KV exists: no token budget used
  EXPECT_EQ(now.num_tokens(), 0);
  EXPECT_EQ(now.free_blocks_after, 5);
}

// A paused sequence whose swapped pages all came back to the device (MigrateKv) has nothing to
// prefill or swap in: it resumes as a swap-in of no pages, with room for its next token.
TEST(Scheduler, APausedSequenceWithAllItsKvResidentResumes) {
  const Scheduler sched(config(64, true));
  SchedSeq w = waiting(1, /*target=*/8, /*computed=*/8, /*blocks=*/2);  // 8 positions: 2 full pages
  w.restart = true;
  const std::vector<SchedSeq> wait = {w};
  const std::vector<SchedSeq> run = {running(0, 5, 2)};  // grows by no block this step
  const SchedulerOutput tight = sched.schedule({run, wait, {}, /*free=*/0, 6, /*step=*/3});
  EXPECT_TRUE(tight.swap_in.empty());  // no block for its next token
  EXPECT_TRUE(tight.prefill.empty());
  const SchedulerOutput room = sched.schedule({run, wait, {}, /*free=*/1, 6, /*step=*/3});
  ASSERT_EQ(room.swap_in.size(), 1u);
  EXPECT_EQ(room.swap_in[0].id, 1);
  EXPECT_EQ(room.swap_in[0].blocks, 0);
  EXPECT_TRUE(room.prefill.empty());
  EXPECT_EQ(room.free_blocks_after, 1);  // the next token's block is left free, not reserved
}

// A sequence paused at a page boundary (as one paused for its own growth always is) resumes only
// when its next token's block is free too: coming back into a full pool, its first decode needed a
// block, and it paused itself again, round after round, while the sequences ahead of it ran.
TEST(Scheduler, SwappedSequenceResumesWithRoomForItsNextToken) {
  const Scheduler sched(config(64, true));
  const std::vector<SchedSeq> run = {running(0, 5, 2)};      // grows by no block this step
  const std::vector<SchedSeq> full = {swapped(1, 8, 2, 0)};  // 8 positions: its 2 pages are full
  const SchedulerOutput tight = sched.schedule({run, full, {}, /*free=*/2, 6, /*step=*/3});
  EXPECT_TRUE(tight.swap_in.empty());
  EXPECT_EQ(tight.free_blocks_after, 2);
  const SchedulerOutput room = sched.schedule({run, full, {}, /*free=*/3, 6, /*step=*/3});
  ASSERT_EQ(room.swap_in.size(), 1u);
  EXPECT_EQ(room.swap_in[0].blocks, 2);  // the next token's block is left free, not reserved
  EXPECT_EQ(room.free_blocks_after, 1);
  // Its last page not full (7 positions): the 2 pages are all it needs.
  const std::vector<SchedSeq> partial = {swapped(1, 7, 2, 0)};
  EXPECT_EQ(sched.schedule({run, partial, {}, 2, 6, 3}).swap_in.size(), 1u);
  // Its pages and the next token's block exceed the pool: it resumes with what the pool has (its
  // growth is then refused as never_fit, not waited for forever).
  EXPECT_EQ(sched.schedule({{}, full, {}, 2, 2, 3}).swap_in.size(), 1u);
}

// A table a KV cut changed swaps out only its full device pages: quantized pages stay in their
// arenas and evicted ones hold nothing, so it swaps in fewer pages than its table has. Its next
// token needs a block only beyond the whole table (10 pages, 40 positions: one block), not beyond
// the swapped pages (which asked for 8 more and kept it waiting while 4 blocks were free).
TEST(Scheduler, SwapInOfACutTableNeedsRoomBeyondItsTableOnly) {
  const Scheduler sched(config(64, true));
  SchedSeq w = swapped(1, /*computed=*/40, /*pages=*/3, /*resume_step=*/0);
  w.num_blocks = 10;  // 7 of them quantized into an arena or evicted
  const std::vector<SchedSeq> wait = {w};
  const SchedulerOutput out = sched.schedule({{}, wait, {}, /*free=*/4, 20, /*step=*/1});
  ASSERT_EQ(out.swap_in.size(), 1u);
  EXPECT_EQ(out.swap_in[0].blocks, 3);
  EXPECT_EQ(out.free_blocks_after, 1);  // its next token's block
  const SchedulerOutput tight = sched.schedule({{}, wait, {}, /*free=*/3, 20, /*step=*/1});
  EXPECT_TRUE(tight.swap_in.empty());  // no block for the next token
  // A pool smaller than the table's entries (10) but not than the full-pool blocks it will hold
  // (3) and its next token's: that block is still waited for.
  EXPECT_TRUE(sched.schedule({{}, wait, {}, /*free=*/3, /*total=*/4, 1}).swap_in.empty());
  EXPECT_EQ(sched.schedule({{}, wait, {}, /*free=*/4, /*total=*/4, 1}).swap_in.size(), 1u);
}

TEST(Scheduler, SwappedSequenceIsNotOvertakenByYoungerPrompts) {
  // The older swapped sequence needs 6 blocks, 4 are free: the younger prompt (1 block) waits.
  const std::vector<SchedSeq> wait = {swapped(1, 24, 6, 0), waiting(2, 4)};
  const SchedulerOutput out = Scheduler(config(64, true)).schedule({{}, wait, {}, 4, 8, 1});
  EXPECT_TRUE(out.swap_in.empty());
  EXPECT_TRUE(out.prefill.empty());
  EXPECT_EQ(out.free_blocks_after, 4);
  // With room, both go in the same step: the swap-in first, then the prompt's chunk.
  const SchedulerOutput room = Scheduler(config(64, true)).schedule({{}, wait, {}, 7, 8, 1});
  ASSERT_EQ(room.swap_in.size(), 1u);
  ASSERT_EQ(room.prefill.size(), 1u);
  EXPECT_EQ(room.prefill[0].id, 2);
  EXPECT_EQ(room.free_blocks_after, 0);
}

// A handoff is admitted only beside the next-token growth of the running sequences served before
// it: admitted into the last free blocks, it was preempted again in the same step by the first of
// them to need a block (or that sequence preempted itself), its copied KV thrown away.
TEST(Scheduler, HandoffLeavesTheGrowthOfSequencesServedBeforeIt) {
  const Scheduler sched(config(64, false));
  // A (priority 2) fills its 2 blocks: its next token needs a 3rd. H (priority 1) needs 2.
  const std::vector<SchedSeq> run = {running(1, 8, 2, /*priority=*/2)};
  const std::vector<SchedHandoff> offer = {{50, /*priority=*/1, 60, 5}};
  const SchedulerOutput tight = sched.schedule({run, {}, offer, /*free=*/2, /*total=*/4, 1});
  EXPECT_TRUE(tight.admitted.empty());
  EXPECT_EQ(tight.handoff_wait, HandoffWait::kNoBlocks);
  EXPECT_TRUE(tight.preempted.empty());
  ASSERT_EQ(tight.decode.size(), 1u);
  EXPECT_EQ(tight.decode[0].id, 1);
  EXPECT_EQ(sched.admit_handoffs({run, {}, offer, 2, 4, 1}).admitted.size(), 0u);
  // With the 3rd block free too, both go: H is admitted and A grows.
  const SchedulerOutput room = sched.schedule({run, {}, offer, /*free=*/3, /*total=*/5, 1});
  ASSERT_EQ(room.admitted.size(), 1u);
  EXPECT_TRUE(room.preempted.empty());
  EXPECT_EQ(room.free_blocks_after, 0);
  // A sequence H is served before keeps no room from it.
  const std::vector<SchedHandoff> urgent = {{50, /*priority=*/3, 60, 5}};
  EXPECT_EQ(sched.admit_handoffs({run, {}, urgent, 2, 4, 1}).admitted.size(), 1u);
}

TEST(Scheduler, HandoffWaitsForASwappedSequenceOfAtLeastItsPriority) {
  const std::vector<SchedSeq> wait = {swapped(1, 8, 2, 100, /*priority=*/1)};
  const std::vector<SchedHandoff> offers = {{50, /*priority=*/1, 60, 4}};
  const SchedulerOutput out = Scheduler(config(64, true)).schedule({{}, wait, offers, 8, 8, 1});
  EXPECT_TRUE(out.admitted.empty());
  EXPECT_EQ(out.handoff_wait, HandoffWait::kPreemptedFirst);
  // A handoff of higher priority goes first.
  const std::vector<SchedHandoff> urgent = {{50, /*priority=*/2, 60, 4}};
  const SchedulerOutput out2 = Scheduler(config(64, true)).schedule({{}, wait, urgent, 8, 8, 1});
  ASSERT_EQ(out2.admitted.size(), 1u);
  // So does a paused sequence whose KV is all resident again (MigrateKv): the handoff could
  // otherwise take the block its next token needs, again and again.
  SchedSeq resident = waiting(2, /*target=*/8, /*computed=*/8, /*blocks=*/2, /*priority=*/1);
  resident.restart = true;
  const std::vector<SchedSeq> paused = {resident};
  const SchedulerOutput out3 = Scheduler(config(64, true)).schedule({{}, paused, offers, 8, 8, 1});
  EXPECT_TRUE(out3.admitted.empty());
  EXPECT_EQ(out3.handoff_wait, HandoffWait::kPreemptedFirst);
}

TEST(Scheduler, ExpiredSliceOfLowerPriorityIsPausedForWaitingWork) {
  // The pool is full: a low-priority sequence (4 blocks) and a high-priority one (2 blocks).
  SchedSeq low = running(1, 14, 4, /*priority=*/0);
  low.slice_expired = true;
  SchedSeq high = running(2, 6, 2, /*priority=*/5);
  high.slice_expired = true;  // expired, but nothing waiting outranks it
  const std::vector<SchedSeq> run = {low, high};
  const std::vector<SchedSeq> wait = {waiting(3, 8, 0, 0, /*priority=*/5)};  // needs 2 blocks
  const SchedulerOutput out = Scheduler(config(64, true)).schedule({run, wait, {}, 0, 6, 1});
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 1);
  EXPECT_EQ(out.preempted[0].reason, PreemptReason::kTimeSlice);
  EXPECT_EQ(out.preempted[0].for_id, 3);
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 3);
  // The paused sequence has no decode row; the other still decodes.
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 2);
}

TEST(Scheduler, NoPauseForAPromptTheBudgetGivesNoChunk) {
  // The pool is full with two low-priority sequences whose slices expired (2 blocks each). Two
  // prompts of higher priority wait, 2 blocks each: 4 (priority 6) is served first, then 3.
  SchedSeq a = running(1, 6, 2, /*priority=*/0), b = running(2, 6, 2, /*priority=*/0);
  a.slice_expired = b.slice_expired = true;
  const std::vector<SchedSeq> run = {a, b};
  const std::vector<SchedSeq> wait = {waiting(3, 8, 0, 0, /*priority=*/5),
                                      waiting(4, 8, 0, 0, /*priority=*/6)};
  // A budget of one min chunk: 4 takes it, so 3 gets no chunk this step. Pausing the second
  // sequence for 3 would free its blocks for nothing: only the one paused for 4 goes.
  SchedulerConfig c = config(/*max_batch_tokens=*/4, /*colocated=*/false, /*min_chunk=*/4);
  SchedulerOutput out = Scheduler(c).schedule({run, wait, {}, 0, 4, 1});
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].for_id, 4);
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 4);
  ASSERT_EQ(out.decode.size(), 1u);  // the other still decodes
  EXPECT_EQ(out.decode[0].id, out.preempted[0].id == 1 ? 2 : 1);
  EXPECT_EQ(out.free_blocks_after, 0);
  // A long prompt (3) yields to a shorter one of its priority (5, its block held): nothing is
  // paused for 3, and 1 keeps decoding.
  SchedSeq low2 = running(1, 14, 4, /*priority=*/0);
  low2.slice_expired = true;
  const std::vector<SchedSeq> run2 = {low2, running(2, 3, 1, /*priority=*/5)};
  const std::vector<SchedSeq> wait2 = {waiting(3, 16, 0, 0, /*priority=*/5, /*last_step=*/0),
                                       waiting(5, 4, 0, 1, /*priority=*/5)};
  c.max_batch_tokens = 8;
  c.max_chunk_tokens = 8;  // 3 (16 tokens, 4 blocks) is long; 5 (4 tokens, its block held) is short
  out = Scheduler(c).schedule({run2, wait2, {}, 0, 5, 1});
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.decode.size(), 2u);
  ASSERT_EQ(out.prefill.size(), 1u);
  EXPECT_EQ(out.prefill[0].id, 5);
}

TEST(Scheduler, UnexpiredOrEqualPriorityIsNotPaused) {
  SchedSeq low = running(1, 14, 4, 0);
  const std::vector<SchedSeq> wait = {waiting(3, 8, 0, 0, 5)};
  // Its slice has not expired: the waiting work waits.
  std::vector<SchedSeq> run = {low};
  SchedulerOutput out = Scheduler(config(64, true)).schedule({run, wait, {}, 0, 4, 1});
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_TRUE(out.prefill.empty());
  // Expired, but the waiting work is not of a higher priority.
  run[0].slice_expired = true;
  const std::vector<SchedSeq> same = {waiting(3, 8, 0, 0, 0)};
  out = Scheduler(config(64, true)).schedule({run, same, {}, 0, 4, 1});
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_TRUE(out.prefill.empty());
}

// The victims of every rule are the SwapPredictor's choice among those the rule allows.
TEST(Scheduler, DecodeGrowthVictimIsThePredictorsChoice) {
  // Equal priorities; the oldest (0) has by far the most slack but is served first.
  std::vector<SchedSeq> run = {running(0, 4, 1, 0, 1), running(1, 4, 1, 0, 2),
                               running(2, 4, 1, 0, 3)};
  run[0].slack_ms = 500;
  run[1].slack_ms = 50;  // more slack than the youngest: needed later
  run[2].slack_ms = 20;
  const SchedulerOutput out = Scheduler(config(64, true)).schedule({run, {}, {}, 1, 8, 1});
  // 0 takes the free block. 1 needs one: it and 2 may give way (0 is served before it); the
  // predictor picks 1 itself (most slack), whose block lets 2 grow. Youngest-first would have
  // preempted 2.
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 1);
  EXPECT_EQ(out.preempted[0].reason, PreemptReason::kDecodeGrowth);
  ASSERT_EQ(out.decode.size(), 2u);
  EXPECT_EQ(out.decode[0].id, 0);
  EXPECT_EQ(out.decode[1].id, 2);
}

TEST(Scheduler, TimeSlicePausesTheSequenceNeededLast) {
  // Two expired low-priority sequences of 2 blocks each; the older is served least often.
  SchedSeq a = running(1, 6, 2, 0, /*arrival=*/1);
  SchedSeq b = running(2, 6, 2, 0, /*arrival=*/2);
  a.slice_expired = b.slice_expired = true;
  a.slack_ms = b.slack_ms = 100;
  a.step_interval_ewma_ms = 80;
  b.step_interval_ewma_ms = 10;
  const std::vector<SchedSeq> run = {a, b};
  const std::vector<SchedSeq> wait = {waiting(3, 8, 0, 0, /*priority=*/5)};  // needs 2 blocks
  const SchedulerOutput out = Scheduler(config(64, true)).schedule({run, wait, {}, 0, 4, 1});
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 1);  // youngest-first would have paused 2
  EXPECT_EQ(out.preempted[0].reason, PreemptReason::kTimeSlice);
  ASSERT_EQ(out.decode.size(), 1u);
  EXPECT_EQ(out.decode[0].id, 2);
}

// Ranks in the reverse of the default order (the one needed first goes first) and records the
// candidates it was shown.
class ReversePredictor final : public SwapPredictor {
 public:
  std::vector<int> rank_victims(std::span<const SchedSeq* const> c) const override {
    for (const SchedSeq* s : c) seen->push_back(s->id);
    std::vector<int> order = DefaultSwapPredictor().rank_victims(c);
    std::reverse(order.begin(), order.end());
    return order;
  }
  std::vector<int> prefetch(std::span<const SchedSeq>, int64_t, int) const override { return {}; }
  std::shared_ptr<std::vector<int>> seen = std::make_shared<std::vector<int>>();
};

TEST(Scheduler, HandoffPreemptsThePredictorsChoiceAmongLowerPrioritiesOnly) {
  // Three sequences of 3 tokens in 1 block each (no growth); the handoff (priority 5) needs 1.
  std::vector<SchedSeq> run = {running(0, 3, 1, 0, 1), running(1, 3, 1, 0, 2),
                               running(2, 3, 1, 5, 3)};
  run[0].slack_ms = 300;  // the older lower-priority one has more slack
  run[1].slack_ms = 5;
  run[2].slack_ms = 1e6;  // equal priority to the handoff: never a victim, whatever its slack
  const std::vector<SchedHandoff> h = {{20, 5, 30, /*num_tokens=*/3}};
  SchedulerOutput out = Scheduler(config(64, false)).schedule({run, {}, h, 0, 3, 1});
  ASSERT_EQ(out.admitted.size(), 1u);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 0);  // youngest-first would have preempted 1
  EXPECT_EQ(out.preempted[0].reason, PreemptReason::kHandoff);

  // Another predictor is applied as given, still only over what the rules allow.
  auto reverse = std::make_shared<ReversePredictor>();
  const Scheduler custom(config(64, false), reverse);
  out = custom.schedule({run, {}, h, 0, 3, 1});
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0].id, 1);
  EXPECT_EQ(std::count(reverse->seen->begin(), reverse->seen->end(), 2), 0);
  EXPECT_GT(std::count(reverse->seen->begin(), reverse->seen->end(), 1), 0);
}

}  // namespace
}  // namespace kvsplit::sched
