// SwapPredictor: the temporal cut's guess of which sequence is needed last (kv-cuts.md §3,
// docs/kv-tiers.md). Pure and backend-free, like the Scheduler that consults it: plain SchedSeq
// views in, indices out, unit-tested without a model (tests/sched/swap_predictor_test.cpp).
//
// Two questions, one per method:
//   rank_victims  the Scheduler pauses (swap out or recompute) running sequences under memory
//                 pressure, for a higher-priority handoff, or at the end of a time slice; among the
//                 ones its rules allow, the predictor says which goes first;
//   prefetch      the worker starts the disk reads of swapped-out sequences one step ahead, and
//                 for those on the host tier reserves their blocks and starts their copies (a
//                 host prefetch, kv::start_host_prefetch), so the step that resumes them does
//                 not wait; the predictor says which.
// Thread-safety: const methods, no state: safe from any thread.
#pragma once

#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "sched/scheduler.h"

namespace kvsplit::sched {

class SwapPredictor {
 public:
  virtual ~SwapPredictor() = default;

  // `candidates` (running sequences that may be paused, in no particular order) ordered victim
  // first: the first is the one needed last. Returns a permutation of their indices.
  virtual std::vector<int> rank_victims(std::span<const SchedSeq* const> candidates) const = 0;
  // True when rank_victims ranks by one fixed order: any subset of candidates ranks as it does
  // within the whole (ties kept in the candidates' order). The Scheduler then ranks all the
  // running sequences once per step and takes the first of the ranking that its rule allows,
  // rather than asking again, shown only those, at every pick (O(running) each).
  virtual bool fixed_order() const { return false; }

  // Swapped-out sequences of `waiting` (swapped_pages > 0) to bring back ahead of step
  // `next_step`, as indices into `waiting`, first to resume first. `free_blocks`: the pool's free
  // blocks once the current step is applied.
  virtual std::vector<int> prefetch(std::span<const SchedSeq> waiting, int64_t next_step,
                                    int free_blocks) const = 0;

  // rank_victims(candidates)[0], or -1 when empty.
  int choose_victim(std::span<const SchedSeq* const> candidates) const;
};

// The default rule, the sequence needed last (docs/kv-tiers.md, "Swap predictor"):
//   1. lowest priority first;
//   2. then the most deadline slack (SchedSeq::slack_ms: its class's latency target minus the
//      time since its last token; a sequence without a deadline has infinite slack);
//   3. then the longest step interval (SchedSeq::step_interval_ewma_ms): served least often;
//   4. then the youngest (largest arrival).
// With slack and interval unset (SchedSeq defaults) this is "lowest priority, then youngest",
// choose_preemption_victim's rule.
// prefetch: the swapped-out sequences whose resume_step <= next_step, in service order (priority,
// then age: the Scheduler's order of swap-ins), while their pages fit in `free_blocks` (the first
// is always taken: it is the next to resume once room is made).
class DefaultSwapPredictor final : public SwapPredictor {
 public:
  std::vector<int> rank_victims(std::span<const SchedSeq* const> candidates) const override;
  bool fixed_order() const override { return true; }  // a stable sort by needed_after
  std::vector<int> prefetch(std::span<const SchedSeq> waiting, int64_t next_step,
                            int free_blocks) const override;
  // True when `a` is needed after `b` (a is the better victim).
  static bool needed_after(const SchedSeq& a, const SchedSeq& b);
};

// The shared default instance (stateless).
std::shared_ptr<const SwapPredictor> default_swap_predictor();

}  // namespace kvsplit::sched
