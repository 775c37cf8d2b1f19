// The default SwapPredictor on plain structs: each rule of its victim order (priority, deadline
// slack, step interval, age) decides when the ones before it tie, and never otherwise; its
// prefetch picks the due swapped-out sequences in service order while they fit.
#include "sched/swap_predictor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <vector>

#include "sched/policy.h"
#include "sched/sequence.h"

namespace kvsplit::sched {
namespace {

SchedSeq seq(int id, int32_t priority, double slack_ms, double interval_ms, int64_t arrival) {
  SchedSeq s;
  s.id = id;
  s.priority = priority;
  s.slack_ms = slack_ms;
  s.step_interval_ewma_ms = interval_ms;
  s.arrival = arrival;
  return s;
}

// The ids of `seqs` in the predictor's victim order.
std::vector<int> victim_ids(const std::vector<SchedSeq>& seqs) {
  std::vector<const SchedSeq*> ptrs;
  for (const SchedSeq& s : seqs) ptrs.push_back(&s);
  std::vector<int> ids;
  for (int i : DefaultSwapPredictor().rank_victims(ptrs)) ids.push_back(seqs[i].id);
  return ids;
}

TEST(SwapPredictor, LowestPriorityGoesFirstWhateverItsSlackIntervalOrAge) {
  // id 2 has the lowest priority but the least slack, the shortest interval and is the oldest.
  const std::vector<SchedSeq> seqs = {seq(1, 5, 900, 90, 20), seq(2, 1, 10, 1, 1),
                                      seq(3, 3, 500, 50, 30)};
  EXPECT_EQ(victim_ids(seqs), (std::vector<int>{2, 3, 1}));
}

TEST(SwapPredictor, WithinAPriorityTheMostSlackGoesFirst) {
  // id 1 has the most slack but the shortest interval and is the oldest.
  const std::vector<SchedSeq> seqs = {seq(1, 0, 150, 1, 1), seq(2, 0, 20, 80, 9),
                                      seq(3, 0, 60, 40, 5)};
  EXPECT_EQ(victim_ids(seqs), (std::vector<int>{1, 3, 2}));
}

TEST(SwapPredictor, NoDeadlineIsTheMostSlack) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<SchedSeq> seqs = {seq(1, 0, 1e9, 50, 9), seq(2, 0, inf, 1, 1),
                                      seq(3, 0, -30, 99, 10)};  // id 3 is already late
  EXPECT_EQ(victim_ids(seqs), (std::vector<int>{2, 1, 3}));
}

TEST(SwapPredictor, EqualSlackTheLongestStepIntervalGoesFirst) {
  // id 1 is served least often but is the oldest.
  const std::vector<SchedSeq> seqs = {seq(1, 0, 100, 75, 1), seq(2, 0, 100, 10, 7),
                                      seq(3, 0, 100, 30, 3)};
  EXPECT_EQ(victim_ids(seqs), (std::vector<int>{1, 3, 2}));
}

TEST(SwapPredictor, FullTiesGoToTheYoungest) {
  const std::vector<SchedSeq> seqs = {seq(1, 0, 100, 10, 4), seq(2, 0, 100, 10, 8),
                                      seq(3, 0, 100, 10, 6)};
  EXPECT_EQ(victim_ids(seqs), (std::vector<int>{2, 3, 1}));
}

TEST(SwapPredictor, UnsetSlackAndIntervalIsLowestPriorityThenYoungest) {
  // The SchedSeq defaults reproduce choose_preemption_victim on random sets.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<SchedSeq> seqs(1 + rng() % 8);
    std::vector<PriorityKey> keys;
    std::vector<const SchedSeq*> ptrs;
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].id = static_cast<int>(i);
      seqs[i].priority = static_cast<int32_t>(rng() % 3);
      seqs[i].arrival = static_cast<int64_t>(rng() % 1000);
      keys.push_back({seqs[i].priority, seqs[i].arrival});
    }
    for (const SchedSeq& s : seqs) ptrs.push_back(&s);
    const int victim = DefaultSwapPredictor().choose_victim(ptrs);
    const int expected = choose_preemption_victim(keys);
    EXPECT_EQ(seqs[victim].priority, seqs[expected].priority);
    EXPECT_EQ(seqs[victim].arrival, seqs[expected].arrival);
  }
  EXPECT_EQ(DefaultSwapPredictor().choose_victim({}), -1);
}

// fixed_order(): any subset ranks as it does within the whole, full ties (equal on every rule)
// in the candidates' order; the Scheduler ranks the running sequences once per step on it.
TEST(SwapPredictor, ADefaultRankingOfASubsetIsItsOrderWithinTheWhole) {
  const DefaultSwapPredictor p;
  EXPECT_TRUE(p.fixed_order());
  const double slacks[] = {std::numeric_limits<double>::infinity(), 5, 40};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<SchedSeq> seqs(1 + rng() % 10);
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i] = seq(static_cast<int>(i), static_cast<int32_t>(rng() % 2), slacks[rng() % 3],
                    static_cast<double>(rng() % 2) * 10, static_cast<int64_t>(rng() % 3));
    }
    std::vector<const SchedSeq*> all;
    for (const SchedSeq& s : seqs) all.push_back(&s);
    std::vector<int> whole;  // ids, victim first
    for (int i : p.rank_victims(all)) whole.push_back(seqs[i].id);
    std::vector<const SchedSeq*> subset;  // a random subset, in the candidates' order
    for (const SchedSeq* s : all)
      if (rng() % 2) subset.push_back(s);
    std::vector<int> ranked;
    for (int i : p.rank_victims(subset)) ranked.push_back(subset[i]->id);
    std::vector<int> restricted;
    for (int id : whole)
      if (std::any_of(subset.begin(), subset.end(), [&](const SchedSeq* s) { return s->id == id; }))
        restricted.push_back(id);
    ASSERT_EQ(ranked, restricted) << "trial " << trial;
  }
}

SchedSeq swapped(int id, int pages, int64_t resume_step, int32_t priority = 0) {
  SchedSeq s;
  s.id = id;
  s.arrival = id;
  s.priority = priority;
  s.swapped_pages = pages;
  s.resume_step = resume_step;
  return s;
}

TEST(SwapPredictor, PrefetchTakesDueSwappedSequencesInServiceOrderWhileTheyFit) {
  std::vector<SchedSeq> waiting = {swapped(1, 3, 10),    swapped(2, 0, 0),  // a prompt
                                   swapped(3, 2, 12),                       // not due
                                   swapped(4, 2, 11, 5),                    // due, served first
                                   swapped(5, 4, 9),     swapped(6, 1, 11)};
  const DefaultSwapPredictor p;
  // Next step 11: due are 1, 4, 5, 6; service order 4 (priority 5), 1, 5, 6.
  EXPECT_EQ(p.prefetch(waiting, 11, 100), (std::vector<int>{3, 0, 4, 5}));
  // 6 free blocks: 4 (2 pages) and 1 (3) fit, 5 (4 more) does not and stops the rest.
  EXPECT_EQ(p.prefetch(waiting, 11, 6), (std::vector<int>{3, 0}));
  // The next to resume is taken even when it does not fit yet.
  EXPECT_EQ(p.prefetch(waiting, 11, 0), (std::vector<int>{3}));
  EXPECT_TRUE(p.prefetch(waiting, 8, 100).empty());
}

// The step-interval EWMA the predictor ranks by leaves out the time a sequence spent preempted:
// counted, a 2 s pause made the sequence just resumed look served least often, and so the first
// victim again.
TEST(SwapPredictorInput, APauseIsNotAStepInterval) {
  using std::chrono::milliseconds;
  Sequence s;
  const Clock::time_point t0 = Clock::now();
  s.enter_phase(SeqPhase::kDecode, t0);
  s.interval_from = t0;  // its first token
  s.note_step_interval(t0 + milliseconds(10));
  s.interval_from = t0 + milliseconds(10);
  EXPECT_NEAR(s.step_interval_ewma_ms, 10.0, 1e-6);
  s.enter_phase(SeqPhase::kPreempted, t0 + milliseconds(20));
  s.enter_phase(SeqPhase::kDecode, t0 + milliseconds(2020));  // resumed after 2 s
  s.note_step_interval(t0 + milliseconds(2030));              // 20 ms of it served, not 2020
  EXPECT_NEAR(s.step_interval_ewma_ms, 0.8 * 10.0 + 0.2 * 20.0, 1e-6);
}

}  // namespace
}  // namespace kvsplit::sched
