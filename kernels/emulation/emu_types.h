// CUDA value types and device intrinsics for host compilers (the emulation harness). Included only
// through kernels/common/cuda_compat.h when KVSPLIT_EMULATE_CUDA is defined; never under nvcc.
//
// `__half` and `__nv_bfloat16` store the raw 16 bits and convert with round-to-nearest-even,
// bit-for-bit as cuda_fp16.h / cuda_bf16.h do (NaN -> the canonical 0x7fff, overflow -> inf).
#pragma once

#if defined(__CUDACC__)
#error "emu_types.h is for host compilers; nvcc uses the real CUDA headers"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

// ---- execution-space and memory qualifiers ----
#define __host__
#define __device__ inline
#define __global__ inline
#define __forceinline__
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ inline

// ---- vector and index types (layout-compatible with vector_types.h) ----
struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- half / bfloat16 ----
struct __align__(2) __half {
  uint16_t bits;
};
struct __align__(2) __nv_bfloat16 {
  uint16_t bits;
};
using half = __half;

namespace kvsplit::emu {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// IEEE binary32 -> binary16, round to nearest even, subnormals and overflow handled exactly.
inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7fff;                 // NaN (CUDA's canonical NaN)
  if (abs >= 0x477ff000u) return sign | 0x7c00u;        // rounds to >= 65520 -> inf
  if (abs < 0x38800000u) {                               // below 2^-14: subnormal half or zero
    if (abs < 0x33000000u) return sign;                  // < 2^-25 rounds to 0 (ties to even 0)
    const uint32_t exp = abs >> 23;                      // 102..112
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                    // 14..24: value = mant >> shift in units of 2^-24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  // Normal: rebias exponent (127 -> 15), round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return sign | static_cast<uint16_t>(h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    const float v = std::ldexp(static_cast<float>(mant), -24);  // exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN (CUDA's canonical NaN)
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace kvsplit::emu

inline __half __float2half(float f) { return __half{kvsplit::emu::float_to_half_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return kvsplit::emu::half_bits_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{kvsplit::emu::float_to_bf16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return kvsplit::emu::bf16_bits_to_float(b.bits); }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }

// ---- math intrinsics: fast-math forms map to the accurate std functions ----
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.f / x; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { return kvsplit::emu::float_bits(f); }
inline float __uint_as_float(unsigned u) { return kvsplit::emu::bits_float(u); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline void __threadfence() {}
inline void __threadfence_block() {}
