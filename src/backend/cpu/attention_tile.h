// Internal to the CPU attention (attention.cpp, attention_mixed.cpp): the tile fold (scores,
// online softmax, P.V; SIMD helpers in attention_vec.h) over a key source (K/V row pointers
// here, quantized pages in quant_keys.h), per-thread scratch, and the hooks of the
// mixed-precision path (semantic cut).
// Not an API: include only from src/backend/cpu/.
#pragma once

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/attention_vec.h"
#include "common/thread_pool.h"
#include "kernels/common/softmax_state.h"
#include "kvsplit/status.h"

namespace kvsplit::backend::cpu_attention {

using kernels::SoftmaxState;

// Keys scored between two softmax rescales (one rescale of o per tile, not per key).
constexpr int kKeyTile = 64;
static_assert(kKeyTile % kW == 0, "score rows are processed in whole vectors");

// Rows are processed in blocks of up to kRowBlock so each K/V vector load feeds several FMAs.
// Every row has its own accumulators and summation order, so a row's result does not depend on
// which rows share its block (decode and prefill agree bitwise).
constexpr int kRowBlock = 4;

// Keys scored together for R rows: R * KB accumulators (at most kW) reduced by one sum_lanes.
template <int R>
constexpr int keys_per_block() {
  const int rows = R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : kW;  // R rounded up to a power of two
  return kW / rows > 1 ? kW / rows : 1;
}

// s[r][t] = q[r] . k_t for t in [0, num_keys), r < R, over n elements, kb = keys_per_block<R>()
// keys per pass. accumulate(tk, acc) adds the products of the whole vector chunks of keys
// tk[0 .. kb) to acc[r * kb + j] (one Vec per row and key) and returns d0, where the chunks end;
// ks(t, d) gives element d >= d0 of key t for the scalar tail. The accumulators are reduced by
// sum_lanes (bitwise as Vec::sum), then the tail is added: a result does not depend on which keys
// or rows share its block, so every caller gets the same bits.
template <int R, typename Accumulate, typename LoadScalar>
KVSPLIT_ALWAYS_INLINE void dot_block_rows_by(const float* const* q, const Accumulate& accumulate,
                                             const LoadScalar& ks, int num_keys, int n,
                                             float* const* s) {
  constexpr int kb = keys_per_block<R>();
  constexpr int kSlots = R * kb > kW ? R * kb : kW;
  static_assert(R * kb <= kW || kW == 1, "one reduction per block");
  for (int t0 = 0; t0 < num_keys; t0 += kb) {
    int tk[kb];  // keys of the block; past the end, the last key again (computed, not stored)
    for (int j = 0; j < kb; ++j) tk[j] = std::min(t0 + j, num_keys - 1);
    Vec acc[kSlots];
    for (Vec& x : acc) x = Vec::zero();
    const int d0 = accumulate(tk, acc);
    float sums[kSlots];
    if constexpr (kW == 1) {
      for (int i = 0; i < R * kb; ++i) sums[i] = acc[i].sum();
    } else {
      sum_lanes(acc).store(sums);
    }
    const int nk = std::min(kb, num_keys - t0);
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < nk; ++j) {
        float x = sums[r * kb + j];
        for (int e = d0; e < n; ++e) x += q[r][e] * ks(tk[j], e);
        s[r][t0 + j] = x;
      }
    }
  }
}

// The accumulate step of dot_block_rows_by for keys whose chunks kv(t, d) loads (k_t[d .. d + kW)
// as a Vec, in channel order): returns where the whole chunks end.
template <int R, typename LoadVec>
KVSPLIT_ALWAYS_INLINE int accumulate_chunks(const float* const* q, const LoadVec& kv, const int* tk,
                                            Vec* acc, int n) {
  constexpr int kb = keys_per_block<R>();
  int d = 0;
  for (; d + kW <= n; d += kW) {
    Vec qv[R];
    for (int r = 0; r < R; ++r) qv[r] = Vec::load(q[r] + d);
    for (int j = 0; j < kb; ++j) {
      const Vec k = kv(tk[j], d);
      for (int r = 0; r < R; ++r) acc[r * kb + j] = Vec::fma(qv[r], k, acc[r * kb + j]);
    }
  }
  return d;
}

// The same with kv(t, d) loading k_t[d .. d + kW) as a Vec (chunks in channel order).
template <int R, typename LoadVec, typename LoadScalar>
KVSPLIT_ALWAYS_INLINE void dot_block_rows(const float* const* q, const LoadVec& kv,
                                          const LoadScalar& ks, int num_keys, int n,
                                          float* const* s) {
  dot_block_rows_by<R>(
      q, [&](const int* tk, Vec* acc) { return accumulate_chunks<R>(q, kv, tk, acc, n); }, ks,
      num_keys, n, s);
}

// o[r][d] += bias[r] + sum_t p[r][t] * v(t, d) for R rows over n elements, t in [0, num_keys);
// vv(t, d) loads v_t[d .. d + kW) as a Vec, vs(t, d) one element; bias null for none. Several
// chunks of d per pass, so that enough FMA chains are in flight.
template <int R, typename LoadVec, typename LoadScalar>
KVSPLIT_ALWAYS_INLINE void pv_block_rows(float* const* o, const float* const* p, const float* bias,
                                         const LoadVec& vv, const LoadScalar& vs, int num_keys,
                                         int n) {
  constexpr int kChunks = R <= 2 ? 4 : 2;
  int d = 0;
  for (; d + kChunks * kW <= n; d += kChunks * kW) {
    Vec acc[R][kChunks];
    for (int r = 0; r < R; ++r) {
      const Vec b = Vec::set1(bias ? bias[r] : 0.f);
      for (int c = 0; c < kChunks; ++c) acc[r][c] = Vec::add(Vec::load(o[r] + d + c * kW), b);
    }
    for (int t = 0; t < num_keys; ++t) {
      Vec v[kChunks];
      for (int c = 0; c < kChunks; ++c) v[c] = vv(t, d + c * kW);
      for (int r = 0; r < R; ++r) {
        const Vec pr = Vec::set1(p[r][t]);
        for (int c = 0; c < kChunks; ++c) acc[r][c] = Vec::fma(pr, v[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < kChunks; ++c) acc[r][c].store(o[r] + d + c * kW);
    }
  }
  for (; d + kW <= n; d += kW) {
    Vec acc[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = Vec::add(Vec::load(o[r] + d), Vec::set1(bias ? bias[r] : 0.f));
    }
    for (int t = 0; t < num_keys; ++t) {
      const Vec v = vv(t, d);
      for (int r = 0; r < R; ++r) acc[r] = Vec::fma(Vec::set1(p[r][t]), v, acc[r]);
    }
    for (int r = 0; r < R; ++r) acc[r].store(o[r] + d);
  }
  for (; d < n; ++d) {
    for (int r = 0; r < R; ++r) {
      float x = o[r][d] + (bias ? bias[r] : 0.f);
      for (int t = 0; t < num_keys; ++t) x += p[r][t] * vs(t, d);
      o[r][d] = x;
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
  int* first = nullptr;        // [n] first key of each row's sliding window (0: none)
  float* o = nullptr;          // [n, head_dim] unnormalized accumulators
  SoftmaxState* st = nullptr;  // [n]
  float* scores = nullptr;     // [n, kKeyTile] scratch (scores, then softmax weights)
};

// Per-thread scratch of a work item, grown on demand and reused.
struct Scratch {
  std::vector<const float*> q;
  std::vector<int> limit;
  std::vector<int> first;
  std::vector<float> o;
  std::vector<SoftmaxState> st;
  std::vector<float> scores;

  Rows rows(int n, int head_dim) {
    q.resize(n);
    limit.resize(n);
    first.assign(n, 0);
    o.assign(static_cast<size_t>(n) * head_dim, 0.f);
    st.assign(n, kernels::softmax_state_empty());
    scores.resize(static_cast<size_t>(n) * kKeyTile);
    return Rows{n, q.data(), limit.data(), first.data(), o.data(), st.data(), scores.data()};
  }
};

inline Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Keys of one tile as f32 row pointers (full-precision pages, or rows dequantized elsewhere).
// A key source for fold_rows: dots<R> writes s[r][t] = q[r] . k_t for R rows and the tile's
// first num_keys keys (the same bits whichever keys and rows a call covers: the scoring side
// outputs recompute them), pv<R> adds sum_t p[r][t] * v_t to o[r] (n = head_dim).
struct PtrKeys {
  const float* const* kp;  // [num_keys] -> [head_dim]
  const float* const* vp;  // [num_keys] -> [head_dim]

  template <int R>
  void dots(const float* const* q, int num_keys, int n, float* const* s) const {
    const float* const* k = kp;
    dot_block_rows<R>(
        q, [k](int t, int d) { return Vec::load(k[t] + d); }, [k](int t, int d) { return k[t][d]; },
        num_keys, n, s);
  }
  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int n) const {
    const float* const* v = vp;
    pv_block_rows<R>(
        o, p, nullptr, [v](int t, int d) { return Vec::load(v[t] + d); },
        [v](int t, int d) { return v[t][d]; }, num_keys, n);
  }
};

// One row of a tile's scores s[0, num_keys) (unscaled dot products in, softmax weights out), of
// which the row may see [lo, nv) (its sliding window starts at lo, its causal limit ends at nv):
// raises the row's running max to cover scale * s[lo, nv), rescales o [head_dim] if it rose, then
// s[t] = exp(scale * s[t] - m) for t in [lo, nv), 0 elsewhere up to num_keys, and adds them to l.
// Reads and writes s in whole vectors (up to kKeyTile).
KVSPLIT_ALWAYS_INLINE void softmax_row(float* s, int lo, int nv, int num_keys, float scale,
                                       SoftmaxState& st, float* o, int head_dim) {
  if (lo >= nv) lo = nv = 0;    // sees no key of this tile
  const int t0 = lo - lo % kW;  // whole vectors before it are all masked
  const Vec vscale = Vec::set1(scale);
  const Vec ninf = Vec::set1(-INFINITY);
  Vec mx = ninf;
  for (int t = t0; t < nv; t += kW) {
    const Vec x = Vec::mul(Vec::load(s + t), vscale);
    x.store(s + t);
    mx = Vec::max(mx, Vec::first(nv - t, Vec::first(lo - t, ninf, x), ninf));
  }
  const float c = kernels::softmax_state_raise_max(&st, mx.max_lane());
  if (c != 1.f) scale_in_place(o, c, head_dim);
  const Vec m = Vec::set1(st.m);
  Vec l = Vec::zero();
  for (int t = 0; t < t0; ++t) s[t] = 0.f;  // masked by the window: weight 0
  int t = t0;
  for (; t < nv; t += kW) {
    Vec p = Vec::first(nv - t, Vec::exp(Vec::sub(Vec::load(s + t), m)), Vec::zero());
    p = Vec::first(lo - t, Vec::zero(), p);
    p.store(s + t);
    l = Vec::add(l, p);
  }
  for (; t < num_keys; ++t) s[t] = 0.f;  // masked: weight 0
  st.l += l.sum();
}

// Folds keys j0 .. j0 + num_keys - 1 (num_keys <= kKeyTile, read through `keys`) into rows
// [i0, i0 + R).
template <int R, typename Keys>
inline void fold_rows(Rows& r, int i0, const Keys& keys, int j0, int num_keys, int head_dim,
                      float scale) {
  int valid[R];  // keys of the tile each row may see: [lo, valid) (window, causal)
  int lo[R];
  int max_valid = 0;
  bool any = false;
  const float* q[R];
  float* s[R];
  float* o[R];
  for (int k = 0; k < R; ++k) {
    valid[k] = std::clamp(r.limit[i0 + k] - j0, 0, num_keys);
    lo[k] = std::clamp(r.first[i0 + k] - j0, 0, num_keys);
    any = any || lo[k] < valid[k];
    max_valid = std::max(max_valid, valid[k]);
    q[k] = r.q[i0 + k];
    s[k] = r.scores + static_cast<size_t>(i0 + k) * kKeyTile;
    o[k] = r.o + static_cast<size_t>(i0 + k) * head_dim;
  }
  if (!any) return;  // no row sees a key of this tile
  keys.template dots<R>(q, max_valid, head_dim, s);
  for (int k = 0; k < R; ++k) {
    softmax_row(s[k], lo[k], valid[k], max_valid, scale, r.st[i0 + k], o[k], head_dim);
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
// precision (tiles of up to kKeyTile keys from consecutive pages of one precision: full keys as
// row pointers, quantized ones as code rows converted in registers, quant_keys.h) and evicted
// pages skipped. A tile never spans an evicted page, so a tile's keys are contiguous positions
// (the causal limit stays exact).
void attend_mixed(const AttentionArgs& a, int seq, int kv_head, int key_begin, int key_end,
                  Rows& r);

// The scoring side outputs of AttentionArgs for the scored sequences, after the decode (m:
// [num_seqs, num_heads], the final running max of every head; entries of unscored sequences are
// not read). Cost: a second read of the keys of the scored sequences' resident pages (one K row
// per token and kv head, no V), and head_dim multiply-adds per summarized page, summary part and
// query head.
void score_side_outputs(const AttentionArgs& a, const float* m, ThreadPool& pool);

}  // namespace kvsplit::backend::cpu_attention
