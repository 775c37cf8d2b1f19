// Request::prompt_logprobs through the engine, in both serving modes: each prompt token's entry
// is the model's teacher-forced log-probability of it (checked against the logprob of the same
// token forced as the first generated one), its alternatives sorted; a prompt of several chunks
// gets every entry; the request computes its whole prompt under a prefix cache; only completion
// 0's first event carries them; bad values are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

// The first event of a request: where its prompt logprobs are.
TokenEvent first_event(RequestHandle handle) {
  TokenEvent ev;
  EXPECT_TRUE(handle.next(&ev, std::chrono::seconds(60)));
  return ev;
}

std::vector<int32_t> prompt_of(int len) {
  std::vector<int32_t> ids;
  for (int i = 0; i < len; ++i) ids.push_back(3 + (i * 53 + 7) % 480);
  return ids;
}

// The model's log-probability of `next` after `prefix`: the logprob of `next` forced as the first
// generated token (logit_bias +100; logprobs are the model's, before the bias).
float forced_logprob(Engine& engine, std::vector<int32_t> prefix, int32_t next) {
  Request r;
  r.prompt_token_ids = std::move(prefix);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 1;
  r.sampling.logit_bias = {{next, 100.0f}};
  r.top_logprobs = 1;
  auto h = engine.submit(r);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  if (!h.ok()) return NAN;
  const TokenEvent ev = first_event(*h);
  EXPECT_EQ(ev.token_ids, std::vector<int32_t>{next});
  EXPECT_EQ(ev.logprobs.size(), 1u);
  const float lp = ev.logprobs.empty() ? NAN : ev.logprobs[0].logprob;
  collect(*h);
  return lp;
}

class EnginePromptLogprobs : public ::testing::TestWithParam<ServingMode> {};

// 300 tokens: three chunks of the 128-token step budget, each returning all its rows, recorded on
// the worker's two sampling threads (128 rows: past parallel_sampling_min_rows); the oracle's
// single rows are recorded on the worker's own thread.
TEST_P(EnginePromptLogprobs, EachEntryIsTheModelsLogprobOfThatPromptToken) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.threads_per_worker = 2;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  const std::vector<int32_t> prompt = prompt_of(300);
  Request r;
  r.prompt_token_ids = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 4;
  r.prompt_logprobs = 3;
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const TokenEvent first = first_event(*h);
  const Collected rest = collect(*h);
  ASSERT_EQ(first.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i < first.prompt_logprobs.size(); ++i) {
    const TokenLogprob& lp = first.prompt_logprobs[i];
    ASSERT_EQ(lp.token_id, prompt[i + 1]) << i;
    ASSERT_LE(lp.logprob, 0.0f) << i;
    ASSERT_EQ(lp.top.size(), 3u) << i;
    for (size_t k = 1; k < lp.top.size(); ++k) ASSERT_GE(lp.top[k - 1].second, lp.top[k].second);
    ASSERT_GE(lp.top[0].second, lp.logprob) << i;
  }
  // Against the oracle, in each chunk and at the chunk edges.
  for (size_t i : {size_t{0}, size_t{1}, size_t{126}, size_t{127}, size_t{128}, size_t{200},
                   prompt.size() - 2}) {
    const float want = forced_logprob(
        **engine, std::vector<int32_t>(prompt.begin(), prompt.begin() + i + 1), prompt[i + 1]);
    EXPECT_NEAR(first.prompt_logprobs[i].logprob, want, 1e-4) << "prompt token " << i + 1;
  }
  // Only the first event has them; the request generates what it would without them.
  EXPECT_TRUE(rest.final_event.prompt_logprobs.empty());
  Request plain = r;
  plain.prompt_logprobs = -1;
  auto hp = (*engine)->submit(plain);
  ASSERT_TRUE(hp.ok());
  const Collected want = collect(*hp);
  std::vector<int32_t> got = first.token_ids;
  got.insert(got.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(got, want.tokens);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// Cached prompt pages have no logits: a request asking for prompt logprobs computes its prompt
// whole (and gets the same entries as without the cache), and leaves it cached for others.
TEST_P(EnginePromptLogprobs, UnderAPrefixCacheThePromptIsComputedWhole) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.prefix_cache = true;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Request r;
  r.prompt_token_ids = prompt_of(100);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 2;
  auto warm = (*engine)->submit(r);  // caches the prompt
  ASSERT_TRUE(warm.ok());
  ASSERT_TRUE(collect(*warm).final_event.status.ok());
  Request asks = r;
  asks.prompt_logprobs = 0;
  auto h = (*engine)->submit(asks);
  ASSERT_TRUE(h.ok());
  const TokenEvent first = first_event(*h);
  const Collected rest = collect(*h);
  EXPECT_EQ(rest.final_event.usage.cached_tokens, 0);
  ASSERT_EQ(first.prompt_logprobs.size(), 99u);
  for (const TokenLogprob& lp : first.prompt_logprobs) EXPECT_TRUE(lp.top.empty());
  auto other = (*engine)->submit(r);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(collect(*other).final_event.usage.cached_tokens, 96);
  // The same entries as an engine without the cache computes.
  auto plain = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(plain.ok());
  auto hp = (*plain)->submit(asks);
  ASSERT_TRUE(hp.ok());
  const TokenEvent want = first_event(*hp);
  collect(*hp);
  ASSERT_EQ(want.prompt_logprobs.size(), 99u);
  for (size_t i = 0; i < 99; ++i)
    EXPECT_FLOAT_EQ(first.prompt_logprobs[i].logprob, want.prompt_logprobs[i].logprob) << i;
}

INSTANTIATE_TEST_SUITE_P(Modes, EnginePromptLogprobs,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated));

TEST(EnginePromptLogprobsRequest, OnlyCompletionZeroCarriesThemAndBadValuesAreRefused) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.prefix_cache = true;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok());
  Request r;
  r.prompt_token_ids = prompt_of(60);
  r.sampling.max_tokens = 3;
  r.n = 3;
  r.prompt_logprobs = 1;
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::vector<int> with(3, 0);
  TokenEvent ev;
  bool last = false;
  while (!last && h->next(&ev, std::chrono::seconds(60))) {
    if (!ev.prompt_logprobs.empty()) {
      ++with[static_cast<size_t>(ev.index)];
      EXPECT_EQ(ev.prompt_logprobs.size(), 59u);
    }
    last = ev.last;
  }
  EXPECT_TRUE(last) << "the stream did not end";
  EXPECT_EQ(with, (std::vector<int>{1, 0, 0}));
  for (int bad : {-2, 21}) {
    Request b = r;
    b.prompt_logprobs = bad;
    auto hb = (*engine)->submit(b);
    ASSERT_FALSE(hb.ok()) << bad;
    EXPECT_EQ(hb.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(hb.status().message().rfind("prompt_logprobs: must be in [-1, 20]", 0), 0u)
        << hb.status().message();
  }
}

}  // namespace
}  // namespace kvsplit
