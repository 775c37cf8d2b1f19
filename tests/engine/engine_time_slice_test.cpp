// Fair time slicing in the engine (docs/kv-cuts.md, "Time slices"): a running request of a
// low-priority class cannot hold the pool against a new prompt of a higher-priority class for
// longer than its class's max_hold_ms. The prompt, which does not fit, is taken from the router
// without pages and the running one is paused for it; both finish with their tokens alone, and
// every block comes back.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

EngineConfig slice_config(double batch_hold_ms, SwapMode swap) {
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 32;  // 512 positions
  cfg.temporal.swap = swap;
  cfg.temporal.host_capacity_mb = swap == SwapMode::kNever ? 0 : 16;
  SlaClass batch;
  batch.name = "batch";
  batch.priority = 0;
  batch.max_hold_ms = batch_hold_ms;
  SlaClass voice;
  voice.name = "voice";
  voice.priority = 5;
  cfg.sla_classes = {batch, voice};
  return cfg;
}

// A greedy request of class `cls`: `tokens` prompt ids cycling from `first` with `period`, and
// `max_tokens` to generate.
Request slice_request(const char* id, const char* cls, int tokens, int first, int period,
                      int max_tokens) {
  Request r;
  r.request_id = id;
  r.sla_class = cls;
  r.prompt_token_ids.resize(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) r.prompt_token_ids[i] = first + i % period;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.temperature = 0;
  return r;
}

// The long request: a 400-token prompt (25 of the 32 blocks) and 100 tokens to generate.
Request long_request() { return slice_request("long", "batch", 400, 100, 37, 100); }

// The urgent one: 200 prompt tokens (13 blocks; 7 are free while the long one runs).
Request urgent_request() { return slice_request("urgent", "voice", 200, 60, 29, 8); }

struct Order {
  Collected long_run, urgent;
  bool urgent_first = false;
};

// Starts the long request with the worker's forward passes held and steps it one step at a time
// up to its first token; then, still held there (the long one cannot decode further meanwhile,
// whatever the machine's timing), submits the urgent one and, when `pulled`, waits until the
// worker has taken it from the router (else a moment); then lets the worker run and reports which
// finished first.
Order run_both(EngineImpl& engine, bool pulled) {
  Order o;
  engine.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto submitted = engine.submit(long_request());
  EXPECT_TRUE(submitted.ok()) << submitted.status().to_string();
  if (!submitted.ok()) {
    engine.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    return o;
  }
  RequestHandle l = *submitted;
  TokenEvent first;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  if (!testing::step_until(engine, 0, [&] { return l.try_next(&first); })) {
    engine.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    o.long_run.timed_out = o.urgent.timed_out = true;
    return o;
  }
  EXPECT_FALSE(first.final);
  auto urgent = engine.submit(urgent_request());
  EXPECT_TRUE(urgent.ok()) << urgent.status().to_string();
  if (!urgent.ok()) {
    engine.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    return o;
  }
  RequestHandle u = *urgent;
  if (pulled) {
    while (engine.stats().pools[0].waiting < 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(engine.stats().pools[0].waiting, 1);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  engine.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  o.urgent = collect(u, std::chrono::seconds(120));
  // The long one's events so far: if it had finished before the urgent one, its final event is
  // already queued.
  TokenEvent ev;
  bool long_done = first.final;
  o.long_run.tokens = first.token_ids;
  while (!long_done && l.try_next(&ev)) {
    o.long_run.tokens.insert(o.long_run.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    long_done = ev.final;
    if (ev.final) o.long_run.final_event = ev;
  }
  o.urgent_first = !long_done;
  if (!long_done) {
    const Collected rest = collect(l, std::chrono::seconds(120));
    o.long_run.tokens.insert(o.long_run.tokens.end(), rest.tokens.begin(), rest.tokens.end());
    o.long_run.final_event = rest.final_event;
    o.long_run.timed_out = rest.timed_out;
  }
  return o;
}

class EngineTimeSlice : public ::testing::TestWithParam<SwapMode> {};

TEST_P(EngineTimeSlice, AHigherPriorityPromptPausesARequestPastItsSlice) {
  KVSPLIT_REQUIRE_MODELS();
  std::vector<int32_t> long_alone, urgent_alone;
  {
    auto ref = Engine::create(testing::stories_config(ServingMode::kColocated));
    ASSERT_TRUE(ref.ok());
    Request l = long_request(), u = urgent_request();
    l.sla_class = u.sla_class = "";  // the reference engine has the default class only
    auto hl = (*ref)->submit(l);
    auto hu = (*ref)->submit(u);
    ASSERT_TRUE(hl.ok() && hu.ok());
    long_alone = collect(*hl).tokens;
    urgent_alone = collect(*hu).tokens;
  }
  auto engine = EngineImpl::create(slice_config(/*batch_hold_ms=*/1, GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  const Order o = run_both(**engine, /*pulled=*/true);
  ASSERT_FALSE(o.urgent.timed_out);
  ASSERT_FALSE(o.long_run.timed_out);
  ASSERT_TRUE(o.urgent.final_event.status.ok()) << o.urgent.final_event.status.to_string();
  ASSERT_TRUE(o.long_run.final_event.status.ok()) << o.long_run.final_event.status.to_string();
  // Before, the urgent prompt waited in the router until the long one had generated all its
  // tokens.
  EXPECT_TRUE(o.urgent_first);
  EXPECT_GE(o.long_run.final_event.timings.preemptions, 1);
  EXPECT_EQ(o.urgent.tokens, urgent_alone);
  EXPECT_EQ(o.long_run.tokens, long_alone);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// With the prefix cache on and the urgent prompt's pages cached by an earlier run, the prompt
// taken without pages finds them when its pages come (its first chunk), and its usage reports
// them: up to 12 full pages of its 200 tokens (never the page of its last token).
TEST_P(EngineTimeSlice, APromptTakenWithoutPagesReportsItsCacheHits) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = slice_config(/*batch_hold_ms=*/1, GetParam());
  cfg.prefix_cache = true;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto warm = (*engine)->submit(urgent_request());
  ASSERT_TRUE(warm.ok());
  const Collected first = collect(*warm);
  ASSERT_TRUE(first.final_event.status.ok());
  EXPECT_EQ(first.final_event.usage.cached_tokens, 0);
  const Order o = run_both(**engine, /*pulled=*/true);
  ASSERT_TRUE(o.urgent.final_event.status.ok()) << o.urgent.final_event.status.to_string();
  ASSERT_TRUE(o.long_run.final_event.status.ok()) << o.long_run.final_event.status.to_string();
  EXPECT_TRUE(o.urgent_first);
  // With a host tier the pages the long prompt pushed out were spilled there and are hit too;
  // without one they were dropped, and the rest are hit.
  const int32_t cached = o.urgent.final_event.usage.cached_tokens;
  if (GetParam() == SwapMode::kNever) {
    EXPECT_GT(cached, 0);
    EXPECT_LE(cached, 192);
    EXPECT_EQ(cached % 16, 0);
  } else {
    EXPECT_EQ(cached, 192);
  }
  EXPECT_EQ(o.urgent.tokens, first.tokens);
}

// max_hold_ms 0 (the default): never paused for a slice; the urgent prompt waits its turn.
TEST_P(EngineTimeSlice, NoSliceNoPause) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(slice_config(/*batch_hold_ms=*/0, GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  const Order o = run_both(**engine, /*pulled=*/false);
  ASSERT_TRUE(o.urgent.final_event.status.ok()) << o.urgent.final_event.status.to_string();
  ASSERT_TRUE(o.long_run.final_event.status.ok()) << o.long_run.final_event.status.to_string();
  EXPECT_FALSE(o.urgent_first);
  EXPECT_EQ(o.long_run.final_event.timings.preemptions, 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// A preempted (or swapped-out) request waiting for its blocks holds back new prompts of no
// higher priority only: a prompt of a higher class that fits is pulled from the router at once
// and finishes first. Two batch requests that need 40 of the 32 blocks by their end: the younger
// is preempted when the pool fills and waits for the older to finish. (Every pull used to stop
// while any preempted sequence waited: the urgent prompt then waited for the batch request.)
TEST_P(EngineTimeSlice, AHigherPriorityPromptIsPulledPastAPreemptedLowerOne) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(slice_config(/*batch_hold_ms=*/0, GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  // A step at a time from the first, held on the step boundary of the first preemption (polled
  // from here, the older one could finish before the hold on a slow machine).
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto older = e.submit(slice_request("older", "batch", 16, 100, 37, 300));
  auto younger = e.submit(slice_request("younger", "batch", 16, 200, 31, 300));
  ASSERT_TRUE(older.ok() && younger.ok());
  ASSERT_TRUE(testing::step_until(e, 0, [&] { return e.stats().preemptions >= 1; }))
      << "the batch requests never preempted each other";
  ASSERT_EQ(e.stats().pools[0].running, 1) << "the older one finished before the preemption";
  auto urgent = e.submit(slice_request("urgent", "voice", 16, 60, 29, 4));  // 2 blocks: fits
  ASSERT_TRUE(urgent.ok());
  EXPECT_TRUE(testing::wait_for_stats(
      e, [](const EngineStats& s) { return s.pools[0].waiting == 2; }, std::chrono::seconds(10)))
      << "the urgent prompt stayed in the router behind the preempted batch request";
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  const Collected u = collect(*urgent, std::chrono::seconds(60));
  ASSERT_TRUE(u.final_event.status.ok()) << u.final_event.status.to_string();
  TokenEvent ev;
  bool older_done = false;
  while (!older_done && older->try_next(&ev)) older_done = ev.final;
  EXPECT_FALSE(older_done) << "the urgent request finished after the batch one";
  EXPECT_TRUE(collect(*older, std::chrono::seconds(60)).final_event.status.ok());
  EXPECT_TRUE(collect(*younger, std::chrono::seconds(60)).final_event.status.ok());
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

INSTANTIATE_TEST_SUITE_P(Swap, EngineTimeSlice,
                         ::testing::Values(SwapMode::kNever, SwapMode::kAlways),
                         [](const auto& info) {
                           return info.param == SwapMode::kNever ? std::string("recompute")
                                                                 : std::string("swap");
                         });

}  // namespace
}  // namespace kvsplit
