// Key sources of the mixed-precision CPU attention (attention_mixed.cpp) for fold_rows
// (attention_tile.h): int8 and int4 pages (kernels/common/kv_quant.h) read straight from the page,
// codes converted to f32 per SIMD chunk in registers, and the helpers that build them for one
// (page, kv head, slot range). Internal: include only from src/backend/cpu/.
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
KVSPLIT_ALWAYS_INLINE void vec_u4_pair(const uint8_t* p, Vec* even, Vec* odd) {
  const __m512i b =
      _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  even->v = _mm512_maskz_cvtepi32_ps(kAll, _mm512_and_si512(b, _mm512_set1_epi32(0xf)));
  odd->v = _mm512_maskz_cvtepi32_ps(kAll, _mm512_maskz_srli_epi32(kAll, b, 4));
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

// Slots [s0, s0 + num_keys) of one kv head of an int8 page: k_t = code * k_scale[t] (per token).
// q . k_t = (q . codes) * k_scale[t]; sum_t p_t v_t = sum_t (p_t * v_scale[t]) codes_t.
struct Int8Keys {
  const int8_t* k;  // [num_keys, head_dim] codes
  const int8_t* v;
  int n;  // head_dim
  float k_scale[kKeyTile];
  float v_scale[kKeyTile];

  template <int R>
  void dots(const float* const* q, int num_keys, int /*n*/, float* const* s) const {
    const int8_t* base = k;
    const int hd = n;
    dot_block_rows<R>(
        q, [base, hd](int t, int d) { return vec_i8(base + t * hd + d); },
        [base, hd](int t, int d) { return static_cast<float>(base[t * hd + d]); }, num_keys, n, s);
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
    const int8_t* base = v;
    const int hd = n;
    pv_block_rows<R>(
        o, pr, nullptr, [base, hd](int t, int d) { return vec_i8(base + t * hd + d); },
        [base, hd](int t, int d) { return static_cast<float>(base[t * hd + d]); }, num_keys, n);
  }
};

// Slots [s0, s0 + num_keys) of one kv head of an int4 page: k_t[d] = k_zero[d] + k_scale[d] * u
// (per channel, dequantized in registers); v_t[d] = v_zero[t] + v_scale[t] * u (per token:
// sum_t p_t v_t = sum_t p_t v_zero[t] + sum_t (p_t v_scale[t]) u_t).
// P.V takes the channels in groups of 2 kW (kW bytes of codes), unpacked as their even and odd
// channels (vec_u4_pair, cheaper than unpacking in channel order), with the accumulators
// deinterleaved around the tile and back; channels past the last whole group go in order.
struct Int4Keys {
  const uint8_t* k;  // [num_keys, head_dim / 2] packed codes
  const uint8_t* v;
  int n;                 // head_dim
  const float* k_scale;  // [head_dim] decoded
  const float* k_zero;
  float v_scale[kKeyTile];
  float v_zero[kKeyTile];

  template <int R>
  void dots(const float* const* q, int num_keys, int /*n*/, float* const* s) const {
    const uint8_t* base = k;
    const int half = n / 2;
    const float* ks = k_scale;
    const float* kz = k_zero;
    dot_block_rows<R>(
        q,
        [=](int t, int d) {
          return Vec::fma(Vec::load(ks + d), vec_u4(base + t * half, d), Vec::load(kz + d));
        },
        [=](int t, int d) {
          return kernels::int4_dequantize(kernels::int4_unpack(base + t * half, d), ks[d], kz[d]);
        },
        num_keys, n, s);
  }
  template <int R>
  void pv(float* const* o, const float* const* p, int num_keys, int /*n*/) const {
    float ps[R][kKeyTile];
    const float* pr[R];
    float bias[R];
    for (int r = 0; r < R; ++r) {
      float b = 0.f;
      for (int t = 0; t < num_keys; ++t) {
        ps[r][t] = p[r][t] * v_scale[t];
        b += p[r][t] * v_zero[t];
      }
      bias[r] = b;
      pr[r] = ps[r];
    }
    const uint8_t* base = v;
    const int half = n / 2;
    const int groups = n / (2 * kW);
    for (int g = 0; g < groups; ++g) {
      const int c = 2 * kW * g;
      Vec ae[R], ao[R];
      for (int r = 0; r < R; ++r) {
        Vec::deinterleave(Vec::load(o[r] + c), Vec::load(o[r] + c + kW), &ae[r], &ao[r]);
        ae[r] = Vec::add(ae[r], Vec::set1(bias[r]));
        ao[r] = Vec::add(ao[r], Vec::set1(bias[r]));
      }
      const uint8_t* codes = base + kW * g;
      for (int t = 0; t < num_keys; ++t) {
        Vec ue, uo;
        vec_u4_pair(codes + t * half, &ue, &uo);
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
        ot, pr, bias, [=](int t, int d) { return vec_u4(base + t * half, d0 + d); },
        [=](int t, int d) {
          return static_cast<float>(kernels::int4_unpack(base + t * half, d0 + d));
        },
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

// Per-thread decoded int4 key parameters of the current page ([head_dim] each).
struct Int4KeyParams {
  std::vector<float> k_scale, k_zero;
};

inline Int4KeyParams& int4_key_params(int head_dim) {
  thread_local Int4KeyParams p;
  if (p.k_scale.size() < static_cast<size_t>(head_dim)) {
    p.k_scale.resize(head_dim);
    p.k_zero.resize(head_dim);
  }
  return p;
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

// Memory lookahead of a walk over the pages of one kv head (h) of one sequence (block-table row
// `row0`), called at page blk before it is folded: one load from each range of page blk + 2, so
// that its TLB misses are walked now (software prefetches that miss the STLB are dropped), and a
// prefetch of every cache line of page blk + 1. Pages sit in their arenas in block-table order,
// which is random, so the hardware prefetchers cannot foresee the next page; without this every
// page starts with page walks and misses (about half the time of a 16K-token decode on the
// development VM). Pages at or past key_end are not touched; results do not depend on it.
inline void page_lookahead(const AttentionArgs& a, int64_t row0, int blk, int key_end, int h) {
  const int bs = a.kv.block_size;
  if ((blk + 2) * bs < key_end) {
    for_each_page_range(
        a, precision_of(a, row0 + blk + 2), a.block_tables[row0 + blk + 2], h,
        [](const void* p, int64_t) { (void)*static_cast<const volatile char*>(p); });
  }
  if ((blk + 1) * bs < key_end) {
    for_each_page_range(a, precision_of(a, row0 + blk + 1), a.block_tables[row0 + blk + 1], h,
                        [](const void* p, int64_t bytes) {
                          constexpr int64_t kLine = 64;
                          const char* c = static_cast<const char*>(p);
                          for (int64_t i = 0; i < bytes; i += kLine) __builtin_prefetch(c + i);
                          __builtin_prefetch(c + bytes - 1);
                        });
  }
}

// Calls fn(keys) with the key source of slots [s0, s1) (s1 - s0 <= kKeyTile) of kv head h of the
// quantized page (p, id).
template <typename Fn>
inline void with_quantized_keys(const AttentionArgs& a, KvPrecision p, int32_t id, int h, int s0,
                                int s1, Fn&& fn) {
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
  Int4KeyParams& params = int4_key_params(hd);
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

}  // namespace kvsplit::backend::cpu_attention
