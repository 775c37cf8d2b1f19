// min_tokens and logit_bias through the engine, in both serving modes: a stop token id is masked
// until min_tokens tokens are out, a banned token never appears, bad values are refused at
// submit, and every KV block comes back.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

class EngineSamplingControls : public ::testing::TestWithParam<ServingMode> {
 protected:
  Collected run(Engine& engine, const Request& r) {
    auto h = engine.submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return {};
    Collected c = collect(*h);
    EXPECT_FALSE(c.timed_out);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    return c;
  }
  static Request greedy(int max_tokens) {
    Request r;
    r.prompt = "Once upon a time";
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    return r;
  }
};

TEST_P(EngineSamplingControls, MinTokensMasksAStopIdUntilReached) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> free_at_start = testing::free_blocks(**engine);

  const Collected plain = run(**engine, greedy(40));
  ASSERT_EQ(plain.tokens.size(), 40u);
  // The greedy text's 4th token as a stop id: without min_tokens it ends the request there.
  const int32_t stop_id = plain.tokens[3];
  Request stopped = greedy(40);
  stopped.sampling.stop_token_ids = {stop_id};
  const Collected early = run(**engine, stopped);
  const auto first = std::find(plain.tokens.begin(), plain.tokens.end(), stop_id);
  EXPECT_EQ(early.tokens, std::vector<int32_t>(plain.tokens.begin(), first + 1));
  EXPECT_EQ(early.final_event.finish_reason, FinishReason::kStop);

  Request held = stopped;
  held.sampling.min_tokens = 12;
  const Collected late = run(**engine, held);
  ASSERT_GE(late.tokens.size(), 12u);
  // Up to the first would-be stop the text is the greedy one; then the stop id is masked for
  // the first 12 tokens (the greedy choice moves to the next-best token).
  EXPECT_TRUE(std::equal(plain.tokens.begin(), first, late.tokens.begin()));
  EXPECT_NE(late.tokens[3], stop_id);
  for (int i = 0; i < 12; ++i) EXPECT_NE(late.tokens[i], stop_id) << i;
  const auto stop_at = std::find(late.tokens.begin(), late.tokens.end(), stop_id);
  if (stop_at != late.tokens.end()) {
    EXPECT_EQ(stop_at + 1, late.tokens.end());  // it stops when the id comes after min_tokens
    EXPECT_EQ(late.final_event.finish_reason, FinishReason::kStop);
  } else {
    EXPECT_EQ(late.tokens.size(), 40u);
    EXPECT_EQ(late.final_event.finish_reason, FinishReason::kLength);
  }
  EXPECT_TRUE(testing::pools_back_to(**engine, free_at_start));
}

TEST_P(EngineSamplingControls, LogitBiasBansAndForcesTokens) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> free_at_start = testing::free_blocks(**engine);

  const Collected plain = run(**engine, greedy(24));
  ASSERT_FALSE(plain.tokens.empty());
  const int32_t banned_id = plain.tokens[0];
  Request banned = greedy(24);
  banned.sampling.logit_bias = {{banned_id, -100.0f}};
  const Collected without = run(**engine, banned);
  ASSERT_FALSE(without.tokens.empty());
  EXPECT_NE(without.tokens, plain.tokens);
  for (int32_t t : without.tokens) EXPECT_NE(t, banned_id);

  // +100 on one id makes it every token, sampled at temperature 1 too.
  Request forced = greedy(10);
  forced.sampling.temperature = 1.0f;
  forced.sampling.seed = 5;
  forced.sampling.logit_bias = {{300, 100.0f}};
  const Collected all = run(**engine, forced);
  EXPECT_EQ(all.tokens, std::vector<int32_t>(10, 300));
  EXPECT_TRUE(testing::pools_back_to(**engine, free_at_start));
}

TEST_P(EngineSamplingControls, BadValuesAreRefusedAtSubmit) {
  KVSPLIT_REQUIRE_MODELS();
  auto engine = Engine::create(testing::stories_config(GetParam()));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Request r = greedy(8);
  r.sampling.logit_bias = {{512, 1.0f}};  // stories260K's vocabulary is 512
  auto h = (*engine)->submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("logit_bias: token id 512 is not in [0, 512)"),
            std::string::npos)
      << h.status().message();
  r = greedy(8);
  r.sampling.min_tokens = 9;
  h = (*engine)->submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("min_tokens"), std::string::npos) << h.status().message();
  // A default max_tokens is raised to min_tokens, up to what the context leaves; past that the
  // error says so (not "max_tokens = 16", a value the client never sent).
  r = greedy(16);
  r.max_tokens_is_default = true;
  r.sampling.min_tokens = 600;  // stories260K's context is 512
  h = (*engine)->submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("min_tokens: 600 tokens cannot be generated: the model "
                                      "context of 512 leaves 508 after the prompt (5 tokens)"),
            std::string::npos)
      << h.status().message();
  r.sampling.min_tokens = 40;
  r.sampling.ignore_eos = true;
  const Collected raised = run(**engine, r);
  EXPECT_EQ(raised.tokens.size(), 40u);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineSamplingControls,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const auto& info) {
                           return info.param == ServingMode::kColocated ? "Colocated"
                                                                        : "Disaggregated";
                         });

}  // namespace
}  // namespace kvsplit
