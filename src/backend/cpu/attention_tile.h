// Internal to the CPU attention (attention.cpp, attention_mixed.cpp): the SIMD vector, the tile
// fold (scores, online softmax, P.V) over a key source (K/V row pointers here, quantized pages in
// quant_keys.h), per-thread scratch, and the hooks of the mixed-precision path (semantic cut).
// Not an API: include only from src/backend/cpu/.
#pragma once

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "backend/backend.h"
#include "common/thread_pool.h"
#include "kernels/common/softmax_state.h"
#include "kvsplit/status.h"

namespace kvsplit::backend::cpu_attention {

using kernels::SoftmaxState;

// Keys scored between two softmax rescales (one rescale of o per tile, not per key).
constexpr int kKeyTile = 64;

// ---- a minimal f32 vector (the widest the compiler targets; no runtime dispatch) ----
#if defined(__AVX512F__)
struct Vec {
  static constexpr int kWidth = 16;
  __m512 v;
  static Vec zero() { return {_mm512_setzero_ps()}; }
  static Vec set1(float x) { return {_mm512_set1_ps(x)}; }
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  static Vec add(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
  // Horizontal sum. Written with the explicit-source mask forms because GCC 12's
  // _mm512_reduce_add_ps trips -Wuninitialized inside its own header.
  float sum() const {
    const __m512 h = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0x4E));
    const __m256 q = _mm256_castpd_ps(
        _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xFF, _mm512_castps_pd(h), 0));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
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
  float sum() const {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
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
  float sum() const { return v; }
};
#endif
constexpr int kW = Vec::kWidth;

// Rows are processed in blocks of up to kRowBlock so each K/V vector load feeds several FMAs.
// Every row has its own accumulators and summation order, so a row's result does not depend on
// which rows share its block (decode and prefill agree bitwise).
constexpr int kRowBlock = 4;

// out[r] = dot(q[r], k) over n elements, for R rows.
template <int R>
inline void dot_rows(const float* const* q, const float* k, int n, float* out) {
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec::zero();
  int d = 0;
  for (; d + kW <= n; d += kW) {
    const Vec kv = Vec::load(k + d);
    for (int r = 0; r < R; ++r) acc[r] = Vec::fma(Vec::load(q[r] + d), kv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = acc[r].sum();
    for (int e = d; e < n; ++e) s += q[r][e] * k[e];
    out[r] = s;
  }
}

// o[r] += sum_t p[r][t] * v[t] over n elements, t in [0, num_keys), for R rows.
template <int R>
inline void pv_rows(float* const* o, const float* const* p, const float* const* v, int num_keys,
                    int n) {
  int d = 0;
  for (; d + kW <= n; d += kW) {
    Vec acc[R];
    for (int r = 0; r < R; ++r) acc[r] = Vec::load(o[r] + d);
    for (int t = 0; t < num_keys; ++t) {
      const Vec vv = Vec::load(v[t] + d);
      for (int r = 0; r < R; ++r) acc[r] = Vec::fma(Vec::set1(p[r][t]), vv, acc[r]);
    }
    for (int r = 0; r < R; ++r) acc[r].store(o[r] + d);
  }
  for (; d < n; ++d) {
    for (int r = 0; r < R; ++r) {
      float s = o[r][d];
      for (int t = 0; t < num_keys; ++t) s += p[r][t] * v[t][d];
      o[r][d] = s;
    }
  }
}

inline void scale_in_place(float* y, float a, int n) {
  for (int d = 0; d < n; ++d) y[d] *= a;
}

// The query vectors one work item accumulates, all reading the same kv head of one sequence.
struct Rows {
  int n = 0;
  const float** q = nullptr;   // [n] -> [head_dim]
  int* limit = nullptr;        // [n] exclusive causal key bound of each row
  float* o = nullptr;          // [n, head_dim] unnormalized accumulators
  SoftmaxState* st = nullptr;  // [n]
  float* scores = nullptr;     // [n, kKeyTile] scratch (scores, then softmax weights)
};

// Per-thread scratch of a work item, grown on demand and reused.
struct Scratch {
  std::vector<const float*> q;
  std::vector<int> limit;
  std::vector<float> o;
  std::vector<SoftmaxState> st;
  std::vector<float> scores;

  Rows rows(int n, int head_dim) {
    q.resize(n);
    limit.resize(n);
    o.assign(static_cast<size_t>(n) * head_dim, 0.f);
    st.assign(n, kernels::softmax_state_empty());
    scores.resize(static_cast<size_t>(n) * kKeyTile);
    return Rows{n, q.data(), limit.data(), o.data(), st.data(), scores.data()};
  }
};

inline Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Keys of one tile as f32 row pointers (full-precision pages, or rows dequantized elsewhere).
// A key source for fold_rows: dot<R> writes out[r] = q[r] . k_t for R rows, pv<R> adds
// sum_t p[r][t] * v_t to o[r] over the tile's first num_keys keys (n = head_dim).
struct PtrKeys {
  const float* const* kp;  // [num_keys] -> [head_dim]
  const float* const* vp;  // [num_keys] -> [head_dim]

  template <int R>
  void dot(const float* const* q, int t, int n, float* out) const {
    dot_rows<R>(q, kp[t], n, out);
  }
  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int n) const {
    pv_rows<R>(o, p, vp, num_keys, n);
  }
};

// Folds keys j0 .. j0 + num_keys - 1 (num_keys <= kKeyTile, read through `keys`) into rows
// [i0, i0 + R).
template <int R, typename Keys>
inline void fold_rows(Rows& r, int i0, const Keys& keys, int j0, int num_keys, int head_dim,
                      float scale) {
  int valid[R];  // keys of the tile each row may see (causal)
  int max_valid = 0;
  const float* q[R];
  float* s[R];
  float* o[R];
  for (int k = 0; k < R; ++k) {
    valid[k] = std::clamp(r.limit[i0 + k] - j0, 0, num_keys);
    max_valid = std::max(max_valid, valid[k]);
    q[k] = r.q[i0 + k];
    s[k] = r.scores + static_cast<size_t>(i0 + k) * kKeyTile;
    o[k] = r.o + static_cast<size_t>(i0 + k) * head_dim;
  }
  if (max_valid == 0) return;
  for (int t = 0; t < max_valid; ++t) {
    float d[R];
    keys.template dot<R>(q, t, head_dim, d);
    for (int k = 0; k < R; ++k) s[k][t] = d[k] * scale;
  }
  for (int k = 0; k < R; ++k) {
    float mx = -INFINITY;
    for (int t = 0; t < valid[k]; ++t) mx = std::max(mx, s[k][t]);
    SoftmaxState& st = r.st[i0 + k];
    const float c = kernels::softmax_state_raise_max(&st, mx);
    if (c != 1.f) scale_in_place(o[k], c, head_dim);
    float l = 0.f;
    for (int t = 0; t < valid[k]; ++t) {
      s[k][t] = expf(s[k][t] - st.m);
      l += s[k][t];
    }
    for (int t = valid[k]; t < max_valid; ++t) s[k][t] = 0.f;  // masked: weight 0
    st.l += l;
  }
  keys.template pv<R>(o, s, max_valid, head_dim);
}

// One tile of keys j0 .. j0 + num_keys - 1 (contiguous positions) folded into every row.
template <typename Keys>
inline void fold_tile(Rows& r, const Keys& keys, int j0, int num_keys, int head_dim, float scale) {
  for (int i0 = 0; i0 < r.n; i0 += kRowBlock) {
    switch (std::min(kRowBlock, r.n - i0)) {
      case 4:
        fold_rows<4>(r, i0, keys, j0, num_keys, head_dim, scale);
        break;
      case 3:
        fold_rows<3>(r, i0, keys, j0, num_keys, head_dim, scale);
        break;
      case 2:
        fold_rows<2>(r, i0, keys, j0, num_keys, head_dim, scale);
        break;
      default:
        fold_rows<1>(r, i0, keys, j0, num_keys, head_dim, scale);
        break;
    }
  }
}

// The same with K/V row pointers into the pages.
inline void fold_tile(Rows& r, const float* const* kp, const float* const* vp, int j0, int num_keys,
                      int head_dim, float scale) {
  fold_tile(r, PtrKeys{kp, vp}, j0, num_keys, head_dim, scale);
}

// ---- mixed-precision pages (attention_mixed.cpp) ----

// kInvalidArgument unless the mixed-precision and scoring fields of `a` are consistent (precision
// values, page ids inside their arenas, non-null arenas where a page needs one, summary slots
// inside [0, num_summary_slots)). `decode`: whether side outputs are allowed.
Status validate_mixed(const AttentionArgs& a, const char* op, bool decode);

// As attend() in attention.cpp, for a.page_precision != nullptr: folds the resident keys of
// [key_begin, key_end) of sequence `seq`, kv head `kv_head`, into `r`, each page read at its own
// precision (full keys in pointer tiles of up to kKeyTile keys; a quantized page as its own
// tile, codes converted in registers, quant_keys.h) and evicted pages skipped. A tile never spans
// an evicted page, so a tile's keys are contiguous positions (the causal limit stays exact).
void attend_mixed(const AttentionArgs& a, int seq, int kv_head, int key_begin, int key_end,
                  Rows& r);

// The scoring side outputs of AttentionArgs for the scored sequences, after the decode (m:
// [num_seqs, num_heads], the final running max of every head; entries of unscored sequences are
// not read). Cost: a second read of the keys of the scored sequences' resident pages (one K row
// per token and kv head, no V), and head_dim multiply-adds per summarized page and query head.
void score_side_outputs(const AttentionArgs& a, const float* m, ThreadPool& pool);

}  // namespace kvsplit::backend::cpu_attention
