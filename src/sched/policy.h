// Scheduling policies as small pure functions over plain structs (unit-tested without a model).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/fair_prefill.h"

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

// Counts summed over the keys served before a key, while counts are added and taken away (the
// Scheduler's per-step block sums: a running sequence's count goes when it is preempted): a
// Fenwick tree over `keys` in service order, O(log n) per call. Every key added must be one of
// `keys` (equal keys share a slot).
class ServiceSums {
 public:
  explicit ServiceSums(std::vector<PriorityKey> keys);
  void add(const PriorityKey& key, int n);
  // The sum of the counts of the keys served strictly before `key`.
  int before(const PriorityKey& key) const;

 private:
  size_t slot(const PriorityKey& key) const;  // how many keys are served before `key`
  std::vector<PriorityKey> keys_;             // in service order
  std::vector<int64_t> tree_;                 // 1-based
};

// Chunked prefill: splits `budget` tokens of one step among prompts with `remaining[i]` tokens
// still to compute, listed in service order. Fair share: every prompt gets up to
// max(min_chunk, budget / n) per round, rounds repeat until the budget or the work runs out, so
// a 32K-token prompt never monopolizes a step and short prompts finish in a few steps.
// Returns the chunk of each prompt this step (0 = none). sum(result) <= budget.
std::vector<int> plan_prefill_chunks(std::span<const int> remaining, int budget, int min_chunk);

// Fair chunked prefill (plan_fair_prefill, PrefillDemand): in common/fair_prefill.h, so the
// policy simulator (src/kvm, which may include only common) plans prefill with the same function.
using common::kMaxPrefillYieldSteps;
using common::plan_fair_prefill;
using common::PrefillDemand;

// Preemption victim among `candidates` (each a running sequence): lowest priority, then youngest.
// Returns the index, or -1 when empty.
int choose_preemption_victim(std::span<const PriorityKey> candidates);

// Load of one decode worker as the router sees it.
struct DecodeLoad {
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int kv_blocks_incoming = 0;  // reserved by handoffs not yet admitted
  int running = 0;
  int waiting = 0;  // sequences and received handoffs not running yet (slots they will take)
  int offers_incoming = 0;  // handoffs posted to it and not yet counted in `waiting`
  int max_seqs = 0;         // its sequence slots (max_num_seqs); 0: not known, never full

  // Every slot is taken or promised: an offer sent now waits for a sequence to end.
  bool slots_full() const {
    return max_seqs > 0 && running + waiting + offers_incoming >= max_seqs;
  }
};
// Handoff destination: a worker with a free sequence slot (DecodeLoad::slots_full) before any
// without one (an offer sent there would wait for a sequence to end, however light its KV); then
// least KV load ((used + incoming) / total), ties to the fewest running, then the lowest index.
// Returns -1 when empty.
// Cache-aware (`cached`, one per worker; ignored unless its size is the workers'): cached[i] is
// the pages of the offer worker i is expected to hold in its prefix cache (shared there, not
// copied), and its load counts (used + incoming - cached[i]) / total, the pages capped at `need`
// (the offer's blocks) and counted only where the offer fits whole (free - incoming >= need: an
// idle cached page counts as free, and sharing it takes a block). A worker that holds the prompt
// takes it unless it is more loaded than another by more than those pages (as fractions of each
// pool). With no pages cached anywhere the choice is the load-only one.
int choose_decode_worker(std::span<const DecodeLoad> workers, std::span<const int> cached = {},
                         int need = 0);

// Handoff liveness (EngineConfig::handoff_stall_ms): a live decode worker drains its inbox at
// every step boundary (and every idle_wait when idle), so it takes an offer within one step of
// its posting. An offer not taken within handoff_stall_bound_ns of its posting, by a worker that
// has not drained its inbox since, marks that worker down before the offer's deadline
// (Worker::stalled_since). The bound is `floor_ns` or kStallStepFactor times the worker's slowest
// recent step, whichever is longer, so a worker whose steps are long is given as many times that.
// floor_ns <= 0: never (only the delivery deadline marks a worker down).
inline constexpr int64_t kStallStepFactor = 4;
inline int64_t handoff_stall_bound_ns(int64_t floor_ns, int64_t slowest_step_ns) {
  if (floor_ns <= 0) return 0;
  return slowest_step_ns > floor_ns / kStallStepFactor ? kStallStepFactor * slowest_step_ns
                                                       : floor_ns;
}

// The longest of the last kWindow values added (0 before the first): a worker's slowest recent
// step, for handoff_stall_bound_ns. An outlier step is forgotten kWindow steps later.
class RecentMax {
 public:
  static constexpr size_t kWindow = 64;
  void add(int64_t v);
  int64_t max() const { return max_; }

 private:
  std::array<int64_t, kWindow> values_{};
  size_t next_ = 0;
  int64_t max_ = 0;
};

}  // namespace kvsplit::sched
