// Effective-KV accounting (docs/kvm.md "Effective-KV accounting"): the integral over a request's
// lifetime of the device bytes its KV pages hold at their precision, and of its resident tokens.
// The level (bytes, tokens) is piecewise constant: it is set at the accounting points of the
// owner of the sequence (a worker or generate_batch) and integrated when it is next set.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/kv_pool.h"

namespace kvsplit::sched {

// A sequence's KV on the device at one instant.
struct KvLevel {
  // Device bytes of its pages at their precision (host / disk / evicted: 0), the key summary of
  // each page that has one (quantized and evicted pages), plus the full block each restore in
  // flight holds.
  int64_t bytes = 0;
  int64_t tokens = 0;  // computed tokens whose KV is on the device, at any precision
  int32_t pages_full = 0, pages_int8 = 0, pages_int4 = 0;  // device pages per rung
  int32_t pages_evicted = 0;  // pages evicted by the semantic cut (a summary at most)
  bool operator==(const KvLevel&) const = default;
};

// The level of `table` in `pool` holding tokens [0, num_computed). O(1) while the table has no
// page entries (every page full precision on the device), else one pass over its pages.
KvLevel kv_level(const kv::KvPool& pool, const kv::BlockTable& table, int num_computed);

class KvAccount {
 public:
  using Clock = std::chrono::steady_clock;
  struct Point {
    Clock::time_point time;
    KvLevel level;
  };

  // Integrates the current level up to `now`, then holds `level` from `now` on. The first call
  // starts the account (nothing before it counts).
  void update(Clock::time_point now, const KvLevel& level);
  // Integrates up to `now` and holds nothing from then on (the sequence's KV was released).
  void close(Clock::time_point now) { update(now, KvLevel{}); }

  double byte_seconds() const { return byte_seconds_; }
  double token_seconds() const { return token_seconds_; }
  const KvLevel& level() const { return level_; }

  // Tests: while on, every account records each update (time and level) in trace().
  static void set_trace_for_tests(bool on) { trace_on_.store(on, std::memory_order_relaxed); }
  const std::vector<Point>& trace() const { return trace_; }

 private:
  static inline std::atomic<bool> trace_on_{false};
  bool started_ = false;
  Clock::time_point since_;
  KvLevel level_;
  double byte_seconds_ = 0;
  double token_seconds_ = 0;
  std::vector<Point> trace_;
};

}  // namespace kvsplit::sched
