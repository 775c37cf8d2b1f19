// compute_logprobs against a long-double reference.
#include "sampling/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace kvsplit::sampling {
namespace {

std::vector<long double> reference_logprobs(const std::vector<float>& logits) {
  long double mx = logits[0];
  for (float l : logits) mx = std::max<long double>(mx, l);
  long double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<long double>(l) - mx);
  std::vector<long double> out;
  for (float l : logits) out.push_back(static_cast<long double>(l) - mx - std::log(sum));
  return out;
}

TEST(LogprobsTest, MatchesLongDoubleReference) {
  std::mt19937_64 rng(17);
  for (int vocab : {1, 2, 512, 32000, 128 * 1024}) {
    std::normal_distribution<float> normal(0.0f, 5.0f);
    std::vector<float> logits(vocab);
    for (float& x : logits) x = normal(rng) + 20.0f;  // large offset: needs the max shift
    const auto ref = reference_logprobs(logits);
    for (int32_t token : {0, vocab / 2, vocab - 1}) {
      float lp = 0.0f;
      compute_logprobs(logits.data(), vocab, token, 0, &lp, nullptr);
      EXPECT_NEAR(lp, static_cast<double>(ref[token]), 1e-5 + 1e-6 * std::fabs(lp))
          << "vocab " << vocab << " token " << token;
      EXPECT_LE(lp, 0.0f);
    }
  }
}

TEST(LogprobsTest, KnownDistribution) {
  // log-softmax of log(p) is log(p).
  std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};
  for (int t = 0; t < 4; ++t) {
    float lp = 0.0f;
    compute_logprobs(logits.data(), 4, t, 0, &lp, nullptr);
    EXPECT_NEAR(lp, logits[t], 1e-6);
  }
}

TEST(LogprobsTest, TopNDescendingLowerIdOnTies) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 2.0f};
  std::vector<std::pair<int32_t, float>> top = {{99, 0.0f}};  // cleared first
  float lp = 0.0f;
  compute_logprobs(logits.data(), 6, 4, 4, &lp, &top);
  const auto ref = reference_logprobs(logits);
  ASSERT_EQ(top.size(), 4u);
  const int32_t want[] = {1, 3, 2, 5};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(top[i].first, want[i]);
    EXPECT_NEAR(top[i].second, static_cast<double>(ref[want[i]]), 1e-6);
  }
  EXPECT_NEAR(lp, static_cast<double>(ref[4]), 1e-6);
  // top_n larger than the vocab returns the whole vocab; top_n 0 returns nothing.
  compute_logprobs(logits.data(), 6, 0, 100, nullptr, &top);
  EXPECT_EQ(top.size(), 6u);
  EXPECT_EQ(top.back().first, 4);
  compute_logprobs(logits.data(), 6, 0, 0, nullptr, &top);
  EXPECT_TRUE(top.empty());
}

TEST(LogprobsTest, TopNOnLargeVocabMatchesFullSort) {
  const int vocab = 50000;
  std::mt19937_64 rng(23);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = std::round(normal(rng) * 8.0f) / 8.0f;  // many ties
  std::vector<int32_t> ids(vocab);
  for (int i = 0; i < vocab; ++i) ids[i] = i;
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<std::pair<int32_t, float>> top;
  compute_logprobs(logits.data(), vocab, 0, 20, nullptr, &top);
  ASSERT_EQ(top.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top[i].first, ids[i]) << i;
}

TEST(LogprobsTest, NonFiniteLogitsDoNotCrash) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {0.0f, nan, 1.0f, -inf};
  std::vector<std::pair<int32_t, float>> top;
  float lp = 0.0f;
  compute_logprobs(logits.data(), 4, 3, 4, &lp, &top);
  ASSERT_EQ(top.size(), 4u);
  EXPECT_EQ(top.back().first, 1);  // NaN sorts last
  std::vector<float> masked = {-inf, 0.0f, -inf};
  compute_logprobs(masked.data(), 3, 0, 0, &lp, nullptr);
  EXPECT_EQ(lp, -inf);
  compute_logprobs(masked.data(), 3, 1, 0, &lp, nullptr);
  EXPECT_EQ(lp, 0.0f);
}

// A NaN entry has probability 0 (as in the sampler): the others still form a distribution
// (before, one NaN made every log-probability of the row NaN).
TEST(LogprobsTest, NaNEntriesAreLeftOutOfTheNormalizer) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits = {0.0f, nan, 0.0f};
  std::vector<std::pair<int32_t, float>> top;
  float lp = 0.0f;
  compute_logprobs(logits.data(), 3, 2, 2, &lp, &top);
  EXPECT_NEAR(lp, std::log(0.5), 1e-6);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 0);
  EXPECT_NEAR(top[0].second, std::log(0.5), 1e-6);
  EXPECT_EQ(top[1].first, 2);
  std::vector<float> all_nan = {nan, nan};
  compute_logprobs(all_nan.data(), 2, 0, 0, &lp, nullptr);
  EXPECT_TRUE(std::isnan(lp));
}

// The log-normalizer is kept in double: a token at probability 1 - 5e-11 reads its tiny negative
// logprob, not a float-rounded 0 (the engine's old copy of this function summed to a float).
TEST(LogprobsTest, ANearCertainTokenKeepsItsTinyLogprob) {
  std::vector<float> logits(512, 0.0f);
  logits[0] = 30.0f;
  float lp = 0.0f;
  compute_logprobs(logits.data(), 512, 0, 0, &lp, nullptr);
  EXPECT_LT(lp, 0.0f);
  EXPECT_GT(lp, -1e-10f);
}

}  // namespace
}  // namespace kvsplit::sampling
