// bench_temporal's shared pieces (bench_temporal.cpp: the modes and main; temporal_restore.cpp:
// the --restore mode).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "model/llama_model.h"
#include "model/loader.h"

namespace kvsplit::bench_temporal {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Options {
  std::string model = "synthetic:llama-110m";
  int threads = 2;
  bool restore = false, prefix = false, spill_alloc = false, swap_bandwidth = false;
  bool disk_direct_io = false;
  bool cold = false;  // --restore: also a disk swap-in with the page cache dropped first
  bool spill_ahead = false, resume_step = false;
  int alloc = 2;                // --spill-ahead: blocks allocated per step
  int step_mb = 64;             // --spill-ahead: bytes a step reads
  std::string backend = "cpu";  // --swap-bandwidth
  int pages = 64;
  int tokens = 2048;
  int prefix_tokens = 400, requests = 8, suffix_tokens = 16;
  int reps = 3;
  std::string disk_path = "/tmp/kvsplit-bench-temporal";
  std::string prefix_spill;  // "", "host" or "disk"
};

// The model on a CPU backend of o.threads threads (the restore and spill-alloc modes).
struct CpuModel {
  std::optional<kvsplit::model::LoadedModel> loaded;
  std::unique_ptr<kvsplit::backend::Backend> be;
  std::unique_ptr<kvsplit::model::LlamaModel> model;
};

// False (with a message) when the model or the backend cannot be made.
bool load_cpu_model(const Options& o, CpuModel* m);

// --restore (temporal_restore.cpp): 0, or 1 with a message.
int run_restore(const Options& o);

}  // namespace kvsplit::bench_temporal
