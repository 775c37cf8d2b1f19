// Fair chunked prefill: how one step's prefill token budget is shared among the prompts a worker
// is prefilling. A pure function over plain structs, here at the bottom of the layers so that the
// Scheduler (src/sched, which re-exports it from sched/policy.h) and the policy simulator
// (src/kvm) plan with the same code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace kvsplit::common {

// Fair chunked prefill, the rule of the Scheduler (docs/kv-cuts.md "Fair time slicing"). Each
// prompt has `remaining` tokens still to compute, its priority, the step that last gave it a
// chunk (-1: never) and, never served, the step it started waiting. The step's `budget` goes:
//   1. progress: every prompt, higher priority first and within a priority the one waiting the
//      longest first (since its last chunk, or never served since it started waiting), gets
//      min(remaining, min_chunk) while the budget lasts, so a long prompt moves every step that
//      has room for one chunk per prompt, and round robin otherwise: prompts that came after
//      its last chunk go after it, however many arrive;
//   2. the rest, higher priority first and within a priority the least remaining first
//      (shortest remaining prefill first; ties: the least recently served), each up to its limit,
//      so short prompts finish within the budget before a long one's chunk grows;
//   3. a long prompt (remaining > max_chunk > 0) gets at most max_chunk tokens in the step, and
//      nothing when a shorter prompt of at least its priority has a chunk in the step, so a long
//      prompt cannot make the step, and the short requests sharing it, slow; the budget left
//      over stays unused. It yields so for at most kMaxPrefillYieldSteps steps after its last
//      chunk: a long prompt that has waited longer ("starving"; every prompt when `step` < 0)
//      gets its min chunk in the progress pass of 1 (only starving long prompts take part in it).
//      max_chunk 0: no prompt is long (progress for every prompt, then shortest remaining first).
// Returns the chunk of each prompt (input order; 0 = none). sum(result) <= budget.
struct PrefillDemand {
  int remaining = 0;
  int32_t priority = 0;
  int64_t last_served = -1;  // the step of its last chunk; -1: never
  // Never served: the step it started waiting (its rank in the progress pass); -1: unknown, it
  // ranks before every prompt served or waiting since a known step.
  int64_t waiting_since = -1;
  // Its rank in the progress pass (the smaller, the sooner): the step it has waited since.
  int64_t since() const { return last_served >= 0 ? last_served : waiting_since; }
};
inline constexpr int64_t kMaxPrefillYieldSteps = 8;

// Prompts a worker holds pulled and not started: enough to fill a step's `max_batch_tokens` at
// the smallest chunk (`min_chunk_tokens`), at least 16 (the engine's workers and the policy
// simulator's).
inline int default_max_prefill_seqs(int max_batch_tokens, int min_chunk_tokens) {
  return std::max(16, max_batch_tokens / std::max(1, min_chunk_tokens));
}

// The time budget of a step's prefill in ms (0: none): `max_chunk_ms` when > 0 and, with
// pools.max_chunk_ms: auto (`from_itl`), `tightest_itl_ms` when > 0: the smallest max_itl_ms
// among the SLA classes of the sequences the step serves (those it decodes wait for the whole
// step; a prompt arriving meanwhile waits for it too); the smaller of those that apply.
// The tighter of two ITL targets, `itl` counting only when > 0 (`tightest` 0: none yet): folds
// the max_itl_ms of a worker's sequences into the `tightest_itl_ms` of step_time_budget_ms.
inline double tighter_itl(double tightest, double itl) {
  return itl > 0 && (tightest == 0 || itl < tightest) ? itl : tightest;
}

inline double step_time_budget_ms(double max_chunk_ms, bool from_itl, double tightest_itl_ms) {
  double budget = max_chunk_ms > 0 ? max_chunk_ms : 0;
  if (from_itl && tightest_itl_ms > 0)
    budget = budget > 0 ? std::min(budget, tightest_itl_ms) : tightest_itl_ms;
  return budget;
}

// The per-prompt chunk cap of a step under a time budget (pools.max_chunk_ms), given that `fit`
// prompt tokens fit in it (<= 0: none): the smaller of `fit` and `budget`, rounded down to a
// block, at least `min_chunk` (0 would mean no cap); with a token cap `token_cap` > 0 too, the
// smaller of the two. The worker's fit comes from its measured steps (Worker::step_chunk_cap),
// the policy simulator's from its profile.
inline int time_chunk_cap(double fit, int budget, int block_size, int min_chunk, int token_cap) {
  const int tokens = fit <= 0 ? 0 : static_cast<int>(std::min<double>(fit, budget));
  const int cap =
      std::clamp(tokens / block_size * block_size, min_chunk, std::max(min_chunk, budget));
  return token_cap > 0 ? std::min(token_cap, cap) : cap;
}
// `step`: the step being planned (the clock of last_served).
std::vector<int> plan_fair_prefill(std::span<const PrefillDemand> prompts, int budget,
                                   int min_chunk, int max_chunk, int64_t step = -1);

}  // namespace kvsplit::common
