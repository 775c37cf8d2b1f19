// The policy simulator's discrete-event model of the engine (internal to simulator*.cpp): a
// request's and a worker's state, and the Sim that steps workers as the Scheduler does
// (simulator_step.cpp) and runs a trace against a policy (simulator.cpp). docs/kvm.md, "The model".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kvm/monitor.h"
#include "kvm/rule_engine.h"
#include "kvm/simulator.h"

namespace kvsplit::kvm::sim_detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
// Preemptions of one request in a row, with no token between them, beyond which it is taken to
// thrash (see Sim::preempt).
inline constexpr int64_t kMaxPreemptions = 20;

// Nearest-rank percentile (as the monitors compute theirs).
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

enum class Role : uint8_t { kColocated, kPrefill, kDecode };
enum class St : uint8_t {
  kPending,  // not arrived yet
  kQueued,   // in the router's queue
  kWaiting,  // on a worker: prefilling (its prompt's blocks reserved) or waiting to recompute
  kRunning,  // on a worker: decoding
  kHandoff,  // disaggregated: prefilled, waiting for a decode worker
  kSwapped,  // on a worker's waiting list, its pages in the host tier
  kDone,
  kRejected
};

inline int64_t blocks_for(int64_t tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

// Blocks a request holding `blocks` pages needs beyond them for `positions` + 1 (its next token).
inline int64_t next_token_blocks(int64_t positions, int64_t blocks, int block_size) {
  return std::max<int64_t>(0, blocks_for(positions + 1, block_size) - blocks);
}

struct Req {
  const TraceRequest* t = nullptr;
  int cls = 0;
  int priority = 0;
  St st = St::kPending;
  // Its lengths, clamped to the model's context as bench_serving_offline clamps a trace's.
  int64_t prompt = 0, output = 0;
  int64_t kv = 0;      // tokens whose KV is computed
  int64_t target = 0;  // tokens to compute before it decodes: the prompt, or prompt + output[:-1]
                       // after a recompute (the last token is then decoded, as the engine does)
  int64_t generated = 0;
  double first_ms = -1, last_ms = 0;
  bool started = false;      // admitted at least once (the queue timeout no longer applies)
  int64_t decode_steps = 0;  // decode steps since its KV was (re)built: the demotion age
  double share = 0;          // share of its old pages to demote (the highest threshold seen)
  double evict_share = 0;    // share to evict
  // Its pages: `held` full-pool blocks, q8 / q4 pages in the int8 / int4 arenas, ev evicted.
  int64_t held = 0, q8 = 0, q4 = 0, ev = 0;
  int64_t last_prefill_step = -1;  // the worker step that last gave it a chunk (fair prefill)
  int64_t waiting_since = -1;      // the worker step that pulled it (PrefillDemand::waiting_since)
  int64_t stuck = 0;               // preemptions in a row without a token between them
  int64_t preemptions = 0;         // in all
  int64_t generated_at_preemption = -1;
  int64_t swapped_pages = 0;  // swapped out: pages in the host tier
  int64_t resume_step = 0;    // swapped out: not back before this worker step
  double host_bytes = 0;
  double ready_ms = 0;  // handoff: when the KV has arrived
  int worker = -1;
  int64_t pages() const { return held + q8 + q4 + ev; }
};

struct Worker {
  Role role = Role::kColocated;
  std::string name;
  double now = 0;
  bool idle = false;
  int64_t steps = 0;
  std::vector<int> running;                   // decoding, request indices
  std::vector<int> waiting;                   // prefilling, waiting to recompute, swapped out
  int64_t total_blocks = 0, free_blocks = 0;  // the full pool
  int64_t free8 = 0, free4 = 0;               // the quantized arenas' free pages
  double host_cap = 0, host_used = 0;
  double busy_ms = 0;
};

// Service order: higher priority first, then older.
inline bool serves_before(const Req& a, const Req& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  return a.t->arrival_ms < b.t->arrival_ms;
}

class Sim {
 public:
  Sim(const EngineConfig& c, const EngineProfile& p, const std::vector<TraceRequest>& trace)
      : c_(c), p_(p), trace_(trace), window_(c.kvm.window_ms) {}

  StatusOr<SimResult> run();

 private:
  double param(const char* name, int cls) const {
    return params_.get(name, cls < 0 ? std::string() : c_.sla_classes[cls].name);
  }
  double block_bytes() const { return c_.block_size * p_.kv_bytes_per_token_full; }
  void enqueue(int i, double now);
  void wake_sleepers(double now);  // workers asleep for want of work look again at `now`
  void reject(int i) {
    reqs_[i].st = St::kRejected;
    remaining_--;
    progress_step_ = res_.steps;
  }
  // Rejected by the engine's failure (a queue timeout, KV it could never hold): the latency
  // window takes it as the engine's does (KvmClassLatency).
  void fail(int i, double now);
  void finish(int i, double now);
  void release(Worker& w, Req& r);  // frees every page it holds on w
  // Preempts `i`, running on `w`: swapped out or dropped for a recompute; onto w's waiting list.
  void preempt(Worker& w, int i, double* cost_ms);
  // The KV cuts after a decode step: pages demoted into the arenas (room permitting) or evicted.
  void apply_cut(Worker& w, Req& r);
  void admit(Worker& w, double now);
  bool step(Worker& w);  // false: nothing to do at w.now
  void tick(double now);
  // The engine's checks of a rule's decision (range, semantic configuration): refused or ok.
  Status check_decision(const KvmDecision& d) const;
  double next_wake(const Worker& w) const;

  const EngineConfig& c_;
  const EngineProfile& p_;
  const std::vector<TraceRequest>& trace_;
  std::vector<Req> reqs_;
  std::vector<Worker> workers_;
  std::vector<int> queue_;    // queued (not admitted) request indices
  std::vector<int> handoff_;  // disaggregated: prefilled, waiting for a decode worker
  std::vector<int> queued_per_class_;
  ParamTable params_;
  std::unique_ptr<RuleEngine> rules_;
  LatencyWindow window_;
  SimResult res_;
  int64_t remaining_ = 0;
  int64_t progress_step_ = 0;  // res_.steps when a request last finished or was rejected
  std::vector<int> order_;     // trace indices by arrival
  int64_t next_arrival_ = 0;
  int64_t swaps_since_tick_ = 0;
  double last_tick_ = 0;
  double mean_use_sum_ = 0;
  std::vector<std::vector<double>> ttft_, itl_;
};

}  // namespace kvsplit::kvm::sim_detail
