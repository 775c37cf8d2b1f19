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

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN included).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_f32(sign);  // +-0
  // Subnormal: normalize.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return bits_to_f32(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13));
}

}  // namespace kvsplit::backend::cpu
