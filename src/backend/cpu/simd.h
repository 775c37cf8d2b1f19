// Compile-time SIMD selection for the CPU backend, and scalar f16/bf16 -> f32 conversion.
// Paths: AVX-512F (16 floats), AVX2+FMA (8 floats), scalar. The widest one the compiler targets
// (-march=native by default) is used; there is no runtime dispatch.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#define KVSPLIT_CPU_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVSPLIT_CPU_AVX2 1
#endif

#include "kernels/common/float_bits.h"

namespace kvsplit::backend::cpu {

#if defined(KVSPLIT_CPU_AVX512)
inline constexpr const char* kSimdName = "avx512";
inline constexpr int kSimdWidth = 16;  // floats per vector
#elif defined(KVSPLIT_CPU_AVX2)
inline constexpr const char* kSimdName = "avx2";
inline constexpr int kSimdWidth = 8;
#else
inline constexpr const char* kSimdName = "scalar";
inline constexpr int kSimdWidth = 1;
#endif

inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The one f16 / bf16 -> f32 conversion (kernels/common/float_bits.h), exact for every input.
inline float bf16_to_f32(uint16_t h) { return kernels::bf16_bits_to_float(h); }
inline float f16_to_f32(uint16_t h) { return kernels::half_bits_to_float(h); }

}  // namespace kvsplit::backend::cpu
