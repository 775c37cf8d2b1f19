// Read-only memory mapping of a whole file (RAII). Weights are views into these mappings; the
// loaders keep the mapping alive through ModelWeights::storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvsplit/status.h"

namespace kvsplit::common {

class MmapFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE, PROT_READ). The file is opened non-blocking and checked
  // to be a regular file first (common::open_regular_file), so a FIFO or device never blocks.
  // Errors: kNotFound (no such file), kPermissionDenied, kInvalidArgument (a directory, a FIFO,
  // a device, or an empty file), kInternal (mmap failure). Every message starts with the path.
  static StatusOr<std::shared_ptr<const MmapFile>> open(const std::string& path);

  ~MmapFile();
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;

  // Valid for the lifetime of this object; `size()` bytes, never null (empty files are refused).
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MmapFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvsplit::common
