// Back-pressure in disaggregated mode: a decode pool with no free sequence slot or too few free
// blocks makes handed-off sequences wait (the prefill side keeps their pages pinned), it never
// fails them. The waits stay bounded: cancel, the class queue timeout and shutdown end them, and a
// destination that does not take its offer in time (hung) fails the handoff explicitly.
// Made deterministic with the workers' test hold (no dependence on the machine's speed).
#include <gtest/gtest.h>

#include <thread>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using sched::TestHold;
using sched::WorkerRole;
using testing::collect;
using testing::Collected;

using testing::wait_for_stats;

// Sequences owned by decode workers: running plus waiting (preempted or offers waiting for room).
int decode_owned(const EngineStats& s) {
  int n = 0;
  for (const PoolStats& p : s.pools) {
    if (p.name.rfind("decode-", 0) == 0) n += p.running + p.waiting;
  }
  return n;
}

int decode_running(const EngineStats& s) {
  int n = 0;
  for (const PoolStats& p : s.pools) {
    if (p.name.rfind("decode-", 0) == 0) n += p.running;
  }
  return n;
}

std::vector<Request> mixed_requests(int n, const std::string& prefix) {
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.request_id = prefix + std::to_string(i);
    r.prompt = prompts[i % 4];
    r.sampling.max_tokens = 10 + (i * 7) % 30;
    r.sampling.ignore_eos = true;
    if (i % 2) {
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 500 + i;
    } else {
      r.sampling.temperature = 0;
    }
    out.push_back(r);
  }
  return out;
}

EngineConfig small_decode_config() {
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 2;
  cfg.max_num_seqs = 3;  // 6 decode slots in all
  // Delivery only (a step boundary of the destination); waiting for room is not bounded by it.
  // Far above a delivery's time on a loaded sanitizer build: these tests check no deadline (an
  // offer that missed it would fail its request), but FullDecodePoolWaitsInsteadOfFailing.
  cfg.handoff_timeout_ms = 5000;
  cfg.sla_classes[0].queue_timeout_ms = 600000;
  cfg.sla_classes[0].max_queue = 100000;
  return cfg;
}

// 40 requests for 6 decode slots, held until every one of them is owned by a decode worker and
// then for longer than handoff_timeout_ms (which used to fail the waiting ones): all finish with
// their tokens alone, none fails.
TEST(EngineBackpressure, FullDecodePoolWaitsInsteadOfFailing) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = small_decode_config();
  cfg.handoff_timeout_ms = 1000;  // the decode workers are held for longer below
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  const std::vector<Request> reqs = mixed_requests(40, "bp");
  std::vector<Collected> alone;
  for (const Request& r : reqs) {
    alone.push_back(collect(*e.submit(r)));
    ASSERT_TRUE(alone.back().final_event.status.ok())
        << alone.back().final_event.status.to_string();
  }

  e.set_test_hold(WorkerRole::kDecode, TestHold::kForward);
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = e.submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& s) { return decode_owned(s) == 40; }))
      << "decode workers own " << decode_owned(e.stats());
  EXPECT_EQ(decode_running(e.stats()), 6);  // every slot taken, 34 offers waiting for room
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(e.stats().requests_failed, 0);
  e.set_test_hold(WorkerRole::kDecode, TestHold::kNone);

  for (size_t i = 0; i < reqs.size(); ++i) {
    Collected c = collect(handles[i]);
    ASSERT_FALSE(c.timed_out) << reqs[i].request_id;
    EXPECT_EQ(c.finals, 1);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens, alone[i].tokens) << reqs[i].request_id;
    EXPECT_EQ(c.text, alone[i].text) << reqs[i].request_id;
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const EngineStats s = e.stats();
  EXPECT_EQ(s.requests_failed, 0);
  EXPECT_EQ(s.requests_finished, 80);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
}

// Unheld overload: 300 concurrent requests for 6 decode slots and a decode KV pool that cannot
// hold them all. Every request finishes with its tokens alone.
TEST(EngineBackpressure, OverloadFinishesEverything) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = small_decode_config();
  cfg.kv_blocks_per_worker = 24;  // 384 tokens: a few sequences at a time, preemption as well
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  const std::vector<Request> reqs = mixed_requests(300, "ov");
  std::vector<Collected> alone;
  for (int i = 0; i < 8; ++i) alone.push_back(collect(*(*engine)->submit(reqs[i])));
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  int failed = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Collected c = collect(handles[i], std::chrono::seconds(120));
    ASSERT_FALSE(c.timed_out) << reqs[i].request_id;
    failed += !c.final_event.status.ok();
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens.size(), static_cast<size_t>(reqs[i].sampling.max_tokens));
    if (i < alone.size()) {
      EXPECT_EQ(c.tokens, alone[i].tokens) << reqs[i].request_id;
    }
  }
  EXPECT_EQ(failed, 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// Sequences waiting for room can be cancelled, and the class queue timeout ends their wait.
TEST(EngineBackpressure, WaitingForRoomIsCancellableAndBounded) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = small_decode_config();
  cfg.num_decode_workers = 1;
  cfg.max_num_seqs = 1;
  SlaClass batch;
  batch.name = "batch";
  batch.queue_timeout_ms = 300;
  cfg.sla_classes.push_back(batch);
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(WorkerRole::kDecode, TestHold::kForward);
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.max_tokens = 20;
  r.request_id = "runs";
  auto runs = e.submit(r);
  r.request_id = "cancelled";
  auto cancelled = e.submit(r);
  ASSERT_TRUE(runs.ok() && cancelled.ok());
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& s) { return decode_owned(s) == 2; }));
  EXPECT_TRUE(e.cancel("", "cancelled"));
  Collected cc = collect(*cancelled, std::chrono::seconds(30));
  EXPECT_EQ(cc.final_event.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(cc.tokens.size(), 1u);  // sampled by the prefill worker before the handoff

  r.request_id = "expires";
  r.sla_class = "batch";
  Collected cx = collect(*e.submit(r), std::chrono::seconds(30));
  ASSERT_FALSE(cx.timed_out);
  EXPECT_EQ(cx.final_event.finish_reason, FinishReason::kError);
  EXPECT_EQ(cx.final_event.status.code(), StatusCode::kDeadlineExceeded);
  // Normally it expires waiting for room on decode-0; on a starved machine it may already have
  // expired in the router queue. Either way the class's queue timeout ended the wait.
  const std::string msg = cx.final_event.status.message();
  EXPECT_NE(msg.find("queue_timeout_ms 300"), std::string::npos) << msg;
  if (cx.tokens.size() == 1) {
    EXPECT_NE(msg.find("for room on decode-0"), std::string::npos) << msg;
  }

  e.set_test_hold(WorkerRole::kDecode, TestHold::kNone);
  Collected cr = collect(*runs);
  EXPECT_TRUE(cr.final_event.status.ok()) << cr.final_event.status.to_string();
  EXPECT_EQ(cr.tokens.size(), 20u);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  const EngineStats s = e.stats();
  EXPECT_EQ(s.requests_cancelled, 1);
  EXPECT_EQ(s.requests_failed, 1);
  EXPECT_EQ(s.requests_finished, 1);
}

// Every accepted request gets its final event at shutdown, also those waiting for room.
TEST(EngineBackpressure, ShutdownEndsWaitsForRoom) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = EngineImpl::create(small_decode_config());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  e.set_test_hold(WorkerRole::kDecode, TestHold::kForward);
  const std::vector<Request> reqs = mixed_requests(12, "sd");
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) handles.push_back(*e.submit(r));
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& s) { return decode_owned(s) == 12; }));
  e.shutdown(std::chrono::milliseconds(0));
  for (RequestHandle& h : handles) {
    Collected c = collect(h, std::chrono::seconds(10));
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.finals, 1);
    EXPECT_EQ(c.final_event.finish_reason, FinishReason::kCancelled);
    EXPECT_EQ(c.final_event.status.code(), StatusCode::kUnavailable);
  }
  for (const PoolStats& p : e.stats().pools)
    EXPECT_EQ(p.kv_blocks_free, p.kv_blocks_total) << p.name;
}

// A higher-priority handoff preempts lower-priority running sequences when the decode pool has
// no free blocks for it; equal priorities wait instead.
TEST(EngineBackpressure, HigherPriorityHandoffPreemptsLowerPriority) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = small_decode_config();
  cfg.num_decode_workers = 1;
  cfg.max_num_seqs = 8;
  cfg.kv_blocks_per_worker = 4;  // 64 tokens per worker
  SlaClass vip;
  vip.name = "vip";
  vip.priority = 5;
  cfg.sla_classes.push_back(vip);
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  Request low;
  low.prompt_token_ids = std::vector<int32_t>(40, 7);  // 3 blocks on the decode worker
  low.sampling.max_tokens = 20;
  low.sampling.ignore_eos = true;
  low.sampling.temperature = 0;
  const Collected low_alone = collect(*e.submit(low));
  Request high = low;
  high.prompt_token_ids = std::vector<int32_t>(30, 9);  // 2 blocks: does not fit beside `low`
  high.sla_class = "vip";
  const Collected high_alone = collect(*e.submit(high));
  // Idle (stats are published after the final events), so the numbers below are fresh.
  ASSERT_TRUE(testing::pools_back_to(e, initial));

  e.set_test_hold(WorkerRole::kDecode, TestHold::kForward);
  low.request_id = "low";
  auto hl = e.submit(low);
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& s) { return decode_running(s) == 1; }));
  high.request_id = "high";
  auto hh = e.submit(high);
  // Admitted by preempting `low` (nothing runs while held: only admission can preempt).
  ASSERT_TRUE(wait_for_stats(e, [](const EngineStats& s) { return s.preemptions == 1; }));
  e.set_test_hold(WorkerRole::kDecode, TestHold::kNone);
  Collected cl = collect(*hl), ch = collect(*hh);
  EXPECT_TRUE(cl.final_event.status.ok() && ch.final_event.status.ok());
  EXPECT_EQ(cl.tokens, low_alone.tokens);
  EXPECT_EQ(ch.tokens, high_alone.tokens);
  EXPECT_EQ(cl.final_event.timings.preemptions, 1);
  EXPECT_EQ(ch.final_event.timings.preemptions, 0);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

// A destination that never takes its offer (hung): the source takes the request back after
// handoff_timeout_ms, fails it with DEADLINE_EXCEEDED and releases the pinned pages; the late
// offer is dropped when the destination recovers, and the engine keeps serving.
TEST(EngineHandoff, UndeliveredOfferIsAnExplicitError) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 1;
  cfg.handoff_timeout_ms = 500;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(WorkerRole::kDecode, TestHold::kAll);
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.max_tokens = 8;
  Collected c = collect(*e.submit(r), std::chrono::seconds(30));
  ASSERT_FALSE(c.timed_out);
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kError);
  EXPECT_EQ(c.final_event.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.final_event.status.message().find("was not received within 500 ms"),
            std::string::npos)
      << c.final_event.status.message();
  EXPECT_EQ(c.tokens.size(), 1u);  // the first token was sampled by the prefill worker
  EXPECT_TRUE(testing::pools_back_to(e, initial));  // pinned pages released
  e.set_test_hold(WorkerRole::kDecode, TestHold::kNone);
  Collected ok = collect(*e.submit(r), std::chrono::seconds(30));
  EXPECT_TRUE(ok.final_event.status.ok()) << ok.final_event.status.to_string();
  EXPECT_EQ(ok.tokens.size(), 8u);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_failed, 1);
}

// With two decode workers, an offer the first (hung) does not take within handoff_timeout_ms is
// offered to the second, with the same pinned pages: the request finishes with the tokens of an
// engine where nothing hangs, and the re-route is counted on the prefill pool. The dead offer is
// dropped when the hung worker recovers; nothing is left held.
TEST(EngineHandoff, AnOfferAHungDecodeWorkerDoesNotTakeGoesToAnother) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 2;
  // The re-route waits for it; its value is not checked. Short, the offer re-routed to the live
  // decode-1 could miss its own deadline on a loaded sanitizer build.
  cfg.handoff_timeout_ms = 5000;
  auto ref = Engine::create(cfg);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.max_tokens = 12;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 4;
  const Collected want = collect(*(*ref)->submit(r), std::chrono::seconds(30));
  ASSERT_TRUE(want.final_event.status.ok()) << want.final_event.status.to_string();
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  // Workers: prefill-0, decode-0, decode-1. Both decode workers are idle, so the offer goes to
  // decode-0 (the lowest index on a tie), which hangs.
  e.set_test_hold_worker(1, TestHold::kAll);
  Collected c = collect(*e.submit(r), std::chrono::seconds(30));
  ASSERT_FALSE(c.timed_out);
  EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
  EXPECT_EQ(c.tokens, want.tokens);
  const EngineStats s = e.stats();
  ASSERT_EQ(s.pools.size(), 3u);
  EXPECT_EQ(s.pools[0].handoffs_rerouted, 1) << s.pools[0].name;
  EXPECT_EQ(s.requests_failed, 0);
  e.set_test_hold_worker(1, TestHold::kNone);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  Collected again = collect(*e.submit(r), std::chrono::seconds(30));
  EXPECT_TRUE(again.final_event.status.ok()) << again.final_event.status.to_string();
  EXPECT_EQ(again.tokens, want.tokens);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

// A request cancelled while its offer sits undelivered at a hung destination: the source takes it
// back at its next step (no waiting for the delivery deadline) and frees the pinned pages.
TEST(EngineHandoff, CancelInFlightToAHungDestination) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kDisaggregated);
  cfg.num_decode_workers = 1;
  cfg.handoff_timeout_ms = 600000;  // never the reason here
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(WorkerRole::kDecode, TestHold::kAll);
  Request r;
  r.request_id = "in-flight";
  r.prompt = "Once upon a time";
  r.sampling.max_tokens = 8;
  auto h = e.submit(r);
  ASSERT_TRUE(h.ok());
  TokenEvent first;
  ASSERT_TRUE(h->next(&first, std::chrono::seconds(30)));  // sampled, then handed off
  ASSERT_EQ(first.token_ids.size(), 1u);
  EXPECT_TRUE(e.cancel("", "in-flight"));
  Collected c = collect(*h, std::chrono::seconds(30));
  ASSERT_FALSE(c.timed_out);
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c.final_event.status.code(), StatusCode::kCancelled);
  e.set_test_hold(WorkerRole::kDecode, TestHold::kNone);
  EXPECT_TRUE(testing::pools_back_to(e, initial));
  EXPECT_EQ(e.stats().requests_cancelled, 1);
}

// Back-pressure from a slow reader (EngineConfig::max_unread_events): a consumer that stops
// reading holds back only its own sequence. While it does not read, at most the bound (plus the
// events of the step in flight when the bound was reached) wait unread, the skipped decode steps
// are counted, and another request runs to its end meanwhile; once it reads again the request
// finishes with the tokens of an unhindered run.
class EngineSlowReader : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineSlowReader, AnUnreadStreamStallsOnlyItsOwnSequence) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.max_unread_events = 8;
  cfg.num_decode_workers = 1;  // both requests decode on one worker: its steps count the skips
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto ref_engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(ref_engine.ok());
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 120;
  r.sampling.ignore_eos = true;
  auto slow = (*engine)->submit(r);
  ASSERT_TRUE(slow.ok()) << slow.status().to_string();
  // Its first 8 events come within milliseconds; then it stalls.
  ASSERT_TRUE(wait_for_stats(**engine, [](const EngineStats& s) { return s.num_running >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Meanwhile another request is served in full, and its steps count the stalled one's skips.
  Request other = r;
  other.prompt = "The dog";
  other.sampling.max_tokens = 40;
  const Collected fast = collect(*(*engine)->submit(other), std::chrono::seconds(30));
  ASSERT_FALSE(fast.timed_out);
  EXPECT_EQ(fast.final_event.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(wait_for_stats(**engine, [](const EngineStats& s) {
    int64_t stalled = 0;
    for (const PoolStats& p : s.pools) stalled += p.decode_rows_stalled;
    return stalled >= 5;
  }));
  // The stalled stream holds the bound's events, not the request's 120.
  int unread = 0;
  std::vector<int32_t> tokens;
  TokenEvent ev;
  while (slow->try_next(&ev)) {
    ++unread;
    tokens.insert(tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    ASSERT_FALSE(ev.final);
  }
  EXPECT_GE(unread, 8);
  EXPECT_LE(unread, 9);
  // Reading again lets it finish, with the tokens of an unhindered run.
  const Collected rest = collect(std::move(*slow), std::chrono::seconds(60));
  ASSERT_FALSE(rest.timed_out);
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  const Collected ref = collect(*(*ref_engine)->submit(r));
  EXPECT_EQ(tokens, ref.tokens);
  EXPECT_EQ(rest.final_event.finish_reason, FinishReason::kLength);
}

// A stalled sequence holds blocks it will not use: another request that needs them takes them
// (the stalled one is preempted, whatever its age), instead of waiting until the slow client
// reads. Once read, the stalled request resumes and finishes with the tokens of an unhindered
// run, and every block is back.
TEST_P(EngineSlowReader, AStalledSequenceYieldsItsBlocks) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.max_unread_events = 8;
  cfg.num_decode_workers = 1;
  cfg.kv_blocks_per_worker = 6;  // 96 tokens: the second request needs the first's blocks
  cfg.sla_classes[0].queue_timeout_ms = 600000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  auto ref_engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(ref_engine.ok());
  Request a;
  a.prompt_token_ids.assign(30, 7);
  a.sampling.temperature = 0;
  a.sampling.max_tokens = 60;
  a.sampling.ignore_eos = true;
  auto slow = (*engine)->submit(a);
  ASSERT_TRUE(slow.ok()) << slow.status().to_string();
  ASSERT_TRUE(wait_for_stats(**engine, [](const EngineStats& s) { return s.num_running >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it stalls after 8 events
  Request b = a;
  b.prompt_token_ids.assign(30, 9);
  b.sampling.max_tokens = 60;  // 90 positions: 6 blocks, the whole pool
  const Collected fast = collect(*(*engine)->submit(b), std::chrono::seconds(30));
  ASSERT_FALSE(fast.timed_out) << "the stalled sequence kept its blocks";
  EXPECT_EQ(fast.final_event.finish_reason, FinishReason::kLength);
  EXPECT_EQ(fast.tokens, collect(*(*ref_engine)->submit(b)).tokens);
  const Collected rest = collect(std::move(*slow), std::chrono::seconds(60));
  ASSERT_FALSE(rest.timed_out);
  EXPECT_EQ(rest.final_event.finish_reason, FinishReason::kLength);
  EXPECT_EQ(rest.tokens, collect(*(*ref_engine)->submit(a)).tokens);
  EXPECT_GT((*engine)->stats().preemptions, 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineSlowReader,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
