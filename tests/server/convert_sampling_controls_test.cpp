// GenerateRequest.min_tokens and SamplingParams.logit_bias at the gRPC edge: copied into the
// engine request (the map sorted by id), refused with the field named when out of range.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "server/convert.h"

namespace kvsplit::server {
namespace {

RequestLimits limits() {
  RequestLimits l;
  l.vocab_size = 512;
  l.max_context = 512;
  l.default_max_tokens = 16;
  l.class_names = {"default"};
  return l;
}

TEST(ConvertSamplingControls, MinTokensAndLogitBiasReachTheEngineRequest) {
  v1::GenerateRequest in;
  in.set_prompt("x");
  in.set_max_tokens(20);
  in.set_min_tokens(5);
  auto& bias = *in.mutable_sampling()->mutable_logit_bias();
  bias[300] = 2.5f;
  bias[7] = -100.0f;
  bias[511] = 100.0f;
  auto r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.min_tokens, 5);
  const std::vector<std::pair<int32_t, float>> want = {{7, -100.0f}, {300, 2.5f}, {511, 100.0f}};
  EXPECT_EQ(r->sampling.logit_bias, want);
}

// max_tokens unset: the server's default (16 here) is raised to min_tokens, within the limit.
TEST(ConvertSamplingControls, AnUnsetMaxTokensIsRaisedToMinTokens) {
  v1::GenerateRequest in;
  in.set_prompt("x");
  in.set_min_tokens(100);
  auto r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.max_tokens, 100);
  EXPECT_TRUE(r->max_tokens_is_default);
  in.set_min_tokens(5);
  r = to_engine_request(in, limits());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sampling.max_tokens, 16);
  RequestLimits small = limits();
  small.max_tokens_limit = 50;
  in.set_min_tokens(60);
  r = to_engine_request(in, small);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("min_tokens: must be in [0, max_tokens = 50], got 60", 0),
            0u)
      << r.status().message();
}

TEST(ConvertSamplingControls, OutOfRangeValuesNameTheirField) {
  v1::GenerateRequest in;
  in.set_prompt("x");
  in.set_max_tokens(4);
  in.set_min_tokens(5);
  auto r = to_engine_request(in, limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("min_tokens: must be in [0, max_tokens = 4], got 5", 0), 0u)
      << r.status().message();
  // A min_tokens past int32 is capped, not wrapped to a negative (valid-looking) value.
  in.set_max_tokens(0);
  in.set_min_tokens(0xFFFFFFFFu);
  r = to_engine_request(in, limits());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("got 2147483647"), std::string::npos) << r.status().message();

  in.set_min_tokens(0);
  (*in.mutable_sampling()->mutable_logit_bias())[512] = 1.0f;
  r = to_engine_request(in, limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "sampling.logit_bias: token id 512 is not in [0, 512)");
  in.mutable_sampling()->clear_logit_bias();
  (*in.mutable_sampling()->mutable_logit_bias())[3] = -100.5f;
  r = to_engine_request(in, limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("sampling.logit_bias: the bias of token 3", 0), 0u)
      << r.status().message();
}

}  // namespace
}  // namespace kvsplit::server
