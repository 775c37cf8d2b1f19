// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// Random123 reference constants), shared by the GPU sampling kernel and its host reference.
// A counter-based generator: the output is a pure function of (counter, key), so every request's
// draw at every step is reproducible without carrying RNG state between steps.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

KVSPLIT_HOST_DEVICE uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds: 128-bit counter `ctr`, 64-bit key (k0, k1).
KVSPLIT_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(kPhiloxM0, ctr.v[0], &hi0);
    const uint32_t lo1 = philox_mulhilo(kPhiloxM1, ctr.v[2], &hi1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

// The high 64 bits of the 128-bit product a * b.
KVSPLIT_HOST_DEVICE uint64_t mul_hi_u64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// Key of the sampling stream (fixed; the request is named by the counter).
inline constexpr uint32_t kSamplingKey0 = 0x6b767370u;  // "kvsp"
inline constexpr uint32_t kSamplingKey1 = 0x6c697421u;  // "lit!"

// The sampling draw of one request at one step: counter = (seed, step), 64 random bits.
// Distinct (seed, step) pairs give distinct counters, and Philox is a bijection of the counter
// for a fixed key, so no two (seed, step) pairs share a draw.
KVSPLIT_HOST_DEVICE uint64_t sampling_random_bits(uint64_t seed, uint64_t step) {
  const Philox4x32 ctr{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                        static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)}};
  const Philox4x32 r = philox4x32_10(ctr, kSamplingKey0, kSamplingKey1);
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

}  // namespace kvsplit::kernels
