// The f32 SIMD vector of the CPU attention (attention_tile.h, quant_keys.h): the widest one the
// compiler targets (AVX-512F 16 lanes, AVX2+FMA 8 lanes, else scalar; no runtime dispatch, as
// simd.h), with the softmax helpers the tile fold needs (a vector exp, lane masks, horizontal max)
// and sum_lanes, the transposed reduction of up to kWidth accumulators in one pass.
// Internal: include only from src/backend/cpu/.
#pragma once

#include <math.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// For the small helpers of the inner loops (GCC otherwise leaves some out of line, and the
// accumulator arrays they take then go through memory).
#define KVSPLIT_ALWAYS_INLINE inline __attribute__((always_inline))

namespace kvsplit::backend::cpu_attention {

// exp(r) for |r| <= ln2 / 2: Taylor series to r^7 (truncation below 2^-27 relative), Horner.
template <typename V>
inline V exp_reduced(V r) {
  V p = V::set1(1.f / 5040.f);
  p = V::fma(p, r, V::set1(1.f / 720.f));
  p = V::fma(p, r, V::set1(1.f / 120.f));
  p = V::fma(p, r, V::set1(1.f / 24.f));
  p = V::fma(p, r, V::set1(1.f / 6.f));
  p = V::fma(p, r, V::set1(0.5f));
  p = V::fma(p, r, V::set1(1.f));
  return V::fma(p, r, V::set1(1.f));
}

// Cody-Waite split of ln 2 (the high part has 9 significant bits, so n * kLn2Hi is exact).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;

#if defined(__AVX512F__)
// All lanes. The zero-masked forms of the intrinsics are used throughout because GCC 12's
// unmasked forms trip -Wmaybe-uninitialized inside its own header.
constexpr __mmask16 kAll = 0xFFFF;

struct Vec {
  static constexpr int kWidth = 16;
  __m512 v;
  static Vec zero() { return {_mm512_setzero_ps()}; }
  static Vec set1(float x) { return {_mm512_set1_ps(x)}; }
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  static Vec add(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
  static Vec sub(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
  static Vec mul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
  // max_ps returns its second operand when either is NaN.
  static Vec max(Vec a, Vec b) { return {_mm512_maskz_max_ps(kAll, a.v, b.v)}; }
  // Lanes [0, n) of a, the others of b (any n).
  static Vec first(int n, Vec a, Vec b) {
    const __mmask16 m = n >= 16 ? 0xFFFF : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
    return {_mm512_mask_blend_ps(m, b.v, a.v)};
  }
  // x[0 .. 2 kWidth) as a = x[0 ..), b = x[kWidth ..) -> even = x[0], x[2], ..., odd = x[1], ...
  static void deinterleave(Vec a, Vec b, Vec* even, Vec* odd) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    even->v = _mm512_maskz_permutex2var_ps(kAll, a.v, ie, b.v);
    odd->v = _mm512_maskz_permutex2var_ps(kAll, a.v, io, b.v);
  }
  // The inverse of deinterleave.
  static void interleave(Vec even, Vec odd, Vec* a, Vec* b) {
    const __m512i ia = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ib =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    a->v = _mm512_maskz_permutex2var_ps(kAll, even.v, ia, odd.v);
    b->v = _mm512_maskz_permutex2var_ps(kAll, even.v, ib, odd.v);
  }
  // e^x within 2 ulp for x in [-87.3, 88.7]; 0 (or a denormal) below, NaN stays NaN.
  static Vec exp(Vec x) {
    const __m512 xc = _mm512_maskz_max_ps(kAll, _mm512_set1_ps(-104.f), x.v);  // NaN x stays NaN
    const __m512 n = _mm512_maskz_roundscale_ps(kAll, _mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    return {_mm512_maskz_scalef_ps(kAll, exp_reduced(Vec{r}).v, n)};
  }
  // Horizontal sum. Written with the explicit-source mask forms because GCC 12's
  // _mm512_reduce_add_ps trips -Wuninitialized inside its own header. Tree:
  // ((x_i + x_{i+8}) + (.. + x_{i+12})) ..., the same per lane as sum_lanes.
  float sum() const {
    const __m512 h = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0x4E));
    const __m256 q = _mm256_castpd_ps(
        _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xFF, _mm512_castps_pd(h), 0));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  float max_lane() const {
    const __m512 h = _mm512_maskz_max_ps(kAll, v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0x4E));
    const __m256 q = _mm256_castpd_ps(
        _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xFF, _mm512_castps_pd(h), 0));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

// Lane i of the result = a[i].sum(), bitwise (the same tree per lane), for 16 vectors.
KVSPLIT_ALWAYS_INLINE Vec sum_lanes(const Vec* a) {
  // Four transposing add steps leave lane 4m + n holding the sum of input 4n + m, so the inputs
  // go in transposed: b[4n + m] = a[4m + n].
  __m512 b[16];
  for (int m = 0; m < 4; ++m) {
    for (int n = 0; n < 4; ++n) b[4 * n + m] = a[4 * m + n].v;
  }
  __m512 c[8];
  for (int i = 0; i < 8; ++i) {
    c[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll, b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_maskz_shuffle_f32x4(kAll, b[2 * i], b[2 * i + 1], 0xEE));
  }
  __m512 e[4];
  for (int j = 0; j < 4; ++j) {
    e[j] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll, c[2 * j], c[2 * j + 1], 0x88),
                         _mm512_maskz_shuffle_f32x4(kAll, c[2 * j], c[2 * j + 1], 0xDD));
  }
  __m512 g[2];
  for (int k = 0; k < 2; ++k) {
    g[k] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll, e[2 * k], e[2 * k + 1]),
                         _mm512_maskz_unpackhi_ps(kAll, e[2 * k], e[2 * k + 1]));
  }
  return {_mm512_add_ps(_mm512_maskz_shuffle_ps(kAll, g[0], g[1], 0x44),
                        _mm512_maskz_shuffle_ps(kAll, g[0], g[1], 0xEE))};
}
#elif defined(__AVX2__) && defined(__FMA__)
struct Vec {
  static constexpr int kWidth = 8;
  __m256 v;
  static Vec zero() { return {_mm256_setzero_ps()}; }
  static Vec set1(float x) { return {_mm256_set1_ps(x)}; }
  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static Vec add(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
  static Vec sub(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
  static Vec mul(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
  static Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
  static Vec first(int n, Vec a, Vec b) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
    return {_mm256_blendv_ps(b.v, a.v, _mm256_castsi256_ps(m))};
  }
  static void deinterleave(Vec a, Vec b, Vec* even, Vec* odd) {
    // shuffle_ps works within 128-bit lanes: [a0 a2 b0 b2 | a4 a6 b4 b6], then 64-bit pairs 0 2
    // 1 3.
    even->v = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a.v, b.v, 0x88)), 0xD8));
    odd->v = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a.v, b.v, 0xDD)), 0xD8));
  }
  static void interleave(Vec even, Vec odd, Vec* a, Vec* b) {
    const __m256 lo = _mm256_unpacklo_ps(even.v, odd.v);  // [e0 o0 e1 o1 | e4 o4 e5 o5]
    const __m256 hi = _mm256_unpackhi_ps(even.v, odd.v);  // [e2 o2 e3 o3 | e6 o6 e7 o7]
    a->v = _mm256_permute2f128_ps(lo, hi, 0x20);
    b->v = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
  // e^x within 2 ulp for x in [-87.3, 88.7]; 0 below, NaN stays NaN.
  static Vec exp(Vec x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);  // ln(FLT_MIN)
    const __m256 xc = _mm256_max_ps(lo, x.v);      // NaN x stays NaN
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(exp_reduced(Vec{r}).v, _mm256_castsi256_ps(e));
    return {_mm256_andnot_ps(_mm256_cmp_ps(x.v, lo, _CMP_LT_OQ), y)};  // below: 0
  }
  // Tree ((x_i + x_{i+4}) + ...), the same per lane as sum_lanes.
  float sum() const {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  float max_lane() const {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

// Lane i of the result = a[i].sum(), bitwise, for 8 vectors.
KVSPLIT_ALWAYS_INLINE Vec sum_lanes(const Vec* a) {
  // Three transposing add steps leave lane 4h + n holding the sum of input 2n + h.
  __m256 b[8];
  for (int h = 0; h < 2; ++h) {
    for (int n = 0; n < 4; ++n) b[2 * n + h] = a[4 * h + n].v;
  }
  __m256 c[4];
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm256_add_ps(_mm256_permute2f128_ps(b[2 * i], b[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(b[2 * i], b[2 * i + 1], 0x31));
  }
  __m256 g[2];
  for (int k = 0; k < 2; ++k) {
    g[k] = _mm256_add_ps(_mm256_unpacklo_ps(c[2 * k], c[2 * k + 1]),
                         _mm256_unpackhi_ps(c[2 * k], c[2 * k + 1]));
  }
  return {_mm256_add_ps(_mm256_shuffle_ps(g[0], g[1], 0x44), _mm256_shuffle_ps(g[0], g[1], 0xEE))};
}
#else
struct Vec {
  static constexpr int kWidth = 1;
  float v;
  static Vec zero() { return {0.f}; }
  static Vec set1(float x) { return {x}; }
  static Vec load(const float* p) { return {*p}; }
  void store(float* p) const { *p = v; }
  static Vec fma(Vec a, Vec b, Vec c) { return {a.v * b.v + c.v}; }
  static Vec add(Vec a, Vec b) { return {a.v + b.v}; }
  static Vec sub(Vec a, Vec b) { return {a.v - b.v}; }
  static Vec mul(Vec a, Vec b) { return {a.v * b.v}; }
  static Vec max(Vec a, Vec b) { return {a.v > b.v ? a.v : b.v}; }
  static Vec first(int n, Vec a, Vec b) { return n > 0 ? a : b; }
  static void deinterleave(Vec a, Vec b, Vec* even, Vec* odd) { *even = a, *odd = b; }
  static void interleave(Vec even, Vec odd, Vec* a, Vec* b) { *a = even, *b = odd; }
  static Vec exp(Vec x) { return {expf(x.v)}; }
  float sum() const { return v; }
  float max_lane() const { return v; }
};

KVSPLIT_ALWAYS_INLINE Vec sum_lanes(const Vec* a) { return a[0]; }
#endif
constexpr int kW = Vec::kWidth;

}  // namespace kvsplit::backend::cpu_attention
