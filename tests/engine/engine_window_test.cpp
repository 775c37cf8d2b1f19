// Sliding windows in the serving engine: on a model whose layers all slide (a synthetic
// stories260K shape with window=32), every worker gives the pages the window has passed back to
// the pool after each step, so long generations that would not fit the pool together run without
// a preemption, with the tokens of an unconstrained pool; a prefill worker hands off only the
// pages still inside the window; cancel releases everything.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"
#include "kvsplit/engine.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;
using testing::run_all;

constexpr int kWindow = 32;

EngineConfig window_config(ServingMode mode, int blocks) {
  EngineConfig c;
  c.model = fmt::format("synthetic:stories260k@seed=3,window={}", kWindow);
  c.mode = mode;
  c.threads_per_worker = 1;
  c.num_prefill_workers = 1;
  c.num_decode_workers = 1;
  c.block_size = 8;
  c.kv_blocks_per_worker = blocks;
  c.max_batch_tokens = 64;
  c.handoff_timeout_ms = 60000;
  return c;
}

// Six greedy generations of 40-token prompts and `max_tokens` tokens (200: 30 pages each with the
// whole KV kept, at most 6 each with only the window's).
std::vector<Request> requests(int max_tokens = 200) {
  std::vector<Request> out;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.request_id = fmt::format("w{}", i);
    r.prompt_token_ids.resize(40);
    for (int t = 0; t < 40; ++t) r.prompt_token_ids[t] = 3 + (i * 37 + t * 11) % 500;
    r.sampling.temperature = 0.f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    out.push_back(r);
  }
  return out;
}

std::vector<int> totals(const Engine& engine) {
  std::vector<int> t;
  for (const PoolStats& p : engine.stats().pools) t.push_back(p.kv_blocks_total);
  return t;
}

// A greedy request of a 300-token prompt (token t: 3 + t * step mod 500) and `max_tokens`.
Request long_request(int step, int max_tokens) {
  Request r = requests().front();
  r.prompt_token_ids.resize(300);
  for (int t = 0; t < 300; ++t) r.prompt_token_ids[t] = 3 + (t * step) % 500;
  r.sampling.max_tokens = max_tokens;
  return r;
}

class EngineWindow : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineWindow, PagesBehindTheWindowAreFreedAndTheTokensStayTheSame) {
  const std::vector<Request> reqs = requests();
  auto roomy = Engine::create(window_config(GetParam(), 1024));
  ASSERT_TRUE(roomy.ok()) << roomy.status().to_string();
  const std::vector<Collected> want = run_all(**roomy, reqs);
  // 64 blocks: the six sequences need 180 pages with everything kept, about 36 with the window.
  auto tight = Engine::create(window_config(GetParam(), 64));
  ASSERT_TRUE(tight.ok()) << tight.status().to_string();
  const std::vector<Collected> got = run_all(**tight, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  ASSERT_EQ(want.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_FALSE(got[i].timed_out) << reqs[i].request_id;
    EXPECT_TRUE(got[i].final_event.status.ok()) << got[i].final_event.status.to_string();
    EXPECT_EQ(got[i].tokens.size(), 200u) << reqs[i].request_id;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << reqs[i].request_id;
  }
  const EngineStats s = (*tight)->stats();
  EXPECT_EQ(s.preemptions, 0) << "the window's pages alone fit the pool";
  int64_t dropped = 0;
  for (const PoolStats& p : s.pools) {
    dropped += p.kv_window_dropped_pages;
    EXPECT_EQ(p.kv_evictions, 0) << p.name;
    // A 40-token prompt's first page is behind the window of the query after it (keys 9-40):
    // dropped on the prefill worker, not handed off.
    if (GetParam() == ServingMode::kDisaggregated && p.name.rfind("prefill", 0) == 0) {
      EXPECT_EQ(p.kv_window_dropped_pages, 6) << p.name;
    }
  }
  // Each sequence ends at 239 positions: pages up to the one holding position 239 - 32 go, 26.
  EXPECT_GE(dropped, 6 * 25);
  EXPECT_TRUE(testing::pools_back_to(**tight, totals(**tight)));
}

TEST_P(EngineWindow, CancelMidGenerationReleasesEverything) {
  auto engine = Engine::create(window_config(GetParam(), 64));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Request> reqs = requests(440);  // the context is 512
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  auto dropped = [&] {
    int64_t n = 0;
    for (const PoolStats& p : (*engine)->stats().pools) n += p.kv_window_dropped_pages;
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (dropped() < 12 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GE(dropped(), 12);
  for (const Request& r : reqs) (*engine)->cancel(r.tenant, r.request_id);
  int cancelled = 0;
  for (RequestHandle& h : handles) {
    const Collected c = collect(h);
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.finals, 1);
    cancelled += c.final_event.finish_reason == FinishReason::kCancelled;
  }
  EXPECT_GT(cancelled, 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, totals(**engine)));
}

// The semantic cut's evicted-pages gauge (kv_pages_evicted) counts its own evictions, not the
// pages dropped behind the sliding window (kv_window_dropped_pages counts those): with thresholds
// that evict nothing it reads 0 while the window drops pages. It counted them.
TEST_P(EngineWindow, TheEvictedPagesGaugeLeavesOutPagesBehindTheWindow) {
  EngineConfig c = window_config(GetParam(), 64);
  c.kv_policy = KvPolicy::kSemantic;
  c.semantic.semantic_threshold = 1e-4f;
  c.semantic.evict_threshold = 0.f;  // relevance is never below 0: nothing is evicted
  auto engine = Engine::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<Request> reqs = requests(440);
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) handles.push_back(*(*engine)->submit(r));
  auto sum = [&](auto field) {
    int64_t n = 0;
    for (const PoolStats& p : (*engine)->stats().pools) n += p.*field;
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (sum(&PoolStats::kv_window_dropped_pages) < 12 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GE(sum(&PoolStats::kv_window_dropped_pages), 12);
  EXPECT_EQ(sum(&PoolStats::kv_evictions), 0);
  EXPECT_EQ(sum(&PoolStats::kv_pages_evicted), 0);
  // The sequences' pages past the window (the evicted fraction's denominator): some, and no more
  // than the pool's blocks (none is behind the window).
  EXPECT_GT(sum(&PoolStats::kv_sequence_pages), 0);
  EXPECT_LE(sum(&PoolStats::kv_sequence_pages), sum(&PoolStats::kv_blocks_total));
  for (const Request& r : reqs) (*engine)->cancel(r.tenant, r.request_id);
  for (RequestHandle& h : handles) EXPECT_FALSE(collect(h).timed_out);
  EXPECT_TRUE(testing::pools_back_to(**engine, totals(**engine)));
}

// A request longer than the pool (a 300-token prompt and 150 tokens: 57 pages of 8 in a pool of
// 32) runs in either mode, prefilled chunk by chunk while only the window's pages stay (a prefill
// worker hands off those alone), with the tokens of a pool that holds it all. Full attention:
// refused.
TEST_P(EngineWindow, ARequestLongerThanThePoolRunsWhileItsWindowFits) {
  const Request r = long_request(29, 150);
  auto tight = Engine::create(window_config(GetParam(), 32));
  ASSERT_TRUE(tight.ok()) << tight.status().to_string();
  EngineConfig full_attention = window_config(GetParam(), 32);
  full_attention.model = "synthetic:stories260k@seed=3";
  auto unwindowed = Engine::create(full_attention);
  ASSERT_TRUE(unwindowed.ok()) << unwindowed.status().to_string();
  auto refused = (*unwindowed)->submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  auto roomy = Engine::create(window_config(GetParam(), 1024));
  ASSERT_TRUE(roomy.ok()) << roomy.status().to_string();
  const std::vector<Collected> want = run_all(**roomy, {r});
  const std::vector<Collected> got = run_all(**tight, {r});
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(want.size(), 1u);
  ASSERT_FALSE(got[0].timed_out);
  EXPECT_TRUE(got[0].final_event.status.ok()) << got[0].final_event.status.to_string();
  EXPECT_EQ(got[0].tokens.size(), 150u);
  EXPECT_EQ(got[0].tokens, want[0].tokens);
  EXPECT_TRUE(testing::pools_back_to(**tight, totals(**tight)));
  if (GetParam() == ServingMode::kDisaggregated) {
    // Position 300's window reads keys 269-300: pages 0-32 (33 of 38) went on the prefill worker.
    const EngineStats stats = (*tight)->stats();
    ASSERT_FALSE(stats.pools.empty());
    const PoolStats& prefill = stats.pools.front();
    EXPECT_EQ(prefill.name.rfind("prefill", 0), 0u) << prefill.name;
    EXPECT_EQ(prefill.kv_window_dropped_pages, 33);
  }
}

// Several prompts longer than the pool at once (four of 300 tokens, 38 pages each, in a pool of
// 16): each fits alone, and together they hold every block with a chunk's worth of pages each.
// They go on in the pages they hold, or the one served last lets its pages go, so every request
// finishes with the tokens of a pool that holds them all. Each used to wait for a whole chunk's
// pages, nothing decoded, and the worker hung for good.
TEST_P(EngineWindow, LongPromptsThatHoldEveryBlockGoOnInThePagesTheyHold) {
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(long_request(7 + 6 * i, 8));
    reqs.back().request_id = fmt::format("long{}", i);
  }
  auto roomy = Engine::create(window_config(GetParam(), 1024));
  ASSERT_TRUE(roomy.ok()) << roomy.status().to_string();
  const std::vector<Collected> want = run_all(**roomy, reqs);
  ASSERT_EQ(want.size(), reqs.size());
  // Chunks of 64 tokens: each prompt's table has room past what it computed. Chunks of 32: each
  // table is full after its first chunk, nothing is behind the window (32) and nothing is free,
  // so the prompt served last lets its pages go (a recompute) for the others.
  for (int chunk : {64, 32}) {
    SCOPED_TRACE(chunk);
    EngineConfig c = window_config(GetParam(), 16);
    c.max_batch_tokens = chunk;
    auto tight = Engine::create(c);
    ASSERT_TRUE(tight.ok()) << tight.status().to_string();
    const std::vector<Collected> got = run_all(**tight, reqs, std::chrono::seconds(60));
    ASSERT_EQ(got.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_FALSE(got[i].timed_out) << i << ": no final event (the worker hung)";
      EXPECT_TRUE(got[i].final_event.status.ok()) << got[i].final_event.status.to_string();
      EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    }
    EXPECT_TRUE(testing::pools_back_to(**tight, totals(**tight)));
  }
}

// The prefix cache on a windowed model: a prompt longer than a prefill chunk (300 tokens, chunks
// of 64) reuses every whole cached page of the prompt, holding only the window's pages, with the
// tokens of an engine without the cache. Before, such a prompt took no cached page at all. With a
// pool smaller than the prompt, its cached pages spill to the host tier, and only the window's come
// back from there.
TEST_P(EngineWindow, ALongPromptReusesItsCachedPagesHoldingOnlyTheWindow) {
  const Request r = long_request(13, 20);
  auto roomy = Engine::create(window_config(GetParam(), 1024));
  ASSERT_TRUE(roomy.ok()) << roomy.status().to_string();
  const std::vector<Collected> want = run_all(**roomy, {r});
  ASSERT_EQ(want.size(), 1u);
  for (bool host : {false, true}) {
    SCOPED_TRACE(host ? "host tier" : "device");
    EngineConfig c = window_config(GetParam(), host ? 32 : 64);
    c.prefix_cache = true;
    if (host) c.temporal.host_capacity_mb = 1;
    auto engine = Engine::create(c);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<Collected> first = run_all(**engine, {r});
    const std::vector<Collected> again = run_all(**engine, {r});
    ASSERT_EQ(first.size(), 1u);
    ASSERT_EQ(again.size(), 1u);
    EXPECT_EQ(first[0].tokens, want[0].tokens);
    EXPECT_EQ(again[0].tokens, want[0].tokens);
    EXPECT_EQ(first[0].final_event.usage.cached_tokens, 0);
    // Every whole page but the one of the last prompt token: 37 of 8 tokens.
    EXPECT_EQ(again[0].final_event.usage.cached_tokens, 296);
    EXPECT_TRUE(testing::pools_back_to(**engine, totals(**engine)));
    int64_t from_host = 0, pages_host = 0;
    for (const PoolStats& p : (*engine)->stats().pools) {
      from_host += p.kv_prefix_hits_host;
      pages_host += p.kv_prefix_pages_host;
    }
    // Position 296's window reads keys 265-296: pages 33-36 at most came back from the host.
    EXPECT_LE(from_host, 4 * 8);
    if (host) {
      EXPECT_GT(pages_host, 0);  // the pages behind stayed there
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineWindow,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const ::testing::TestParamInfo<ServingMode>& i) {
                           return i.param == ServingMode::kColocated ? "Colocated"
                                                                     : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
