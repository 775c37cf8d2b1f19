// min_tokens and logit_bias: their validation, the sampler's bias and stop-id mask, and the stop
// checker's stop strings before and after min_tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kvsplit/sampling_params.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"

namespace kvsplit::sampling {
namespace {

Status validate_with(int32_t vocab, void (*mutate)(SamplingParams&)) {
  SamplingParams p;
  mutate(p);
  return p.validate(vocab);
}

void expect_field_error(const Status& st, const std::string& field, const std::string& detail) {
  ASSERT_FALSE(st.ok()) << field;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind(field + ": ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(detail), std::string::npos) << st.message();
}

TEST(MinTokensParams, RangeIsZeroToMaxTokens) {
  expect_field_error(validate_with(0, [](SamplingParams& p) { p.min_tokens = -1; }), "min_tokens",
                     "got -1");
  expect_field_error(validate_with(0,
                                   [](SamplingParams& p) {
                                     p.max_tokens = 8;
                                     p.min_tokens = 9;
                                   }),
                     "min_tokens", "max_tokens = 8");
  EXPECT_TRUE(validate_with(0, [](SamplingParams& p) {
                p.max_tokens = 8;
                p.min_tokens = 8;
              }).ok());
}

TEST(LogitBiasParams, IdsBiasesAndCount) {
  expect_field_error(validate_with(10,
                                   [](SamplingParams& p) {
                                     p.logit_bias = {{10, 1.0f}};
                                   }),
                     "logit_bias", "token id 10 is not in [0, 10)");
  expect_field_error(validate_with(0,
                                   [](SamplingParams& p) {
                                     p.logit_bias = {{-1, 1.0f}};
                                   }),
                     "logit_bias", "token id -1");
  expect_field_error(validate_with(10,
                                   [](SamplingParams& p) {
                                     p.logit_bias = {{3, 100.5f}};
                                   }),
                     "logit_bias", "the bias of token 3");
  expect_field_error(validate_with(10,
                                   [](SamplingParams& p) {
                                     p.logit_bias = {{3, std::nanf("")}};
                                   }),
                     "logit_bias", "the bias of token 3");
  expect_field_error(validate_with(10,
                                   [](SamplingParams& p) {
                                     p.logit_bias = {{4, 1.0f}, {2, 1.0f}, {4, -1.0f}};
                                   }),
                     "logit_bias", "token id 4 is given twice");
  expect_field_error(validate_with(0,
                                   [](SamplingParams& p) {
                                     for (int i = 0; i <= 200; ++i) p.logit_bias.push_back({i, 1});
                                   }),
                     "logit_bias", "at most 200 entries, got 201");
  EXPECT_TRUE(validate_with(10, [](SamplingParams& p) {
                p.logit_bias = {{0, -100.0f}, {9, 100.0f}};
              }).ok());
  EXPECT_TRUE(validate_with(0, [](SamplingParams& p) {
                for (int i = 0; i < 200; ++i) p.logit_bias.push_back({i, 1});
              }).ok());
}

// Neither is "plain greedy": a backend's argmax of the raw logits would ignore them.
TEST(MinTokensLogitBias, AreNotPlainGreedy) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(is_plain_greedy(p));
  p.min_tokens = 1;
  EXPECT_FALSE(is_plain_greedy(p));
  p.min_tokens = 0;
  p.logit_bias = {{1, 0.5f}};
  EXPECT_FALSE(is_plain_greedy(p));
}

TEST(LogitBias, ShiftsGreedyAndSampledChoices) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{2, 1.5f}};
  Sampler greedy(p, 1);
  std::vector<float> logits = {0.0f, 1.0f, 0.0f, 1.4f};
  EXPECT_EQ(greedy.sample(logits.data(), 4, {}, {}), 2);  // 0 + 1.5 beats 1.4
  EXPECT_FLOAT_EQ(logits[2], 1.5f);

  // -100 removes a token from a temperature-1 draw in practice; +100 makes it certain.
  p.temperature = 1.0f;
  p.logit_bias = {{3, -100.0f}};
  Sampler banned(p, 7);
  p.logit_bias = {{0, 100.0f}};
  Sampler forced(p, 7);
  for (int i = 0; i < 500; ++i) {
    std::vector<float> a = {0.0f, 1.0f, 0.0f, 3.0f};
    EXPECT_NE(banned.sample(a.data(), 4, {}, {}), 3);
    std::vector<float> b = {0.0f, 1.0f, 0.0f, 3.0f};
    EXPECT_EQ(forced.sample(b.data(), 4, {}, {}), 0);
  }
}

// The bias comes before the repetition penalty (vLLM's order): a biased positive logit is divided.
TEST(LogitBias, AppliesBeforeTheRepetitionPenalty) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{1, 2.0f}};
  Sampler s(p, 1);
  std::vector<float> logits = {0.0f, 1.0f, 1.9f};
  const std::vector<int32_t> prompt = {1};
  // Bias then penalty: (1 + 2) / 2 = 1.5 < 1.9. Penalty then bias would give 2.5 and pick 1.
  EXPECT_EQ(s.sample(logits.data(), 3, prompt, {}), 2);
  EXPECT_FLOAT_EQ(logits[1], 1.5f);
}

TEST(MinTokens, MasksEosAndStopIdsUntilReached) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 10;
  p.min_tokens = 2;
  p.stop_token_ids = {3};
  const std::vector<int32_t> eos = {0};
  Sampler s(p, 1, eos);
  const std::vector<float> row = {5.0f, 1.0f, 2.0f, 4.0f};  // EOS best, then stop id 3
  std::vector<int32_t> output;
  std::vector<float> logits = row;
  EXPECT_EQ(s.sample(logits.data(), 4, {}, output), 2);  // 0 and 3 masked
  EXPECT_EQ(logits[0], -std::numeric_limits<float>::infinity());
  output.push_back(2);
  logits = row;
  EXPECT_EQ(s.sample(logits.data(), 4, {}, output), 2);  // one generated: still masked
  output.push_back(2);
  logits = row;
  EXPECT_EQ(s.sample(logits.data(), 4, {}, output), 0);  // two generated: EOS allowed again

  // ignore_eos: EOS is not a stop id, so it is not masked; stop_token_ids still are.
  p.ignore_eos = true;
  Sampler no_eos(p, 1, eos);
  logits = row;
  EXPECT_EQ(no_eos.sample(logits.data(), 4, {}, {}), 0);
  logits = {1.0f, 1.0f, 2.0f, 4.0f};
  EXPECT_EQ(no_eos.sample(logits.data(), 4, {}, {}), 2);
}

TEST(MinTokens, MaskedIdsAreNeverDrawn) {
  SamplingParams p;
  p.max_tokens = 4;
  p.min_tokens = 3;
  const std::vector<int32_t> eos = {1};
  Sampler s(p, 99, eos);
  const std::vector<int32_t> two = {0, 0};
  for (int i = 0; i < 300; ++i) {
    std::vector<float> logits = {0.0f, 2.0f, 0.0f};
    EXPECT_NE(s.sample(logits.data(), 3, {}, two), 1);
  }
}

using Tokens = std::vector<std::pair<int32_t, std::string>>;

std::string run_stop(int min_tokens, const std::vector<std::string>& stop, const Tokens& tokens,
                     FinishReason* reason, int* steps) {
  SamplingParams p;
  p.max_tokens = 100;
  p.min_tokens = min_tokens;
  p.stop = stop;
  EXPECT_TRUE(p.validate().ok());
  StopChecker c(p, {}, 100);
  std::string text;
  *reason = FinishReason::kNone;
  *steps = 0;
  for (const auto& [id, delta] : tokens) {
    const StopChecker::Step step = c.on_token(id, delta);
    text += step.text;
    ++*steps;
    if (step.reason != FinishReason::kNone) {
      *reason = step.reason;
      return text;
    }
  }
  return text + c.flush();
}

TEST(MinTokens, StopStringsCountOnlyOnceReached) {
  const Tokens tokens = {{5, "a."}, {6, "b"}, {7, "c."}, {8, "d."}};
  FinishReason reason;
  int steps = 0;
  EXPECT_EQ(run_stop(0, {"."}, tokens, &reason, &steps), "a");
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(steps, 1);
  // The "." of tokens 1 is text; token 3 is the min_tokens-th, so its "." stops.
  EXPECT_EQ(run_stop(3, {"."}, tokens, &reason, &steps), "a.bc");
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(run_stop(4, {"."}, tokens, &reason, &steps), "a.bc.d");
  EXPECT_EQ(steps, 4);
}

// A stop string that starts before min_tokens and ends at or after it stops; a shorter one that
// was complete inside held-back text before min_tokens does not.
TEST(MinTokens, AStopStringEndingAfterTheThresholdStops) {
  FinishReason reason;
  int steps = 0;
  EXPECT_EQ(run_stop(2, {"END"}, {{1, "xEN"}, {2, "D tail"}}, &reason, &steps), "x");
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(steps, 2);
  // "ab" is complete in token 1 (held back as the start of "xabc"); it is no stop at token 2,
  // where nothing ends: the text flows on.
  EXPECT_EQ(run_stop(2, {"ab", "xabc"}, {{1, "xab"}, {2, "z"}, {3, "q"}}, &reason, &steps),
            "xabzq");
  EXPECT_EQ(reason, FinishReason::kNone);
  EXPECT_EQ(steps, 3);
}

}  // namespace
}  // namespace kvsplit::sampling
