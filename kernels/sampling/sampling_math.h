// Per-element math of the GPU sampler (kernels/sampling/sampling.cuh), shared with its host
// reference in the tests: the scaled logit, its integer probability mass and its sort key.
//
// Masses are fixed point: q = floor(expf(s - s_max) * 2^40) (the most likely token has 2^40).
// Sums of masses are exact integers, so the kept set and the picked token do not depend on
// summation order (threads, atomics) — the device and the host reference agree bit for bit
// when their expf agrees (under the emulation harness it is the same function). Tokens with
// probability below 2^-40 of the most likely one get mass 0 and are never drawn.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

inline constexpr int kSampleMassBits = 40;
// Vocab limit: vocab * 2^40 must fit in uint64.
inline constexpr int kSampleMaxVocab = 1 << 23;
// Temperatures below this are greedy (as src/sampling's kGreedyTemperature).
inline constexpr float kSampleGreedyTemperature = 1e-5f;

KVSPLIT_HOST_DEVICE uint32_t float_bits_of(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, 4);
#endif
  return u;
}

// Order-preserving map of a non-NaN float to uint32 (a < b  <=>  key(a) < key(b); -0 < +0).
KVSPLIT_HOST_DEVICE uint32_t float_order_key(float f) {
  const uint32_t u = float_bits_of(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The total order of the sampler: descending scaled logit, then ascending token id. Unique per
// token, so "the k largest keys" is exactly k tokens.
KVSPLIT_HOST_DEVICE uint64_t sample_sort_key(float scaled_logit, int token) {
  return (static_cast<uint64_t>(float_order_key(scaled_logit)) << 32) |
         static_cast<uint64_t>(0xffffffffu - static_cast<uint32_t>(token));
}

// exp(s - s_max) in [0, 1]; the relative probability of a token.
KVSPLIT_HOST_DEVICE float sample_weight(float scaled_logit, float max_scaled) {
  return expf(scaled_logit - max_scaled);
}

// Fixed-point mass of a weight in [0, 1] (truncation: the same on host and device).
KVSPLIT_HOST_DEVICE uint64_t sample_mass(float weight) {
  return static_cast<uint64_t>(weight * static_cast<float>(1ull << kSampleMassBits));
}

// Mass limit of top-p over candidate mass `total`: the kept prefix (in sort-key order) ends at
// the first token whose inclusive running mass exceeds this (top_p <= 0: only the first token).
KVSPLIT_HOST_DEVICE uint64_t top_p_limit(float top_p, uint64_t total) {
  if (!(top_p > 0.f)) return 0;
  return static_cast<uint64_t>(static_cast<double>(top_p) * static_cast<double>(total));
}

}  // namespace kvsplit::kernels
