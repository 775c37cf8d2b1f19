// Builders of the simulator tests (simulator_test.cpp, simulator_rules_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvm/simulator.h"

namespace kvsplit::kvm {

// A profile with round numbers: a step costs 1 ms + 0.01 ms per prompt token + 0.1 ms per
// decoding sequence + 0.001 ms per attended KV token; 100 bytes per full token.
inline EngineProfile test_profile() {
  EngineProfile p;
  p.step_base_ms = 1;
  p.prefill_ms_per_token = 0.01;
  p.prefill_ms_per_kv_token = 0;
  p.decode_ms_per_seq = 0.1;
  p.decode_ms_per_kv_token = 0.001;
  p.kv_bytes_per_token_full = 100;
  p.kv_bytes_per_token_int8 = 30;
  p.kv_bytes_per_token_int4 = 18;
  p.copy_bytes_per_ms = 1e5;
  return p;
}

inline EngineConfig test_config() {
  EngineConfig c;
  c.mode = ServingMode::kColocated;
  c.num_decode_workers = 1;
  c.max_num_seqs = 64;
  c.max_batch_tokens = 256;
  c.kv_blocks_per_worker = 4096;
  SlaClass fast;
  fast.name = "fast";
  fast.max_ttft_ms = 200.0;
  fast.max_itl_ms = 20.0;
  fast.priority = 1;
  fast.max_queue = 100000;
  fast.queue_timeout_ms = 600000.0;
  SlaClass slow = fast;
  slow.name = "slow";
  slow.max_ttft_ms = 5000.0;
  slow.max_itl_ms = 100.0;
  slow.priority = 0;
  c.sla_classes = {fast, slow};
  return c;
}

// `n` requests every `gap_ms`, alternating classes.
inline std::vector<TraceRequest> uniform_trace(int n, double gap_ms, int prompt, int output) {
  std::vector<TraceRequest> t;
  for (int i = 0; i < n; ++i) t.push_back({i * gap_ms, prompt, output, i % 2 ? "slow" : "fast"});
  return t;
}

inline const SimClassResult& cls(const SimResult& r, const std::string& name) {
  for (const SimClassResult& c : r.classes) {
    if (c.name == name) return c;
  }
  static SimClassResult none;
  ADD_FAILURE() << "no class " << name;
  return none;
}

}  // namespace kvsplit::kvm
