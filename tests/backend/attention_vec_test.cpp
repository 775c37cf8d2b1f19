// The SIMD helpers of the CPU attention fold (src/backend/cpu/attention_vec.h), for the vector
// width this build targets: sum_lanes equals Vec::sum lane by lane bitwise (the scoring side
// outputs rely on the fold and the rescoring getting the same bits), Vec::exp against std::exp,
// Vec::first and max_lane, the even/odd channel shuffles of the int4 path.
#include "backend/cpu/attention_vec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace kvsplit::backend::cpu_attention {
namespace {

TEST(CpuAttentionVec, SumLanesIsVecSumPerLaneBitwise) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<float> x(static_cast<size_t>(kW) * kW);
    for (float& v : x) v = u(rng) * std::ldexp(1.f, static_cast<int>(rng() % 40) - 20);
    Vec a[kW];
    for (int i = 0; i < kW; ++i) a[i] = Vec::load(x.data() + i * kW);
    float got[kW];
    if constexpr (kW == 1) {
      got[0] = a[0].sum();
    } else {
      sum_lanes(a).store(got);
    }
    for (int i = 0; i < kW; ++i) ASSERT_EQ(got[i], a[i].sum()) << "lane " << i;
  }
}

TEST(CpuAttentionVec, ExpIsWithinTwoUlpAndUnderflowsToZero) {
  std::vector<float> x;
  for (float v = -87.f; v <= 0.f; v += 0.0137f) x.push_back(v);
  for (float v : {0.f, -0.f, -1e-30f, -0.5f * std::log(2.f), -std::log(2.f), -1.f, -87.3f}) {
    x.push_back(v);
  }
  while (x.size() % kW) x.push_back(0.f);
  for (size_t i = 0; i < x.size(); i += kW) {
    float y[kW];
    Vec::exp(Vec::load(x.data() + i)).store(y);
    for (int j = 0; j < kW; ++j) {
      const double want = std::exp(static_cast<double>(x[i + j]));
      const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
      ASSERT_LE(std::abs(y[j] - want), 2 * ulp) << "exp(" << x[i + j] << ")";
    }
  }
  // Far below the normal range: 0 or a denormal, never negative, inf or NaN.
  for (float v : {-88.f, -100.f, -200.f, -1e30f, -std::numeric_limits<float>::infinity()}) {
    float y[kW];
    Vec::exp(Vec::set1(v)).store(y);
    EXPECT_GE(y[0], 0.f) << v;
    EXPECT_LT(y[0], 1.2e-38f) << v;
  }
  float y[kW];
  Vec::exp(Vec::set1(std::numeric_limits<float>::quiet_NaN())).store(y);
  EXPECT_TRUE(std::isnan(y[0]));
}

TEST(CpuAttentionVec, FirstAndMaxLane) {
  float x[kW], y[kW];
  for (int i = 0; i < kW; ++i) x[i] = static_cast<float>(i % 5) - 2.f;
  for (int n = -1; n <= kW + 1; ++n) {
    Vec::first(n, Vec::load(x), Vec::set1(-9.f)).store(y);
    for (int i = 0; i < kW; ++i) ASSERT_EQ(y[i], i < n ? x[i] : -9.f) << n << " " << i;
  }
  float mx = x[0];
  for (int i = 1; i < kW; ++i) mx = std::max(mx, x[i]);
  EXPECT_EQ(Vec::load(x).max_lane(), mx);
}

TEST(CpuAttentionVec, DeinterleaveSplitsEvenAndOddChannelsAndInterleaveUndoesIt) {
  float x[2 * kW], e[kW], o[kW], a[kW], b[kW];
  for (int i = 0; i < 2 * kW; ++i) x[i] = static_cast<float>(i) + 0.5f;
  Vec ve, vo, va, vb;
  Vec::deinterleave(Vec::load(x), Vec::load(x + kW), &ve, &vo);
  ve.store(e);
  vo.store(o);
  for (int i = 0; i < kW; ++i) {
    ASSERT_EQ(e[i], x[2 * i]) << i;
    ASSERT_EQ(o[i], x[2 * i + 1]) << i;
  }
  Vec::interleave(ve, vo, &va, &vb);
  va.store(a);
  vb.store(b);
  for (int i = 0; i < kW; ++i) {
    ASSERT_EQ(a[i], x[i]) << i;
    ASSERT_EQ(b[i], x[kW + i]) << i;
  }
}

}  // namespace
}  // namespace kvsplit::backend::cpu_attention
