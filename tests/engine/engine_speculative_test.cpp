// Speculative decoding (EngineConfig::speculative, n-gram prompt lookup): the same tokens, text,
// finish reasons and logprobs as without it (greedy and seeded sampling, both serving modes, under
// load, with stop strings, penalties, guided decoding, n > 1 and preemption), fewer forward steps,
// counters that move, and every block back in its pool after finishes and cancels.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <thread>

#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using testing::Collected;

const char* kPrompts[] = {
    "Once upon a time", "Lily wanted to", "The dog",       "One day, a little girl named Sue", "",
    "Tom and his mom",  "The sun was",    "A big red ball"};

EngineConfig config(ServingMode mode, bool speculative) {
  EngineConfig c = testing::stories_config(mode);
  if (speculative) {
    c.speculative.method = SpeculativeMethod::kNgram;
    c.speculative.num_speculative_tokens = 5;
    c.speculative.prompt_lookup_min = 1;
    c.speculative.prompt_lookup_max = 3;
  }
  return c;
}

// Long outputs (stories260K repeats itself: the drafts get accepted), greedy and seeded.
std::vector<Request> workload(int n) {
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.request_id = fmt::format("s{}", i);
    r.prompt = kPrompts[i % 8];
    r.sampling.max_tokens = 40 + (i * 37) % 160;
    r.sampling.ignore_eos = i % 3 == 0;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 500 + i;
    } else {
      r.sampling.temperature = 0.0f;
    }
    out.push_back(r);
  }
  return out;
}

struct Output {
  Collected c;
  std::vector<TokenLogprob> logprobs;
  std::set<std::chrono::steady_clock::time_point> times;  // distinct times of its token events
};

Output collect_all(RequestHandle h) {
  Output o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (true) {
    TokenEvent ev;
    if (!h.next(&ev, std::chrono::milliseconds(50))) {
      if (std::chrono::steady_clock::now() > deadline) {
        o.c.timed_out = true;
        return o;
      }
      continue;
    }
    o.c.tokens.insert(o.c.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    o.c.text += ev.text;
    o.logprobs.insert(o.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    if (!ev.token_ids.empty()) o.times.insert(ev.time);
    if (ev.final) {
      o.c.final_event = ev;
      ++o.c.finals;
      return o;
    }
  }
}

// Runs `reqs` on `engine`: all at once (`together`) or one after another.
std::vector<Output> run(Engine& engine, const std::vector<Request>& reqs, bool together) {
  std::vector<Output> out;
  std::vector<RequestHandle> handles;
  for (const Request& r : reqs) {
    auto h = engine.submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return {};
    if (together) {
      handles.push_back(*h);
    } else {
      out.push_back(collect_all(*h));
    }
  }
  for (RequestHandle& h : handles) out.push_back(collect_all(h));
  return out;
}

void expect_same(const std::vector<Request>& reqs, const std::vector<Output>& want,
                 const std::vector<Output>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string& id = reqs[i].request_id;
    ASSERT_FALSE(got[i].c.timed_out) << id;
    EXPECT_EQ(got[i].c.tokens, want[i].c.tokens) << id;
    EXPECT_EQ(got[i].c.text, want[i].c.text) << id;
    EXPECT_EQ(got[i].c.final_event.finish_reason, want[i].c.final_event.finish_reason) << id;
    EXPECT_TRUE(got[i].c.final_event.status.ok()) << id << got[i].c.final_event.status.to_string();
    EXPECT_EQ(got[i].c.final_event.usage.completion_tokens,
              static_cast<int>(got[i].c.tokens.size()))
        << id;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << id;
    for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
      // The verifying pass computes a row as a prompt chunk does, not as the decode kernel:
      // the same value up to float rounding.
      EXPECT_NEAR(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-3) << id << " " << t;
      ASSERT_EQ(got[i].logprobs[t].top.size(), want[i].logprobs[t].top.size()) << id;
    }
  }
}

struct SpecCounts {
  int64_t rows = 0, drafts = 0, accepted = 0, steps = 0;
};

SpecCounts counts(const Engine& e) {
  SpecCounts s;
  for (const PoolStats& p : e.stats().pools) {
    s.rows += p.spec_rows;
    s.drafts += p.spec_draft_tokens;
    s.accepted += p.spec_accepted_tokens;
  }
  return s;
}

class EngineSpeculative : public ::testing::TestWithParam<ServingMode> {};

TEST_P(EngineSpeculative, SameTokensAsWithoutAloneAndUnderLoad) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Request> reqs = workload(16);
  auto plain = Engine::create(config(GetParam(), false));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  const std::vector<Output> want = run(**plain, reqs, /*together=*/false);
  EXPECT_EQ(counts(**plain).drafts, 0);

  auto spec = Engine::create(config(GetParam(), true));
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**spec);
  expect_same(reqs, want, run(**spec, reqs, /*together=*/false));
  const SpecCounts alone = counts(**spec);
  EXPECT_GT(alone.rows, 0);
  EXPECT_GT(alone.accepted, 0);
  EXPECT_LE(alone.accepted, alone.drafts);
  expect_same(reqs, want, run(**spec, reqs, /*together=*/true));
  EXPECT_GT(counts(**spec).accepted, alone.accepted);
  EXPECT_TRUE(testing::pools_back_to(**spec, initial));
  EXPECT_EQ((*spec)->stats().requests_failed, 0);
}

// Greedy decoding of one long request: every accepted draft token is a forward pass saved.
TEST_P(EngineSpeculative, AcceptedDraftsSaveForwardPasses) {
  KVSPLIT_REQUIRE_MODELS();
  Request r;
  r.request_id = "long";
  r.prompt = "Once upon a time";
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 250;
  r.sampling.ignore_eos = true;
  auto plain = Engine::create(config(GetParam(), false));
  auto spec = Engine::create(config(GetParam(), true));
  ASSERT_TRUE(plain.ok() && spec.ok());
  const std::vector<Output> want = run(**plain, {r}, false);
  const std::vector<Output> got = run(**spec, {r}, false);
  expect_same({r}, want, got);
  ASSERT_EQ(got[0].c.tokens.size(), 250u);
  const SpecCounts s = counts(**spec);
  EXPECT_GT(s.accepted, 0);
  // The tokens of one forward pass share its time: a lone request's distinct token times are its
  // passes (the prefill's, then one per decode row). Without drafts, one per token; with them,
  // every accepted draft token is a pass saved.
  EXPECT_EQ(want[0].times.size(), 250u);
  EXPECT_EQ(static_cast<int64_t>(got[0].times.size()), 250 - s.accepted);
  // The decode rows that carried drafts are among those passes.
  EXPECT_LE(s.rows, 249 - s.accepted);
}

// 48 sequences decoding at once on a worker with two sampling threads: past
// parallel_sampling_min_rows, rows are sampled and their next drafts looked up on both threads
// (run under TSan with the other concurrency tests).
TEST_P(EngineSpeculative, ParallelSamplingThreadsLookUpTheDrafts) {
  KVSPLIT_REQUIRE_MODELS();
  std::vector<Request> reqs = workload(48);
  for (Request& r : reqs) {
    r.sampling.max_tokens = 60;
    r.sampling.ignore_eos = true;
  }
  EngineConfig base = config(GetParam(), false);
  base.threads_per_worker = 2;
  base.num_decode_workers = 1;  // all 48 on one decoding worker
  EngineConfig on = base;
  on.speculative = config(GetParam(), true).speculative;
  auto plain = Engine::create(base);
  auto spec = Engine::create(on);
  ASSERT_TRUE(plain.ok() && spec.ok());
  const std::vector<int> initial = testing::free_blocks(**spec);
  expect_same(reqs, run(**plain, reqs, true), run(**spec, reqs, true));
  EXPECT_GT(counts(**spec).accepted, 0);
  EXPECT_TRUE(testing::pools_back_to(**spec, initial));
}

// A step time budget (pools.max_chunk_ms) that no step fits: drafts never stretch a step, so none
// is fed, and the output is the plain one.
TEST_P(EngineSpeculative, DraftsStayWithinTheStepTimeBudget) {
  KVSPLIT_REQUIRE_MODELS();
  const std::vector<Request> reqs = workload(4);
  auto plain = Engine::create(config(GetParam(), false));
  EngineConfig tight = config(GetParam(), true);
  tight.max_chunk_ms = 1e-6;
  auto spec = Engine::create(tight);
  ASSERT_TRUE(plain.ok() && spec.ok());
  expect_same(reqs, run(**plain, reqs, true), run(**spec, reqs, true));
  EXPECT_EQ(counts(**spec).rows, 0);
}

// Stop strings, penalties, logprobs, min_tokens, guided decoding and n > 1 in the same batch.
TEST_P(EngineSpeculative, SamplingControlsGiveTheSameOutput) {
  KVSPLIT_REQUIRE_MODELS();
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.request_id = fmt::format("c{}", i);
    r.prompt = kPrompts[i];
    r.sampling.max_tokens = 120;
    r.sampling.temperature = i % 2 ? 0.7f : 0.0f;
    r.sampling.seed = 9 + i;
    r.top_logprobs = i % 3 == 0 ? 2 : 0;
    switch (i % 4) {
      case 0:
        r.sampling.stop = {"the park", "."};
        r.sampling.min_tokens = 10;
        break;
      case 1:
        r.sampling.repetition_penalty = 1.1f;
        r.sampling.frequency_penalty = 0.3f;
        break;
      case 2:
        r.sampling.guided.kind = GuidedDecoding::Kind::kRegex;
        r.sampling.guided.spec = "([A-Za-z]+ ){3,12}(the|a) [a-z]+\\.";
        break;
      default:
        r.n = 3;
        r.sampling.temperature = 0.9f;
        break;
    }
    reqs.push_back(r);
  }
  auto plain = Engine::create(config(GetParam(), false));
  auto spec = Engine::create(config(GetParam(), true));
  ASSERT_TRUE(plain.ok() && spec.ok());
  const std::vector<int> initial = testing::free_blocks(**spec);
  for (const Request& r : reqs) {
    if (r.n > 1) {
      auto a = (*plain)->submit(r);
      auto b = (*spec)->submit(r);
      ASSERT_TRUE(a.ok() && b.ok());
      const auto ca = testing::collect_completions(*a, r.n);
      const auto cb = testing::collect_completions(*b, r.n);
      for (int k = 0; k < r.n; ++k) {
        EXPECT_EQ(cb.completions[k].tokens, ca.completions[k].tokens) << r.request_id << " " << k;
        EXPECT_EQ(cb.completions[k].text, ca.completions[k].text) << r.request_id << " " << k;
      }
      continue;
    }
    expect_same({r}, run(**plain, {r}, false), run(**spec, {r}, false));
  }
  EXPECT_GT(counts(**spec).accepted, 0);
  EXPECT_TRUE(testing::pools_back_to(**spec, initial));
}

// A pool too small for the batch: preemptions (recompute) and drafts together, same tokens.
TEST_P(EngineSpeculative, PreemptionWithDraftsKeepsTokens) {
  KVSPLIT_REQUIRE_MODELS();
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.request_id = fmt::format("p{}", i);
    r.prompt = kPrompts[i];
    r.sampling.max_tokens = 100;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    r.sampling.seed = 77 + i;
    reqs.push_back(r);
  }
  auto plain = Engine::create(config(GetParam(), false));
  ASSERT_TRUE(plain.ok());
  const std::vector<Output> want = run(**plain, reqs, false);
  EngineConfig small = config(GetParam(), true);
  small.kv_blocks_per_worker = 14;
  small.num_decode_workers = 1;
  small.handoff_timeout_ms = 60000;
  auto spec = Engine::create(small);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**spec);
  expect_same(reqs, want, run(**spec, reqs, true));
  EXPECT_GT((*spec)->stats().preemptions, 0);
  EXPECT_GT(counts(**spec).accepted, 0);
  EXPECT_TRUE(testing::pools_back_to(**spec, initial));
}

TEST_P(EngineSpeculative, CancelsMidDraftLeaveNoBlockBehind) {
  KVSPLIT_REQUIRE_MODELS();
  auto spec = Engine::create(config(GetParam(), true));
  ASSERT_TRUE(spec.ok());
  const std::vector<int> initial = testing::free_blocks(**spec);
  std::vector<Request> reqs = workload(24);
  std::vector<RequestHandle> handles;
  for (Request& r : reqs) {
    r.sampling.max_tokens = 400;
    r.sampling.ignore_eos = true;
    auto h = (*spec)->submit(r);
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  // Cancel each after a few of its tokens, at different points of its drafts.
  for (size_t i = 0; i < handles.size(); ++i) {
    TokenEvent ev;
    int tokens = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (tokens < static_cast<int>(3 + i % 7) && std::chrono::steady_clock::now() < deadline) {
      if (handles[i].next(&ev, std::chrono::milliseconds(20))) {
        tokens += static_cast<int>(ev.token_ids.size());
        if (ev.final) break;
      }
    }
    (*spec)->cancel(reqs[i].tenant, reqs[i].request_id);
  }
  for (RequestHandle& h : handles) {
    const Output o = collect_all(h);
    EXPECT_FALSE(o.c.timed_out);
  }
  EXPECT_TRUE(testing::pools_back_to(**spec, initial));
  const EngineStats st = (*spec)->stats();
  EXPECT_GT(st.requests_cancelled, 0);
  EXPECT_EQ(st.requests_cancelled + st.requests_finished, 24);
  EXPECT_EQ(st.requests_failed, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineSpeculative,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

TEST(EngineSpeculativeConfig, BadSettingsAreRefusedNamingTheField) {
  EngineConfig c = config(ServingMode::kColocated, true);
  c.speculative.num_speculative_tokens = 0;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("EngineConfig.speculative.num_speculative_tokens"),
            std::string::npos)
      << e.status().message();
  c = config(ServingMode::kColocated, true);
  c.speculative.prompt_lookup_min = 4;
  c.speculative.prompt_lookup_max = 2;
  e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("prompt_lookup_min"), std::string::npos);
  c = config(ServingMode::kColocated, true);
  c.speculative.method = static_cast<SpeculativeMethod>(7);
  EXPECT_FALSE(Engine::create(c).ok());
}

}  // namespace
}  // namespace kvsplit
