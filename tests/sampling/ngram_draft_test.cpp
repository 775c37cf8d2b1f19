// propose_ngram_draft (speculative decoding's prompt lookup): longest suffix first, latest
// occurrence, overlapping copies, the bounds, and a brute-force oracle over random sequences.
#include "sampling/ngram_draft.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kvsplit::sampling {
namespace {

std::vector<int32_t> draft(const std::vector<int32_t>& tokens, int k, int min_n, int max_n) {
  std::vector<int32_t> out = {99, 99};  // cleared by the call
  propose_ngram_draft(tokens, NgramDraftConfig{k, min_n, max_n}, &out);
  return out;
}

TEST(NgramDraft, ProposesWhatFollowedTheSuffixEarlier) {
  // "... 1 2 3 4 5 ... 1 2" -> 3 4 5
  EXPECT_EQ(draft({1, 2, 3, 4, 5, 9, 1, 2}, 3, 1, 3), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(draft({1, 2, 3, 4, 5, 9, 1, 2}, 2, 1, 3), (std::vector<int32_t>{3, 4}));
}

TEST(NgramDraft, TheLongestSuffixWinsOverARecentShorterOne) {
  // Suffix "7 8": its only earlier occurrence is at the start (-> 1); "8" alone occurs later too
  // (-> 5), which a 1-gram lookup would take.
  const std::vector<int32_t> t = {7, 8, 1, 2, 8, 5, 7, 8};
  EXPECT_EQ(draft(t, 1, 1, 2), (std::vector<int32_t>{1}));
  EXPECT_EQ(draft(t, 1, 1, 1), (std::vector<int32_t>{5}));
}

TEST(NgramDraft, TheLatestOccurrenceWins) {
  EXPECT_EQ(draft({4, 1, 4, 2, 4}, 1, 1, 1), (std::vector<int32_t>{2}));
}

TEST(NgramDraft, NothingWithoutAnEarlierOccurrenceOfMinN) {
  EXPECT_TRUE(draft({1, 2, 3, 4}, 4, 1, 4).empty());
  EXPECT_TRUE(draft({1, 2, 9, 2}, 4, 2, 4).empty());  // "2" occurs, "9 2" does not
  EXPECT_FALSE(draft({1, 2, 9, 2}, 4, 1, 4).empty());
  EXPECT_TRUE(draft({5}, 4, 1, 4).empty());
  EXPECT_TRUE(draft({}, 4, 1, 4).empty());
}

TEST(NgramDraft, ALoopIsCopiedOnIntoTheDraft) {
  // Period 2: "a b a b" -> a b a b a (the copy runs past the end of the sequence).
  EXPECT_EQ(draft({3, 1, 2, 1, 2}, 5, 1, 2), (std::vector<int32_t>{1, 2, 1, 2, 1}));
  // Period 1.
  EXPECT_EQ(draft({6, 6, 6}, 3, 1, 4), (std::vector<int32_t>{6, 6, 6}));
}

// Brute force: for n from max_n down, the latest e < len - 1 with tokens[e-n+1..e] equal to the
// suffix; the draft is the sequence continued by copying from e + 1.
std::vector<int32_t> oracle(const std::vector<int32_t>& t, int k, int min_n, int max_n) {
  const int len = static_cast<int>(t.size());
  for (int n = max_n; n >= min_n; --n) {
    if (n > len - 1) continue;
    for (int e = len - 2; e >= n - 1; --e) {
      bool eq = true;
      for (int i = 0; i < n; ++i) eq = eq && t[e - i] == t[len - 1 - i];
      if (!eq) continue;
      std::vector<int32_t> ext = t;
      for (int i = 0; i < k; ++i) ext.push_back(ext[e + 1 + i]);
      return std::vector<int32_t>(ext.begin() + len, ext.end());
    }
  }
  return {};
}

TEST(NgramDraft, MatchesABruteForceOracle) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    const int len = static_cast<int>(rng() % 40);
    const int alphabet = 2 + static_cast<int>(rng() % 5);
    std::vector<int32_t> t(len);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % alphabet);
    const int k = 1 + static_cast<int>(rng() % 6);
    const int min_n = 1 + static_cast<int>(rng() % 3);
    const int max_n = min_n + static_cast<int>(rng() % 4);
    ASSERT_EQ(draft(t, k, min_n, max_n), oracle(t, k, min_n, max_n))
        << "iter " << iter << " len " << len << " k " << k << " n " << min_n << ".." << max_n;
  }
}

TEST(DraftAcceptance, LengthFollowsTheAcceptedRuns) {
  DraftAcceptance a;
  EXPECT_EQ(a.length(8), 3);  // prior 2/3: a run of 2 expected
  EXPECT_EQ(a.length(1), 1);
  for (int i = 0; i < 20; ++i) a.observe(6, 6, false);  // every draft accepted
  EXPECT_GT(a.rate(), 0.95);
  EXPECT_EQ(a.length(8), 8);
  for (int i = 0; i < 60; ++i) a.observe(8, 0, true);  // every first draft token rejected
  EXPECT_LT(a.rate(), 0.1);
  EXPECT_EQ(a.length(8), 1);  // never 0: one token keeps probing
  a.observe(0, 0, true);      // nothing drafted: no change
  EXPECT_EQ(a.length(8), 1);
  // Half of the tokens accepted: runs of 1 expected, 2 drafted.
  DraftAcceptance half;
  for (int i = 0; i < 40; ++i) half.observe(4, 1, true);
  EXPECT_NEAR(half.rate(), 0.5, 0.05);
  EXPECT_EQ(half.length(8), 2);
  // A finish inside the draft is no rejection.
  DraftAcceptance end;
  for (int i = 0; i < 20; ++i) end.observe(4, 2, false);
  EXPECT_EQ(end.length(8), 8);
}

}  // namespace
}  // namespace kvsplit::sampling
