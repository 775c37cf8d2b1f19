// Key sources of the mixed-precision CPU attention (attention_mixed.cpp) for fold_rows
// (attention_tile.h): int8 and int4 pages (kernels/common/kv_quant.h) read straight from the page,
// codes converted to f32 per SIMD chunk in registers; the helpers that append (page, kv head,
// slot range) to a tile; and the page lookahead (prefetch) of both CPU attention paths.
// Internal: include only from src/backend/cpu/.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/attention_tile.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend::cpu_attention {

using kernels::KvPrecision;
using kernels::QuantPageLayout;

// ---- quantized key sources for fold_rows: dequantization in registers, no scratch rows ----

#if defined(__AVX512F__)
// Codes q[0 .. 16) as floats.
KVSPLIT_ALWAYS_INLINE Vec vec_i8(const int8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return {_mm512_maskz_cvtepi32_ps(kAll, _mm512_maskz_cvtepi8_epi32(kAll, b))};
}
// Codes of channels [d, d + 16) of a packed int4 row as floats (d a multiple of 16).
KVSPLIT_ALWAYS_INLINE Vec vec_u4(const uint8_t* row, int d) {
  uint64_t x;
  std::memcpy(&x, row + d / 2, 8);
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i sh = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
  __m512i v = _mm512_maskz_permutexvar_epi32(
      kAll, idx, _mm512_zextsi128_si512(_mm_cvtsi64_si128(static_cast<int64_t>(x))));
  v = _mm512_and_si512(_mm512_maskz_srlv_epi32(kAll, v, sh), _mm512_set1_epi32(0xf));
  return {_mm512_maskz_cvtepi32_ps(kAll, v)};
}
// As the AVX2 one below. The codes become floats by a table lookup (vpermps reads only the low 4
// bits of each index): no mask, no int -> float conversion.
KVSPLIT_ALWAYS_INLINE void vec_u4_pair(const uint8_t* p, Vec* even, Vec* odd) {
  const __m512 codes = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f,
                                      12.f, 13.f, 14.f, 15.f);
  const __m512i b =
      _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  even->v = _mm512_maskz_permutexvar_ps(kAll, b, codes);
  odd->v = _mm512_maskz_permutexvar_ps(kAll, _mm512_maskz_srli_epi32(kAll, b, 4), codes);
}
#elif defined(__AVX2__) && defined(__FMA__)
KVSPLIT_ALWAYS_INLINE Vec vec_i8(const int8_t* q) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))};
}
KVSPLIT_ALWAYS_INLINE Vec vec_u4(const uint8_t* row, int d) {
  uint32_t x;
  std::memcpy(&x, row + d / 2, 4);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(x)), sh),
                                     _mm256_set1_epi32(0xf));
  return {_mm256_cvtepi32_ps(v)};
}
// Codes of channels [0, 2 kW) of the kW bytes at p, deinterleaved: even = channels 0, 2, ...
// (low nibbles), odd = channels 1, 3, ... (high nibbles).
KVSPLIT_ALWAYS_INLINE void vec_u4_pair(const uint8_t* p, Vec* even, Vec* odd) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  even->v = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0xf)));
  odd->v = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#else
KVSPLIT_ALWAYS_INLINE Vec vec_i8(const int8_t* q) { return {static_cast<float>(*q)}; }
KVSPLIT_ALWAYS_INLINE Vec vec_u4(const uint8_t* row, int d) {
  return {static_cast<float>(kernels::int4_unpack(row, d))};
}
KVSPLIT_ALWAYS_INLINE void vec_u4_pair(const uint8_t* p, Vec* even, Vec* odd) {
  even->v = static_cast<float>(p[0] & 0xf);
  odd->v = static_cast<float>(p[0] >> 4);
}
#endif

// dst[0, n) = src[0, n) with each whole group of 2 kW channels deinterleaved (its even channels,
// then its odd ones, as vec_u4_pair unpacks codes); the rest in order. dst may be src.
inline void deinterleave_groups(const float* src, int n, float* dst) {
  int d = 0;
  for (; d + 2 * kW <= n; d += 2 * kW) {
    Vec e, o;
    Vec::deinterleave(Vec::load(src + d), Vec::load(src + d + kW), &e, &o);
    e.store(dst + d);
    o.store(dst + d + kW);
  }
  for (; d < n; ++d) dst[d] = src[d];
}

// The byte ranges of the next tile's quantized pages, whose cache lines the fold of the current
// tile (Int8Keys / Int4Keys::dots) prefetches a few at a time, so that the prefetches overlap its
// arithmetic. Issued all at once (as the full pages are), the prefetches of a tile queue up behind
// the line fill buffers and stall the fold that follows them. A hint: no effect on results.
struct PrefetchQueue {
  static constexpr int kCapacity = 256;  // ranges; past it, add() prefetches at once
  static constexpr uintptr_t kLine = 64;
  uintptr_t line[kCapacity];  // per range: its next line to prefetch (line-aligned)
  uintptr_t end[kCapacity];   // per range: one past its last byte
  int n = 0;                  // ranges queued
  int next = 0;               // ranges fully issued

  void add(const void* p, int64_t bytes) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(p);
    if (n < kCapacity) {
      line[n] = b & ~(kLine - 1);
      end[n] = b + static_cast<uintptr_t>(bytes);
      ++n;
      return;
    }
    for (uintptr_t c = b & ~(kLine - 1); c < b + bytes; c += kLine) {
      __builtin_prefetch(reinterpret_cast<const void*>(c));
    }
  }
  // Prefetches the next k queued lines.
  KVSPLIT_ALWAYS_INLINE void issue(int k) {
    while (k > 0 && next < n) {
      uintptr_t c = line[next];
      const uintptr_t e = end[next];
      for (; k > 0 && c < e; --k, c += kLine) __builtin_prefetch(reinterpret_cast<const void*>(c));
      line[next] = c;
      if (c >= e) ++next;
    }
  }
  void drain() {
    issue(1 << 30);
    n = next = 0;
  }
};

// Lines a fold issues from its PrefetchQueue per key it scores (about what the line fill buffers
// complete in the time of one key: int4 pages need about 2.6 lines a key, int8 ones 4.1).
constexpr int kPrefetchLinesPerKey = 3;

// Keys of int8 pages (one tile: up to kKeyTile keys, from one or more pages): k_t = code *
// k_scale[t] (per token). q . k_t = (q . codes) * k_scale[t]; sum_t p_t v_t = sum_t (p_t *
// v_scale[t]) codes_t.
struct Int8Keys {
  int n = 0;                  // head_dim
  const int8_t* k[kKeyTile];  // per key: [head_dim] codes
  const int8_t* v[kKeyTile];
  float k_scale[kKeyTile];
  float v_scale[kKeyTile];
  PrefetchQueue* prefetch = nullptr;  // the next tile's ranges, or null

  template <int R>
  void dots(const float* const* q, int num_keys, int /*n*/, float* const* s) const {
    const int8_t* const* rows = k;
    PrefetchQueue* pf = prefetch;
    const int hd = n;
    dot_block_rows_by<R>(
        q,
        [&](const int* tk, Vec* acc) {
          if (pf) pf->issue(kPrefetchLinesPerKey * keys_per_block<R>());
          return accumulate_chunks<R>(
              q, [rows](int t, int d) { return vec_i8(rows[t] + d); }, tk, acc, hd);
        },
        [rows](int t, int d) { return static_cast<float>(rows[t][d]); }, num_keys, n, s);
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < num_keys; ++t) s[r][t] *= k_scale[t];
    }
  }
  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int /*n*/) const {
    float ps[R][kKeyTile];
    const float* pr[R];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < num_keys; ++t) ps[r][t] = p[r][t] * v_scale[t];
      pr[r] = ps[r];
    }
    const int8_t* const* rows = v;
    pv_block_rows<R>(
        o, pr, nullptr, [rows](int t, int d) { return vec_i8(rows[t] + d); },
        [rows](int t, int d) { return static_cast<float>(rows[t][d]); }, num_keys, n);
  }
};

// Keys of int4 pages (one tile, as Int8Keys): k_t[d] = k_zero[d] + k_scale[d] * u (per channel
// of the key's page, dequantized in registers); v_t[d] = v_zero[t] + v_scale[t] * u (per token:
// sum_t p_t v_t = sum_t p_t v_zero[t] + sum_t (p_t v_scale[t]) u_t).
// Channels go in groups of 2 kW (kW bytes of codes), unpacked as their even and odd channels
// (vec_u4_pair, cheaper than unpacking in channel order): the key parameters and the queries are
// deinterleaved the same way (deinterleave_groups), the P.V accumulators around the tile and
// back. Channels past the last whole group go in channel order.
struct Int4Keys {
  int n = 0;                   // head_dim
  const uint8_t* k[kKeyTile];  // per key: [head_dim / 2] packed codes
  const uint8_t* v[kKeyTile];
  const float* k_scale[kKeyTile];  // per key: its page's decoded [head_dim] parameters,
  const float* k_zero[kKeyTile];   // deinterleaved (deinterleave_groups)
  float* q_scratch = nullptr;      // [kRowBlock, head_dim] per-thread scratch
  float* fold_scratch = nullptr;   // [kKeyTile, head_dim] per-thread scratch (dots_folded)
  float v_scale[kKeyTile];
  float v_zero[kKeyTile];
  PrefetchQueue* prefetch = nullptr;  // the next tile's ranges, or null
  bool fold = false;  // one query head per kv head (MHA): the rows' dots take dots_folded

  template <int R>
  void dots(const float* const* q, int num_keys, int /*n*/, float* const* s) const {
    constexpr int kb = keys_per_block<R>();
    static_assert(R <= kRowBlock);
    const float* qd[R];  // the rows' queries, deinterleaved as the parameters
    for (int r = 0; r < R; ++r) {
      deinterleave_groups(q[r], n, q_scratch + r * n);
      qd[r] = q_scratch + r * n;
    }
    if (fold && n >= 2 * kW) {  // MHA: every row on its own (the same bits in any row block)
      for (int r = 0; r < R; ++r) dots_folded(qd[r], num_keys, s[r]);
      return;
    }
    const uint8_t* const* rows = k;
    const float* const* ks = k_scale;
    const float* const* kz = k_zero;
    const int groups = n / (2 * kW);
    PrefetchQueue* pf = prefetch;
    dot_block_rows_by<R>(
        qd,
        [&](const int* tk, Vec* acc) {
          if (pf) pf->issue(kPrefetchLinesPerKey * kb);
          for (int g = 0; g < groups; ++g) {
            const int c = 2 * kW * g;
            Vec qe[R], qo[R];
            for (int r = 0; r < R; ++r) {
              qe[r] = Vec::load(qd[r] + c);
              qo[r] = Vec::load(qd[r] + c + kW);
            }
            for (int j = 0; j < kb; ++j) {
              const int t = tk[j];
              Vec ue, uo;
              vec_u4_pair(rows[t] + kW * g, &ue, &uo);
              const Vec ke = Vec::fma(Vec::load(ks[t] + c), ue, Vec::load(kz[t] + c));
              const Vec ko = Vec::fma(Vec::load(ks[t] + c + kW), uo, Vec::load(kz[t] + c + kW));
              for (int r = 0; r < R; ++r) {
                acc[r * kb + j] = Vec::fma(qe[r], ke, acc[r * kb + j]);
                acc[r * kb + j] = Vec::fma(qo[r], ko, acc[r * kb + j]);
              }
            }
          }
          return accumulate_rest<R>(qd, tk, acc, 2 * kW * groups);
        },
        [&](int t, int d) { return key_at(t, d); }, num_keys, n, s);
  }

  // Channels [d, n) past the whole groups, in channel order: whole vectors of dequantized keys
  // into acc (as dots()); returns where they end (the scalar tail is key_at's).
  template <int R>
  KVSPLIT_ALWAYS_INLINE int accumulate_rest(const float* const* qd, const int* tk, Vec* acc,
                                            int d) const {
    constexpr int kb = keys_per_block<R>();
    for (; d + kW <= n; d += kW) {
      for (int j = 0; j < kb; ++j) {
        const int t = tk[j];
        const Vec kd =
            Vec::fma(Vec::load(k_scale[t] + d), vec_u4(k[t], d), Vec::load(k_zero[t] + d));
        for (int r = 0; r < R; ++r) {
          acc[r * kb + j] = Vec::fma(Vec::load(qd[r] + d), kd, acc[r * kb + j]);
        }
      }
    }
    return d;
  }
  // Element d of key t, dequantized.
  float key_at(int t, int d) const {
    return kernels::int4_dequantize(kernels::int4_unpack(k[t], d), k_scale[t][d], k_zero[t][d]);
  }
  // One query row (MHA: a kv head's single query head): the key scale is folded into the query
  // and the zero point into a per-page constant, q . k_t = (q * k_scale) . u_t + q . k_zero over
  // the whole channel groups, so each key costs its unpack and one fma per vector instead of three
  // (with several rows the per-page products cost more than they save: kv-quant.md). Channels
  // past the whole groups are dequantized per key as in dots(). Taken by every row of an MHA
  // layer (`fold`), whatever rows share its block: a prefill's rows of several tokens then get
  // the bits a decode of each token gets (each row pays its own unpacking there).
  void dots_folded(const float* qd, int num_keys, float* s) const {
    const int groups = n / (2 * kW);
    const int gn = 2 * kW * groups;  // channels in whole groups
    float* folded = fold_scratch;    // [pages of the tile, n]: q * k_scale of each page
    const float* fq[kKeyTile];       // per key: its page's folded query
    float bias[kKeyTile];            // per key: its page's q . k_zero over the groups
    const float* page_scale = nullptr;
    int pages = 0;
    float page_bias = 0;
    for (int t = 0; t < num_keys; ++t) {
      if (k_scale[t] != page_scale) {  // a key of the next page (keys come page by page)
        page_scale = k_scale[t];
        float* f = folded + static_cast<size_t>(pages++) * n;
        const float* kz = k_zero[t];
        Vec b = Vec::zero();
        for (int d = 0; d < gn; d += kW) {
          const Vec qv = Vec::load(qd + d);
          Vec::mul(qv, Vec::load(page_scale + d)).store(f + d);
          b = Vec::fma(qv, Vec::load(kz + d), b);
        }
        page_bias = b.sum();
      }
      fq[t] = folded + static_cast<size_t>(pages - 1) * n;
      bias[t] = page_bias;
    }
    const uint8_t* const* rows = k;
    constexpr int kb = keys_per_block<1>();
    PrefetchQueue* pf = prefetch;
    const float* const qrow[1] = {qd};
    float* const srow[1] = {s};
    dot_block_rows_by<1>(
        qrow,
        [&](const int* tk, Vec* acc) {
          if (pf) pf->issue(kPrefetchLinesPerKey * kb);
          for (int g = 0; g < groups; ++g) {
            const int c = 2 * kW * g;
            for (int j = 0; j < kb; ++j) {
              const int t = tk[j];
              Vec ue, uo;
              vec_u4_pair(rows[t] + kW * g, &ue, &uo);
              acc[j] = Vec::fma(Vec::load(fq[t] + c), ue, acc[j]);
              acc[j] = Vec::fma(Vec::load(fq[t] + c + kW), uo, acc[j]);
            }
          }
          return accumulate_rest<1>(qrow, tk, acc, gn);
        },
        [&](int t, int d) { return key_at(t, d); }, num_keys, n, srow);
    for (int t = 0; t < num_keys; ++t) s[t] += bias[t];
  }

  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int /*n*/) const {
    float ps[R][kKeyTile];
    const float* pr[R];
    float bias[R];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < num_keys; ++t) ps[r][t] = p[r][t] * v_scale[t];
      Vec acc = Vec::zero();  // bias = sum_t p_t v_zero[t], in vectors (no serial add chain)
      int t = 0;
      for (; t + kW <= num_keys; t += kW) {
        acc = Vec::fma(Vec::load(p[r] + t), Vec::load(v_zero + t), acc);
      }
      float b = acc.sum();
      for (; t < num_keys; ++t) b += p[r][t] * v_zero[t];
      bias[r] = b;
      pr[r] = ps[r];
    }
    const uint8_t* const* rows = v;
    const int groups = n / (2 * kW);
    for (int g = 0; g < groups; ++g) {
      const int c = 2 * kW * g;
      Vec ae[R], ao[R];
      for (int r = 0; r < R; ++r) {
        Vec::deinterleave(Vec::load(o[r] + c), Vec::load(o[r] + c + kW), &ae[r], &ao[r]);
        ae[r] = Vec::add(ae[r], Vec::set1(bias[r]));
        ao[r] = Vec::add(ao[r], Vec::set1(bias[r]));
      }
      for (int t = 0; t < num_keys; ++t) {
        Vec ue, uo;
        vec_u4_pair(rows[t] + kW * g, &ue, &uo);
        for (int r = 0; r < R; ++r) {
          const Vec pt = Vec::set1(ps[r][t]);
          ae[r] = Vec::fma(pt, ue, ae[r]);
          ao[r] = Vec::fma(pt, uo, ao[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        Vec a, b;
        Vec::interleave(ae[r], ao[r], &a, &b);
        a.store(o[r] + c);
        b.store(o[r] + c + kW);
      }
    }
    const int d0 = 2 * kW * groups;  // channels past the whole groups, in channel order
    if (d0 == n) return;
    float* ot[R];
    for (int r = 0; r < R; ++r) ot[r] = o[r] + d0;
    pv_block_rows<R>(
        ot, pr, bias, [=](int t, int d) { return vec_u4(rows[t], d0 + d); },
        [=](int t, int d) { return static_cast<float>(kernels::int4_unpack(rows[t], d0 + d)); },
        num_keys, n - d0);
  }
};

// out[i] = f16 h[i] as f32 (exact: F16C where the compiler targets it, else float_bits.h).
inline void decode_f16(const uint16_t* h, int n, float* out) {
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

inline KvPrecision precision_of(const AttentionArgs& a, int64_t row) {
  return a.page_precision ? static_cast<KvPrecision>(a.page_precision[row]) : KvPrecision::kFull;
}

// Full-precision K/V row pointers of slots [s0, s1) of kv head h of page `id` of `kv`.
inline void full_rows(const AttentionArgs& a, int32_t id, int h, int s0, int s1, const float** kp,
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

// Asks for the cache lines of [p, p + bytes) (a hint: no fault, no effect on results).
// Calls fn(ptr, bytes) for each contiguous range that attending kv head h of page (p, id) reads:
// K and V rows (full: f32; int8 / int4: codes), then the quantization parameters.
template <typename Fn>
inline void for_each_page_range(const AttentionArgs& a, KvPrecision p, int32_t id, int h, Fn&& fn) {
  const int hd = a.head_dim;
  const int bs = a.kv.block_size;
  if (p == KvPrecision::kFull) {
    const kernels::PagedKvLayout layout{a.kv.num_kv_heads, bs, hd};
    const float* pages = static_cast<const float*>(a.kv.data);
    const int64_t row_bytes = int64_t{bs} * hd * static_cast<int64_t>(sizeof(float));
    fn(pages + layout.offset(id, 0, h, 0), row_bytes);
    fn(pages + layout.offset(id, 1, h, 0), row_bytes);
    return;
  }
  const QuantPageLayout ql{a.num_kv_heads, bs, hd};
  if (p == KvPrecision::kInt8) {
    const uint8_t* page = static_cast<const uint8_t*>(a.int8_pages) + id * ql.bytes(p);
    const int8_t* values = reinterpret_cast<const int8_t*>(page + ql.int8_values_offset());
    const uint16_t* scales = kernels::kvq_f16_at(page, ql.int8_scales_offset());
    fn(values + ql.token_index(0, h, 0) * hd, int64_t{bs} * hd);
    fn(values + ql.token_index(1, h, 0) * hd, int64_t{bs} * hd);
    fn(scales + ql.token_index(0, h, 0), int64_t{bs} * 2);
    fn(scales + ql.token_index(1, h, 0), int64_t{bs} * 2);
    return;
  }
  if (p != KvPrecision::kInt4) return;  // evicted: nothing
  const uint8_t* page = static_cast<const uint8_t*>(a.int4_pages) + id * ql.bytes(p);
  const uint8_t* values = page + ql.int4_values_offset();
  fn(values + ql.token_index(0, h, 0) * (hd / 2), int64_t{bs} * (hd / 2));
  fn(values + ql.token_index(1, h, 0) * (hd / 2), int64_t{bs} * (hd / 2));
  fn(kernels::kvq_f16_at(page, ql.int4_k_scale_offset()) + int64_t{h} * hd, int64_t{hd} * 2);
  fn(kernels::kvq_f16_at(page, ql.int4_k_zero_offset()) + int64_t{h} * hd, int64_t{hd} * 2);
  fn(kernels::kvq_f16_at(page, ql.int4_v_scale_offset()) + int64_t{h} * bs, int64_t{bs} * 2);
  fn(kernels::kvq_f16_at(page, ql.int4_v_zero_offset()) + int64_t{h} * bs, int64_t{bs} * 2);
}

// Pages page_lookahead looks at.
enum class Lookahead : uint8_t { kAll, kFull, kQuantized };

// Memory lookahead of a walk over the pages of one kv head (h) of one sequence (block-table row
// `row0`), called at page blk before it is folded: one load from each range of page
// blk + 2 * distance, so that its TLB misses are walked now (software prefetches that miss the
// STLB are dropped), and a prefetch of every cache line of page blk + distance, or with `queue`
// its lines queued for the fold to issue. Only the pages `which` selects. Pages sit in their
// arenas in block-table order, which is random, so the hardware prefetchers cannot foresee the
// next page; without this every page starts with page walks and misses (about half the time of a
// 16K-token decode on the development VM). Pages at or past key_end are not touched; results do
// not depend on it.
inline void page_lookahead(const AttentionArgs& a, int64_t row0, int blk, int key_end, int h,
                           int distance = 1, Lookahead which = Lookahead::kAll,
                           PrefetchQueue* queue = nullptr) {
  const int bs = a.kv.block_size;
  const auto wanted = [&](int b) {
    if (b < 0 || b * bs >= key_end) return false;
    const bool full = precision_of(a, row0 + b) == KvPrecision::kFull;
    return which == Lookahead::kAll || full == (which == Lookahead::kFull);
  };
  const int touch = blk + 2 * distance;
  if (wanted(touch)) {
    for_each_page_range(
        a, precision_of(a, row0 + touch), a.block_tables[row0 + touch], h,
        [](const void* p, int64_t) { (void)*static_cast<const volatile char*>(p); });
  }
  const int next = blk + distance;
  if (!wanted(next)) return;
  if (queue) {
    for_each_page_range(a, precision_of(a, row0 + next), a.block_tables[row0 + next], h,
                        [queue](const void* c, int64_t bytes) { queue->add(c, bytes); });
    return;
  }
  for_each_page_range(a, precision_of(a, row0 + next), a.block_tables[row0 + next], h,
                      [](const void* c, int64_t bytes) {
                        constexpr int64_t kLine = 64;
                        const char* line = static_cast<const char*>(c);
                        for (int64_t i = 0; i < bytes; i += kLine) __builtin_prefetch(line + i);
                        __builtin_prefetch(line + bytes - 1);
                      });
}

// Per-thread decoded int4 key parameters of the pages of the current tile ([kKeyTile pages, 2
// (scale, zero), head_dim]).
inline float* int4_param_slots(int head_dim) {
  thread_local std::vector<float> p;
  const size_t need = static_cast<size_t>(kKeyTile) * 2 * head_dim;
  if (p.size() < need) p.resize(need);
  return p.data();
}

// Per-thread query scratch of Int4Keys::dots ([kRowBlock, head_dim]).
inline float* int4_query_scratch(int head_dim) {
  thread_local std::vector<float> p;
  const size_t need = static_cast<size_t>(kRowBlock) * head_dim;
  if (p.size() < need) p.resize(need);
  return p.data();
}

// Per-thread folded queries of Int4Keys::dots_folded ([kKeyTile pages, head_dim]).
inline float* int4_fold_scratch(int head_dim) {
  thread_local std::vector<float> p;
  const size_t need = static_cast<size_t>(kKeyTile) * head_dim;
  if (p.size() < need) p.resize(need);
  return p.data();
}

// Appends slots [s0, s1) of kv head h of the int8 page `id` to `keys` as keys [at, at + s1 - s0)
// (at + s1 - s0 <= kKeyTile).
inline void append_int8(const AttentionArgs& a, int32_t id, int h, int s0, int s1, int at,
                        Int8Keys& keys) {
  const int hd = a.head_dim;
  const QuantPageLayout ql{a.num_kv_heads, a.kv.block_size, hd};
  const uint8_t* page =
      static_cast<const uint8_t*>(a.int8_pages) + id * ql.bytes(KvPrecision::kInt8);
  const int8_t* values = reinterpret_cast<const int8_t*>(page + ql.int8_values_offset());
  const uint16_t* scales = kernels::kvq_f16_at(page, ql.int8_scales_offset());
  const int8_t* k0 = values + ql.token_index(0, h, s0) * hd;
  const int8_t* v0 = values + ql.token_index(1, h, s0) * hd;
  keys.n = hd;
  for (int i = 0; i < s1 - s0; ++i) {
    keys.k[at + i] = k0 + static_cast<int64_t>(i) * hd;
    keys.v[at + i] = v0 + static_cast<int64_t>(i) * hd;
  }
  decode_f16(scales + ql.token_index(0, h, s0), s1 - s0, keys.k_scale + at);
  decode_f16(scales + ql.token_index(1, h, s0), s1 - s0, keys.v_scale + at);
}

// As append_int8 for an int4 page; `params` [2, head_dim] receives the page's decoded key
// parameters (deinterleaved), which the appended keys point to (it must outlive their use).
inline void append_int4(const AttentionArgs& a, int32_t id, int h, int s0, int s1, int at,
                        float* params, Int4Keys& keys) {
  const int hd = a.head_dim;
  const int bs = a.kv.block_size;
  const QuantPageLayout ql{a.num_kv_heads, bs, hd};
  const uint8_t* page =
      static_cast<const uint8_t*>(a.int4_pages) + id * ql.bytes(KvPrecision::kInt4);
  const uint8_t* values = page + ql.int4_values_offset();
  decode_f16(kernels::kvq_f16_at(page, ql.int4_k_scale_offset()) + int64_t{h} * hd, hd, params);
  decode_f16(kernels::kvq_f16_at(page, ql.int4_k_zero_offset()) + int64_t{h} * hd, hd, params + hd);
  deinterleave_groups(params, hd, params);
  deinterleave_groups(params + hd, hd, params + hd);
  const uint8_t* k0 = values + ql.token_index(0, h, s0) * (hd / 2);
  const uint8_t* v0 = values + ql.token_index(1, h, s0) * (hd / 2);
  keys.n = hd;
  keys.fold = a.num_heads == a.num_kv_heads;
  keys.q_scratch = int4_query_scratch(hd);
  keys.fold_scratch = int4_fold_scratch(hd);
  for (int i = 0; i < s1 - s0; ++i) {
    keys.k[at + i] = k0 + static_cast<int64_t>(i) * (hd / 2);
    keys.v[at + i] = v0 + static_cast<int64_t>(i) * (hd / 2);
    keys.k_scale[at + i] = params;
    keys.k_zero[at + i] = params + hd;
  }
  const uint16_t* v_scale = kernels::kvq_f16_at(page, ql.int4_v_scale_offset()) + int64_t{h} * bs;
  const uint16_t* v_zero = kernels::kvq_f16_at(page, ql.int4_v_zero_offset()) + int64_t{h} * bs;
  decode_f16(v_scale + s0, s1 - s0, keys.v_scale + at);
  decode_f16(v_zero + s0, s1 - s0, keys.v_zero + at);
}

// Calls fn(keys) with the key source of slots [s0, s1) (s1 - s0 <= kKeyTile) of kv head h of the
// quantized page (p, id).
template <typename Fn>
inline void with_quantized_keys(const AttentionArgs& a, KvPrecision p, int32_t id, int h, int s0,
                                int s1, Fn&& fn) {
  if (p == KvPrecision::kInt8) {
    Int8Keys keys;
    append_int8(a, id, h, s0, s1, 0, keys);
    fn(keys);
    return;
  }
  Int4Keys keys;
  append_int4(a, id, h, s0, s1, 0, int4_param_slots(a.head_dim), keys);
  fn(keys);
}

}  // namespace kvsplit::backend::cpu_attention
