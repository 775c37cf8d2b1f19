// Tokens under load equal tokens alone (greedy and seeded sampling), in both serving modes; the
// greedy output matches llama2.c run.c's golden.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "engine/start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

const char* kPrompts[] = {
    "Once upon a time", "Lily wanted to", "The dog",       "One day, a little girl named Sue", "",
    "Tom and his mom",  "The sun was",    "A big red ball"};

std::vector<Request> workload(bool sampled, int n) {
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.request_id = fmt::format("r{}", i);
    r.prompt = kPrompts[i % 8];
    r.sampling.max_tokens = 8 + (i * 7) % 40;
    if (sampled) {
      r.sampling.temperature = 1.0f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 1000 + i;
    } else {
      r.sampling.temperature = 0.0f;
    }
    out.push_back(r);
  }
  return out;
}

class EngineTokens : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineTokens, GreedyMatchesRunCGolden) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const int checked = testing::expect_greedy_goldens(**engine);
  EXPECT_GE(checked, 4);
}

void expect_load_equals_alone(ServingMode mode, bool sampled) {
  const std::vector<Request> reqs = workload(sampled, 24);
  auto engine = Engine::create(testing::stories_config(mode));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  std::vector<Collected> alone;
  for (const Request& r : reqs) {
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    alone.push_back(collect(*h));
    ASSERT_FALSE(alone.back().timed_out);
  }
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    Collected c = collect(handles[i]);
    ASSERT_FALSE(c.timed_out) << reqs[i].request_id;
    EXPECT_EQ(c.finals, 1);
    EXPECT_EQ(c.events_after_final, 0);
    EXPECT_EQ(c.tokens, alone[i].tokens) << reqs[i].request_id;
    EXPECT_EQ(c.text, alone[i].text) << reqs[i].request_id;
    EXPECT_EQ(c.final_event.finish_reason, alone[i].final_event.finish_reason);
    EXPECT_EQ(c.final_event.usage.completion_tokens, static_cast<int>(c.tokens.size()));
    EXPECT_GT(c.final_event.timings.ttft_ms, 0);
    EXPECT_GE(c.final_event.timings.e2e_ms, c.final_event.timings.ttft_ms);
  }
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.requests_finished, 48);
  EXPECT_EQ(s.requests_failed, 0);
}

TEST_P(EngineTokens, GreedyUnderLoadEqualsAlone) {
  KVSPLIT_REQUIRE_MODELS();
  expect_load_equals_alone(GetParam(), /*sampled=*/false);
}

TEST_P(EngineTokens, SeededSamplingUnderLoadEqualsAlone) {
  KVSPLIT_REQUIRE_MODELS();
  expect_load_equals_alone(GetParam(), /*sampled=*/true);
}

// A pool far too small for the workload: sequences are preempted (recompute) and still produce
// exactly the tokens they produce alone.
TEST_P(EngineTokens, PreemptionKeepsTokens) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.kv_blocks_per_worker = 12;  // 192 tokens per worker
  cfg.block_size = 16;
  cfg.handoff_timeout_ms = 60000;
  cfg.num_decode_workers = 1;
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    Request r;
    r.request_id = "p" + std::to_string(i);
    r.prompt = kPrompts[i % 8];
    r.sampling.max_tokens = 100;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.sampling.seed = 77 + i;
    reqs.push_back(r);
  }
  std::vector<Collected> alone;
  {
    auto big = Engine::create(testing::stories_config(GetParam()));
    ASSERT_TRUE(big.ok());
    for (const Request& r : reqs) alone.push_back(collect(*(*big)->submit(r)));
  }
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  // All ten are pulled before any prefill runs (held) and, disaggregated, the decode worker
  // starts once it holds two, so they certainly decode together and outgrow the pool, however
  // slowly this thread or the prefill worker runs (two need more than its 12 pages).
  std::vector<RequestHandle> handles;
  {
    testing::StartTogether together(**engine, GetParam());
    for (const Request& r : reqs) {
      auto h = (*engine)->submit(r);
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      handles.push_back(*h);
    }
    ASSERT_TRUE(together.release(10, 2));
  }
  int preempted_requests = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Collected c = collect(handles[i]);
    ASSERT_FALSE(c.timed_out);
    ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens, alone[i].tokens) << reqs[i].request_id;
    EXPECT_EQ(c.tokens.size(), 100u);
    preempted_requests += c.final_event.timings.preemptions > 0;
  }
  const EngineStats s = (*engine)->stats();
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(preempted_requests, 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// Fair prefill (max_chunk_tokens): a long prompt cut into 16-token chunks while short prompts are
// admitted ahead of its remaining chunks gives every request the tokens it gets alone with the
// long prompt in one chunk (greedy and seeded sampling).
TEST_P(EngineTokens, ChunkCapKeepsTokens) {
  KVSPLIT_REQUIRE_MODELS();
  std::vector<Request> reqs;
  Request l;
  l.request_id = "long";
  for (int i = 0; i < 400; ++i) l.prompt_token_ids.push_back(3 + (i * 37) % 500);
  l.sampling.max_tokens = 24;
  l.sampling.ignore_eos = true;
  reqs.push_back(l);
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.request_id = "s" + std::to_string(i);
    r.prompt = kPrompts[i % 8];
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.sampling.seed = 11 + i;
    reqs.push_back(r);
  }
  reqs[0].sampling.temperature = 0.7f;
  reqs[0].sampling.seed = 5;
  std::vector<Collected> alone;
  {
    EngineConfig big = testing::stories_config(GetParam());
    big.max_batch_tokens = 512;
    big.max_chunk_tokens = 0;  // the long prompt in one chunk (the default, said)
    auto engine = Engine::create(big);
    ASSERT_TRUE(engine.ok());
    for (const Request& r : reqs) alone.push_back(collect(*(*engine)->submit(r)));
  }
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.max_batch_tokens = 64;
  cfg.max_chunk_tokens = 16;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  const sched::WorkerRole puller = GetParam() == ServingMode::kColocated
                                       ? sched::WorkerRole::kColocated
                                       : sched::WorkerRole::kPrefill;
  // All seven are pulled before any prefill runs (held), so they share steps.
  (*engine)->set_test_hold(puller, sched::TestHold::kForward);
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) handles.push_back(*(*engine)->submit(r));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((*engine)->stats().pools[0].waiting < 7 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ((*engine)->stats().pools[0].waiting, 7);
  (*engine)->set_test_hold(puller, sched::TestHold::kNone);
  std::vector<Collected> got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    got.push_back(collect(handles[i]));
    ASSERT_FALSE(got.back().timed_out);
    ASSERT_TRUE(got.back().final_event.status.ok());
    EXPECT_EQ(got.back().tokens, alone[i].tokens) << reqs[i].request_id;
  }
  // The short prompts' first tokens came before the long one's (they were admitted ahead of its
  // remaining chunks). A prefill worker steps only for prefill: the cap holds even once the long
  // prompt is alone there, so it takes at least 400 / 16 steps (a request arriving meanwhile
  // would wait for one 16-token chunk, not for the whole budget).
  for (size_t i = 1; i < reqs.size(); ++i) {
    EXPECT_LT(got[i].final_event.timings.ttft_ms, got[0].final_event.timings.ttft_ms)
        << reqs[i].request_id;
  }
  if (GetParam() == ServingMode::kDisaggregated) {
    // The prefill worker's step counter moves at the end of the step that handed the long one
    // off, which may come after the decode worker finished it: wait (bounded) for the count.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((*engine)->worker_snapshots().at(0).steps < 25 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE((*engine)->worker_snapshots().at(0).steps, 25);
  }
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// Time-based fair prefill (max_chunk_ms): a 400-token prompt on a worker whose steps are timed.
// Within a budget far below any step's time the chunk is min_chunk_tokens (16) once 4 steps of
// 4 x 16 tokens are timed, so the prompt takes at least 4 + (400 - 256) / 16 = 13 steps; within
// a budget far above it the whole rest goes in one step (5 steps). The tokens are those of one
// chunk either way.
TEST_P(EngineTokens, TimeBasedChunkCapFollowsTheBudgetAndKeepsTokens) {
  KVSPLIT_REQUIRE_MODELS();
  Request l;
  l.request_id = "long";
  for (int i = 0; i < 400; ++i) l.prompt_token_ids.push_back(3 + (i * 37) % 500);
  l.sampling.max_tokens = 12;
  l.sampling.ignore_eos = true;
  l.sampling.temperature = 0.7f;
  l.sampling.seed = 5;
  std::vector<int32_t> alone;
  {
    auto engine = Engine::create(testing::stories_config(GetParam()));
    ASSERT_TRUE(engine.ok());
    alone = collect(*(*engine)->submit(l)).tokens;
  }
  for (const double budget_ms : {1e-6, 1e5}) {
    EngineConfig cfg = testing::stories_config(GetParam());
    cfg.max_batch_tokens = 512;
    cfg.max_chunk_ms = budget_ms;
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const Collected got = collect(*(*engine)->submit(l));
    ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
    EXPECT_EQ(got.tokens, alone) << budget_ms;
    if (GetParam() == ServingMode::kDisaggregated) {  // the prefill worker steps only to prefill
      // Its step counter moves at the end of the step that handed the sequence off, which may
      // come after the decode worker finished it: wait for the count to settle.
      const int64_t want = budget_ms < 1 ? 13 : 5;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while ((*engine)->worker_snapshots().at(0).steps < want &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int64_t steps = (*engine)->worker_snapshots().at(0).steps;
      if (budget_ms < 1) {
        EXPECT_GE(steps, 13);
      } else {
        EXPECT_EQ(steps, 5);
      }
    }
  }
}

// pools.max_chunk_ms: auto (colocated). A request of a class with a tight max_itl_ms decodes
// while a 400-token prompt arrives: every step carries its decode row, so the prompt's chunks are
// cut to the minimum (a block) and it takes about 25 steps, each giving the decoding request a
// token. With a loose max_itl_ms the prompt goes in ~4 steps of the token budget (its own class
// is loose too). Tokens unchanged.
TEST(EngineChunkAuto, TheTightestDecodingClassSetsTheStepBudget) {
  KVSPLIT_REQUIRE_MODELS();
  Request l;
  for (int i = 0; i < 400; ++i) l.prompt_token_ids.push_back(3 + (i * 37) % 500);
  l.sampling.max_tokens = 4;
  l.sampling.temperature = 0;
  Request d;
  d.prompt = "Once upon a time";
  d.sla_class = "chat";
  d.sampling.max_tokens = 300;
  d.sampling.ignore_eos = true;
  d.sampling.temperature = 0;
  std::vector<int32_t> alone;
  for (const double itl_ms : {1e-3, 1e5}) {
    EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
    cfg.max_chunk_ms_auto = true;
    SlaClass chat;
    chat.name = "chat";
    chat.max_itl_ms = itl_ms;
    // The prompt's own (default) class is loose too: its 200 ms default capped the chunks of a
    // step slowed down enough (under TSan on a busy machine: 7 decode tokens during the prompt).
    SlaClass loose;
    loose.max_itl_ms = 1e5;
    cfg.sla_classes = {loose, chat};
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    // The decoding request is stepped to its first token and held there while the prompt is
    // submitted and pulled; `submitted` is taken then, before either makes progress. (Taken while
    // it decoded freely, a slow test thread let it count tokens before the prompt had arrived.)
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
    auto dh = (*engine)->submit(d);
    ASSERT_TRUE(dh.ok());
    TokenEvent first;
    ASSERT_TRUE(testing::step_until(**engine, 0, [&] { return dh->try_next(&first); }));
    auto lh = (*engine)->submit(l);
    ASSERT_TRUE(lh.ok());
    ASSERT_TRUE(testing::wait_for_stats(**engine, [](const EngineStats& s) {
      return s.pools[0].running + s.pools[0].waiting == 2;
    })) << "the prompt was not pulled";
    const auto submitted = std::chrono::steady_clock::now();
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    TokenEvent ev;
    ASSERT_TRUE(lh->next(&ev, std::chrono::seconds(30)));
    ASSERT_FALSE(ev.token_ids.empty());
    const auto first_long = ev.time;
    Collected rest = collect(std::move(*lh));
    ASSERT_TRUE(rest.final_event.status.ok()) << rest.final_event.status.to_string();
    std::vector<int32_t> tokens = ev.token_ids;
    tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
    if (alone.empty()) {
      alone = tokens;
    } else {
      EXPECT_EQ(tokens, alone);
    }
    int during = 0;  // the decoding request's tokens while the prompt was prefilled
    while (dh->next(&ev, std::chrono::seconds(30))) {
      if (ev.time > submitted && ev.time <= first_long)
        during += static_cast<int>(ev.token_ids.size());
      if (ev.final) break;
    }
    ASSERT_TRUE(ev.final && ev.status.ok()) << ev.status.to_string();
    // Tight: 25 steps of one block, fewer while the worker's step cost is not yet fitted (4
    // blocks a chunk until 4 steps are timed).
    if (itl_ms < 1) {
      EXPECT_GE(during, 12) << "the prompt's chunks were not cut to the tight class's budget";
    } else {
      EXPECT_LE(during, 6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineTokens,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
