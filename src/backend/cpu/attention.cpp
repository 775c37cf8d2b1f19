#include "backend/cpu/attention.h"

#include <math.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/common/paged_kv.h"
#include "kernels/common/softmax_state.h"

namespace kvsplit::backend {
namespace {

using kernels::SoftmaxState;

// Keys scored between two softmax rescales (one rescale of o per tile, not per key).
constexpr int kKeyTile = 64;
// Query vectors (GQA group x query rows) one prefill work item carries; K/V read once per item.
constexpr int kPrefillRowsPerItem = 64;

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

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Folds keys j0 .. j0 + num_keys - 1 (K/V row pointers kp, vp) into rows [i0, i0 + R).
template <int R>
void fold_rows(Rows& r, int i0, const float* const* kp, const float* const* vp, int j0,
               int num_keys, int head_dim, float scale) {
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
    dot_rows<R>(q, kp[t], head_dim, d);
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
  pv_rows<R>(o, s, vp, max_valid, head_dim);
}

// One tile of keys j0 .. j0 + num_keys - 1 (pointers into the pages) folded into every row.
void fold_tile(Rows& r, const float* const* kp, const float* const* vp, int j0, int num_keys,
               int head_dim, float scale) {
  for (int i0 = 0; i0 < r.n; i0 += kRowBlock) {
    switch (std::min(kRowBlock, r.n - i0)) {
      case 4:
        fold_rows<4>(r, i0, kp, vp, j0, num_keys, head_dim, scale);
        break;
      case 3:
        fold_rows<3>(r, i0, kp, vp, j0, num_keys, head_dim, scale);
        break;
      case 2:
        fold_rows<2>(r, i0, kp, vp, j0, num_keys, head_dim, scale);
        break;
      default:
        fold_rows<1>(r, i0, kp, vp, j0, num_keys, head_dim, scale);
        break;
    }
  }
}

// Folds keys [key_begin, key_end) of kv head `kv_head` of the sequence with block table `table`
// into `r`. Reads each block-table entry once and each K/V row once.
void attend(const AttentionArgs& a, const int32_t* table, int kv_head, int key_begin, int key_end,
            Rows& r) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const kernels::PagedKvLayout layout{a.kv.num_kv_heads, bs, hd};
  const float* pages = static_cast<const float*>(a.kv.data);
  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  int n = 0;
  int tile_begin = key_begin;
  for (int blk = key_begin / bs; blk * bs < key_end; ++blk) {
    const int32_t id = table[blk];
    const float* k_base = pages + layout.offset(id, 0, kv_head, 0);
    const float* v_base = pages + layout.offset(id, 1, kv_head, 0);
    const int s0 = std::max(key_begin - blk * bs, 0);
    const int s1 = std::min(bs, key_end - blk * bs);
    for (int slot = s0; slot < s1; ++slot) {
      kp[n] = k_base + static_cast<int64_t>(slot) * hd;
      vp[n] = v_base + static_cast<int64_t>(slot) * hd;
      if (++n == kKeyTile) {
        fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
        tile_begin += n;
        n = 0;
      }
    }
  }
  if (n > 0) fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
}

// out = o / l (0 for an empty state, which a valid call never produces).
void write_normalized(const float* o, SoftmaxState st, int head_dim, float* out) {
  const float inv = st.l > 0.f ? 1.f / st.l : 0.f;
  for (int d = 0; d < head_dim; ++d) out[d] = o[d] * inv;
}

std::string seq_str(int s) { return "sequence " + std::to_string(s); }

Status validate(const AttentionArgs& a, const char* op) {
  const std::string where = std::string(op) + ": ";
  if (a.kv.dtype != DType::kF32) {
    return unimplemented(where + "the CPU backend reads f32 pages only, got " +
                         std::string(dtype_name(a.kv.dtype)));
  }
  if (a.num_seqs < 0 || a.num_tokens < 0)
    return invalid_argument(where + "negative num_seqs/num_tokens");
  if (a.num_heads <= 0 || a.num_kv_heads <= 0 || a.head_dim <= 0) {
    return invalid_argument(where + "num_heads, num_kv_heads and head_dim must be positive");
  }
  if (a.num_heads % a.num_kv_heads != 0) {
    return invalid_argument(where + "num_heads " + std::to_string(a.num_heads) +
                            " is not a multiple of num_kv_heads " + std::to_string(a.num_kv_heads));
  }
  if (a.kv.num_kv_heads != a.num_kv_heads || a.kv.head_dim != a.head_dim) {
    return invalid_argument(where + "KV pages hold " + std::to_string(a.kv.num_kv_heads) +
                            " kv heads x head_dim " + std::to_string(a.kv.head_dim) +
                            ", args say " + std::to_string(a.num_kv_heads) + " x " +
                            std::to_string(a.head_dim));
  }
  if (a.kv.block_size <= 0 || a.kv.num_blocks < 0) {
    return invalid_argument(where + "bad page geometry (block_size " +
                            std::to_string(a.kv.block_size) + ", num_blocks " +
                            std::to_string(a.kv.num_blocks) + ")");
  }
  if (!std::isfinite(a.scale)) return invalid_argument(where + "scale is not finite");
  if (a.num_seqs == 0) return ok_status();
  if (!a.query_start || !a.kv_lens || !a.block_tables) {
    return invalid_argument(where + "null query_start, kv_lens or block_tables");
  }
  if (a.num_tokens > 0 && (!a.q || !a.out || !a.kv.data)) {
    return invalid_argument(where + "null q, out or KV pages");
  }
  if (a.query_start[0] != 0 || a.query_start[a.num_seqs] != a.num_tokens) {
    return invalid_argument(where + "query_start must run from 0 to num_tokens " +
                            std::to_string(a.num_tokens));
  }
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start[s + 1] - a.query_start[s];
    const int kv_len = a.kv_lens[s];
    if (q_len < 0) return invalid_argument(where + "query_start decreases at " + seq_str(s));
    if (kv_len < q_len) {
      return invalid_argument(where + seq_str(s) + " has kv_len " + std::to_string(kv_len) +
                              " < q_len " + std::to_string(q_len));
    }
    const int nb = (kv_len + a.kv.block_size - 1) / a.kv.block_size;
    if (nb > a.max_blocks_per_seq) {
      return invalid_argument(where + seq_str(s) + " needs " + std::to_string(nb) +
                              " blocks, block table has " + std::to_string(a.max_blocks_per_seq));
    }
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
    for (int b = 0; b < nb; ++b) {
      if (table[b] < 0 || table[b] >= a.kv.num_blocks) {
        return invalid_argument(where + seq_str(s) + " block " + std::to_string(b) + " is id " +
                                std::to_string(table[b]) + ", outside [0, " +
                                std::to_string(a.kv.num_blocks) + ")");
      }
    }
  }
  return ok_status();
}

Status validate_plan(const AttentionArgs& a, const backend::SplitPlan& plan) {
  const std::string where = "attention_decode: split plan ";
  if (plan.num_seqs() != a.num_seqs || static_cast<int>(plan.split_offset.size()) != a.num_seqs) {
    return invalid_argument(where + "covers " + std::to_string(plan.num_seqs()) +
                            " sequences, the batch has " + std::to_string(a.num_seqs));
  }
  if (plan.chunk_tokens <= 0 || plan.chunk_tokens % a.kv.block_size != 0) {
    return invalid_argument(where + "chunk_tokens " + std::to_string(plan.chunk_tokens) +
                            " is not a positive multiple of block_size " +
                            std::to_string(a.kv.block_size));
  }
  int offset = 0;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int64_t n = plan.num_splits[s];
    if (n < 1 || plan.split_offset[s] != offset || n * plan.chunk_tokens < a.kv_lens[s]) {
      return invalid_argument(where + "does not match kv_len " + std::to_string(a.kv_lens[s]) +
                              " of " + seq_str(s) + " (num_splits " + std::to_string(n) +
                              ", split_offset " + std::to_string(plan.split_offset[s]) + ")");
    }
    offset += static_cast<int>(n);
  }
  if (offset != plan.total_splits) return invalid_argument(where + "total_splits is inconsistent");
  return ok_status();
}

// Split-K workspace of one calling thread: partial o [total_splits, num_heads, head_dim] and
// states [total_splits, num_heads]; work list [(seq, split)].
struct DecodeWorkspace {
  std::vector<float> o;
  std::vector<SoftmaxState> st;
  std::vector<std::pair<int, int>> items;
};

}  // namespace

Status cpu_attention_decode(const AttentionArgs& a, const backend::SplitPlan& plan,
                            ThreadPool& pool) {
  KVSPLIT_RETURN_IF_ERROR(validate(a, "attention_decode"));
  for (int s = 0; s < a.num_seqs; ++s) {
    if (a.query_start[s + 1] - a.query_start[s] != 1) {
      return invalid_argument("attention_decode: " + seq_str(s) +
                              " must have exactly one query token");
    }
  }
  KVSPLIT_RETURN_IF_ERROR(validate_plan(a, plan));
  if (a.num_seqs == 0) return ok_status();

  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  thread_local DecodeWorkspace ws_tls;
  DecodeWorkspace& ws = ws_tls;  // the caller's; captured by reference below
  ws.items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    for (int sp = 0; sp < plan.num_splits[s]; ++sp) ws.items.emplace_back(s, sp);
  }
  if (plan.has_splits()) {
    ws.o.resize(static_cast<size_t>(plan.total_splits) * a.num_heads * hd);
    ws.st.resize(static_cast<size_t>(plan.total_splits) * a.num_heads);
  }

  const int64_t num_items = static_cast<int64_t>(ws.items.size()) * nkv;
  pool.parallel_for(num_items, [&](int64_t item) {
    const int kvh = static_cast<int>(item % nkv);
    const auto [s, sp] = ws.items[item / nkv];
    const int kv_len = a.kv_lens[s];
    const int key_begin = sp * plan.chunk_tokens;
    const int key_end = std::min(kv_len, key_begin + plan.chunk_tokens);
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
    const int64_t head0 = static_cast<int64_t>(a.query_start[s]) * a.num_heads + kvh * group;

    Rows r = thread_scratch().rows(group, hd);
    for (int g = 0; g < group; ++g) {
      r.q[g] = a.q + (head0 + g) * hd;
      r.limit[g] = key_end;
    }
    attend(a, table, kvh, key_begin, key_end, r);

    if (plan.num_splits[s] == 1) {
      for (int g = 0; g < group; ++g) {
        write_normalized(r.o + static_cast<size_t>(g) * hd, r.st[g], hd, a.out + (head0 + g) * hd);
      }
      return;
    }
    const int64_t slot0 =
        (static_cast<int64_t>(plan.split_offset[s]) + sp) * a.num_heads + kvh * group;
    std::copy(r.o, r.o + static_cast<size_t>(group) * hd, ws.o.data() + slot0 * hd);
    std::copy(r.st, r.st + group, ws.st.data() + slot0);
  });
  if (!plan.has_splits()) return ok_status();

  // Merge the partial states of every split sequence: out = (sum_i o_i e^{m_i - m}) / l.
  pool.parallel_for(static_cast<int64_t>(a.num_seqs) * a.num_heads, [&](int64_t item) {
    const int s = static_cast<int>(item / a.num_heads);
    const int h = static_cast<int>(item % a.num_heads);
    if (plan.num_splits[s] == 1) return;
    float* out = a.out + (static_cast<int64_t>(a.query_start[s]) * a.num_heads + h) * hd;
    std::fill(out, out + hd, 0.f);
    SoftmaxState acc = kernels::softmax_state_empty();
    for (int sp = 0; sp < plan.num_splits[s]; ++sp) {
      const int64_t slot = (static_cast<int64_t>(plan.split_offset[s]) + sp) * a.num_heads + h;
      float sa, sb;
      acc = kernels::softmax_state_merge(acc, ws.st[slot], &sa, &sb);
      const float* o = ws.o.data() + slot * hd;
      for (int d = 0; d < hd; ++d) out[d] = out[d] * sa + o[d] * sb;
    }
    const float inv = acc.l > 0.f ? 1.f / acc.l : 0.f;
    scale_in_place(out, inv, hd);
  });
  return ok_status();
}

Status cpu_attention_prefill(const AttentionArgs& a, ThreadPool& pool) {
  KVSPLIT_RETURN_IF_ERROR(validate(a, "attention_prefill"));
  if (a.num_tokens == 0) return ok_status();

  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  const int rows_per_item = std::max(1, kPrefillRowsPerItem / group);  // query rows per item
  // Work list [(seq, first query row)], heaviest (latest rows, most keys) first.
  thread_local std::vector<std::pair<int, int>> items_tls;
  std::vector<std::pair<int, int>>& items = items_tls;
  items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start[s + 1] - a.query_start[s];
    for (int i = 0; i < q_len; i += rows_per_item) items.emplace_back(s, i);
  }
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    const auto keys = [&](const std::pair<int, int>& it) {
      return a.kv_lens[it.first] - (a.query_start[it.first + 1] - a.query_start[it.first]) +
             it.second;
    };
    return keys(x) > keys(y);
  });

  pool.parallel_for(static_cast<int64_t>(items.size()) * nkv, [&](int64_t item) {
    const int kvh = static_cast<int>(item % nkv);
    const auto [s, i0] = items[item / nkv];
    const int q_len = a.query_start[s + 1] - a.query_start[s];
    const int num_rows = std::min(rows_per_item, q_len - i0);
    const int pos0 = a.kv_lens[s] - q_len + i0;  // position of the item's first query row
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;

    Rows r = thread_scratch().rows(num_rows * group, hd);
    for (int i = 0; i < num_rows; ++i) {
      const int64_t head0 =
          static_cast<int64_t>(a.query_start[s] + i0 + i) * a.num_heads + kvh * group;
      for (int g = 0; g < group; ++g) {
        r.q[i * group + g] = a.q + (head0 + g) * hd;
        r.limit[i * group + g] = pos0 + i + 1;
      }
    }
    attend(a, table, kvh, 0, pos0 + num_rows, r);
    for (int i = 0; i < num_rows; ++i) {
      const int64_t head0 =
          static_cast<int64_t>(a.query_start[s] + i0 + i) * a.num_heads + kvh * group;
      for (int g = 0; g < group; ++g) {
        const int row = i * group + g;
        write_normalized(r.o + static_cast<size_t>(row) * hd, r.st[row], hd,
                         a.out + (head0 + g) * hd);
      }
    }
  });
  return ok_status();
}

}  // namespace kvsplit::backend
