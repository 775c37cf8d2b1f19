// The Scheduler's victims with a fixed-order predictor (SwapPredictor::fixed_order: the running
// sequences ranked once per step, the first each rule allows taken) against the same predictor
// asked at every pick, shown only the sequences the rule allows: on random steps (growth,
// handoffs, time slices, stalled readers, ties on every rule) the two plans are the same.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "sched/scheduler.h"
#include "sched/swap_predictor.h"

namespace kvsplit::sched {
namespace {

// The default order, asked at every pick (fixed_order false), counting the calls.
class AskedEveryPick final : public SwapPredictor {
 public:
  explicit AskedEveryPick(bool fixed) : fixed_(fixed) {}
  std::vector<int> rank_victims(std::span<const SchedSeq* const> c) const override {
    ++*calls;
    return DefaultSwapPredictor().rank_victims(c);
  }
  bool fixed_order() const override { return fixed_; }
  std::vector<int> prefetch(std::span<const SchedSeq>, int64_t, int) const override { return {}; }
  std::shared_ptr<int> calls = std::make_shared<int>(0);

 private:
  bool fixed_;
};

struct Step {
  SchedulerConfig config;
  std::vector<SchedSeq> running, waiting;
  std::vector<SchedHandoff> handoffs;
  SchedulerInput input() const {
    SchedulerInput in{running, waiting, handoffs};
    in.total_blocks = total;
    in.free_blocks = free;
    in.step = step;
    return in;
  }
  int total = 0, free = 0;
  int64_t step = 0;
};

Step random_step(std::mt19937& rng) {
  auto u = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  Step s;
  SchedulerConfig& c = s.config;
  c.block_size = u(1, 4);
  c.max_batch_tokens = u(4, 48);
  c.min_chunk_tokens = u(1, 8);
  c.max_num_seqs = u(4, 40);
  c.decode_in_budget = u(0, 1) == 1;
  const double slacks[] = {std::numeric_limits<double>::infinity(), 5, -3};
  int id = 0;
  for (int i = u(0, 16); i > 0; --i) {
    SchedSeq r;
    r.id = id++;
    r.priority = u(0, 2);
    r.arrival = u(0, 20);
    r.num_computed = u(0, 40);
    r.num_blocks = (r.num_computed + c.block_size - 1) / c.block_size + u(0, 1);
    r.final_positions = u(0, 1) ? r.num_computed + u(0, 40) : 0;
    r.stalled = u(0, 6) == 0;
    r.slice_expired = u(0, 3) == 0;
    r.slack_ms = slacks[u(0, 2)];
    r.step_interval_ewma_ms = u(0, 1) * 10.0;
    s.running.push_back(r);
  }
  for (int i = u(0, 8); i > 0; --i) {
    SchedSeq w;
    w.id = id++;
    w.priority = u(0, 2);
    w.arrival = u(0, 20);
    w.target = u(1, 60);
    w.restart = u(0, 1) == 1;
    if (w.restart && u(0, 1)) {  // swapped out, its KV whole
      w.num_computed = w.target;
      w.num_blocks = (w.target + c.block_size - 1) / c.block_size;
      w.swapped_pages = u(1, w.num_blocks);
    }
    s.waiting.push_back(w);
  }
  for (int i = u(0, 4); i > 0; --i)
    s.handoffs.push_back({id++, u(0, 2), u(0, 30), /*num_tokens=*/u(1, 40)});
  s.total = u(4, 100);
  s.free = u(0, s.total / 4);
  s.step = u(0, 3);
  return s;
}

void expect_same(const SchedulerOutput& a, const SchedulerOutput& b, int trial) {
  ASSERT_EQ(a.preempted.size(), b.preempted.size()) << "trial " << trial;
  for (size_t i = 0; i < a.preempted.size(); ++i) {
    EXPECT_EQ(a.preempted[i].id, b.preempted[i].id) << "trial " << trial;
    EXPECT_EQ(a.preempted[i].reason, b.preempted[i].reason) << "trial " << trial;
    EXPECT_EQ(a.preempted[i].for_id, b.preempted[i].for_id) << "trial " << trial;
  }
  ASSERT_EQ(a.decode.size(), b.decode.size()) << "trial " << trial;
  for (size_t i = 0; i < a.decode.size(); ++i) EXPECT_EQ(a.decode[i].id, b.decode[i].id);
  ASSERT_EQ(a.admitted.size(), b.admitted.size()) << "trial " << trial;
  ASSERT_EQ(a.prefill.size(), b.prefill.size()) << "trial " << trial;
  ASSERT_EQ(a.swap_in.size(), b.swap_in.size()) << "trial " << trial;
  EXPECT_EQ(a.free_blocks_after, b.free_blocks_after) << "trial " << trial;
}

TEST(SchedulerVictims, RankedOncePerStepTheyAreThoseAskedAtEveryPick) {
  auto fixed = std::make_shared<AskedEveryPick>(true);
  auto asked = std::make_shared<AskedEveryPick>(false);
  std::mt19937 rng(5);
  int steps_with_victims = 0, picks = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Step s = random_step(rng);
    const int fixed_before = *fixed->calls, asked_before = *asked->calls;
    const SchedulerOutput a = Scheduler(s.config, fixed).schedule(s.input());
    const SchedulerOutput b = Scheduler(s.config, asked).schedule(s.input());
    expect_same(a, b, trial);
    if (HasFatalFailure()) return;
    EXPECT_LE(*fixed->calls - fixed_before, 1) << "trial " << trial;  // once per step at most
    steps_with_victims += !b.preempted.empty();
    picks += *asked->calls - asked_before;
  }
  // The random steps exercise it: many preempt, several sequences at a time.
  EXPECT_GT(steps_with_victims, 300);
  EXPECT_GT(picks, 2 * steps_with_victims);
}

}  // namespace
}  // namespace kvsplit::sched
