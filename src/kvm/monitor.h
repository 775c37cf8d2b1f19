// The KVM's monitors (docs/kvm.md): turn the engine's counters into one KvmSnapshot per sample.
// Pure bookkeeping: the engine feeds it EngineStats and finished requests' latencies.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/kvm.h"

namespace kvsplit::kvm {

// Requests' TTFT and mean ITL per class, over a sliding window of time: finished requests, and
// failed ones (their TTFT, or the time they waited). A NaN is no sample: a one-token request has
// no ITL.
class LatencyWindow {
 public:
  explicit LatencyWindow(double window_ms) : window_ms_(window_ms) {}
  void set_window_ms(double window_ms) { window_ms_ = window_ms; }  // a policy reload
  double window_ms() const { return window_ms_; }
  void add(const std::string& sla_class, double now_ms, double ttft_ms, double mean_itl_ms);
  // Drops samples older than now_ms - window; fills samples and the p50 / p99 (nearest rank).
  void fill(double now_ms, KvmClassLatency* out);

 private:
  struct Sample {
    double time_ms, ttft_ms, itl_ms;
  };
  double window_ms_;
  std::map<std::string, std::deque<Sample>> by_class_;
};

// Inputs beyond EngineStats that only the engine knows.
struct MonitorInputs {
  // The link bandwidth of a worker that measured none of its own (PoolStats::kv_link_bytes_per_s
  // 0); 0: such a worker's link_use stays 0.
  double link_bytes_per_s = 0;
};

class Monitor {
 public:
  explicit Monitor(double window_ms) : latency_(window_ms) {}
  LatencyWindow& latency() { return latency_; }
  // One sample: rates are over the time since the previous sample.
  KvmSnapshot sample(double now_ms, const EngineStats& stats, const MonitorInputs& in);

 private:
  LatencyWindow latency_;
  bool have_prev_ = false;
  double prev_ms_ = 0;
  int64_t prev_swaps_ = 0, prev_recalls_ = 0;
  // A worker's bytes since start: over its host link (swaps, host-staged shard exchange), and
  // its shard exchange off it (KvmSnapshot::peer_exchange_mb_s).
  struct LinkBytes {
    int64_t host = 0, peer = 0;
  };
  std::map<std::string, LinkBytes> prev_link_bytes_;  // per worker (PoolStats::name)
};

}  // namespace kvsplit::kvm
