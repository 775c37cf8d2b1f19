#include "kv/checksum.h"

// XXH3 is inlined from the header (the same values as the library's): Debian's libxxhash is built
// for baseline x86-64, about 3x slower than the AVX2 code the compiler generates here
// (docs/kv-tiers.md).
#define XXH_INLINE_ALL
#if defined(__AVX2__)
#define XXH_VECTOR XXH_AVX2  // not its AVX-512 loop: GCC 12 warns on it, and it gains little
#endif
#include <xxhash.h>

#include <algorithm>

#include "common/check.h"

namespace kvsplit::kv {

uint64_t xxh3_64(std::span<const iovec> iov, uint64_t seed, int64_t offset, int64_t length) {
  KVSPLIT_CHECK(offset >= 0);
  size_t i = 0;
  while (i < iov.size() && offset >= static_cast<int64_t>(iov[i].iov_len))
    offset -= static_cast<int64_t>(iov[i++].iov_len);
  if (length < 0) {
    length = 0;
    for (size_t j = i; j < iov.size(); ++j) length += static_cast<int64_t>(iov[j].iov_len);
    length -= offset;
  }
  // The common case, one contiguous range: the one-shot function (no state to set up).
  if (length == 0 || (i < iov.size() && offset + length <= static_cast<int64_t>(iov[i].iov_len)))
    return XXH3_64bits_withSeed(
        i < iov.size() ? static_cast<const std::byte*>(iov[i].iov_base) + offset : nullptr,
        static_cast<size_t>(length), seed);
  XXH3_state_t state;  // 64-byte aligned by its declaration; on the stack, no allocation
  XXH3_64bits_reset_withSeed(&state, seed);
  for (; length > 0; ++i, offset = 0) {
    KVSPLIT_CHECK_MSG(i < iov.size(), "xxh3_64: the range ends past the iovecs");
    const int64_t take = std::min(length, static_cast<int64_t>(iov[i].iov_len) - offset);
    XXH3_64bits_update(&state, static_cast<const std::byte*>(iov[i].iov_base) + offset,
                       static_cast<size_t>(take));
    length -= take;
  }
  return XXH3_64bits_digest(&state);
}

uint64_t xxh3_64(std::span<const std::byte> bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

}  // namespace kvsplit::kv
