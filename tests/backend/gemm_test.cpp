// GEMM: accuracy against an fp64 reference, bitwise agreement with the reference-order scalar
// loop, and batch invariance across m, tiles, packing paths and thread counts.
#include "backend/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "common/thread_pool.h"

namespace kvsplit::backend::cpu {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct AlignedFloats {
  explicit AlignedFloats(int64_t n)
      : p(static_cast<float*>(
            std::aligned_alloc(64, std::max<int64_t>(64, (n * 4 + 63) / 64 * 64)))) {}
  ~AlignedFloats() { std::free(p); }
  float* p;
};

// out_ref[i, j] = sum_k x[i, k] w[j, k] (+ bias) (+ out0) in double.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                              int64_t n, int64_t k, const float* bias, const float* out0) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += double(x[i * k + kk]) * w[j * k + kk];
      if (bias) acc += bias[j];
      if (out0) acc += out0[i * n + j];
      out[i * n + j] = acc;
    }
  return out;
}

bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * 4) == 0;
}

struct Shape {
  int64_t m, n, k;
};

TEST(Gemm, MatchesFp64ReferenceAndScalarOrder) {
  ThreadPool pool(2);
  const Shape shapes[] = {{1, 1, 1},     {1, 7, 3},     {2, 65, 17},  {3, 64, 16},
                          {5, 130, 100}, {6, 129, 257}, {7, 31, 33},  {11, 200, 65},
                          {17, 67, 129}, {13, 1, 1000}, {1, 301, 768}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool use_bias = variant & 1;
      const bool accumulate = variant & 2;
      SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                        << " bias=" << use_bias << " acc=" << accumulate);
      auto x = random_vec(s.m * s.k, seed++);
      auto w = random_vec(s.n * s.k, seed++);
      auto bias = random_vec(s.n, seed++);
      auto out0 = random_vec(s.m * s.n, seed++);
      const float* b = use_bias ? bias.data() : nullptr;

      AlignedFloats packed(packed_size(s.n, s.k));
      pack_matrix(w.data(), DType::kF32, s.n, s.k, packed.p, &pool);
      std::vector<float> got = out0;
      gemm(x.data(), s.m, GemmWeights{packed.p, nullptr, DType::kF32, s.n, s.k}, b, got.data(),
           accumulate, pool);

      auto ref = reference(x, w, s.m, s.n, s.k, b, accumulate ? out0.data() : nullptr);
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        ASSERT_NEAR(got[i], ref[i], 1e-5 * (std::sqrt(double(s.k)) + 2)) << "element " << i;
      }
      // Same per-element order as the scalar loop: bitwise equal.
      std::vector<float> scalar = out0;
      gemm_scalar_rowmajor(x.data(), s.m, w.data(), s.n, s.k, b, scalar.data(), accumulate);
      ASSERT_TRUE(bitwise_equal(got.data(), scalar.data(), got.size()));
      // Unpacked (raw row-major) weights take the on-the-fly packing path: same bits.
      std::vector<float> raw = out0;
      gemm(x.data(), s.m, GemmWeights{nullptr, w.data(), DType::kF32, s.n, s.k}, b, raw.data(),
           accumulate, pool);
      ASSERT_TRUE(bitwise_equal(got.data(), raw.data(), got.size()));
    }
  }
}

TEST(Gemm, BatchInvariantAcrossMAndThreads) {
  const int64_t n = 197, k = 333, big_m = 37;
  auto x = random_vec(big_m * k, 11);
  auto w = random_vec(n * k, 12);
  auto bias = random_vec(n, 13);
  AlignedFloats packed(packed_size(n, k));
  pack_matrix(w.data(), DType::kF32, n, k, packed.p, nullptr);
  const GemmWeights gw{packed.p, nullptr, DType::kF32, n, k};

  ThreadPool pool1(1);
  std::vector<float> all(big_m * n);
  gemm(x.data(), big_m, gw, bias.data(), all.data(), false, pool1);
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    std::vector<float> batch(big_m * n);
    gemm(x.data(), big_m, gw, bias.data(), batch.data(), false, pool);
    ASSERT_TRUE(bitwise_equal(all.data(), batch.data(), all.size())) << threads << " threads";
    for (int64_t r = 0; r < big_m; ++r) {
      // Row r alone (m = 1) and inside a sub-batch starting at r (other tile offsets).
      std::vector<float> one(n), sub((std::min<int64_t>(big_m - r, 4)) * n);
      gemm(x.data() + r * k, 1, gw, bias.data(), one.data(), false, pool);
      ASSERT_TRUE(bitwise_equal(one.data(), all.data() + r * n, n)) << "row " << r;
      gemm(x.data() + r * k, sub.size() / n, gw, bias.data(), sub.data(), false, pool);
      ASSERT_TRUE(bitwise_equal(sub.data(), all.data() + r * n, n)) << "row " << r;
    }
  }
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);  // truncation: exact bf16 values for the test
}

TEST(Gemm, HalfPrecisionWeightsConvertExactly) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);

  const int64_t m = 3, n = 45, k = 70;
  auto x = random_vec(m * k, 21);
  auto wf = random_vec(n * k, 22);
  std::vector<uint16_t> wb(n * k);
  std::vector<float> wb_f(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    wb[i] = to_bf16(wf[i]);
    wb_f[i] = bf16_to_f32(wb[i]);
  }
  ThreadPool pool(2);
  std::vector<float> got(m * n), want(m * n), raw(m * n);
  AlignedFloats packed(packed_size(n, k));
  pack_matrix(wb.data(), DType::kBF16, n, k, packed.p, &pool);
  gemm(x.data(), m, GemmWeights{packed.p, nullptr, DType::kF32, n, k}, nullptr, got.data(), false,
       pool);
  gemm(x.data(), m, GemmWeights{nullptr, wb.data(), DType::kBF16, n, k}, nullptr, raw.data(), false,
       pool);
  gemm_scalar_rowmajor(x.data(), m, wb_f.data(), n, k, nullptr, want.data(), false);
  EXPECT_TRUE(bitwise_equal(got.data(), want.data(), got.size()));
  EXPECT_TRUE(bitwise_equal(raw.data(), want.data(), got.size()));
}

// 16-bit packed panels (kept bf16/f16): read directly for one tile (m <= kGemmMr), widened once
// for several; both bit-identical to the f32 scalar order, and batch invariant.
TEST(Gemm, PackedHalfPanelsBatchInvariant) {
  const int64_t n = 150, k = 77, big_m = 23;
  auto x = random_vec(big_m * k, 41);
  std::vector<uint16_t> wb(n * k), wh(n * k);
  std::vector<float> wb_f(n * k), wh_f(n * k);
  std::mt19937 rng(42);
  for (int64_t i = 0; i < n * k; ++i) {
    // Magnitudes in [0.25, 2) with random sign and mantissa.
    wb[i] = static_cast<uint16_t>((rng() & 0x8000) | (0x3e80 + rng() % 0x0180));
    wh[i] = static_cast<uint16_t>((rng() & 0x8000) | (0x3400 + rng() % 0x0c00));
    wb_f[i] = bf16_to_f32(wb[i]);
    wh_f[i] = f16_to_f32(wh[i]);
  }
  auto bias = random_vec(n, 43);
  auto out0 = random_vec(big_m * n, 44);
  ThreadPool pool(3);
  struct Case {
    DType dt;
    const uint16_t* w;
    const std::vector<float>* wf;
  };
  for (const Case& c :
       {Case{DType::kBF16, wb.data(), &wb_f}, Case{DType::kF16, wh.data(), &wh_f}}) {
    std::vector<uint16_t> packed(packed_size(n, k) + 32);
    uint16_t* p =
        reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(packed.data()) + 63) / 64 * 64);
    pack_matrix(c.w, c.dt, n, k, p, c.dt, &pool);
    const GemmWeights gw{p, nullptr, c.dt, n, k};
    std::vector<float> want = out0;
    gemm_scalar_rowmajor(x.data(), big_m, c.wf->data(), n, k, bias.data(), want.data(), true);
    for (int64_t m : {int64_t{1}, int64_t{4}, int64_t{kGemmMr}, int64_t{kGemmMr + 1}, big_m}) {
      std::vector<float> got(out0.begin(), out0.begin() + m * n);
      gemm(x.data(), m, gw, bias.data(), got.data(), true, pool);
      ASSERT_TRUE(bitwise_equal(got.data(), want.data(), got.size()))
          << dtype_name(c.dt) << " m=" << m;
    }
  }
}

TEST(Gemm, ZeroKGivesBias) {
  ThreadPool pool(2);
  std::vector<float> bias = {1.f, 2.f, 3.f}, out(6, 7.f);
  gemm(nullptr, 2, GemmWeights{nullptr, nullptr, DType::kF32, 3, 0}, bias.data(), out.data(), false,
       pool);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

// Through the Backend interface: upload_matrix (packed, f32/f16/bf16) and gemm on plain views.
TEST(CpuBackendGemm, UploadedAndPlainViewsAgree) {
  auto be = make_cpu_backend(2);
  const int m = 9, n = 77, k = 96;
  auto x = random_vec(m * k, 31);
  auto w = random_vec(n * k, 32);
  auto bias = random_vec(n, 33);
  auto up = be->upload_matrix(w.data(), DType::kF32, n, k);
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  std::vector<float> a(m * n), b(m * n), want(m * n);
  ASSERT_TRUE(be->gemm(x.data(), m, *up, bias.data(), a.data(), false).ok());
  ASSERT_TRUE(
      be->gemm(x.data(), m, MatrixView{w.data(), DType::kF32, n, k}, bias.data(), b.data(), false)
          .ok());
  gemm_scalar_rowmajor(x.data(), m, w.data(), n, k, bias.data(), want.data(), false);
  EXPECT_TRUE(bitwise_equal(a.data(), want.data(), a.size()));
  EXPECT_TRUE(bitwise_equal(b.data(), want.data(), b.size()));

  std::vector<uint16_t> wh(n * k);
  std::vector<float> wh_f(n * k);
  for (int64_t i = 0; i < n * k; ++i) {  // f16 of 1 + small multiples of 2^-10: exact
    wh[i] = static_cast<uint16_t>(0x3c00 + (i * 37) % 1024);
    wh_f[i] = f16_to_f32(wh[i]);
  }
  auto uph = be->upload_matrix(wh.data(), DType::kF16, n, k);
  ASSERT_TRUE(uph.ok());
  EXPECT_EQ(uph->dtype, DType::kF16);  // kept 16-bit, widened exactly inside gemm
  ASSERT_TRUE(be->gemm(x.data(), m, *uph, nullptr, a.data(), false).ok());
  gemm_scalar_rowmajor(x.data(), m, wh_f.data(), n, k, nullptr, want.data(), false);
  EXPECT_TRUE(bitwise_equal(a.data(), want.data(), a.size()));

  EXPECT_EQ(be->gemm(x.data(), -1, *up, nullptr, a.data(), false).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(be->gemm(x.data(), m, *up, nullptr, nullptr, false).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(be->upload_matrix(nullptr, DType::kF32, 3, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(be->upload_matrix(w.data(), DType::kF32, -1, 3).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::backend::cpu
