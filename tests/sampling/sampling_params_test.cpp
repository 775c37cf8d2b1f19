// SamplingParams::validate: every field's range, boundary values, and error messages.
#include "kvsplit/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace kvsplit {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_invalid(const std::function<void(SamplingParams&)>& mutate, const std::string& field) {
  SamplingParams p;
  mutate(p);
  Status st = p.validate();
  ASSERT_FALSE(st.ok()) << "expected " << field << " to be rejected";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind(field + ": ", 0), 0u) << st.message();
}

void expect_valid(const std::function<void(SamplingParams&)>& mutate) {
  SamplingParams p;
  mutate(p);
  Status st = p.validate();
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(SamplingParamsTest, DefaultsAreValid) {
  expect_valid([](SamplingParams&) {});
}

TEST(SamplingParamsTest, Temperature) {
  expect_invalid([](SamplingParams& p) { p.temperature = -1.0f; }, "temperature");
  expect_invalid([](SamplingParams& p) { p.temperature = kNaN; }, "temperature");
  expect_invalid([](SamplingParams& p) { p.temperature = kInf; }, "temperature");
  expect_valid([](SamplingParams& p) { p.temperature = 0.0f; });
  expect_valid([](SamplingParams& p) { p.temperature = 2.5f; });
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_EQ(p.validate().message(), "temperature: must be in [0, 100], got -1");
  expect_invalid([](SamplingParams& p) { p.temperature = 100.5f; }, "temperature");
}

// The same rules the gRPC edge applies (it calls validate with the vocabulary size).
TEST(SamplingParamsTest, VocabularyBoundsAndStopLimits) {
  SamplingParams p;
  p.top_k = 513;
  EXPECT_TRUE(p.validate().ok());  // no vocabulary given: only >= -1
  EXPECT_EQ(p.validate(512).message(), "top_k: must be in [-1, 512] (0 or -1 = off), got 513");
  p = {};
  p.stop_token_ids = {3, 512};
  EXPECT_EQ(p.validate(512).message(),
            "stop_token_ids: stop_token_ids[1] = 512 is not in [0, 512)");
  p.stop_token_ids.assign(65, 1);
  EXPECT_NE(p.validate().message().find("at most 64 ids"), std::string::npos);
  p = {};
  p.stop = {"ok", "\xff"};
  EXPECT_EQ(p.validate().message(), "stop: stop[1] is not valid UTF-8");
  p = {};
  p.repetition_penalty = 10.5f;
  EXPECT_EQ(p.validate().message(), "repetition_penalty: must be in [0.01, 10], got 10.5");
  p.repetition_penalty = 1e-40f;  // a seen token's logit / 1e-40 was +inf: a NaN softmax
  EXPECT_EQ(p.validate().message(), "repetition_penalty: must be in [0.01, 10], got 1e-40");
}

TEST(SamplingParamsTest, TopP) {
  expect_invalid([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  expect_invalid([](SamplingParams& p) { p.top_p = -0.5f; }, "top_p");
  expect_invalid([](SamplingParams& p) { p.top_p = 1.01f; }, "top_p");
  expect_invalid([](SamplingParams& p) { p.top_p = kNaN; }, "top_p");
  expect_valid([](SamplingParams& p) { p.top_p = 1.0f; });
  expect_valid([](SamplingParams& p) { p.top_p = 1e-6f; });
}

TEST(SamplingParamsTest, TopK) {
  expect_invalid([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  expect_valid([](SamplingParams& p) { p.top_k = -1; });  // vLLM's "off"
  expect_valid([](SamplingParams& p) { p.top_k = 0; });
  expect_valid([](SamplingParams& p) { p.top_k = 50; });
}

TEST(SamplingParamsTest, MinP) {
  expect_invalid([](SamplingParams& p) { p.min_p = -0.1f; }, "min_p");
  expect_invalid([](SamplingParams& p) { p.min_p = 1.5f; }, "min_p");
  expect_invalid([](SamplingParams& p) { p.min_p = kNaN; }, "min_p");
  expect_valid([](SamplingParams& p) { p.min_p = 0.0f; });
  expect_valid([](SamplingParams& p) { p.min_p = 1.0f; });
}

TEST(SamplingParamsTest, RepetitionPenalty) {
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty");
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = kNaN; }, "repetition_penalty");
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = kInf; }, "repetition_penalty");
  expect_valid([](SamplingParams& p) { p.repetition_penalty = 0.5f; });
  expect_valid([](SamplingParams& p) { p.repetition_penalty = 1.3f; });
}

TEST(SamplingParamsTest, PresenceAndFrequencyPenalties) {
  expect_invalid([](SamplingParams& p) { p.presence_penalty = 2.01f; }, "presence_penalty");
  expect_invalid([](SamplingParams& p) { p.presence_penalty = -2.01f; }, "presence_penalty");
  expect_invalid([](SamplingParams& p) { p.presence_penalty = kNaN; }, "presence_penalty");
  expect_invalid([](SamplingParams& p) { p.frequency_penalty = 3.0f; }, "frequency_penalty");
  expect_invalid([](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty");
  expect_invalid([](SamplingParams& p) { p.frequency_penalty = kNaN; }, "frequency_penalty");
  expect_valid([](SamplingParams& p) {
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
  });
}

TEST(SamplingParamsTest, MaxTokens) {
  // max_tokens counts generated tokens: at least one (the prefill's).
  expect_invalid([](SamplingParams& p) { p.max_tokens = -1; }, "max_tokens");
  expect_invalid([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  expect_invalid([](SamplingParams& p) { p.max_tokens = std::numeric_limits<int32_t>::max(); },
                 "max_tokens");
  expect_valid([](SamplingParams& p) { p.max_tokens = 1; });
  expect_valid([](SamplingParams& p) { p.max_tokens = 1 << 30; });
}

TEST(SamplingParamsTest, StopStrings) {
  expect_invalid([](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop");
  expect_invalid([](SamplingParams& p) { p.stop = {std::string(257, 'x')}; }, "stop");
  expect_invalid([](SamplingParams& p) { p.stop.assign(17, "x"); }, "stop");
  expect_valid([](SamplingParams& p) { p.stop.assign(16, std::string(256, 'x')); });
}

TEST(SamplingParamsTest, StopTokenIds) {
  expect_invalid([](SamplingParams& p) { p.stop_token_ids = {5, -1}; }, "stop_token_ids");
  expect_valid([](SamplingParams& p) { p.stop_token_ids = {0, 2, 100000}; });
}

TEST(SamplingParamsTest, FinishReasonNames) {
  EXPECT_STREQ(finish_reason_name(FinishReason::kNone), "none");
  EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::kCancelled), "cancelled");
  EXPECT_STREQ(finish_reason_name(FinishReason::kError), "error");
}

}  // namespace
}  // namespace kvsplit
