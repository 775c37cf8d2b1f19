// splitmix64: a bijective 64-bit mixer (Steele, Lea and Flood's SplittableRandom finalizer).
// Nearby inputs give unrelated outputs, so it derives independent seeds and keys from counters.
#pragma once

#include <cstdint>

namespace kvsplit {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace kvsplit
