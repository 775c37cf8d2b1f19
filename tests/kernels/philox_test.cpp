// Philox4x32-10 against Random123's published known-answer vectors, and the host reference of the
// GPU sampler as a sampler: its draws follow the renormalised kept distribution.
#include "kernels/common/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "sampling_reference.h"

namespace kvsplit::testing {
namespace {

using kernels::Philox4x32;

void expect_philox(Philox4x32 ctr, uint32_t k0, uint32_t k1, Philox4x32 want) {
  const Philox4x32 got = kernels::philox4x32_10(ctr, k0, k1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want.v[i]) << "word " << i;
}

TEST(Philox, Random123KnownAnswers) {
  expect_philox({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_philox({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
                {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_philox({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
                {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, SamplingBitsAreAPureFunctionOfSeedAndStep) {
  EXPECT_EQ(kernels::sampling_random_bits(7, 3), kernels::sampling_random_bits(7, 3));
  std::set<uint64_t> seen;
  for (uint64_t seed : {0ull, 1ull, 0x100000000ull, ~0ull})
    for (uint64_t step : {0ull, 1ull, 2ull, 0x100000000ull})
      seen.insert(kernels::sampling_random_bits(seed, step));
  EXPECT_EQ(seen.size(), 16u);  // seed and step words both reach the counter
}

TEST(Philox, MulHi) {
  EXPECT_EQ(kernels::mul_hi_u64(~0ull, ~0ull), ~0ull - 1);
  EXPECT_EQ(kernels::mul_hi_u64(1ull << 63, 10), 5u);
  EXPECT_EQ(kernels::mul_hi_u64(0, 12345), 0u);
}

// Empirical frequencies of the reference over many steps vs the expected kept distribution.
void expect_distribution(const std::vector<float>& logits, const kernels::SampleRowParams& base,
                         const std::vector<double>& want) {
  const int vocab = static_cast<int>(logits.size()), draws = 40000;
  std::vector<int> hits(vocab, 0);
  kernels::SampleRowParams p = base;
  for (int i = 0; i < draws; ++i) {
    p.step = static_cast<uint64_t>(i);
    const int32_t t = reference_sample(logits.data(), vocab, p);
    ASSERT_GE(t, 0);
    ASSERT_LT(t, vocab);
    ++hits[t];
  }
  for (int i = 0; i < vocab; ++i) {
    const double sigma = std::sqrt(draws * want[i] * (1 - want[i])) + 1;
    EXPECT_NEAR(hits[i], draws * want[i], 5 * sigma) << "token " << i;
  }
}

TEST(SamplingReference, FollowsTheKeptDistribution) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.1f)};
  kernels::SampleRowParams p;
  p.seed = 99;
  expect_distribution(logits, p, {0.4, 0.3, 0.2, 0.1});
  p.top_k = 2;  // renormalised over {0, 1}
  expect_distribution(logits, p, {4.0 / 7, 3.0 / 7, 0, 0});
  p.top_k = 0;
  p.top_p = 0.65f;  // 0.4 + 0.3 passes 0.65
  expect_distribution(logits, p, {4.0 / 7, 3.0 / 7, 0, 0});
  p.top_p = 1.f;
  p.min_p = 0.45f;  // keep p >= 0.18
  expect_distribution(logits, p, {4.0 / 9, 3.0 / 9, 2.0 / 9, 0});
  p.min_p = 0.f;
  p.temperature = 0.5f;  // p^2 renormalised: 16, 9, 4, 1 over 30
  expect_distribution(logits, p, {16.0 / 30, 9.0 / 30, 4.0 / 30, 1.0 / 30});
}

}  // namespace
}  // namespace kvsplit::testing
