// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012): a keyed 64-bit
// hash. With a secret key its outputs cannot be predicted nor its collisions crafted, which a
// fast unkeyed hash (xxHash) does not promise: the prefix cache keys tenants' pages with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvsplit {

class SipHasher {
 public:
  SipHasher(uint64_t k0, uint64_t k1)
      : v0_(k0 ^ 0x736f6d6570736575ull),
        v1_(k1 ^ 0x646f72616e646f6dull),
        v2_(k0 ^ 0x6c7967656e657261ull),
        v3_(k1 ^ 0x7465646279746573ull) {}

  SipHasher& update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    len_ += n;
    while (n > 0) {
      const size_t take = n < 8 - fill_ ? n : 8 - fill_;
      std::memcpy(tail_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 8) {
        compress(load_le(tail_));
        fill_ = 0;
      }
    }
    return *this;
  }
  SipHasher& update_u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    return update(b, sizeof(b));
  }

  // The hash of everything updated so far (the hasher is spent afterwards).
  uint64_t finish() {
    uint64_t last = static_cast<uint64_t>(len_ & 0xff) << 56;
    for (size_t i = 0; i < fill_; ++i) last |= static_cast<uint64_t>(tail_[i]) << (8 * i);
    compress(last);
    v2_ ^= 0xff;
    for (int i = 0; i < 4; ++i) round();
    return v0_ ^ v1_ ^ v2_ ^ v3_;
  }

 private:
  static uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }
  static uint64_t load_le(const unsigned char* b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    return v;
  }
  void round() {
    v0_ += v1_;
    v1_ = rotl(v1_, 13);
    v1_ ^= v0_;
    v0_ = rotl(v0_, 32);
    v2_ += v3_;
    v3_ = rotl(v3_, 16);
    v3_ ^= v2_;
    v0_ += v3_;
    v3_ = rotl(v3_, 21);
    v3_ ^= v0_;
    v2_ += v1_;
    v1_ = rotl(v1_, 17);
    v1_ ^= v2_;
    v2_ = rotl(v2_, 32);
  }
  void compress(uint64_t m) {
    v3_ ^= m;
    round();
    round();
    v0_ ^= m;
  }

  uint64_t v0_, v1_, v2_, v3_;
  unsigned char tail_[8] = {};
  size_t fill_ = 0;
  uint64_t len_ = 0;
};

}  // namespace kvsplit
