// safetensors reader over a memory mapping: u64 little-endian header length, JSON header
// (`__metadata__` plus one entry per tensor: dtype, shape, data_offsets relative to the data
// section), then the raw little-endian data. Tensors are views; nothing is copied.
#pragma once

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

  // The tensor `name` as a weight view. kNotFound "<file>: no tensor <name>" when absent;
  // kUnimplemented naming the tensor and dtype when it is not F32/F16/BF16 (or misaligned).
  StatusOr<WeightTensor> tensor(std::string_view name) const;
  bool contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

  const std::map<std::string, SafetensorsEntry, std::less<>>& entries() const { return entries_; }
  const std::string& path() const { return mapping_->path(); }
  // Keep-alive for the views handed out by tensor().
  const std::shared_ptr<const common::MmapFile>& mapping() const { return mapping_; }

 private:
  std::shared_ptr<const common::MmapFile> mapping_;
  std::map<std::string, SafetensorsEntry, std::less<>> entries_;
};

}  // namespace kvsplit::model
