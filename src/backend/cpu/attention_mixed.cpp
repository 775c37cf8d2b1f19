// Mixed-precision paged attention on the CPU (semantic cut): pages read at their own precision in
// the same tile loop as full pages, evicted pages skipped, and the scoring side outputs.
#include <math.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend::cpu_attention {
namespace {

using kernels::KvPrecision;
using kernels::QuantPageLayout;

// ---- quantized key sources for fold_rows: dequantization in registers, no scratch rows ----

#if defined(__AVX512F__)
// All lanes. The zero-masked intrinsics are used because GCC 12's unmasked forms trip
// -Wmaybe-uninitialized inside its own header (as Vec::sum in attention_tile.h).
constexpr __mmask16 kAll = 0xFFFF;
// Codes q[0 .. 16) as floats.
inline Vec vec_i8(const int8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return {_mm512_maskz_cvtepi32_ps(kAll, _mm512_maskz_cvtepi8_epi32(kAll, b))};
}
// Codes of channels [d, d + 16) of a packed int4 row as floats (d a multiple of 16).
inline Vec vec_u4(const uint8_t* row, int d) {
  uint64_t x;
  std::memcpy(&x, row + d / 2, 8);
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i sh = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
  __m512i v = _mm512_maskz_permutexvar_epi32(
      kAll, idx, _mm512_zextsi128_si512(_mm_cvtsi64_si128(static_cast<int64_t>(x))));
  v = _mm512_and_si512(_mm512_maskz_srlv_epi32(kAll, v, sh), _mm512_set1_epi32(0xf));
  return {_mm512_maskz_cvtepi32_ps(kAll, v)};
}
#elif defined(__AVX2__) && defined(__FMA__)
inline Vec vec_i8(const int8_t* q) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))};
}
inline Vec vec_u4(const uint8_t* row, int d) {
  uint32_t x;
  std::memcpy(&x, row + d / 2, 4);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(x)), sh),
                                     _mm256_set1_epi32(0xf));
  return {_mm256_cvtepi32_ps(v)};
}
#else
inline Vec vec_i8(const int8_t* q) { return {static_cast<float>(*q)}; }
inline Vec vec_u4(const uint8_t* row, int d) {
  return {static_cast<float>(kernels::int4_unpack(row, d))};
}
#endif

// out[r] = sum_d q[r][d] * k(d) for R rows; kv(d) gives k[d .. d + kW) as a Vec, ks(d) one value.
template <int R, typename LoadVec, typename LoadScalar>
inline void dot_rows_by(const float* const* q, const LoadVec& kv, const LoadScalar& ks, int n,
                        float* out) {
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec::zero();
  int d = 0;
  for (; d + kW <= n; d += kW) {
    const Vec k = kv(d);
    for (int r = 0; r < R; ++r) acc[r] = Vec::fma(Vec::load(q[r] + d), k, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = acc[r].sum();
    for (int e = d; e < n; ++e) s += q[r][e] * ks(e);
    out[r] = s;
  }
}

// o[r][d] += bias[r] + sum_t p[r][t] * v(t, d) for R rows; vv(t, d) a Vec, vs(t, d) one value.
template <int R, typename LoadVec, typename LoadScalar>
inline void pv_rows_by(float* const* o, const float (*p)[kKeyTile], const float* bias,
                       const LoadVec& vv, const LoadScalar& vs, int num_keys, int n) {
  int d = 0;
  for (; d + kW <= n; d += kW) {
    Vec acc[R];
    for (int r = 0; r < R; ++r) acc[r] = Vec::add(Vec::load(o[r] + d), Vec::set1(bias[r]));
    for (int t = 0; t < num_keys; ++t) {
      const Vec v = vv(t, d);
      for (int r = 0; r < R; ++r) acc[r] = Vec::fma(Vec::set1(p[r][t]), v, acc[r]);
    }
    for (int r = 0; r < R; ++r) acc[r].store(o[r] + d);
  }
  for (; d < n; ++d) {
    for (int r = 0; r < R; ++r) {
      float s = o[r][d] + bias[r];
      for (int t = 0; t < num_keys; ++t) s += p[r][t] * vs(t, d);
      o[r][d] = s;
    }
  }
}

// Slots [s0, s0 + num_keys) of one kv head of an int8 page: k_t = code * k_scale[t] (per token).
// q . k_t = (q . codes) * k_scale[t]; sum_t p_t v_t = sum_t (p_t * v_scale[t]) codes_t.
struct Int8Keys {
  const int8_t* k;  // [num_keys, head_dim] codes
  const int8_t* v;
  int n;  // head_dim
  float k_scale[kKeyTile];
  float v_scale[kKeyTile];

  template <int R>
  void dot(const float* const* q, int t, int /*n*/, float* out) const {
    const int8_t* row = k + static_cast<int64_t>(t) * n;
    dot_rows_by<R>(
        q, [row](int d) { return vec_i8(row + d); },
        [row](int d) { return static_cast<float>(row[d]); }, n, out);
    for (int r = 0; r < R; ++r) out[r] *= k_scale[t];
  }
  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int /*n*/) const {
    float ps[R][kKeyTile];
    float bias[R];
    for (int r = 0; r < R; ++r) {
      bias[r] = 0.f;
      for (int t = 0; t < num_keys; ++t) ps[r][t] = p[r][t] * v_scale[t];
    }
    const int8_t* base = v;
    const int hd = n;
    pv_rows_by<R>(
        o, ps, bias, [base, hd](int t, int d) { return vec_i8(base + t * hd + d); },
        [base, hd](int t, int d) { return static_cast<float>(base[t * hd + d]); }, num_keys, n);
  }
};

// Slots [s0, s0 + num_keys) of one kv head of an int4 page: k_t[d] = k_zero[d] + k_scale[d] * u
// (per channel, dequantized in registers); v_t[d] = v_zero[t] + v_scale[t] * u (per token:
// sum_t p_t v_t = sum_t p_t v_zero[t] + sum_t (p_t v_scale[t]) u_t).
struct Int4Keys {
  const uint8_t* k;  // [num_keys, head_dim / 2] packed codes
  const uint8_t* v;
  int n;                 // head_dim
  const float* k_scale;  // [head_dim] decoded
  const float* k_zero;
  float v_scale[kKeyTile];
  float v_zero[kKeyTile];

  template <int R>
  void dot(const float* const* q, int t, int /*n*/, float* out) const {
    const uint8_t* row = k + static_cast<int64_t>(t) * (n / 2);
    const float* ks = k_scale;
    const float* kz = k_zero;
    dot_rows_by<R>(
        q, [=](int d) { return Vec::fma(Vec::load(ks + d), vec_u4(row, d), Vec::load(kz + d)); },
        [=](int d) { return kernels::int4_dequantize(kernels::int4_unpack(row, d), ks[d], kz[d]); },
        n, out);
  }
  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int /*n*/) const {
    float ps[R][kKeyTile];
    float bias[R];
    for (int r = 0; r < R; ++r) {
      float b = 0.f;
      for (int t = 0; t < num_keys; ++t) {
        ps[r][t] = p[r][t] * v_scale[t];
        b += p[r][t] * v_zero[t];
      }
      bias[r] = b;
    }
    const uint8_t* base = v;
    const int half = n / 2;
    pv_rows_by<R>(
        o, ps, bias, [base, half](int t, int d) { return vec_u4(base + t * half, d); },
        [base, half](int t, int d) {
          return static_cast<float>(kernels::int4_unpack(base + t * half, d));
        },
        num_keys, n);
  }
};

// out[i] = f16 h[i] as f32 (exact: F16C where the compiler targets it, else float_bits.h).
void decode_f16(const uint16_t* h, int n, float* out) {
  int i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
    _mm512_storeu_ps(out + i, _mm512_maskz_cvtph_ps(kAll, x));
  }
#endif
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(x));
  }
#endif
  for (; i < n; ++i) out[i] = kernels::kvq_half_float(h[i]);
}

// Per-thread decoded int4 key parameters of the current page ([head_dim] each).
struct Int4Params {
  std::vector<float> k_scale, k_zero;
};

Int4Params& int4_params(int head_dim) {
  thread_local Int4Params p;
  if (p.k_scale.size() < static_cast<size_t>(head_dim)) {
    p.k_scale.resize(head_dim);
    p.k_zero.resize(head_dim);
  }
  return p;
}

KvPrecision precision_of(const AttentionArgs& a, int64_t row) {
  return a.page_precision ? static_cast<KvPrecision>(a.page_precision[row]) : KvPrecision::kFull;
}

// Full-precision K/V row pointers of slots [s0, s1) of kv head h of page `id` of `kv`.
void full_rows(const AttentionArgs& a, int32_t id, int h, int s0, int s1, const float** kp,
               const float** vp) {
  const int hd = a.head_dim;
  const kernels::PagedKvLayout layout{a.kv.num_kv_heads, a.kv.block_size, hd};
  const float* pages = static_cast<const float*>(a.kv.data);
  const float* k_base = pages + layout.offset(id, 0, h, 0);
  const float* v_base = pages + layout.offset(id, 1, h, 0);
  for (int slot = s0; slot < s1; ++slot) {
    kp[slot - s0] = k_base + static_cast<int64_t>(slot) * hd;
    vp[slot - s0] = v_base + static_cast<int64_t>(slot) * hd;
  }
}

// Calls fn(keys) with the key source of slots [s0, s1) (s1 - s0 <= kKeyTile) of kv head h of the
// quantized page (p, id).
template <typename Fn>
void with_quantized_keys(const AttentionArgs& a, KvPrecision p, int32_t id, int h, int s0, int s1,
                         Fn&& fn) {
  const int hd = a.head_dim;
  const int bs = a.kv.block_size;
  const QuantPageLayout ql{a.num_kv_heads, bs, hd};
  if (p == KvPrecision::kInt8) {
    const uint8_t* page = static_cast<const uint8_t*>(a.int8_pages) + id * ql.bytes(p);
    const int8_t* values = reinterpret_cast<const int8_t*>(page + ql.int8_values_offset());
    const uint16_t* scales = kernels::kvq_f16_at(page, ql.int8_scales_offset());
    Int8Keys keys;
    keys.k = values + ql.token_index(0, h, s0) * hd;
    keys.v = values + ql.token_index(1, h, s0) * hd;
    keys.n = hd;
    decode_f16(scales + ql.token_index(0, h, s0), s1 - s0, keys.k_scale);
    decode_f16(scales + ql.token_index(1, h, s0), s1 - s0, keys.v_scale);
    fn(keys);
    return;
  }
  const uint8_t* page = static_cast<const uint8_t*>(a.int4_pages) + id * ql.bytes(p);
  const uint8_t* values = page + ql.int4_values_offset();
  Int4Params& params = int4_params(hd);
  const uint16_t* k_scale = kernels::kvq_f16_at(page, ql.int4_k_scale_offset()) + int64_t{h} * hd;
  const uint16_t* k_zero = kernels::kvq_f16_at(page, ql.int4_k_zero_offset()) + int64_t{h} * hd;
  decode_f16(k_scale, hd, params.k_scale.data());
  decode_f16(k_zero, hd, params.k_zero.data());
  const uint16_t* v_scale = kernels::kvq_f16_at(page, ql.int4_v_scale_offset()) + int64_t{h} * bs;
  const uint16_t* v_zero = kernels::kvq_f16_at(page, ql.int4_v_zero_offset()) + int64_t{h} * bs;
  Int4Keys keys;
  keys.k = values + ql.token_index(0, h, s0) * (hd / 2);
  keys.v = values + ql.token_index(1, h, s0) * (hd / 2);
  keys.n = hd;
  keys.k_scale = params.k_scale.data();
  keys.k_zero = params.k_zero.data();
  decode_f16(v_scale + s0, s1 - s0, keys.v_scale);
  decode_f16(v_zero + s0, s1 - s0, keys.v_zero);
  fn(keys);
}

// out[r] = q[r] . k_t for the nr <= kRowBlock rows q[0 .. nr), as fold_rows computes them.
template <typename Keys>
void dot_block(const Keys& keys, const float* const* q, int nr, int t, int hd, float* out) {
  switch (nr) {
    case 4:
      keys.template dot<4>(q, t, hd, out);
      break;
    case 3:
      keys.template dot<3>(q, t, hd, out);
      break;
    case 2:
      keys.template dot<2>(q, t, hd, out);
      break;
    default:
      keys.template dot<1>(q, t, hd, out);
      break;
  }
}

std::string page_str(int s, int b) {
  return "page " + std::to_string(b) + " of sequence " + std::to_string(s);
}

}  // namespace

Status validate_mixed(const AttentionArgs& a, const char* op, bool decode) {
  const std::string where = std::string(op) + ": ";
  if (a.score_seqs && !decode) {
    return invalid_argument(where + "score_seqs (scoring side outputs) is decode-only");
  }
  if (!a.page_precision && !a.score_seqs) return ok_status();
  const bool bound = a.score_seqs && a.page_bound;
  if (bound && (!a.summary_slots || (a.num_summary_slots > 0 && !a.summaries))) {
    return invalid_argument(where + "page_bound needs summary_slots and summaries");
  }
  if (a.num_summary_slots < 0) return invalid_argument(where + "negative num_summary_slots");
  if (bound && !(a.scale > 0.f)) return invalid_argument(where + "page_bound needs scale > 0");
  for (int s = 0; s < a.num_seqs; ++s) {
    const int nb = (a.kv_lens[s] + a.kv.block_size - 1) / a.kv.block_size;
    const int64_t row0 = static_cast<int64_t>(s) * a.max_blocks_per_seq;
    for (int b = 0; b < nb; ++b) {
      const int p = a.page_precision ? a.page_precision[row0 + b] : 0;
      const int32_t id = a.block_tables[row0 + b];
      const void* arena = a.kv.data;
      int count = a.kv.num_blocks;
      const char* name = "kv";
      switch (p) {
        case static_cast<int>(KvPrecision::kFull):
          break;
        case static_cast<int>(KvPrecision::kInt8):
          arena = a.int8_pages, count = a.num_int8_blocks, name = "int8_pages";
          break;
        case static_cast<int>(KvPrecision::kInt4):
          arena = a.int4_pages, count = a.num_int4_blocks, name = "int4_pages";
          if (a.head_dim % 2 != 0)
            return invalid_argument(where + "int4 pages need an even head_dim");
          break;
        case static_cast<int>(KvPrecision::kEvicted):
          arena = nullptr, name = nullptr;
          break;
        default:
          return invalid_argument(where + page_str(s, b) + " has precision " + std::to_string(p) +
                                  ", not a KvPrecision (0..3)");
      }
      if (name && !arena) {
        return invalid_argument(where + page_str(s, b) + " needs the " + name +
                                " arena, which is null");
      }
      if (name && (id < 0 || id >= count)) {
        return invalid_argument(where + page_str(s, b) + " is id " + std::to_string(id) + " in " +
                                name + ", outside [0, " + std::to_string(count) + ")");
      }
      if (bound && a.score_seqs[s]) {
        const int32_t slot = a.summary_slots[row0 + b];
        if (slot < -1 || slot >= a.num_summary_slots) {
          return invalid_argument(where + page_str(s, b) + " has summary slot " +
                                  std::to_string(slot) + ", outside [0, " +
                                  std::to_string(a.num_summary_slots) + ") (or -1)");
        }
      }
    }
  }
  return ok_status();
}

void attend_mixed(const AttentionArgs& a, int seq, int kv_head, int key_begin, int key_end,
                  Rows& r) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const int64_t row0 = static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  // Full-precision keys gather into pointer tiles of up to kKeyTile keys, as attend(); a
  // quantized page is folded as its own tile(s), read in registers straight from the page.
  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  int n = 0;
  int tile_begin = key_begin;
  const auto flush = [&] {
    if (n > 0) fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
    tile_begin += n;
    n = 0;
  };
  for (int blk = key_begin / bs; blk * bs < key_end; ++blk) {
    const KvPrecision p = precision_of(a, row0 + blk);
    const int32_t id = a.block_tables[row0 + blk];
    int slot = std::max(key_begin - blk * bs, 0);
    const int s1 = std::min(bs, key_end - blk * bs);
    if (p == KvPrecision::kEvicted) {  // a gap: the tile before it ends here
      flush();
      tile_begin = blk * bs + s1;
      continue;
    }
    if (p == KvPrecision::kFull) {
      while (slot < s1) {
        const int take = std::min(s1 - slot, kKeyTile - n);
        full_rows(a, id, kv_head, slot, slot + take, kp + n, vp + n);
        slot += take;
        n += take;
        if (n == kKeyTile) flush();
      }
      continue;
    }
    flush();
    while (slot < s1) {
      const int take = std::min(s1 - slot, kKeyTile);
      with_quantized_keys(a, p, id, kv_head, slot, slot + take, [&](const auto& keys) {
        fold_tile(r, keys, tile_begin, take, hd, a.scale);
      });
      slot += take;
      tile_begin += take;
    }
  }
  flush();
}

namespace {

// Relevance of slots [0, num_keys) of one page for the query rows of kv head g of sequence s:
// rel[t] = max(rel[t], max over the group's heads of exp(z - m)), z computed by keys.dot exactly
// as fold_rows scored it, so the most attended token of a head gets exactly 1.
template <typename Keys>
void page_relevance(const AttentionArgs& a, const Keys& keys, const float* q0, const float* mh,
                    int g, int num_keys, float* rel) {
  const int hd = a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  const float* q[kRowBlock];
  for (int i0 = 0; i0 < group; i0 += kRowBlock) {
    const int nr = std::min(kRowBlock, group - i0);
    for (int k = 0; k < nr; ++k) q[k] = q0 + static_cast<int64_t>(g * group + i0 + k) * hd;
    for (int t = 0; t < num_keys; ++t) {
      float d[kRowBlock];
      dot_block(keys, q, nr, t, hd, d);
      for (int k = 0; k < nr; ++k) {
        const float z = d[k] * a.scale;  // z - m below may be contracted into an fma:
        const float m = mh[g * group + i0 + k];
        rel[t] = std::max(rel[t], z >= m ? 1.f : expf(z - m));  // z == m gives exactly 1
      }
    }
  }
}

}  // namespace

void score_side_outputs(const AttentionArgs& a, const float* m, ThreadPool& pool) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  thread_local std::vector<std::pair<int, int>> items_tls;  // [(seq, page)]
  std::vector<std::pair<int, int>>& items = items_tls;
  items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    if (!a.score_seqs[s]) continue;
    const int nb = (a.kv_lens[s] + bs - 1) / bs;
    for (int i = 0; i < nb; ++i) items.emplace_back(s, i);
  }
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t item) {
    const auto [s, i] = items[item];
    const int64_t row = static_cast<int64_t>(s) * a.max_blocks_per_seq + i;
    const float* q0 = a.q + static_cast<int64_t>(a.query_start[s]) * a.num_heads * hd;
    const float* mh = m + static_cast<int64_t>(s) * a.num_heads;
    if (a.page_bound && a.summary_slots[row] >= 0) {
      const float* summary =
          a.summaries + static_cast<int64_t>(a.summary_slots[row]) * 2 * nkv * hd;
      float best = 0.f;
      for (int h = 0; h < a.num_heads; ++h) {
        const float* kmin = summary + static_cast<int64_t>(h / group) * hd;
        const float* kmax = kmin + static_cast<int64_t>(nkv) * hd;
        const float* q = q0 + static_cast<int64_t>(h) * hd;
        double ub = 0.0;
        for (int d = 0; d < hd; ++d) {
          ub += std::max(static_cast<double>(q[d]) * kmin[d], static_cast<double>(q[d]) * kmax[d]);
        }
        best = std::max(best, expf(static_cast<float>(a.scale * ub) - mh[h]));
      }
      a.page_bound[row] = std::max(a.page_bound[row], best);
    }
    const KvPrecision p = precision_of(a, row);
    if (!a.token_relevance || p == KvPrecision::kEvicted) return;
    const int32_t id = a.block_tables[row];
    const int n = std::min(bs, a.kv_lens[s] - i * bs);
    float* out = a.token_relevance + static_cast<int64_t>(s) * a.max_blocks_per_seq * bs + i * bs;
    float rel[kKeyTile];
    const float* kp[kKeyTile];
    const float* vp[kKeyTile];
    for (int t0 = 0; t0 < n; t0 += kKeyTile) {
      const int t1 = std::min(n, t0 + kKeyTile);
      std::fill(rel, rel + (t1 - t0), 0.f);
      for (int g = 0; g < nkv; ++g) {
        if (p == KvPrecision::kFull) {
          full_rows(a, id, g, t0, t1, kp, vp);
          page_relevance(a, PtrKeys{kp, vp}, q0, mh, g, t1 - t0, rel);
        } else {
          with_quantized_keys(a, p, id, g, t0, t1, [&](const auto& keys) {
            page_relevance(a, keys, q0, mh, g, t1 - t0, rel);
          });
        }
      }
      for (int t = t0; t < t1; ++t) out[t] = std::max(out[t], rel[t - t0]);
    }
  });
}

}  // namespace kvsplit::backend::cpu_attention
