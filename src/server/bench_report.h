// Workload generation and result summaries of kvsplit-bench-serving (pure functions, seeded).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::server::bench {

struct Spec {
  int num_requests = 200;
  double rate = 0;  // Poisson arrivals per second; 0: all at t = 0 (concurrency-bound)
  int concurrency = 64;
  int prompt_min = 16, prompt_max = 64;                 // prompt tokens, uniform
  int output_min = 32, output_max = 128;                // max_tokens, uniform
  std::vector<std::pair<std::string, double>> classes;  // SLA class -> weight
  uint64_t seed = 0;
};

struct Work {
  std::vector<int32_t> prompt;  // token ids
  uint32_t max_tokens = 0;
  std::string sla_class;
  double arrival_s = 0;  // offset from the start
};

struct Outcome {
  bool ok = false;
  std::string error;
  std::string sla_class;
  int tokens = 0;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;  // one per message after the first (gap / tokens in it)
  // From the first token to the last: the request's mean inter-token latency is
  // itl_total_ms / itl_tokens, as the server's mean_itl_ms (Timings).
  double itl_total_ms = 0;
  int itl_tokens = 0;

  // A message carrying `n` > 0 tokens arrived `ms` after the request was sent, `gap_ms` after
  // the previous one.
  void record_message(double ms, double gap_ms, int n);
  double mean_itl_ms() const { return itl_tokens > 0 ? itl_total_ms / itl_tokens : 0; }
};

// Parses "MIN:MAX" lengths and "name:weight,..." class mixes into `spec` (kInvalidArgument
// naming the flag).
Status parse_spec(const std::string& prompt_len, const std::string& output_len,
                  const std::string& class_mix, Spec* spec);
// Deterministic for a given spec; max_tokens is clipped so that the engine admits each request
// (prompt + max_tokens - 1 <= max_context).
std::vector<Work> make_workload(const Spec& spec, int32_t vocab_size, int32_t max_context);
// p50/p90/p99/mean of TTFT, ITL, E2E; tokens/s, requests/s, goodput (requests per second whose
// TTFT met their class's max_ttft_ms and whose mean ITL met its max_itl_ms: the server's SLO
// definition); per-request samples for plotting.
nlohmann::json summarize(const std::string& mode, const Spec& spec,
                         const std::vector<Outcome>& outcomes, double seconds,
                         const std::map<std::string, std::pair<double, double>>& targets);
void print_summary(const nlohmann::json& summary);
// `message` with every run of digits replaced by '#' (at most 240 characters): errors that
// differ only in request ids or numbers share a kind.
std::string error_kind(const std::string& message);
// The q-quantile (0..1) of `v` by linear interpolation; 0 for an empty vector.
double quantile(std::vector<double> v, double q);

}  // namespace kvsplit::server::bench
