// Test helper: requests that start together on every machine, however slowly the test's or a
// worker's thread runs (tests that need sequences to outgrow a pool side by side).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "engine/engine_impl.h"

namespace kvsplit::testing {

// Holds the workers that pull from the router and, in the disaggregated mode, the decode workers
// (sched::TestHold::kForward: they admit, but run no forward pass). Submit the requests, then
// call release(): it lets the pullers go once they hold `pulled` sequences and, disaggregated,
// the decode workers once they hold `handed` between them. Without the decode hold a descheduled
// prefill thread can hand sequences over one at a time, each finishing before the next arrives.
class StartTogether {
 public:
  StartTogether(EngineImpl& engine, ServingMode mode)
      : engine_(engine), disagg_(mode == ServingMode::kDisaggregated) {
    engine_.set_test_hold(puller(), sched::TestHold::kForward);
    if (disagg_) engine_.set_test_hold(sched::WorkerRole::kDecode, sched::TestHold::kForward);
  }
  ~StartTogether() {
    engine_.set_test_hold(puller(), sched::TestHold::kNone);
    if (disagg_) engine_.set_test_hold(sched::WorkerRole::kDecode, sched::TestHold::kNone);
  }
  StartTogether(const StartTogether&) = delete;
  StartTogether& operator=(const StartTogether&) = delete;

  ::testing::AssertionResult release(int pulled, int handed) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const int got = wait_held(disagg_ ? "prefill" : "colocated", pulled, until);
    engine_.set_test_hold(puller(), sched::TestHold::kNone);
    if (got < pulled) {
      return ::testing::AssertionFailure() << "the held pullers hold " << got << " of " << pulled;
    }
    if (!disagg_) return ::testing::AssertionSuccess();
    const int admitted = wait_held("decode", handed, until);
    engine_.set_test_hold(sched::WorkerRole::kDecode, sched::TestHold::kNone);
    if (admitted < handed) {
      return ::testing::AssertionFailure()
             << "the held decode workers admitted " << admitted << " of " << handed;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  sched::WorkerRole puller() const {
    return disagg_ ? sched::WorkerRole::kPrefill : sched::WorkerRole::kColocated;
  }
  // Sequences (running or waiting) on the pools whose name contains `role`, once they reach `n`
  // or at `until`.
  int wait_held(const char* role, int n, std::chrono::steady_clock::time_point until) const {
    while (true) {
      int held = 0;
      for (const PoolStats& p : engine_.stats().pools) {
        if (p.name.find(role) != std::string::npos) held += p.running + p.waiting;
      }
      if (held >= n || std::chrono::steady_clock::now() >= until) return held;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  EngineImpl& engine_;
  const bool disagg_;
};

}  // namespace kvsplit::testing
