// Parallel sampling (Request::n) through the engine, in both serving modes: completion i of a
// seeded request is the seeded request with n = 1 and seed + i; each completion ends once and the
// stream's last event is marked; under a prefix cache the prompt is computed once; cancel ends
// every completion; admission is all or nothing; every KV block comes back.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::collect_completions;
using testing::Collected;
using testing::CollectedCompletions;

// Each completion ended once, nothing bad or late, exactly one last event.
void expect_well_formed(const CollectedCompletions& c) {
  EXPECT_FALSE(c.timed_out);
  EXPECT_EQ(c.lasts, 1);
  EXPECT_EQ(c.events_after_last, 0);
  EXPECT_EQ(c.bad_index, 0);
  for (size_t i = 0; i < c.completions.size(); ++i) {
    EXPECT_EQ(c.completions[i].finals, 1) << "completion " << i;
    EXPECT_EQ(c.completions[i].events_after_final, 0) << "completion " << i;
    EXPECT_EQ(c.completions[i].final_event.index, static_cast<int>(i));
    EXPECT_EQ(c.completions[i].final_event.usage.completion_tokens,
              static_cast<int>(c.completions[i].tokens.size()));
  }
}

Request story(int max_tokens, float temperature) {
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  return r;
}

class EngineCompletions : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineCompletions, SeededCompletionIIsTheSeededRequestWithSeedPlusI) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  constexpr int kN = 4;
  Request r = story(24, 0.9f);
  r.sampling.seed = 11;
  r.request_id = "four";
  r.n = kN;
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->request_id(), "four");
  const CollectedCompletions got = collect_completions(*h, kN);
  expect_well_formed(got);
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < kN; ++i) {
    Request one = story(24, 0.9f);
    one.sampling.seed = 11 + i;
    auto h1 = (*engine)->submit(one);
    ASSERT_TRUE(h1.ok());
    const Collected want = collect(*h1);
    const Collected& c = got.completions[static_cast<size_t>(i)];
    EXPECT_EQ(c.tokens, want.tokens) << "completion " << i;
    EXPECT_EQ(c.text, want.text) << "completion " << i;
    EXPECT_EQ(c.final_event.finish_reason, want.final_event.finish_reason);
    EXPECT_EQ(c.final_event.request_id, "four");
    distinct.insert(c.tokens);
  }
  EXPECT_GE(distinct.size(), 2u) << "the completions sampled alike";
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  // Counted per completion.
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.requests_finished, kN + kN);
  EXPECT_EQ(s.requests_submitted, kN + kN);
}

// With the prefix cache, completions 1..n-1 wait for completion 0's prompt and take its pages:
// each computes only the page of its last prompt token. Without the wait they were all admitted
// at once and every one computed the prompt (cached_tokens 0).
TEST_P(EngineCompletions, UnderAPrefixCacheThePromptIsComputedOnce) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.prefix_cache = true;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  Request r;
  for (int i = 0; i < 100; ++i) r.prompt_token_ids.push_back(3 + (i * 37) % 400);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 8;
  r.n = 4;
  r.cache_salt = "once";  // nothing else in the cache under this scope
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const CollectedCompletions got = collect_completions(*h, r.n);
  expect_well_formed(got);
  // The 100-token prompt: pages 0..5 (96 tokens) are whole; page 6 holds the last token.
  EXPECT_EQ(got.completions[0].final_event.usage.cached_tokens, 0);
  for (int i = 1; i < r.n; ++i) {
    EXPECT_EQ(got.completions[static_cast<size_t>(i)].final_event.usage.cached_tokens, 96)
        << "completion " << i;
    EXPECT_EQ(got.completions[static_cast<size_t>(i)].tokens, got.completions[0].tokens);
  }
  // Greedy: what one request without the cache generates.
  auto plain = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(plain.ok());
  Request one = r;
  one.n = 1;
  auto h1 = (*plain)->submit(one);
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(collect(*h1).tokens, got.completions[0].tokens);
  int64_t hits = 0;
  for (const PoolStats& p : (*engine)->stats().pools) hits += p.kv_prefix_hits;
  EXPECT_GE(hits, r.n - 1);
  // Cached prompt pages count as available.
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

TEST_P(EngineCompletions, CancelEndsEveryCompletion) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.prefix_cache = true;    // completions 1..2 may still be held for the prompt
  cfg.max_unread_events = 4;  // unread, they stall: none reaches its 400 tokens before the cancel
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  Request r = story(400, 1.0f);
  r.sampling.ignore_eos = true;
  r.request_id = "many";
  r.n = 3;
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok());
  CollectedCompletions got;
  got.completions.resize(static_cast<size_t>(r.n));
  TokenEvent first;
  ASSERT_TRUE(h->next(&first, std::chrono::seconds(60)));
  testing::absorb(first, got);
  EXPECT_TRUE((*engine)->cancel("", "many"));
  testing::collect_rest(*h, got);
  expect_well_formed(got);
  for (const Collected& c : got.completions) {
    EXPECT_EQ(c.final_event.finish_reason, FinishReason::kCancelled);
    EXPECT_LT(c.tokens.size(), 400u);
  }
  EXPECT_FALSE((*engine)->cancel("", "many"));
  EXPECT_EQ((*engine)->stats().requests_cancelled, r.n);
  // Cached prompt pages count as available.
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineCompletions,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated));

TEST(EngineCompletionsAdmission, BadNIsRefused) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = Engine::create(testing::stories_config(ServingMode::kColocated));
  ASSERT_TRUE(engine.ok());
  for (int n : {0, -1, kMaxCompletions + 1}) {
    Request r = story(4, 0);
    r.n = n;
    auto h = (*engine)->submit(r);
    ASSERT_FALSE(h.ok()) << n;
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(h.status().message().rfind("n: must be in [1, 128]", 0), 0u) << h.status().message();
  }
  EXPECT_EQ((*engine)->stats().requests_submitted, 0);
}

// Every completion takes its own queue slot, and a request is queued whole or not at all; an id
// is in flight while any of its completions is.
TEST(EngineCompletionsAdmission, QueuedWholeOrNotAtAllAndTheIdIsHeldByAll) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.sla_classes[0].max_queue = 5;
  cfg.sla_classes[0].queue_timeout_ms = 600000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok());
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kAll);  // nothing leaves
  Request a = story(4, 0);
  a.request_id = "a";
  a.n = 3;
  auto ha = e.submit(a);
  ASSERT_TRUE(ha.ok());
  Request b = a;
  b.request_id = "b";
  auto hb = e.submit(b);  // 3 + 3 > 5
  ASSERT_FALSE(hb.ok());
  EXPECT_EQ(hb.status().code(), StatusCode::kResourceExhausted) << hb.status().to_string();
  EXPECT_EQ(hb.status().message().rfind("n = 3: SLA class", 0), 0u) << hb.status().message();
  EXPECT_NE(hb.status().message().find("3 sequences to queue"), std::string::npos)
      << hb.status().message();
  EXPECT_EQ(e.stats().num_waiting, 3) << "the refused request's completions were taken back";
  EXPECT_FALSE(e.cancel("", "b"));
  // More completions than the queue holds can never be queued: not a retry-later error.
  Request huge = story(4, 0);
  huge.n = 6;
  auto hh = e.submit(huge);
  ASSERT_FALSE(hh.ok());
  EXPECT_EQ(hh.status().code(), StatusCode::kInvalidArgument) << hh.status().to_string();
  EXPECT_NE(hh.status().message().find("exceed SLA class"), std::string::npos);
  // "a" is in flight under each of its completions.
  Request dup = story(4, 0);
  dup.request_id = "a";
  auto hd = e.submit(dup);
  ASSERT_FALSE(hd.ok());
  EXPECT_EQ(hd.status().code(), StatusCode::kAlreadyExists);
  b.n = 2;  // 3 + 2 fits
  hb = e.submit(b);
  ASSERT_TRUE(hb.ok()) << hb.status().to_string();
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  for (auto [h, n] : {std::pair{*ha, 3}, std::pair{*hb, 2}}) {
    const CollectedCompletions got = collect_completions(h, n);
    expect_well_formed(got);
    for (const Collected& c : got.completions) {
      EXPECT_EQ(c.tokens, got.completions[0].tokens);  // greedy
      EXPECT_EQ(c.tokens.size(), 4u);
    }
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

// Requests of 1 to 4 completions cancelled at random instants under a small pool with the
// temporal cut and the prefix cache: every completion ends once, every stream has one last event,
// and every block returns.
TEST(EngineCompletionsStorm, RandomCancelsEndEveryCompletionOnce) {
  KVSPLIT_REQUIRE_MODELS();
  for (ServingMode mode : {ServingMode::kColocated, ServingMode::kDisaggregated}) {
    SCOPED_TRACE(mode == ServingMode::kColocated ? "colocated" : "disaggregated");
    EngineConfig cfg = testing::stories_config(mode);
    cfg.kv_blocks_per_worker = 24;
    cfg.max_batch_tokens = 64;
    cfg.prefix_cache = true;
    cfg.temporal.host_capacity_mb = 4;
    cfg.sla_classes[0].queue_timeout_ms = 600000;
    auto engine = EngineImpl::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    std::mt19937 rng(77);
    constexpr int kRequests = 60;
    std::vector<RequestHandle> handles;
    std::vector<int> ns;
    std::vector<int> cancel_after;
    for (int i = 0; i < kRequests; ++i) {
      Request r;
      r.request_id = fmt::format("s{}", i);
      const int len = 1 + static_cast<int>(rng() % 50);
      for (int k = 0; k < len; ++k) r.prompt_token_ids.push_back(3 + static_cast<int>(rng() % 400));
      r.sampling.max_tokens = 1 + static_cast<int>(rng() % 40);
      r.sampling.temperature = (rng() % 2) ? 0.0f : 1.0f;
      r.n = 1 + static_cast<int>(rng() % 4);
      auto h = (*engine)->submit(r);
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      handles.push_back(*h);
      ns.push_back(r.n);
      const int kind = static_cast<int>(rng() % 3);
      cancel_after.push_back(kind == 0 ? 0 : kind == 1 ? 1 + static_cast<int>(rng() % 6) : -1);
      if (cancel_after.back() == 0) (*engine)->cancel("", r.request_id);
    }
    int cancelled = 0, ended = 0;
    for (int i = 0; i < kRequests; ++i) {
      CollectedCompletions got;
      got.completions.resize(static_cast<size_t>(ns[i]));
      // Cancelled after reading some of its events.
      if (cancel_after[i] > 0) {
        for (int k = 0; k < cancel_after[i] && got.lasts == 0; ++k) {
          TokenEvent ev;
          if (!handles[i].next(&ev, std::chrono::seconds(60))) break;
          testing::absorb(ev, got);
        }
        (*engine)->cancel("", fmt::format("s{}", i));
      }
      testing::collect_rest(handles[i], got, std::chrono::seconds(120));
      expect_well_formed(got);
      for (const Collected& c : got.completions) {
        const FinishReason fr = c.final_event.finish_reason;
        ++ended;
        cancelled += fr == FinishReason::kCancelled;
        EXPECT_TRUE(fr == FinishReason::kCancelled || fr == FinishReason::kStop ||
                    fr == FinishReason::kLength)
            << finish_reason_name(fr) << " " << c.final_event.status.to_string();
      }
    }
    EXPECT_GT(cancelled, 0);
    EXPECT_GT(ended, cancelled);
    const EngineStats s = (*engine)->stats();
    EXPECT_EQ(s.requests_cancelled, cancelled);
    EXPECT_EQ(s.requests_cancelled + s.requests_finished, ended);
    // Cached prompt pages count as available.
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  }
}

}  // namespace
}  // namespace kvsplit
