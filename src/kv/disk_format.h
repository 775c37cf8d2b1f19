// The disk tier's on-disk format and index entry (kv/disk_tier.h; docs/kv-tiers.md). Internal to
// the disk tier's .cpp files.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/disk_tier.h"

namespace kvsplit::kv::disk_format {

inline constexpr char kFileName[] = "kvsplit-kv-tier.data";
// Eight ASCII characters as a little-endian word: what `hexdump -C` shows at the offset.
constexpr uint64_t magic8(const char (&s)[9]) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(s[i]);
  return v;
}
inline constexpr uint64_t kFileMagic = magic8("KVSPTIER");
inline constexpr int64_t kDataOffset =
    4096;  // the file header; extent i starts at 4096 + i * extent
inline constexpr int64_t kRequestBytes = int64_t{8}
                                         << 20;  // one piece's cap (in-flight parallelism)

struct FileHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  int64_t extent_bytes;
  uint64_t session;
};

}  // namespace kvsplit::kv::disk_format

namespace kvsplit::kv {

// One slot of the in-memory index (records live as long as their DiskTier).
struct DiskTier::Record {
  enum class State : uint8_t { kFree, kWriting, kReady };
  State state = State::kFree;
  uint32_t generation = 1;
  int readers = 0;
  RecordKey key;
  int64_t payload_bytes = 0;
  // Format 2: the record's checksum lives here, not on disk (docs/kv-tiers.md, "Record format");
  // set when its write completes.
  uint64_t checksum = 0;
  std::vector<int32_t> extents;  // ascending
};

}  // namespace kvsplit::kv
