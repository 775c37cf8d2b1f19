// StopChecker: EOS / ignore_eos, stop ids, stop strings across tokens, held-back text,
// max_new_tokens.
#include "sampling/stop.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace kvsplit::sampling {
namespace {

SamplingParams with_stop(std::vector<std::string> stop) {
  SamplingParams p;
  p.stop = std::move(stop);
  EXPECT_TRUE(p.validate().ok());
  return p;
}

// Feeds (token, delta) pairs until the checker finishes; returns the emitted text and reason.
struct Result {
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int steps = 0;
};
Result feed(StopChecker& c, const std::vector<std::pair<int32_t, std::string>>& tokens) {
  Result r;
  for (const auto& [id, delta] : tokens) {
    StopChecker::Step step = c.on_token(id, delta);
    r.text += step.text;
    ++r.steps;
    if (step.reason != FinishReason::kNone) {
      r.reason = step.reason;
      return r;
    }
  }
  r.text += c.flush();
  return r;
}

TEST(StopCheckerTest, EosStopsAndItsTextIsNotEmitted) {
  StopChecker c(SamplingParams{}, {2, 1}, 100);
  const Result r = feed(c, {{10, "Once"}, {11, " upon"}, {1, "\n<s>\n"}, {12, "never"}});
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "Once upon");
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(c.num_generated(), 3);
  EXPECT_TRUE(c.finished());
}

// Only a stop string says so (its caller then drops what its detokenizer still holds).
TEST(StopCheckerTest, OnlyAStopStringReportsStopString) {
  StopChecker strings(with_stop({"END"}), {2}, 100);
  EXPECT_FALSE(strings.on_token(10, "ab").stop_string);
  const StopChecker::Step s = strings.on_token(11, "cEND\xe2");
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_TRUE(s.stop_string);
  EXPECT_EQ(s.text, "c");  // "ab" went out with the first token
  StopChecker eos(with_stop({"END"}), {2}, 100);
  const StopChecker::Step e = eos.on_token(2, "");
  EXPECT_EQ(e.reason, FinishReason::kStop);
  EXPECT_FALSE(e.stop_string);
  StopChecker length(with_stop({"END"}), {2}, 1);
  const StopChecker::Step l = length.on_token(10, "x");
  EXPECT_EQ(l.reason, FinishReason::kLength);
  EXPECT_FALSE(l.stop_string);
}

TEST(StopCheckerTest, IgnoreEosRunsToLength) {
  SamplingParams p;
  p.ignore_eos = true;
  StopChecker c(p, {2}, 3);
  const Result r = feed(c, {{2, "a"}, {2, "b"}, {2, "c"}, {2, "d"}});
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.text, "abc");
  EXPECT_EQ(r.steps, 3);
}

TEST(StopCheckerTest, StopTokenIdsStopEvenWithIgnoreEos) {
  SamplingParams p;
  p.ignore_eos = true;
  p.stop_token_ids = {7};
  StopChecker c(p, {2}, 100);
  const Result r = feed(c, {{5, "x"}, {2, "y"}, {7, "STOP"}, {5, "z"}});
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "xy");
}

TEST(StopCheckerTest, MaxTokensGivesLength) {
  StopChecker c(SamplingParams{}, {2}, 2);
  const Result r = feed(c, {{5, "a"}, {6, "b"}, {7, "c"}});
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.text, "ab");
  EXPECT_EQ(r.steps, 2);
}

TEST(StopCheckerTest, EosOnTheLastAllowedTokenIsStop) {
  StopChecker c(SamplingParams{}, {2}, 2);
  const Result r = feed(c, {{5, "a"}, {2, "</s>"}});
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "a");
}

TEST(StopCheckerTest, StopStringInsideOneToken) {
  StopChecker c(with_stop({"END"}), {}, 100);
  const Result r = feed(c, {{1, "hello "}, {2, "worldENDmore"}});
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "hello world");
}

TEST(StopCheckerTest, StopStringSplitAcrossTokensIsNeverEmitted) {
  StopChecker c(with_stop({"\n\nThe"}), {}, 100);
  std::string emitted;
  auto step = c.on_token(1, "end.");
  emitted += step.text;
  EXPECT_EQ(step.text, "end.");
  step = c.on_token(2, "\n");
  EXPECT_EQ(step.text, "");  // "\n" may start the stop string
  step = c.on_token(3, "\nT");
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(step.reason, FinishReason::kNone);
  step = c.on_token(4, "he cat");
  EXPECT_EQ(step.reason, FinishReason::kStop);
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(c.flush(), "");
}

TEST(StopCheckerTest, HeldBackTextIsReleasedWhenItStopsMatching) {
  StopChecker c(with_stop({"stop"}), {}, 100);
  auto step = c.on_token(1, "a st");
  EXPECT_EQ(step.text, "a ");
  step = c.on_token(2, "o");
  EXPECT_EQ(step.text, "");
  step = c.on_token(3, "ry");
  EXPECT_EQ(step.text, "story");
  EXPECT_EQ(step.reason, FinishReason::kNone);
}

TEST(StopCheckerTest, OverlappingPrefixesHoldFromTheEarliestPossibleStart) {
  // "aab": after "xaa" the suffix "aa" may start "aab" -> hold "aa", emit "x".
  StopChecker c(with_stop({"aab"}), {}, 100);
  auto step = c.on_token(1, "xaa");
  EXPECT_EQ(step.text, "x");
  step = c.on_token(2, "a");  // "aaa": "aa" still may start it, the first 'a' is released
  EXPECT_EQ(step.text, "a");
  step = c.on_token(3, "b");  // "aab" -> stop
  EXPECT_EQ(step.reason, FinishReason::kStop);
  EXPECT_EQ(step.text, "");
}

TEST(StopCheckerTest, EarliestOfSeveralStopStringsWins) {
  StopChecker c(with_stop({"World", "lo W", "xyz"}), {}, 100);
  const Result r = feed(c, {{1, "Hel"}, {2, "lo"}, {3, " World"}});
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "Hel");
}

TEST(StopCheckerTest, LengthReleasesHeldText) {
  StopChecker c(with_stop({"stop"}), {}, 2);
  auto step = c.on_token(1, "go");
  EXPECT_EQ(step.text, "go");
  step = c.on_token(2, " st");
  EXPECT_EQ(step.reason, FinishReason::kLength);
  EXPECT_EQ(step.text, " st");
}

TEST(StopCheckerTest, EosReleasesHeldText) {
  StopChecker c(with_stop({"stop"}), {2}, 100);
  EXPECT_EQ(c.on_token(1, "a sto").text, "a ");
  auto step = c.on_token(2, "</s>");
  EXPECT_EQ(step.reason, FinishReason::kStop);
  EXPECT_EQ(step.text, "sto");
}

TEST(StopCheckerTest, FlushReturnsHeldTextOnce) {
  StopChecker c(with_stop({"abc"}), {}, 100);
  EXPECT_EQ(c.on_token(1, "xab").text, "x");
  EXPECT_EQ(c.flush(), "ab");
  EXPECT_EQ(c.flush(), "");
}

TEST(StopCheckerTest, MultiByteUtf8StopString) {
  StopChecker c(with_stop({"é!"}), {}, 100);  // "\xC3\xA9!"
  EXPECT_EQ(c.on_token(1, "caf\xC3").text, "caf");
  EXPECT_EQ(c.on_token(2, "\xA9").text, "");
  auto step = c.on_token(3, "!!");
  EXPECT_EQ(step.reason, FinishReason::kStop);
  EXPECT_EQ(step.text, "");
}

TEST(StopCheckerTest, NoStopConditionsStreamsEverythingImmediately) {
  StopChecker c(SamplingParams{}, {}, 1000);
  std::string all;
  for (int i = 0; i < 50; ++i) {
    auto step = c.on_token(i, "tok ");
    EXPECT_EQ(step.text, "tok ");
    EXPECT_EQ(step.reason, FinishReason::kNone);
  }
  EXPECT_EQ(c.flush(), "");
}

}  // namespace
}  // namespace kvsplit::sampling
