// The request-trace format shared by the policy simulator (`kvsplit policy simulate`),
// bench_serving_offline and kvsplit-bench-serving (docs/kvm.md, "Policy simulator"): JSON lines
// {"arrival_ms": 12.5, "prompt_tokens": 64, "output_tokens": 32, "class": "interactive"}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::kvm {

struct TraceRequest {
  double arrival_ms = 0;  // >= 0, since the trace starts; lines need not be sorted
  int prompt_tokens = 1;  // >= 1
  int output_tokens = 1;  // >= 1
  std::string sla_class;  // empty: the default class
  int64_t line = 0;       // 1-based line of the file it was read from (0: generated)
};

// Parses JSONL text: one object per line, blank lines skipped, `class` optional. Errors
// (kInvalidArgument) name the line and the field: "<what>:3: prompt_tokens: must be an integer
// >= 1, got 0". Unknown fields are errors too. File order is kept (the
// simulator and the benchmarks sort by arrival themselves).
StatusOr<std::vector<TraceRequest>> parse_trace(std::string_view text,
                                                const std::string& what = "trace");
// Reads a trace file (kNotFound when missing); errors start with the path.
StatusOr<std::vector<TraceRequest>> read_trace_file(const std::string& path);

// One JSON line per request (class omitted when empty), in order.
std::string format_trace(const std::vector<TraceRequest>& trace);
Status write_trace_file(const std::string& path, const std::vector<TraceRequest>& trace);

// Bounds of a trace: arrivals within 1e9 ms (11.6 days), and at most this many requests made by
// make_phased_trace.
inline constexpr double kMaxTraceMs = 1e9;
inline constexpr double kMaxTraceRequests = 1e7;

// The phased trace of issue 15's benchmark: calm, then a memory spike of long prompts, then calm
// again, with two SLA classes. Poisson arrivals per class and phase; lengths uniform in
// [median / 2, median * 3 / 2] (at least 1). Deterministic for a seed.
struct PhasedTraceOptions {
  double calm_ms = 10000;   // each calm phase (before and after the spike)
  double spike_ms = 10000;  // the spike phase
  uint64_t seed = 1;
  // The interactive class: short prompts, tight targets; the same in every phase.
  std::string interactive_class = "interactive";
  double interactive_rate = 4;  // requests per second
  int interactive_prompt = 32, interactive_output = 32;
  // The batch class: long prompts, loose targets; a low rate when calm, a high one in the spike.
  std::string batch_class = "batch";
  double batch_rate_calm = 0.5, batch_rate_spike = 6;
  int batch_prompt = 128, batch_output = 64;  // calm
  int spike_prompt = 384, spike_output = 96;  // spike: the long prompts
  // Multiplies every rate above (> 0): the same phases and lengths at a load scaled to a faster
  // or slower machine (scripts/bench_kvm.sh derives it from the machine's engine profile).
  double rate_scale = 1;
};
Status validate(const PhasedTraceOptions& o);

// What became of one request of a trace, as bench_serving_offline measures it (`--write-requests`)
// and `kvsplit policy simulate --write-requests` predicts it, so that the two can be compared
// request by request. One JSON line each, in arrival order (ties: trace order; `index` counts in
// that order): {"index":…, "arrival_ms":…,
// "class":…, "prompt_tokens":…, "output_tokens":…, "ok":…, "ttft_ms":…, "mean_itl_ms":…,
// "e2e_ms":…, "preemptions":…} (`preemptions`: -1 where unknown; not ok: latencies are 0).
struct RequestOutcome {
  int64_t index = 0;  // 0-based position in arrival order
  double arrival_ms = 0;
  std::string sla_class;
  int prompt_tokens = 0, output_tokens = 0;
  bool ok = false;  // finished (false: rejected, failed or never run)
  double ttft_ms = 0, mean_itl_ms = 0, e2e_ms = 0;
  int64_t preemptions = -1;
};
std::string format_outcomes(const std::vector<RequestOutcome>& outcomes);
Status write_outcomes_file(const std::string& path, const std::vector<RequestOutcome>& outcomes);
std::vector<TraceRequest> make_phased_trace(const PhasedTraceOptions& o);

}  // namespace kvsplit::kvm
