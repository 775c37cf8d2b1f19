// XXH3-64 over scattered bytes: the disk tier's record checksum (kv/disk_tier.h) and the digest
// the I/O backends compute as a read lands (kv/block_io.h, IoRequest::digest). One definition, so
// the value a helper thread computes is the value the tier recomputes when it has to.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvsplit::kv {

// XXH3-64 with `seed` of the bytes [offset, offset + length) of the concatenation of `iov`
// (length -1: to the end). The same value as XXH3_64bits_withSeed over those bytes copied out.
// KVSPLIT_CHECKs that the range lies inside the iovecs.
uint64_t xxh3_64(std::span<const iovec> iov, uint64_t seed, int64_t offset = 0,
                 int64_t length = -1);
// XXH3-64 with `seed` of `bytes`.
uint64_t xxh3_64(std::span<const std::byte> bytes, uint64_t seed);

}  // namespace kvsplit::kv
