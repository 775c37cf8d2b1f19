#include "sched/policy.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

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

std::vector<int> fair(std::vector<PrefillDemand> d, int budget, int min_chunk, int max_chunk) {
  return plan_fair_prefill(d, budget, min_chunk, max_chunk);
}

TEST(FairPrefill, ShortPromptsFinishBeforeTheLongOneGrowsAndTheCapHolds) {
  // A long prompt (served last step) and three short ones: the short ones finish this step; the
  // long one yields to them (its min chunk only), and the budget left over stays unused.
  const std::vector<PrefillDemand> d = {{400, 0, 7}, {12, 0, -1}, {16, 0, -1}, {12, 0, -1}};
  EXPECT_EQ(fair(d, 128, 4, 16), (std::vector<int>{4, 12, 16, 12}));
  // Alone, or with only longer prompts, it gets the cap.
  EXPECT_EQ(fair({{400, 0, 7}}, 128, 4, 16), (std::vector<int>{16}));
  EXPECT_EQ(fair({{400, 0, 7}, {900, 0, 1}}, 128, 4, 16), (std::vector<int>{16, 4}));
  // Without the cap the long prompt takes what the short ones leave (work-conserving).
  EXPECT_EQ(fair(d, 128, 4, 0), (std::vector<int>{88, 12, 16, 12}));
  // A tight budget goes to the least remaining first once every prompt has its min chunk: the
  // long one still moves.
  EXPECT_EQ(fair(d, 32, 4, 0), (std::vector<int>{4, 12, 4, 12}));
}

TEST(FairPrefill, ALongPromptYieldsToShorterOnesForABoundedNumberOfSteps) {
  auto at = [](std::vector<PrefillDemand> d, int64_t step) {
    return plan_fair_prefill(d, 128, 4, 16, step);
  };
  // Served at step 7: at steps 8..7+K it yields to the short prompts entirely (not even its min
  // chunk), so their step carries no long chunk; the budget left over stays unused.
  const std::vector<PrefillDemand> d = {{400, 0, 7}, {12, 0, -1}, {16, 0, -1}, {12, 0, -1}};
  EXPECT_EQ(at(d, 8), (std::vector<int>{0, 12, 16, 12}));
  EXPECT_EQ(at(d, 7 + kMaxPrefillYieldSteps), (std::vector<int>{0, 12, 16, 12}));
  // Starving (no chunk for more than K steps): its min chunk again.
  EXPECT_EQ(at(d, 8 + kMaxPrefillYieldSteps), (std::vector<int>{4, 12, 16, 12}));
  // Alone, it takes the cap whatever the step.
  EXPECT_EQ(at({{400, 0, 7}}, 8), (std::vector<int>{16}));
  // Two long prompts: the shorter takes the cap, the longer waits (shortest remaining first).
  EXPECT_EQ(at({{400, 0, 7}, {900, 0, 6}}, 8), (std::vector<int>{16, 0}));
  // A higher-priority long prompt does not yield to a lower-priority short one.
  EXPECT_EQ(at({{400, 5, 7}, {12, 0, 6}}, 8), (std::vector<int>{16, 12}));
  // Without the cap no prompt is long: the step changes nothing (progress, then shortest first).
  EXPECT_EQ(plan_fair_prefill(d, 128, 4, 0, 8), (std::vector<int>{88, 12, 16, 12}));
  // Over many steps with short prompts always waiting, the long one still moves once every
  // K + 1 steps.
  int64_t last = 0;
  int served = 0;
  for (int64_t step = 1; step <= 10 * (kMaxPrefillYieldSteps + 1); ++step) {
    const std::vector<int> c = at({{400, 0, last}, {12, 0, step - 1}}, step);
    EXPECT_EQ(c[1], 12);
    if (c[0] > 0) {
      EXPECT_EQ(c[0], 4);
      EXPECT_EQ(step - last, kMaxPrefillYieldSteps + 1);
      last = step;
      ++served;
    }
  }
  EXPECT_EQ(served, 10);
}

TEST(FairPrefill, ALongPromptProgressesEveryStepItHasRoomFor) {
  // Eight short prompts would fill a 64-token budget on their own; the long one still gets its
  // min chunk, first or last in round robin order.
  for (int64_t last : {-1, 3, 100}) {
    std::vector<PrefillDemand> d = {{1000, 0, last}};
    for (int i = 0; i < 8; ++i) d.push_back({12, 0, 50});
    const std::vector<int> c = fair(d, 64, 4, 32);
    EXPECT_EQ(c[0], 4) << last;
    EXPECT_EQ(sum(c), 64);
  }
  // No room for everyone's chunk: round robin, the least recently served first.
  const std::vector<int> c = fair({{1000, 0, 9}, {12, 0, 2}, {12, 0, 5}}, 8, 4, 0);
  EXPECT_EQ(c, (std::vector<int>{0, 4, 4}));
  EXPECT_EQ(fair({{1000, 0, 1}, {12, 0, 2}, {12, 0, 5}}, 8, 4, 0), (std::vector<int>{4, 4, 0}));
}

TEST(FairPrefill, ANeverServedPromptRanksByTheStepItStartedWaiting) {
  // A long prompt waiting since step 0, never served and starving at step 20, and short prompts
  // pulled at step 19, with room for two chunks: the long one goes first, not after every short
  // prompt that came after it.
  const std::vector<PrefillDemand> d = {
      {12, 0, -1, 19}, {12, 0, -1, 19}, {12, 0, -1, 19}, {1000, 0, -1, 0}};
  EXPECT_EQ(plan_fair_prefill(d, 8, 4, 32, 20), (std::vector<int>{4, 0, 0, 4}));
  // It ranks after a prompt served before it started waiting, and before one served since.
  EXPECT_EQ(plan_fair_prefill({{{12, 0, 3}, {1000, 0, -1, 5}}}, 4, 4, 32, 20),
            (std::vector<int>{4, 0}));
  EXPECT_EQ(plan_fair_prefill({{{12, 0, 6}, {1000, 0, -1, 5}}}, 4, 4, 32, 20),
            (std::vector<int>{0, 4}));
  // Unknown (-1): before a prompt waiting since a known step.
  EXPECT_EQ(plan_fair_prefill({{{12, 0, -1, 0}, {1000, 0, -1}}}, 4, 4, 32, 20),
            (std::vector<int>{0, 4}));
}

TEST(FairPrefill, PrioritiesWinOverShortestFirst) {
  // A high-priority long prompt is filled (up to the cap) before a low-priority short one gets
  // more than its min chunk; a high-priority short one before a low-priority long one.
  EXPECT_EQ(fair({{12, 0, -1}, {400, 5, -1}}, 32, 4, 0), (std::vector<int>{4, 28}));
  EXPECT_EQ(fair({{12, 0, -1}, {400, 5, -1}}, 32, 4, 16), (std::vector<int>{12, 16}));
  EXPECT_EQ(fair({{400, 0, -1}, {12, 5, -1}}, 20, 4, 0), (std::vector<int>{8, 12}));
}

TEST(FairPrefill, NeverExceedsRemainingBudgetOrCap) {
  for (int budget : {0, 1, 7, 16, 100, 512}) {
    for (int min_chunk : {1, 16, 64}) {
      for (int cap : {0, 8, 32}) {
        const std::vector<PrefillDemand> d = {
            {5, 0, -1}, {300, 1, 2}, {0, 0, -1}, {17, 1, 4}, {64, 0, 1}};
        const std::vector<int> c = fair(d, budget, min_chunk, cap);
        ASSERT_EQ(c.size(), d.size());
        EXPECT_LE(sum(c), budget);
        for (size_t i = 0; i < c.size(); ++i) {
          EXPECT_LE(c[i], d[i].remaining);
          if (cap > 0 && d[i].remaining > cap) {
            EXPECT_LE(c[i], std::max(cap, min_chunk));
          }
        }
        if (cap == 0) {
          EXPECT_EQ(sum(c), std::min(budget, 5 + 300 + 17 + 64));  // work-conserving
        }
      }
    }
  }
  EXPECT_TRUE(fair({}, 32, 16, 0).empty());
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

// pools.max_chunk_ms and its `auto` (the tightest max_itl_ms of the classes a step serves):
// whichever apply, the smaller; neither, no budget.
TEST(StepTimeBudget, TheSmallerOfTheConfiguredAndTheServedClassesItl) {
  EXPECT_EQ(common::step_time_budget_ms(0, false, 50), 0);    // off: the classes do not count
  EXPECT_EQ(common::step_time_budget_ms(80, false, 50), 80);  // a number alone
  EXPECT_EQ(common::step_time_budget_ms(0, true, 50), 50);    // auto alone
  EXPECT_EQ(common::step_time_budget_ms(0, true, 0), 0);      // auto, nothing served
  EXPECT_EQ(common::step_time_budget_ms(80, true, 50), 50);   // both: the smaller
  EXPECT_EQ(common::step_time_budget_ms(30, true, 50), 30);
  EXPECT_EQ(common::step_time_budget_ms(30, true, 0), 30);
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

// A worker whose sequence slots are all taken (running, waiting, or promised to offers posted to
// it) gets an offer only when every worker's are: however light its KV, the offer would wait for
// a sequence to end there.
TEST(DecodeWorker, AFreeSlotComesBeforeTheLightestKv) {
  std::vector<DecodeLoad> w(2);
  for (DecodeLoad& d : w) {
    d.kv_blocks_total = 100;
    d.max_seqs = 4;
  }
  w[0].kv_blocks_free = 95;  // lighter KV, but 4 slots taken
  w[0].running = 4;
  w[1].kv_blocks_free = 40;
  w[1].running = 2;
  EXPECT_EQ(choose_decode_worker(w), 1);
  w[1].waiting = 1;
  w[1].offers_incoming = 1;  // 4 of 4 now too: both full, by load
  EXPECT_TRUE(w[1].slots_full());
  EXPECT_EQ(choose_decode_worker(w), 0);
  w[0].running = 3;  // a free slot on 0 again
  EXPECT_EQ(choose_decode_worker(w), 0);
  w[1].max_seqs = 0;  // unknown: never full
  EXPECT_FALSE(w[1].slots_full());
  w[0].running = 4;
  EXPECT_EQ(choose_decode_worker(w), 1);
  // Cache-aware discounts apply among workers with slots alike.
  w[0].running = 3;
  w[0].kv_blocks_free = 60;  // 40 used
  w[1].max_seqs = 8;         // 60 used, 30 of the offer's 30 pages cached: 60 - 30 < 40
  const std::vector<int> on1 = {0, 30};
  EXPECT_EQ(choose_decode_worker(w, on1, 30), 1);
  EXPECT_EQ(choose_decode_worker(w), 0);  // by load alone
}

// Cache-aware: a worker's load less the pages of the offer it is expected to share.
TEST(DecodeWorker, HoldingThePromptTakesItUnlessMoreLoadedThanItSaves) {
  std::vector<DecodeLoad> w(2);
  for (DecodeLoad& d : w) d.kv_blocks_total = 100;
  w[0].kv_blocks_free = 90;  // 10 used
  w[1].kv_blocks_free = 95;  // 5 used
  const std::vector<int> none = {0, 0};
  EXPECT_EQ(choose_decode_worker(w, none, 20), 1);  // no pages cached: plain least load
  const std::vector<int> on0 = {16, 0};             // worker 0 holds 16 of the offer's 20 pages
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 0);   // 10 - 16 < 5
  w[0].kv_blocks_free = 70;                         // 30 used: 30 - 16 > 5
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 1);
  w[0].kv_blocks_free = 79;  // 21 used: 21 - 16 = 5, a tie: fewer running, then index
  w[0].running = 2;
  w[1].running = 1;
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 1);
  w[1].running = 2;
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 0);
  // More cached than the offer needs counts as the offer's blocks only.
  const std::vector<int> over = {40, 0};
  w[0].kv_blocks_free = 70;
  EXPECT_EQ(choose_decode_worker(w, over, 20), 1);  // 30 - 20 > 5
  // Only where the offer fits whole: 19 free (the cached pages among them, idle) is short of 20.
  w[0].kv_blocks_free = 19;
  w[1].kv_blocks_free = 30;
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 1);  // 81 used > 70: no discount on worker 0
  w[0].kv_blocks_free = 25;
  w[0].kv_blocks_incoming = 6;  // blocks promised to offers in flight count against the room
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 1);  // 75 + 6 > 70
  w[0].kv_blocks_incoming = 0;
  EXPECT_EQ(choose_decode_worker(w, on0, 20), 0);  // 75 - 16 < 70
  // A `cached` of another size than the workers' is ignored (load only).
  const std::vector<int> bad = {16};
  EXPECT_EQ(choose_decode_worker(w, bad, 20), 1);
}

// The stall bound is the floor until a worker's steps are long enough that kStallStepFactor of
// them exceed it; a floor of 0 turns it off whatever the steps.
TEST(HandoffStall, BoundIsTheFloorOrFourSlowestSteps) {
  constexpr int64_t kMs = 1000000;
  EXPECT_EQ(handoff_stall_bound_ns(1000 * kMs, 0), 1000 * kMs);  // no step measured yet
  EXPECT_EQ(handoff_stall_bound_ns(1000 * kMs, 20 * kMs), 1000 * kMs);
  EXPECT_EQ(handoff_stall_bound_ns(1000 * kMs, 250 * kMs), 1000 * kMs);
  EXPECT_EQ(handoff_stall_bound_ns(1000 * kMs, 300 * kMs), kStallStepFactor * 300 * kMs);
  EXPECT_EQ(handoff_stall_bound_ns(0, 300 * kMs), 0);
  EXPECT_EQ(handoff_stall_bound_ns(-5, 0), 0);
}

// The slowest of the last kWindow steps: an outlier counts until kWindow newer steps pushed it
// out, and then the window's own maximum takes over.
TEST(HandoffStall, RecentMaxForgetsAnOutlierAfterItsWindow) {
  RecentMax r;
  EXPECT_EQ(r.max(), 0);
  r.add(5);
  r.add(900);
  r.add(7);
  EXPECT_EQ(r.max(), 900);
  for (size_t k = 0; k + 2 < RecentMax::kWindow; ++k) r.add(10);
  EXPECT_EQ(r.max(), 900);  // 900 is now the oldest in the window
  r.add(10);
  EXPECT_EQ(r.max(), 10);  // 900 left the window
  r.add(11);
  EXPECT_EQ(r.max(), 11);
}

// The sums over the keys served before a key, against the plain loop, while counts come and go
// (the Scheduler takes a preempted sequence's away), equal keys included.
TEST(ServiceSums, AreTheSumsOverTheKeysServedBefore) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<PriorityKey> keys(1 + rng() % 12);
    for (PriorityKey& k : keys)
      k = {static_cast<int32_t>(rng() % 3), static_cast<int64_t>(rng() % 5)};
    ServiceSums sums(keys);
    std::vector<int> counts(keys.size(), 0);
    for (int op = 0; op < 30; ++op) {
      const size_t i = rng() % keys.size();
      const int n = static_cast<int>(rng() % 7) - 3;
      sums.add(keys[i], n);
      counts[i] += n;
      const PriorityKey& q = keys[rng() % keys.size()];
      int expected = 0;
      for (size_t j = 0; j < keys.size(); ++j)
        if (serves_before(keys[j], q)) expected += counts[j];
      ASSERT_EQ(sums.before(q), expected) << "trial " << trial << " op " << op;
    }
  }
}

}  // namespace
}  // namespace kvsplit::sched
