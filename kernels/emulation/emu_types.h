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

#include "kernels/common/float_bits.h"

// ---- execution-space and memory qualifiers ----
#define __host__
#define __device__ inline
#define __global__ inline
#define __forceinline__
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ inline

// ---- vector and index types (layout-compatible with vector_types.h) ----
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
  unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned int x, y, z, w;
};
struct __attribute__((aligned(16))) int4 {
  int x, y, z, w;
};
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
using ::kvsplit::kernels::bf16_bits_to_float;
using ::kvsplit::kernels::bits_float;
using ::kvsplit::kernels::float_bits;
using ::kvsplit::kernels::float_to_bf16_bits;
using ::kvsplit::kernels::float_to_half_bits;
using ::kvsplit::kernels::half_bits_to_float;
}  // namespace kvsplit::emu

inline __half __float2half(float f) { return __half{kvsplit::emu::float_to_half_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return kvsplit::emu::half_bits_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16(float f) {
  return __nv_bfloat16{kvsplit::emu::float_to_bf16_bits(f)};
}
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
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) { return kvsplit::emu::float_bits(f); }
inline float __uint_as_float(unsigned u) { return kvsplit::emu::bits_float(u); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
