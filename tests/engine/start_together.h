// Test helper: requests that start together on every machine, however slowly the test's or a
// worker's thread runs (tests that need sequences to outgrow a pool side by side).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

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

// One step with a forward pass of worker `index` (prefill workers first, as send_command), held
// at kForward before (by the caller) and after. Sets kOneStep and waits until the worker's
// steps advance (a step that plans nothing does not consume kOneStep; steps are counted at the
// very end of a step), then sets kForward, which returns once the worker's loop has seen it: the
// worker has put kOneStep back to kForward by itself by then, so that cannot overwrite the next
// call's kOneStep. False when no step ran within 30 s.
inline bool step_once(EngineImpl& engine, size_t index) {
  const int64_t before = engine.worker_snapshots().at(index).steps;
  engine.set_test_hold_worker(index, sched::TestHold::kOneStep);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (engine.worker_snapshots()[index].steps == before &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  engine.set_test_hold_worker(index, sched::TestHold::kForward);
  return engine.worker_snapshots()[index].steps > before;
}

// Steps worker `index` (held at kForward by the caller) one step at a time until `done()` holds,
// checked before each step, so the worker stays held on the exact step boundary where it became
// true. False after `max_steps` steps or a step that did not run.
template <typename Pred>
bool step_until(EngineImpl& engine, size_t index, Pred done, int max_steps = 10000) {
  for (int i = 0; i < max_steps; ++i) {
    if (done()) return true;
    if (!step_once(engine, index)) return false;
  }
  return done();
}

// Steps worker `index` (held at kForward by the caller; the one decoding `h`) until `h` has
// delivered at least `n` tokens, appended to `tokens`; the worker stays held on that step
// boundary, so the request cannot finish before the caller's hold or cancel however slowly its
// thread runs. False when the request ended first or a step did not run.
inline bool step_to_tokens(EngineImpl& engine, size_t index, RequestHandle& h, size_t n,
                           std::vector<int32_t>* tokens) {
  bool ended = false;
  const bool reached = step_until(engine, index, [&] {
    TokenEvent ev;
    while (!ended && h.try_next(&ev)) {
      tokens->insert(tokens->end(), ev.token_ids.begin(), ev.token_ids.end());
      ended = ev.final;
    }
    return ended || tokens->size() >= n;
  });
  return reached && !ended;
}

}  // namespace kvsplit::testing
