// Decode workers in disaggregated mode that cannot take a KV handoff: one that hangs is marked
// down, the offers in flight to it are taken back at once, and new offers go to the others until
// it drains its inbox again; an offer waiting for room on one decode worker is passed on to
// another that has room (and taken back, the other marked down, when that one does not receive it
// in time, or once it is marked down). Made deterministic with the workers' test holds. Workers:
// prefill-0, decode-0, decode-1 (indices 0, 1, 2).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_impl.h"
#include "engine_test_util.h"

namespace kvsplit {
namespace {

using sched::TestHold;
using testing::collect;
using testing::Collected;
using testing::wait_for_stats;

constexpr size_t kDecode0 = 1, kDecode1 = 2;

Request short_request(const char* prompt) {
  Request r;
  r.prompt = prompt;
  r.sampling.max_tokens = 10;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 4;
  return r;
}

// A prompt of `n` token ids (100: 6 full pages of 16 and 4 tokens).
Request long_request(int n, unsigned seed = 11) {
  std::mt19937 rng(seed);
  Request r;
  r.prompt_token_ids.resize(static_cast<size_t>(n));
  for (int32_t& t : r.prompt_token_ids) t = 3 + static_cast<int32_t>(rng() % 500);
  r.sampling.max_tokens = 6;
  r.sampling.temperature = 0;
  return r;
}

EngineConfig two_decode_workers() {
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 2;
  cfg.block_size = 16;
  // Long enough that no offer to a live worker misses it under a slow sanitizer build; the tests
  // of a missed deadline set their own.
  cfg.handoff_timeout_ms = 5000;
  cfg.handoff_stall_ms = 0;  // the deadlines mark workers down (on for the stall tests)
  return cfg;
}

// The delivery deadline of the tests where an offer to a hung worker misses it.
constexpr int32_t kShortDeadlineMs = 300;

// A hung decode worker lets one offer pass its delivery deadline: that offer goes to the other
// decode worker, and the hung one is marked down. The next offer goes to the other one although
// it is more loaded (a held sequence of 3 blocks against the 1 incoming block the hung worker
// shows), and nothing more is re-routed. Once it drains its inbox again it is up.
TEST(EngineHandoffHealth, AHungDecodeWorkerIsMarkedDownAndNewOffersAvoidIt) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.handoff_timeout_ms = kShortDeadlineMs;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold_worker(kDecode0, TestHold::kAll);
  const Collected first = collect(*e.submit(short_request("Once upon a time")));
  ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
  EngineStats s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 1);
  EXPECT_TRUE(s.pools[kDecode0].marked_down);
  EXPECT_FALSE(s.pools[kDecode1].marked_down);
  e.set_test_hold_worker(kDecode1, TestHold::kForward);
  auto busy = e.submit(long_request(40));
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 1; }));
  // By load alone this one would go to decode-0.
  auto second = e.submit(short_request("Lily wanted to"));
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return st.pools[kDecode1].running == 2;
  })) << "the second offer did not reach decode-1";
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(*second)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(*busy)).final_event.status.ok());
  s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 1) << "the second offer went to the hung worker";
  EXPECT_TRUE(s.pools[kDecode0].marked_down);
  e.set_test_hold_worker(kDecode0, TestHold::kNone);
  EXPECT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return !st.pools[kDecode0].marked_down;
  })) << "decode-0 drains its inbox and is up again";
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 0);
}

// Waits for the first token event of `h` (the prefill worker posts the offer at once after it).
void first_token(RequestHandle& h) {
  TokenEvent ev;
  ASSERT_TRUE(h.next(&ev, std::chrono::seconds(60)));
  ASSERT_FALSE(ev.final) << ev.status.to_string();
}

// Three held workers: decode-0 runs one short sequence, decode-1 a long prompt (7 blocks), both
// before their forward passes; then decode-0 hangs (takes no offer). `busy` waits on decode-1.
// send_two_offers then submits `first` and, 2 s after its offer, `second`, while decode-0 is not
// down yet; second_at is taken at second's first token (its offer is posted just after).
struct HungDecode0 {
  RequestHandle on_0, busy, first, second;
  std::chrono::steady_clock::time_point second_at;
};
HungDecode0 hang_decode_0(EngineImpl& e) {
  HungDecode0 h;
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
  h.on_0 = *e.submit(short_request("Once upon a time"));  // both idle: decode-0 (1 block)
  EXPECT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].running == 1; }));
  h.busy = *e.submit(long_request(100));  // the lighter decode-1 (7 blocks)
  EXPECT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 1; }));
  e.set_test_hold_worker(kDecode0, TestHold::kAll);
  return h;
}

void send_two_offers(EngineImpl& e, HungDecode0* h) {
  auto first = e.submit(short_request("Lily wanted to"));
  ASSERT_TRUE(first.ok());
  h->first = *first;
  first_token(h->first);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  auto second = e.submit(short_request("The dog"));
  ASSERT_TRUE(second.ok());
  h->second = *second;
  first_token(h->second);
  h->second_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[0].handoffs_rerouted == 2; }));
}

// Two offers in flight to a hung decode-0 (decode-1 is busier), posted 2 s apart. When the first
// passes its deadline, decode-0 is marked down and the second is taken back at once, in the same
// pass, not at its own deadline 2 s later; both finish on decode-1.
TEST(EngineHandoffHealth, OffersInFlightToAWorkerMarkedDownAreTakenBackAtOnce) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.handoff_timeout_ms = 4000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  HungDecode0 held = hang_decode_0(e);
  ASSERT_NO_FATAL_FAILURE(send_two_offers(e, &held));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - held.second_at)
          .count();
  // Taken back at the first's deadline, about 4 - 2 = 2 s after second_at; waiting out its own
  // would be about 4 s (handoff_timeout_ms after its offer was posted, just before second_at).
  // The midpoint leaves a second either way (the bound was 2 s, which the regression could meet).
  EXPECT_LT(ms, 3000.0) << "the second offer waited out its own deadline";
  EXPECT_TRUE(e.stats().pools[kDecode0].marked_down);
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 3; }));
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(held.first)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(held.second)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(held.busy)).final_event.status.ok());
  e.set_test_hold_worker(kDecode0, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(held.on_0)).final_event.status.ok());
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const EngineStats s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 2);
  EXPECT_EQ(s.requests_failed, 0);
}

// A worker an offer left before its deadline keeps its try. As above, but decode-1 hangs too,
// and decode-0 comes back once it is marked down: when decode-1 misses both offers, the one that
// missed decode-0's deadline fails (every worker had it), and the one taken back early is
// offered to decode-0 again and finishes there.
TEST(EngineHandoffHealth, AWorkerAnOfferLeftEarlyKeepsItsTry) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.handoff_timeout_ms = 4000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  HungDecode0 held = hang_decode_0(e);
  e.set_test_hold_worker(kDecode1, TestHold::kAll);
  ASSERT_NO_FATAL_FAILURE(send_two_offers(e, &held));
  e.set_test_hold_worker(kDecode0, TestHold::kForward);  // drains its inbox: up again
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return !st.pools[kDecode0].marked_down; }));
  const Collected c1 = collect(std::move(held.first), std::chrono::seconds(30));
  ASSERT_FALSE(c1.timed_out);
  EXPECT_EQ(c1.final_event.status.code(), StatusCode::kDeadlineExceeded)
      << c1.final_event.status.to_string();
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return st.pools[kDecode0].running == 2;
  })) << "the second offer did not come back to decode-0";
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kNone);
  const Collected c2 = collect(std::move(held.second), std::chrono::seconds(30));
  EXPECT_TRUE(c2.final_event.status.ok()) << c2.final_event.status.to_string();
  EXPECT_TRUE(collect(std::move(held.busy)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(held.on_0)).final_event.status.ok());
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const EngineStats s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 3);
  EXPECT_EQ(s.requests_failed, 1);
}

// An offer passed on to decode-1 comes back to decode-0 as soon as decode-1 is marked down by
// another offer's missed deadline, not at its own. Two slots per decode worker: the offer waits
// on decode-0 (both full); decode-1 frees its slots and hangs; a new request goes to decode-1's
// free slot; 2 s later decode-0 passes the waiting offer on to decode-1 too. When the new
// request's offer passes its deadline it goes to decode-0, and so does the passed-on one.
TEST(EngineHandoffHealth, AnOfferPassedOnComesBackOnceItsTargetIsMarkedDown) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.max_num_seqs = 2;
  cfg.handoff_timeout_ms = 4000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
  std::vector<RequestHandle> handles;
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  for (int i = 0; i < 4; ++i) {  // two on each decode worker
    auto h = e.submit(short_request(prompts[i]));
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
    ASSERT_TRUE(wait_for_stats(e, [&](const EngineStats& st) {
      return st.pools[kDecode0].running + st.pools[kDecode1].running == i + 1;
    }));
  }
  ASSERT_EQ(e.stats().pools[kDecode0].running, 2);
  auto waits = e.submit(short_request("The cat sat"));  // no slot anywhere: decode-0 (a tie)
  ASSERT_TRUE(waits.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].waiting == 1; }));
  e.set_test_hold_worker(kDecode0, TestHold::kAll);
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(handles[1])).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(handles[3])).final_event.status.ok());
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return st.pools[kDecode1].running == 0 && st.pools[kDecode1].waiting == 0;
  }));
  e.set_test_hold_worker(kDecode1, TestHold::kAll);    // looks free, takes nothing
  const auto x_at = std::chrono::steady_clock::now();  // x's offer is posted after this
  auto x = e.submit(short_request("A bird"));          // decode-1's free slot
  ASSERT_TRUE(x.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  e.set_test_hold_worker(kDecode0, TestHold::kForward);  // passes `waits` on to decode-1
  ASSERT_TRUE(wait_for_stats(
      e, [](const EngineStats& st) { return st.pools[kDecode0].handoffs_forwarded == 1; }));
  // Back on decode-0: `x` rerouted there, `waits` taken back.
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return st.pools[kDecode1].marked_down && st.pools[kDecode0].waiting == 2;
  }));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - x_at).count();
  // Without the early take-back: not before 2 s (the hold) + handoff_timeout_ms = 6 s after x_at;
  // with it, x's deadline (handoff_timeout_ms after its offer was posted, a few ms after x_at),
  // about 4 s. The midpoint leaves a second either way.
  EXPECT_LT(ms, 5000.0) << "the passed-on offer waited out its own deadline";
  EngineStats s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 1);
  EXPECT_EQ(s.pools[kDecode0].handoffs_forwarded, 1);
  e.set_test_hold_worker(kDecode0, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(*waits)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(*x)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(handles[0])).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(handles[2])).final_event.status.ok());
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return !st.pools[kDecode1].marked_down; }));
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  s = e.stats();
  EXPECT_EQ(s.requests_failed, 0);
  EXPECT_EQ(s.pools[kDecode0].handoffs_forwarded, 1);
}

// One sequence slot per decode worker, both held before their forward pass. An offer that lands
// on decode-0 while decode-1's slot is taken waits there; once decode-1 frees its slot, decode-0
// passes the offer on and it finishes there (with the tokens of an engine where nothing is held)
// while decode-0 is still held. With forward_waiting_handoffs off it waits for decode-0.
TEST(EngineHandoffHealth, AnOfferWaitingForRoomGoesToADecodeWorkerThatHasRoom) {
  KVSPLIT_REQUIRE_MODELS();
  for (const bool forward : {true, false}) {
    EngineConfig cfg = two_decode_workers();
    cfg.max_num_seqs = 1;
    cfg.forward_waiting_handoffs = forward;
    const Request moved = short_request("The dog");
    Collected want;
    {
      auto ref = Engine::create(cfg);
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      want = collect(*(*ref)->submit(moved));
      ASSERT_TRUE(want.final_event.status.ok()) << want.final_event.status.to_string();
    }

    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    EngineImpl& e = **engine;
    const std::vector<int> initial = testing::free_blocks(e);
    e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
    auto on_0 = e.submit(short_request("Once upon a time"));  // both idle: decode-0 (1 block)
    ASSERT_TRUE(on_0.ok());
    ASSERT_TRUE(
        wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].running == 1; }));
    auto on_1 = e.submit(long_request(40));  // to the idle decode-1 (3 blocks)
    ASSERT_TRUE(on_1.ok());
    ASSERT_TRUE(
        wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 1; }));
    auto h = e.submit(moved);  // the less loaded decode-0; no slot there
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(
        wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].waiting == 1; }));
    EXPECT_EQ(e.stats().pools[kDecode0].handoffs_forwarded, 0);  // no room on decode-1 yet
    e.set_test_hold_worker(kDecode1, TestHold::kNone);
    if (forward) {
      const Collected c = collect(std::move(*h), std::chrono::seconds(30));
      ASSERT_FALSE(c.timed_out) << "the offer still waits on the held decode-0";
      EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      EXPECT_EQ(c.tokens, want.tokens);
      const EngineStats s = e.stats();
      EXPECT_EQ(s.pools[kDecode0].handoffs_forwarded, 1);
      EXPECT_EQ(s.pools[kDecode0].running, 1);  // still held
    } else {
      EXPECT_TRUE(collect(std::move(*on_1)).final_event.status.ok());
      ASSERT_TRUE(
          wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 0; }));
      // decode-1 idle for 20 decode-0 loops (2 ms each): the offer still waits on decode-0.
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      const EngineStats s = e.stats();
      EXPECT_EQ(s.pools[kDecode0].waiting, 1);
      EXPECT_EQ(s.pools[kDecode0].handoffs_forwarded, 0);
    }
    e.set_test_hold_worker(kDecode0, TestHold::kNone);
    EXPECT_TRUE(collect(std::move(*on_0)).final_event.status.ok());
    if (forward) {
      EXPECT_TRUE(collect(std::move(*on_1)).final_event.status.ok());
    } else {
      const Collected c = collect(std::move(*h));
      EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      EXPECT_EQ(c.tokens, want.tokens);
    }
    EXPECT_TRUE(testing::pools_back_to(e, initial));
    const EngineStats s = e.stats();
    EXPECT_EQ(s.requests_failed, 0);
    EXPECT_EQ(s.pools[kDecode1].handoffs_forwarded, 0);
  }
}

// An offer passed on is cached where it was admitted, and the prefill worker's cache-aware
// routing learns that: the same prompt, sent again with both decode workers idle, goes to
// decode-1 (which took the pages when decode-0 passed the offer on) and reuses its pages there.
// One slot per decode worker; the prefix cache on.
TEST(EngineHandoffHealth, RoutingLearnsWhereAPassedOnOfferWasCached) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.max_num_seqs = 1;
  cfg.prefix_cache = true;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
  auto on_0 = e.submit(short_request("Once upon a time"));  // both idle: decode-0 (1 block)
  ASSERT_TRUE(on_0.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].running == 1; }));
  auto on_1 = e.submit(long_request(40));  // the idle decode-1 (3 blocks)
  ASSERT_TRUE(on_1.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 1; }));
  const Request cached = long_request(100, 23);  // 6 full pages, none shared with on_1's
  auto h = e.submit(cached);                     // no slot anywhere: the lighter decode-0
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].waiting == 1; }));
  e.set_test_hold_worker(kDecode1, TestHold::kNone);  // on_1 ends; decode-0 passes `h` on
  const Collected first = collect(std::move(*h), std::chrono::seconds(30));
  ASSERT_FALSE(first.timed_out);
  ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
  EXPECT_EQ(e.stats().pools[kDecode0].handoffs_forwarded, 1);
  e.set_test_hold_worker(kDecode0, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(*on_0)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(*on_1)).final_event.status.ok());
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return st.pools[kDecode0].running == 0 && st.pools[kDecode1].running == 0;
  }));
  const int64_t cached_before = e.stats().pools[kDecode1].handoff_pages_cached;
  const Collected again = collect(*e.submit(cached));
  ASSERT_TRUE(again.final_event.status.ok()) << again.final_event.status.to_string();
  EXPECT_EQ(again.tokens, first.tokens);
  const EngineStats s = e.stats();
  EXPECT_EQ(s.pools[kDecode1].handoff_pages_cached - cached_before, 6)
      << "the prompt went to decode-0, where the prefill worker had first sent it";
  EXPECT_EQ(s.pools[0].handoffs_to_cached, 1);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(s.requests_failed, 0);
}

// Two slots per decode worker, both held before their forward pass: decode-1 runs two short
// sequences (2 blocks, no slot left), decode-0 one long prompt (3 blocks, a slot free). The
// next offer goes to decode-0's free slot, not to decode-1's lighter KV, and is admitted at once.
TEST(EngineHandoffHealth, AnOfferGoesToAFreeSlotBeforeLighterKv) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.max_num_seqs = 2;
  cfg.forward_waiting_handoffs = false;  // where the prefill worker sends it, it stays
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
  std::vector<RequestHandle> handles;
  const auto submit_until = [&](const Request& r, size_t pool, int running) {
    auto h = e.submit(r);
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
    ASSERT_TRUE(
        wait_for_stats(e, [&](const EngineStats& st) { return st.pools[pool].running == running; }))
        << "pool " << pool << " running " << running;
  };
  submit_until(long_request(40), kDecode0, 1);                   // both idle: decode-0
  submit_until(short_request("Once upon a time"), kDecode1, 1);  // lighter: decode-1
  submit_until(short_request("Lily wanted to"), kDecode1, 2);    // still lighter: decode-1
  submit_until(short_request("The dog"), kDecode0, 2);           // decode-1 is full
  EXPECT_EQ(e.stats().pools[kDecode1].waiting, 0);
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kNone);
  for (RequestHandle& h : handles) EXPECT_TRUE(collect(std::move(h)).final_event.status.ok());
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

// A hung decode worker is marked down by the stall bound (handoff_stall_ms; its steps are short,
// so the floor is the bound), long before the offer's delivery deadline: the offer in flight to
// it goes to the other decode worker then.
TEST(EngineHandoffHealth, AStalledDecodeWorkerIsMarkedDownLongBeforeTheDeadline) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.handoff_timeout_ms = 60000;
  cfg.handoff_stall_ms = 500;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  HungDecode0 held = hang_decode_0(e);
  // Before the submit: the offer is sent later, so `ms` below is never less than the time the
  // offer waited (taken after the first token, a test thread descheduled meanwhile made it less).
  const auto sent_at = std::chrono::steady_clock::now();
  auto first = e.submit(short_request("Lily wanted to"));  // the lighter, hung decode-0
  ASSERT_TRUE(first.ok());
  first_token(*first);
  ASSERT_TRUE(wait_for_stats(
      e, [](const EngineStats& st) { return st.pools[0].handoffs_rerouted == 1; },
      std::chrono::seconds(20)))
      << "the offer waited for its deadline";
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent_at).count();
  EXPECT_GT(ms, 300.0) << "taken back before the stall bound";
  EXPECT_LT(ms, 10000.0);
  EXPECT_TRUE(e.stats().pools[kDecode0].marked_down);
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 2; }));
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(*first)).final_event.status.ok());
  EXPECT_TRUE(collect(std::move(held.busy)).final_event.status.ok());
  e.set_test_hold_worker(kDecode0, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(held.on_0)).final_event.status.ok());
  EXPECT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return !st.pools[kDecode0].marked_down; }));
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const EngineStats s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 1);
  EXPECT_EQ(s.requests_failed, 0);
}

// The worker an offer is passed on to hangs: the one that passed it takes it back (after
// handoff_timeout_ms, or the stall bound) and marks it down; the offer is admitted there once it
// has room, with the tokens it would have had, and nothing is left held. One slot per decode
// worker: the offer lands on decode-0 while both slots are taken (decode-0 holds its prompt in
// its prefix cache); decode-1 then frees its slot and hangs before decode-0 looks for room
// elsewhere. `back_ms`: from decode-0's release to the offer back on it.
void passed_on_to_a_hung_worker(EngineConfig cfg, double* back_ms) {
  cfg.max_num_seqs = 1;
  cfg.prefix_cache = true;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  const Request cached = long_request(100);
  const Collected first = collect(*e.submit(cached));  // both idle: decode-0 caches its pages
  ASSERT_TRUE(first.final_event.status.ok()) << first.final_event.status.to_string();
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    const PoolStats& d = st.pools[kDecode0];
    return d.running == 0 && d.kv_blocks_free == d.kv_blocks_total;
  }));
  e.set_test_hold(sched::WorkerRole::kDecode, TestHold::kForward);
  auto slot0 = e.submit(short_request("Once upon a time"));  // both idle: decode-0
  ASSERT_TRUE(slot0.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].running == 1; }));
  auto slot1 = e.submit(short_request("Lily wanted to"));  // the free slot: decode-1
  ASSERT_TRUE(slot1.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode1].running == 1; }));
  auto h = e.submit(cached);  // no free slot anywhere: to the cached prompt on decode-0
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return st.pools[kDecode0].waiting == 1; }));
  e.set_test_hold_worker(kDecode0, TestHold::kAll);
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(collect(std::move(*slot1)).final_event.status.ok());
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& st) {
    return st.pools[kDecode1].running == 0 && st.pools[kDecode1].waiting == 0;
  }));
  e.set_test_hold_worker(kDecode1, TestHold::kAll);  // looks free, takes nothing
  const auto released_at = std::chrono::steady_clock::now();
  e.set_test_hold_worker(kDecode0, TestHold::kForward);
  ASSERT_TRUE(wait_for_stats(
      e,
      [](const EngineStats& st) {
        return st.pools[kDecode1].marked_down && st.pools[kDecode0].waiting == 1;
      },
      std::chrono::seconds(20)))
      << "decode-0 took the offer back from the hung decode-1";
  *back_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - released_at)
          .count();
  EngineStats s = e.stats();
  EXPECT_EQ(s.pools[0].handoffs_to_cached, 1);
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 0);
  EXPECT_EQ(s.pools[kDecode0].handoffs_forwarded, 1);
  EXPECT_EQ(s.requests_failed, 0);
  e.set_test_hold_worker(kDecode0, TestHold::kNone);
  const Collected c = collect(std::move(*h), std::chrono::seconds(30));
  ASSERT_FALSE(c.timed_out);
  EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
  EXPECT_EQ(c.tokens, first.tokens);
  EXPECT_TRUE(collect(std::move(*slot0)).final_event.status.ok());
  EXPECT_EQ(e.stats().pools[kDecode0].handoffs_forwarded, 1);  // not to the marked-down worker
  e.set_test_hold_worker(kDecode1, TestHold::kNone);
  EXPECT_TRUE(
      wait_for_stats(e, [](const EngineStats& st) { return !st.pools[kDecode1].marked_down; }));
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 0);
}

TEST(EngineHandoffHealth, AnOfferPassedOnToAHungWorkerComesBack) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.handoff_timeout_ms = kShortDeadlineMs;
  double ms = 0;
  ASSERT_NO_FATAL_FAILURE(passed_on_to_a_hung_worker(cfg, &ms));
}

// As above with a delivery deadline of a minute: the stall bound brings the offer back.
TEST(EngineHandoffHealth, AnOfferPassedOnToAStalledWorkerComesBackBeforeItsDeadline) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.handoff_timeout_ms = 60000;
  cfg.handoff_stall_ms = 500;
  double ms = 0;
  ASSERT_NO_FATAL_FAILURE(passed_on_to_a_hung_worker(cfg, &ms));
  EXPECT_GT(ms, 300.0) << "taken back before the stall bound";
  EXPECT_LT(ms, 10000.0);
}

// A cancel storm while offers are passed between decode workers that hold their slots: every
// request ends exactly once and every pool's blocks return.
TEST(EngineHandoffHealth, CancelsWhileOffersArePassedOnLeaveEveryPoolEmpty) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = two_decode_workers();
  cfg.max_num_seqs = 2;
  cfg.sla_classes[0].queue_timeout_ms = 600000;
  cfg.sla_classes[0].max_queue = 100000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  std::mt19937 rng(7);
  std::vector<RequestHandle> handles;
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  for (int i = 0; i < 60; ++i) {
    Request r = short_request(prompts[i % 4]);
    r.request_id = "storm-" + std::to_string(i);
    r.sampling.max_tokens = 5 + static_cast<int>(rng() % 40);
    r.sampling.ignore_eos = true;
    auto h = e.submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
    if (rng() % 3 == 0) e.cancel("", "storm-" + std::to_string(rng() % (i + 1)));
  }
  for (int i = 0; i < 60; i += 2) e.cancel("", "storm-" + std::to_string(i));
  int finished = 0;
  for (RequestHandle& h : handles) {
    const Collected c = collect(std::move(h), std::chrono::seconds(60));
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.finals, 1);
    EXPECT_TRUE(c.final_event.status.ok() || c.final_event.status.code() == StatusCode::kCancelled)
        << c.final_event.status.to_string();
    finished += c.final_event.status.ok();
  }
  EXPECT_GT(finished, 0);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 0);
}

}  // namespace
}  // namespace kvsplit
