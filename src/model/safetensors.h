// safetensors reader over a memory mapping: u64 little-endian header length, JSON header
// (`__metadata__` plus one entry per tensor: dtype, shape, data_offsets relative to the data
// section), then the raw little-endian data. Tensors are views; nothing is copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mmap_file.h"
#include "kvsplit/status.h"
#include "model/weights.h"

namespace kvsplit::model {

struct SafetensorsEntry {
  std::string dtype;  // as written: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  uint64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`: header length bounded (<= 100 MiB) and within the file, JSON
  // header parses, every entry has a known dtype, non-negative shape, data_offsets with
  // begin <= end <= data section size and end - begin == numel * dtype size, and the tensors
  // tile the data section exactly (no overlap, no gap, no trailing bytes). Errors name the
  // file (and the tensors) and the fault.
  static StatusOr<SafetensorsFile> open(const std::string& path);
  // The same checks over `size` bytes in memory (the caller keeps them alive); `name` stands for
  // the path in errors. For the fuzz target and tests.
  static StatusOr<SafetensorsFile> parse_bytes(const uint8_t* data, size_t size,
                                               const std::string& name);

  // The tensor `name` as a weight view. kNotFound "<file>: no tensor <name>" when absent;
  // kUnimplemented naming the tensor and dtype when it is not F32/F16/BF16. A tensor whose data
  // is not aligned to its element size (a header not padded: the format does not require it) is
  // copied once into aligned memory the file keeps (copies()); others are views of the mapping.
  // Not thread-safe.
  StatusOr<WeightTensor> tensor(std::string_view name) const;
  bool contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

  const std::map<std::string, SafetensorsEntry, std::less<>>& entries() const { return entries_; }
  const std::string& path() const { return path_; }
  // Keep-alive for the views handed out by tensor(): the mapping, and the aligned copies.
  const std::shared_ptr<const common::MmapFile>& mapping() const { return mapping_; }
  std::shared_ptr<const void> copies() const { return copies_; }

 private:
  Status parse(const uint8_t* base, uint64_t size, const std::string& path);

  std::string path_;
  std::shared_ptr<const common::MmapFile> mapping_;  // null for parse_bytes
  std::map<std::string, SafetensorsEntry, std::less<>> entries_;
  // Aligned copies of misaligned tensors, by name (shared: views stay valid when the file moves).
  std::shared_ptr<std::map<std::string, std::unique_ptr<std::byte[]>, std::less<>>> copies_ =
      std::make_shared<std::map<std::string, std::unique_ptr<std::byte[]>, std::less<>>>();
};

}  // namespace kvsplit::model
