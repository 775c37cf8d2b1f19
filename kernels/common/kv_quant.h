// Quantized KV pages (semantic cut, docs kv-cuts.md §2): int8 symmetric per token and head, int4
// KIVI (keys asymmetric per channel within the page, values asymmetric per token). Page layouts
// and the per-element math shared by the CPU backend and the CUDA kernels.
//
// A quantized page holds ONE page of ONE layer: the block_size tokens of every kv head, K and V.
// Only FULL pages (all block_size slots written) are quantized: the int4 key parameters are taken
// over all block_size tokens of the page, so a slot written later would not be covered.
//
// Parameters (scales, zero points) are stored as f16 bits, and values are quantized with the
// ROUNDED parameters, rounded outwards so that the stored range covers every value of the group:
//   |x - dequantize(quantize(x))| <= scale / 2   (plus f32 rounding of x / scale, 2^-23 relative)
// for every x of a group, where scale is the stored parameter of the group. The bound holds for
// |x| <= 127 * 65504 (int8) and |x| <= 65504 (int4: its zero point is an f16); larger values and
// +-inf saturate to the end of the stored range (the f16 parameters are clamped to 65504, never
// inf). A NaN anywhere in a group makes the group's parameters NaN: every element of the group
// dequantizes to NaN (the poison propagates like it would from a full-precision page).
// Denormal inputs work: a nonzero scale is at least the smallest f16 subnormal (2^-24).
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/float_bits.h"  // host conversions (the device pass uses cuda_fp16.h)
#include "kernels/common/host_device.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace kvsplit::kernels {

// Storage precision of one page. kEvicted: nothing resident (only the page's summary remains).
enum class KvPrecision : uint8_t { kFull = 0, kInt8 = 1, kInt4 = 2, kEvicted = 3 };

constexpr int kInt8QMax = 127;  // int8 codes in [-127, 127]
constexpr int kInt4QMax = 15;   // int4 codes in [0, 15]

// ---- f16 parameter bits ----
constexpr uint16_t kHalfMaxBits = 0x7bff;  // 65504, the largest finite f16
constexpr float kHalfMax = 65504.f;
constexpr uint16_t kHalfNanBits = 0x7fff;

KVSPLIT_HOST_DEVICE uint16_t kvq_half_bits(float x) {  // round to nearest even
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(x));
#else
  return float_to_half_bits(x);
#endif
}
KVSPLIT_HOST_DEVICE float kvq_half_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return half_bits_to_float(h);
#endif
}
// Neighbouring finite f16 values (h finite; +-0 step to the smallest subnormal).
KVSPLIT_HOST_DEVICE uint16_t kvq_half_next_up(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x0001;
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}
KVSPLIT_HOST_DEVICE uint16_t kvq_half_next_down(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001;
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
// The smallest f16 >= x, and the largest f16 <= x, for finite |x| <= 65504.
KVSPLIT_HOST_DEVICE uint16_t kvq_half_at_least(float x) {
  const uint16_t h = kvq_half_bits(x);
  return kvq_half_float(h) < x ? kvq_half_next_up(h) : h;
}
KVSPLIT_HOST_DEVICE uint16_t kvq_half_at_most(float x) {
  const uint16_t h = kvq_half_bits(x);
  return kvq_half_float(h) > x ? kvq_half_next_down(h) : h;
}

KVSPLIT_HOST_DEVICE int64_t kvq_align16(int64_t n) { return (n + 15) & ~int64_t{15}; }

// ---- key summaries (recall bounds) ----
// A page's key summary, per layer: f16 bits [summary_parts, 2 (min, max), num_kv_heads, head_dim]
// (QuantPageLayout::summary_elems), part p the min and max of each channel over the page's slots
// [p * block_size / summary_parts, (p + 1) * block_size / summary_parts), the min rounded down and
// the max rounded up, so each part's range still covers its keys and
// max_p sum_d max(q_d kmin_pd, q_d kmax_pd) stays an upper bound of q.k over the page. More parts
// give a tighter bound for proportionally more bytes. Half the bytes of f32.
using KvSummaryElem = uint16_t;
constexpr uint16_t kHalfInfBits = 0x7c00, kHalfNegInfBits = 0xfc00;
// The largest f16 <= x (-inf below -65504; +inf stays +inf; NaN: NaN).
KVSPLIT_HOST_DEVICE uint16_t kvq_summary_min_bits(float x) {
  if (!(x == x)) return kHalfNanBits;
  if (x > kHalfMax) return x == INFINITY ? kHalfInfBits : kHalfMaxBits;
  if (x < -kHalfMax) return kHalfNegInfBits;
  return kvq_half_at_most(x);
}
// The smallest f16 >= x (+inf above 65504; -inf stays -inf; NaN: NaN).
KVSPLIT_HOST_DEVICE uint16_t kvq_summary_max_bits(float x) {
  if (!(x == x)) return kHalfNanBits;
  if (x < -kHalfMax)
    return x == -INFINITY ? kHalfNegInfBits : static_cast<uint16_t>(0x8000u | kHalfMaxBits);
  if (x > kHalfMax) return kHalfInfBits;
  return kvq_half_at_least(x);
}

// Byte layout of one quantized page of one layer. Every section starts 16-byte aligned, and
// bytes() is a multiple of 16, so pages packed back to back in an arena stay aligned.
//   int8: values int8 [2 (K, V), num_kv_heads, block_size, head_dim] at int8_values_offset(),
//         scales f16 [2, num_kv_heads, block_size] at int8_scales_offset().
//   int4: values u8 [2, num_kv_heads, block_size, head_dim / 2] (channel 2c in the low nibble,
//         2c + 1 in the high one) at int4_values_offset(); key parameters per channel f16
//         [num_kv_heads, head_dim] (scale, zero point); value parameters per token f16
//         [num_kv_heads, block_size] (scale, zero point).
// head_dim must be even.
struct QuantPageLayout {
  int num_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;
  // Key summaries only ("key summaries" above; the quantized bytes do not depend on it): the page
  // is summarized in this many equal parts, >= 1 and dividing block_size.
  int summary_parts = 1;

  // f16 elements of one page's key summary of one layer: [summary_parts, 2, num_kv_heads,
  // head_dim].
  KVSPLIT_HOST_DEVICE int64_t summary_elems() const {
    return int64_t{summary_parts} * 2 * num_kv_heads * head_dim;
  }
  KVSPLIT_HOST_DEVICE bool valid_summary_parts() const {
    return summary_parts >= 1 && block_size > 0 && block_size % summary_parts == 0;
  }

  // Values per (K or V) section: num_kv_heads * block_size * head_dim.
  KVSPLIT_HOST_DEVICE int64_t values_per_kv() const {
    return int64_t{num_kv_heads} * block_size * head_dim;
  }
  // Index of (kv_sel, head, slot) in a [2, num_kv_heads, block_size] array.
  KVSPLIT_HOST_DEVICE int64_t token_index(int kv_sel, int head, int slot) const {
    return (int64_t{kv_sel} * num_kv_heads + head) * block_size + slot;
  }

  KVSPLIT_HOST_DEVICE int64_t int8_values_offset() const { return 0; }
  KVSPLIT_HOST_DEVICE int64_t int8_scales_offset() const {
    return kvq_align16(2 * values_per_kv());
  }
  KVSPLIT_HOST_DEVICE int64_t int4_values_offset() const { return 0; }
  KVSPLIT_HOST_DEVICE int64_t int4_k_scale_offset() const { return kvq_align16(values_per_kv()); }
  KVSPLIT_HOST_DEVICE int64_t int4_k_zero_offset() const {
    return int4_k_scale_offset() + kvq_align16(int64_t{2} * num_kv_heads * head_dim);
  }
  KVSPLIT_HOST_DEVICE int64_t int4_v_scale_offset() const {
    return int4_k_zero_offset() + kvq_align16(int64_t{2} * num_kv_heads * head_dim);
  }
  KVSPLIT_HOST_DEVICE int64_t int4_v_zero_offset() const {
    return int4_v_scale_offset() + kvq_align16(int64_t{2} * num_kv_heads * block_size);
  }

  // Bytes of one page of one layer at precision p: int8 / int4 as above, 0 for kEvicted. kFull
  // pages live in the LayerKv arena (their size depends on the KV dtype): -1.
  KVSPLIT_HOST_DEVICE int64_t bytes(KvPrecision p) const {
    switch (p) {
      case KvPrecision::kInt8:
        return int8_scales_offset() + kvq_align16(int64_t{4} * num_kv_heads * block_size);
      case KvPrecision::kInt4:
        return int4_v_zero_offset() + kvq_align16(int64_t{2} * num_kv_heads * block_size);
      case KvPrecision::kEvicted:
        return 0;
      default:
        return -1;
    }
  }
};

// ---- int8: symmetric, x = q * scale, q in [-127, 127] ----

// Scale bits of a group whose largest magnitude is amax (>= 0, +inf, or NaN for a group holding a
// NaN): 0 for an all-zero group; otherwise the smallest f16 with scale * 127 >= amax, at least
// 2^-24 and at most 65504.
KVSPLIT_HOST_DEVICE uint16_t int8_scale_bits(float amax) {
  if (!(amax == amax)) return kHalfNanBits;
  if (amax == 0.f) return 0;
  const float s = amax / kInt8QMax;
  if (!(s < kHalfMax)) return kHalfMaxBits;
  uint16_t h = kvq_half_at_least(s);
  while (kvq_half_float(h) * kInt8QMax < amax && h < kHalfMaxBits) h = kvq_half_next_up(h);
  return h;
}

// Code of x at `scale` (a decoded int8_scale_bits value). Scale 0 or NaN: 0.
KVSPLIT_HOST_DEVICE int8_t int8_quantize(float x, float scale) {
  if (!(scale > 0.f)) return 0;
  float v = rintf(x / scale);
  if (!(v == v)) return 0;
  v = v < -kInt8QMax ? -kInt8QMax : (v > kInt8QMax ? kInt8QMax : v);
  return static_cast<int8_t>(v);
}

KVSPLIT_HOST_DEVICE float int8_dequantize(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// Quantizes one group (one token of one head: x[0], x[stride], ... x[(n-1) stride]) into
// q[0 .. n) and returns its scale bits.
KVSPLIT_HOST_DEVICE uint16_t int8_quantize_group(const float* x, int n, int64_t stride, int8_t* q) {
  float amax = 0.f;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i * stride]);
    nan |= !(a == a);
    amax = a > amax ? a : amax;
  }
  const uint16_t bits = int8_scale_bits(nan ? NAN : amax);
  const float scale = kvq_half_float(bits);
  for (int i = 0; i < n; ++i) q[i] = int8_quantize(x[i * stride], scale);
  return bits;
}

// ---- int4: asymmetric, x = zero + scale * u, u in [0, 15] ----

struct Int4Params {
  uint16_t scale_bits;
  uint16_t zero_bits;
};

// Parameters of a group with minimum lo and maximum hi (NaN when the group holds a NaN): zero is
// the largest f16 <= lo (clamped to +-65504); scale the smallest f16 with
// zero + 15 * scale >= hi (0 when hi == zero), at most 65504.
KVSPLIT_HOST_DEVICE Int4Params int4_params(float lo, float hi) {
  if (!(lo == lo) || !(hi == hi)) return Int4Params{kHalfNanBits, kHalfNanBits};
  lo = lo < -kHalfMax ? -kHalfMax : (lo > kHalfMax ? kHalfMax : lo);
  hi = hi < lo ? lo : (hi > kHalfMax ? kHalfMax : hi);
  const uint16_t z = kvq_half_at_most(lo);
  const float zero = kvq_half_float(z);
  if (hi == zero) return Int4Params{0, z};
  const float s = (hi - zero) / kInt4QMax;
  if (!(s < kHalfMax)) return Int4Params{kHalfMaxBits, z};
  uint16_t h = kvq_half_at_least(s);
  while (fmaf(kvq_half_float(h), float{kInt4QMax}, zero) < hi && h < kHalfMaxBits) {
    h = kvq_half_next_up(h);
  }
  return Int4Params{h, z};
}

// Code of x at (scale, zero) (decoded Int4Params). Scale 0 or NaN: 0.
KVSPLIT_HOST_DEVICE uint8_t int4_quantize(float x, float scale, float zero) {
  if (!(scale > 0.f)) return 0;
  float v = rintf((x - zero) / scale);
  if (!(v == v)) return 0;
  v = v < 0.f ? 0.f : (v > kInt4QMax ? kInt4QMax : v);
  return static_cast<uint8_t>(v);
}

KVSPLIT_HOST_DEVICE float int4_dequantize(uint8_t u, float scale, float zero) {
  return fmaf(scale, static_cast<float>(u), zero);
}

// Min and max of a group x[0], x[stride], ... x[(n-1) stride] as int4_params wants them.
KVSPLIT_HOST_DEVICE Int4Params int4_group_params(const float* x, int n, int64_t stride) {
  float lo = INFINITY, hi = -INFINITY;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    const float v = x[i * stride];
    nan |= !(v == v);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  return nan ? int4_params(NAN, NAN) : int4_params(lo, hi);
}

// Nibble c of a packed row (channel c: low nibble of byte c / 2 when c is even).
KVSPLIT_HOST_DEVICE uint8_t int4_unpack(const uint8_t* packed, int c) {
  return static_cast<uint8_t>((packed[c >> 1] >> ((c & 1) * 4)) & 0xfu);
}
KVSPLIT_HOST_DEVICE uint8_t int4_pack(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xfu) | ((odd & 0xfu) << 4));
}

// ---- one dequantized element of a page (kv_sel 0 = K, 1 = V) ----

KVSPLIT_HOST_DEVICE const uint16_t* kvq_f16_at(const uint8_t* page, int64_t offset) {
  return reinterpret_cast<const uint16_t*>(page + offset);
}

KVSPLIT_HOST_DEVICE float int8_page_elem(const QuantPageLayout& l, const uint8_t* page, int kv_sel,
                                         int head, int slot, int d) {
  const int64_t t = l.token_index(kv_sel, head, slot);
  const int8_t q =
      reinterpret_cast<const int8_t*>(page + l.int8_values_offset())[t * l.head_dim + d];
  return int8_dequantize(q, kvq_half_float(kvq_f16_at(page, l.int8_scales_offset())[t]));
}

KVSPLIT_HOST_DEVICE float int4_page_elem(const QuantPageLayout& l, const uint8_t* page, int kv_sel,
                                         int head, int slot, int d) {
  const int64_t t = l.token_index(kv_sel, head, slot);
  const uint8_t u = int4_unpack(page + l.int4_values_offset() + t * (l.head_dim / 2), d);
  float scale, zero;
  if (kv_sel == 0) {
    const int64_t c = int64_t{head} * l.head_dim + d;
    scale = kvq_half_float(kvq_f16_at(page, l.int4_k_scale_offset())[c]);
    zero = kvq_half_float(kvq_f16_at(page, l.int4_k_zero_offset())[c]);
  } else {
    const int64_t c = int64_t{head} * l.block_size + slot;
    scale = kvq_half_float(kvq_f16_at(page, l.int4_v_scale_offset())[c]);
    zero = kvq_half_float(kvq_f16_at(page, l.int4_v_zero_offset())[c]);
  }
  return int4_dequantize(u, scale, zero);
}

}  // namespace kvsplit::kernels
