// Scheduling policies as small pure functions over plain structs (unit-tested without a model).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvsplit::sched {

// Order of service: higher priority first, then older (smaller arrival) first. Preemption picks
// victims from the other end (lowest priority, then youngest).
struct PriorityKey {
  int32_t priority = 0;
  int64_t arrival = 0;
};
inline bool serves_before(const PriorityKey& a, const PriorityKey& b) {
  return a.priority != b.priority ? a.priority > b.priority : a.arrival < b.arrival;
}

// Chunked prefill: splits `budget` tokens of one step among prompts with `remaining[i]` tokens
// still to compute, listed in service order. Fair share: every prompt gets up to
// max(min_chunk, budget / n) per round, rounds repeat until the budget or the work runs out, so
// a 32K-token prompt never monopolizes a step and short prompts finish in a few steps.
// Returns the chunk of each prompt this step (0 = none). sum(result) <= budget.
std::vector<int> plan_prefill_chunks(std::span<const int> remaining, int budget, int min_chunk);

// Fair chunked prefill, the rule of the Scheduler (docs/kv-cuts.md "Fair time slicing"). Each
// prompt has `remaining` tokens still to compute, its priority and the step that last gave it a
// chunk (-1: never). The step's `budget` goes:
//   1. progress: every prompt, higher priority first and within a priority the least recently
//      served first, gets min(remaining, min_chunk) while the budget lasts, so a long prompt
//      moves every step that has room for one chunk per prompt (and round robin otherwise);
//   2. the rest, higher priority first and within a priority the least remaining first
//      (shortest remaining prefill first; ties: the least recently served), each up to its limit,
//      so short prompts finish within the budget before a long one's chunk grows;
//   3. a long prompt (remaining > max_chunk > 0) gets at most max_chunk tokens in the step, and
//      only its min chunk when a shorter prompt of at least its priority has a chunk in the step,
//      so a long prompt cannot make the step, and the short requests sharing it, slow; the budget
//      left over stays unused. max_chunk 0: no prompt is long (plain shortest-remaining-first).
// Returns the chunk of each prompt (input order; 0 = none). sum(result) <= budget.
struct PrefillDemand {
  int remaining = 0;
  int32_t priority = 0;
  int64_t last_served = -1;
};
std::vector<int> plan_fair_prefill(std::span<const PrefillDemand> prompts, int budget,
                                   int min_chunk, int max_chunk);

// Preemption victim among `candidates` (each a running sequence): lowest priority, then youngest.
// Returns the index, or -1 when empty.
int choose_preemption_victim(std::span<const PriorityKey> candidates);

// Load of one decode worker as the router sees it.
struct DecodeLoad {
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int kv_blocks_incoming = 0;  // reserved by handoffs not yet admitted
  int running = 0;
  int max_running = 0;
};
// Handoff destination: least KV load ((used + incoming) / total), ties to the fewest running, then
// the lowest index. Returns -1 when empty.
int choose_decode_worker(std::span<const DecodeLoad> workers);

}  // namespace kvsplit::sched
