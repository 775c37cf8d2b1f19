// SipHash-2-4 against the reference test vectors (key 00..0f, message 00..len-1; the paper's
// appendix and the reference implementation's vectors.h), fed whole and in pieces.
#include "common/siphash.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvsplit {
namespace {

constexpr uint64_t kK0 = 0x0706050403020100ull, kK1 = 0x0f0e0d0c0b0a0908ull;

uint64_t hash_of(size_t len, size_t piece) {
  std::vector<unsigned char> m(len);
  for (size_t i = 0; i < len; ++i) m[i] = static_cast<unsigned char>(i);
  SipHasher h(kK0, kK1);
  for (size_t at = 0; at < len; at += piece) h.update(m.data() + at, std::min(piece, len - at));
  return h.finish();
}

TEST(SipHash, ReferenceVectors) {
  const std::pair<size_t, uint64_t> vectors[] = {
      {0, 0x726fdb47dd0e0e31ull}, {1, 0x74f839c593dc67fdull},  {7, 0xab0200f58b01d137ull},
      {8, 0x93f5f5799a932462ull}, {15, 0xa129ca6149be45e5ull}, {63, 0x958a324ceb064572ull},
  };
  for (const auto& [len, want] : vectors) {
    for (size_t piece : {size_t{1}, size_t{3}, size_t{8}, size_t{64}}) {
      EXPECT_EQ(hash_of(len, piece), want) << "len " << len << " piece " << piece;
    }
  }
}

TEST(SipHash, TheKeyChangesTheHash) {
  const uint64_t m = 42;
  EXPECT_NE(SipHasher(kK0, kK1).update_u64(m).finish(),
            SipHasher(kK0 ^ 1, kK1).update_u64(m).finish());
  EXPECT_EQ(SipHasher(kK0, kK1).update_u64(m).finish(), SipHasher(kK0, kK1).update_u64(m).finish());
}

}  // namespace
}  // namespace kvsplit
