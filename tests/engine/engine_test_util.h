// Helpers of the engine tests: configs over the shared stories260K model and bounded collection
// of a request's events.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvsplit/engine.h"
#include "test_util.h"

namespace kvsplit::testing {

inline EngineConfig stories_config(ServingMode mode) {
  EngineConfig c;
  c.model = model_path("stories260K.bin");
  c.mode = mode;
  c.threads_per_worker = 1;
  c.num_prefill_workers = 1;
  c.num_decode_workers = mode == ServingMode::kDisaggregated ? 2 : 1;
  c.kv_blocks_per_worker = 512;
  c.max_batch_tokens = 128;
  return c;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  TokenEvent final_event;
  int finals = 0;
  int events_after_final = 0;
  bool timed_out = false;
};

// Drains `handle` until its final event or `timeout`; never hangs.
inline Collected collect(RequestHandle handle,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  Collected r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    TokenEvent ev;
    if (!handle.next(&ev, std::chrono::milliseconds(50))) {
      if (std::chrono::steady_clock::now() > deadline) {
        r.timed_out = true;
        return r;
      }
      continue;
    }
    r.tokens.insert(r.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    r.text += ev.text;
    if (ev.final) {
      r.final_event = ev;
      ++r.finals;
      break;
    }
  }
  TokenEvent extra;
  while (handle.try_next(&extra)) ++r.events_after_final;
  return r;
}

// The events of a request of `n` completions (Request::n), each completion's collected as
// collect() does, until the stream's last event or `timeout`; never hangs.
struct CollectedCompletions {
  std::vector<Collected> completions;  // by TokenEvent::index
  int lasts = 0;                       // events marked last
  int events_after_last = 0;
  int bad_index = 0;  // events whose index is outside [0, n)
  bool timed_out = false;
};
// Adds `ev` to `r` (sized to the request's n); whether it was the stream's last event.
inline bool absorb(const TokenEvent& ev, CollectedCompletions& r) {
  if (r.lasts > 0) {
    ++r.events_after_last;
    return false;
  }
  if (ev.index < 0 || ev.index >= static_cast<int>(r.completions.size())) {
    ++r.bad_index;
  } else {
    Collected& c = r.completions[static_cast<size_t>(ev.index)];
    if (c.finals > 0) ++c.events_after_final;
    c.tokens.insert(c.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    c.text += ev.text;
    if (ev.final) {
      c.final_event = ev;
      ++c.finals;
    }
  }
  r.lasts += ev.last;
  return ev.last;
}
// Goes on collecting into `r` until the last event (unless seen) or `timeout`.
inline void collect_rest(RequestHandle handle, CollectedCompletions& r,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (r.lasts == 0) {
    TokenEvent ev;
    if (!handle.next(&ev, std::chrono::milliseconds(50))) {
      if (std::chrono::steady_clock::now() > deadline) {
        r.timed_out = true;
        return;
      }
      continue;
    }
    absorb(ev, r);
  }
  TokenEvent extra;
  while (handle.try_next(&extra)) ++r.events_after_last;
}
inline CollectedCompletions collect_completions(
    RequestHandle handle, int n, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  CollectedCompletions r;
  r.completions.resize(static_cast<size_t>(n));
  collect_rest(handle, r, timeout);
  return r;
}

// Submits every request, then collects each one's events (at most `timeout` each).
inline std::vector<Collected> run_all(
    Engine& engine, const std::vector<Request>& reqs,
    std::chrono::milliseconds timeout = std::chrono::seconds(300)) {
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = engine.submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return {};
    handles.push_back(*h);
  }
  std::vector<Collected> out;
  for (RequestHandle& h : handles) out.push_back(collect(h, timeout));
  return out;
}

// Waits until every pool reports `expected` free blocks and nothing running or waiting. Pool
// stats are published after each step, i.e. after that step's final events: a snapshot read just
// after the last final event can be one step old (e.g. a preempted sequence that held no blocks
// still counted as waiting), hence the polling.
inline bool pools_back_to(const Engine& engine, const std::vector<int>& expected,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const EngineStats s = engine.stats();
    bool ok = s.pools.size() == expected.size();
    for (size_t i = 0; ok && i < expected.size(); ++i) {
      ok = s.pools[i].kv_blocks_free == expected[i] && s.pools[i].running == 0 &&
           s.pools[i].waiting == 0;
    }
    if (ok) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Polls stats until `pred` holds; false after `timeout`.
template <typename Pred>
bool wait_for_stats(const Engine& e, Pred pred,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred(e.stats())) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline std::vector<int> free_blocks(const Engine& engine) {
  std::vector<int> out;
  for (const PoolStats& p : engine.stats().pools) out.push_back(p.kv_blocks_free);
  return out;
}

// Submits every 64-step greedy golden of stories260K to `engine` and expects its tokens; returns
// how many were checked.
inline int expect_greedy_goldens(Engine& engine) {
  const auto goldens = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  int checked = 0;
  for (const auto& g : goldens) {
    if (g["steps"].get<int>() != 64) continue;
    Request r;
    r.prompt = g["prompt"].get<std::string>();
    r.sampling.temperature = 0;
    r.sampling.max_tokens =
        g["steps"].get<int>() - static_cast<int>(g["prompt_token_ids"].size()) + 1;
    auto h = engine.submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) continue;
    Collected c = collect(*h);
    EXPECT_FALSE(c.timed_out);
    EXPECT_EQ(c.tokens, g["output_token_ids"].get<std::vector<int32_t>>()) << r.prompt;
    EXPECT_TRUE(c.final_event.status.ok());
    ++checked;
  }
  return checked;
}

}  // namespace kvsplit::testing
