// bench_serving_offline's shared pieces (bench_serving_offline.cpp: the workloads, the engine
// config, the request stream; serving_offline_fairness.cpp: the --fairness mode;
// serving_offline_capacity.cpp: the --capacity and --swap-compare modes).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "kvm/trace.h"
#include "kvsplit/engine.h"

namespace kvsplit::bench_serving {

using kvsplit::EngineConfig;
using kvsplit::EngineImpl;
using kvsplit::Request;
using kvsplit::ServingMode;
using kvsplit::TokenEvent;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "synthetic:stories260k";
  std::string mode = "both";
  int requests = 200;
  double rate = 50;  // requests per second
  uint64_t seed = 1;
  double prompt_median = 64, prompt_sigma = 0.8;
  double output_median = 32, output_sigma = 0.6;
  double interactive_share = 0.5;
  int prefill_workers = 1, decode_workers = 1, colocated_workers = 2;
  int threads = 1;
  int max_batch_tokens = 512;
  int max_chunk_tokens = -1;       // -1: the engine's default
  double max_chunk_ms = 0;         // EngineConfig::max_chunk_ms (0: off)
  bool max_chunk_ms_auto = false;  // EngineConfig::max_chunk_ms_auto (the classes' max_itl_ms)
  int kv_blocks = 0;
  int max_num_seqs = 0;          // sequences per worker (0: the engine's default)
  bool forward_handoffs = true;  // EngineConfig::forward_waiting_handoffs
  bool bookkeeping = false;
  int bookkeeping_seqs = 256, bookkeeping_tokens = 8;
  int sampling_threads = 0;  // --bookkeeping: 0 runs 1 and then --threads sampling threads
  bool capacity = false;
  double kv_capacity_mb = 5;
  double quant_fraction = 0.7;
  std::vector<int> capacity_seqs = {8, 12, 16, 20, 24};
  int capacity_prompt = 16, capacity_output = 480;
  float semantic_threshold = 0.99f;
  int recent_tokens = 16;
  int score_interval = 1;
  bool swap_compare = false;
  int swap_seqs = 8, swap_prompt = 256, swap_output = 128, swap_reps = 1;
  int64_t host_mb = 256;
  double sla_ttft_ms = 0, sla_itl_ms = 0;  // --swap-compare goodput targets (0: the class's)
  std::string trace;           // replay this request trace instead of the synthetic workload
  std::string write_trace;     // write the workload (generated or replayed) as a trace
  std::string write_requests;  // write each request's outcome (kvm::RequestOutcome JSON lines)
  std::string config;          // server YAML: engine settings, SLA classes and kvm
  bool fairness = false;
  int fair_requests = 60;
  double fair_rate = 3;
  int fair_prompt_min = 32, fair_prompt_max = 64, fair_output_min = 16, fair_output_max = 32;
  int long_prompt = 4096, long_output = 16;
  double long_at_s = 2;
};

struct Item {
  double arrival_s;
  Request request;
};

// One request of p random prompt ids (never BOS/EOS) generating exactly n tokens (EOS ignored).
Item synthetic_item(std::string id, double arrival_s, int p, int n, const std::string& cls,
                    int vocab, std::mt19937_64& rng);
std::vector<kvsplit::kvm::TraceRequest> trace_of(const std::vector<Item>& work);
double pct(std::vector<double> v, double p);
// The engine config of a run: --config's file when given, else the options'.
EngineConfig base_config(const Options& o, ServingMode mode);

// One request's end as the client saw it.
struct Outcome {
  bool ok = false;
  double ttft_ms = 0, e2e_ms = 0, mean_itl_ms = 0;
  int64_t tokens = 0;
  int32_t preemptions = 0;
};

struct StreamResult {
  std::vector<Outcome> outcomes;  // per item of the workload
  std::vector<double> itl;        // every inter-token gap (ms)
  double wall_s = 0;
};

// Submits `work` at its arrival times and collects every request's events until all are final.
StreamResult run_stream(EngineImpl& engine, const std::vector<Item>& work, const char* name,
                        bool report_refused);

// --fairness (serving_offline_fairness.cpp).
int run_fairness(const Options& o);
// --capacity and --swap-compare (serving_offline_capacity.cpp).
int run_capacity(const Options& o);
int run_swap_compare(const Options& o);

}  // namespace kvsplit::bench_serving
