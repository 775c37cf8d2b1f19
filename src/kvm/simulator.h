// The policy simulator (docs/kvm.md, "Policy simulator"): a discrete-event model of the engine,
// without model weights, that replays a request trace against an engine config and its KVM
// policy. Step costs come from an EngineProfile measured on this machine (bench_engine
// --write-profile). `kvsplit policy simulate` prints what it returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvm/profile.h"
#include "kvm/trace.h"
#include "kvsplit/engine.h"
#include "kvsplit/kvm.h"
#include "kvsplit/status.h"

namespace kvsplit::kvm {

struct SimClassResult {
  std::string name;
  double max_ttft_ms = 0, max_itl_ms = 0;  // the class's targets
  int64_t requests = 0;                    // in the trace
  int64_t finished = 0;
  int64_t rejected = 0;  // queue full (max_queue), queue timeout, or larger than a worker's KV
  int64_t met = 0;       // finished with ttft <= max_ttft_ms and mean ITL <= max_itl_ms
  double ttft_p50_ms = 0, ttft_p99_ms = 0;  // over finished requests (nearest rank)
  double itl_p50_ms = 0, itl_p99_ms = 0;    // over finished requests' mean inter-token latency
  double attainment = 0;                    // met / requests (0 without requests)
};

struct SimResult {
  std::vector<SimClassResult> classes;  // in the config's class order
  std::vector<KvmDecision> decisions;   // in time order
  double end_ms = 0;                    // when the last request finished
  int64_t steps = 0;                    // engine steps over all workers
  int64_t preemptions = 0, swaps_out = 0, swaps_in = 0, recomputes = 0;
  double peak_device_kv_use = 0;  // max over KVM samples (0 without samples)
  double mean_device_kv_use = 0;  // mean over KVM samples
  int64_t samples = 0;            // KVM samples taken (every kvm.interval_ms)
  double mean_step_ms = 0;        // the workers' busy time / steps
  int64_t peak_running = 0;       // most sequences decoding at once on one worker
  // Requests preempted more than 20 times in a row without a token (sequences that preempt each
  // other at every block boundary in a pool they fill between them): counted as rejected so that
  // the run ends.
  int64_t thrashed = 0;
  // Requests a server refuses with INVALID_ARGUMENT, prompt + output - 1 > the profile's
  // max_context (sched::check_request's rule), which the simulator fits to the context instead,
  // as bench_serving_offline fits a trace.
  int64_t over_context = 0;
  // Rules whose `when` or `exit` reads a metric the model does not produce (disk_kv_use,
  // link_use, peer_exchange_mb_s, storage_latency_ms, prefix_hit_rate, recall_rate): it reads 0
  // throughout, so such a
  // rule fires (or never does) whatever the engine would see. One line per (rule, metric):
  // "rule 'cold-prefix' reads prefix_hit_rate, which the simulator does not model (it reads 0)".
  std::vector<std::string> unmodelled;
  // Each decode worker's KV as modelled: full-pool blocks and the semantic cut's arena pages.
  int64_t kv_blocks_per_worker = 0, int8_pages_per_worker = 0, int4_pages_per_worker = 0;
  // Every request of the trace in arrival order (ties: trace order), as the model predicts it
  // (`policy simulate --write-requests`).
  std::vector<RequestOutcome> requests;
};

// Replays `trace` (any order; sorted by arrival here) on the engine `config` describes: its
// workers and mode, max_num_seqs, max_batch_tokens, KV capacity, the cuts' settings, the SLA
// classes and the kvm section (rules evaluated every kvm.interval_ms when kvm.enabled; decisions
// applied to the simulated parameters in enforce mode, only listed in dry-run). Deterministic.
// Errors: kInvalidArgument for a trace class the config lacks (naming the trace line) or for
// rules that do not validate (naming the rule and the field).
StatusOr<SimResult> simulate(const EngineConfig& config, const EngineProfile& profile,
                             const std::vector<TraceRequest>& trace);

// The `--json` line of `kvsplit policy simulate`:
// {"classes":{"<name>":{"requests":…, "ttft_p99_ms":…, "itl_p99_ms":…, "attainment":…, …}},
//  "decisions":[{"time_ms":…, "rule":…, "action":…, "param":…, "class":…, "before":…,
//  "after":…, "monitors":…}], "steps":…, "mean_step_ms":…, "preemptions":…,
//  "kv_blocks_per_worker":…}
std::string sim_result_json(const SimResult& r);

}  // namespace kvsplit::kvm
