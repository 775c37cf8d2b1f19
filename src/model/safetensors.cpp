#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>

#include "common/file_read.h"
#include "common/json_util.h"

namespace kvsplit::model {

namespace {

constexpr uint64_t kMaxHeaderBytes = common::kMaxSafetensorsHeaderBytes;

// The format requires the tensors to tile the data section: sorted by offset, each starts where
// the previous one ends, the first at 0 and the last at the end. Anything else (overlap, a gap,
// trailing bytes) is an error naming the tensors involved.
Status check_tiling(const std::string& path,
                    const std::map<std::string, SafetensorsEntry, std::less<>>& entries,
                    const uint8_t* data_begin, uint64_t data_size) {
  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> spans;
  spans.reserve(entries.size());
  for (const auto& [name, e] : entries) {
    const uint64_t begin = static_cast<uint64_t>(e.data - data_begin);
    spans.emplace_back(begin, begin + e.nbytes, &name);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t expect = 0;
  const std::string* prev = nullptr;
  for (const auto& [begin, end, name] : spans) {
    if (begin < expect) {
      return invalid_argument(path + ": tensor " + *name + " (data_offsets [" +
                              std::to_string(begin) + ", " + std::to_string(end) +
                              "]) overlaps tensor " + *prev + " (which ends at " +
                              std::to_string(expect) + ")");
    }
    if (begin > expect) {
      return invalid_argument(path + ": " + std::to_string(begin - expect) +
                              " bytes of the data section before tensor " + *name +
                              " belong to no tensor (offset " + std::to_string(expect) +
                              "): the tensors must cover the data section exactly");
    }
    expect = end;
    prev = name;
  }
  if (expect != data_size) {
    return invalid_argument(path + ": the tensors cover " + std::to_string(expect) +
                            " bytes of the " + std::to_string(data_size) +
                            "-byte data section: the tensors must cover it exactly");
  }
  return ok_status();
}

// Element size of every dtype the format defines with whole-byte elements; 0 = unknown.
size_t dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0") {
    return 1;
  }
  return 0;
}

std::optional<backend::DType> supported_dtype(std::string_view d) {
  if (d == "F32") return backend::DType::kF32;
  if (d == "F16") return backend::DType::kF16;
  if (d == "BF16") return backend::DType::kBF16;
  return std::nullopt;
}

Status parse_entry(const std::string& path, const std::string& name, const common::Json& j,
                   const uint8_t* data_begin, uint64_t data_size, SafetensorsEntry* out) {
  const std::string what = path + ": tensor " + name;
  if (!j.is_object()) return invalid_argument(what + ": header entry is not an object");
  KVSPLIT_ASSIGN_OR_RETURN(out->dtype, common::json_string(j, "dtype", std::nullopt, what));
  const size_t esize = dtype_bytes(out->dtype);
  if (esize == 0) {
    return unimplemented(what + ": dtype " + out->dtype + " is not supported (F32, F16, BF16)");
  }
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array()) {
    return invalid_argument(what + ": 'shape' missing or not an array");
  }
  uint64_t numel = 1;
  for (const auto& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
      return invalid_argument(what + ": bad shape " + shape->dump());
    }
    out->shape.push_back(d.get<int64_t>());
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d.get<int64_t>()), &numel) ||
        numel > (uint64_t{1} << 48)) {
      return invalid_argument(what + ": shape " + shape->dump() + " too large");
    }
  }
  auto offs = j.find("data_offsets");
  if (offs == j.end() || !offs->is_array() || offs->size() != 2 ||
      !(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned()) {
    return invalid_argument(what + ": 'data_offsets' must be [begin, end] (non-negative integers)");
  }
  const uint64_t begin = (*offs)[0].get<uint64_t>();
  const uint64_t end = (*offs)[1].get<uint64_t>();
  if (begin > end || end > data_size) {
    return invalid_argument(what + ": data_offsets [" + std::to_string(begin) + ", " +
                            std::to_string(end) + "] outside the data section of " +
                            std::to_string(data_size) + " bytes (file truncated?)");
  }
  if (end - begin != numel * esize) {
    return invalid_argument(what + ": data_offsets span " + std::to_string(end - begin) +
                            " bytes but shape " + shape->dump() + " of " + out->dtype + " needs " +
                            std::to_string(numel * esize));
  }
  out->data = data_begin + begin;
  out->nbytes = end - begin;
  return ok_status();
}

}  // namespace

StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  KVSPLIT_ASSIGN_OR_RETURN(f.mapping_, common::MmapFile::open(path));
  KVSPLIT_RETURN_IF_ERROR(f.parse(f.mapping_->data(), f.mapping_->size(), path));
  f.path_ = path;
  return f;
}

StatusOr<SafetensorsFile> SafetensorsFile::parse_bytes(const uint8_t* data, size_t size,
                                                       const std::string& name) {
  SafetensorsFile f;
  KVSPLIT_RETURN_IF_ERROR(f.parse(data, size, name));
  f.path_ = name;
  return f;
}

Status SafetensorsFile::parse(const uint8_t* base, uint64_t size, const std::string& path) {
  SafetensorsFile& f = *this;
  if (size < 8) {
    return invalid_argument(path + ": truncated: " + std::to_string(size) +
                            " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian hosts only (x86-64, aarch64)
  if (header_len > kMaxHeaderBytes) {
    return invalid_argument(path + ": header length " + std::to_string(header_len) +
                            " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
                            " bytes (not a safetensors file?)");
  }
  if (header_len > size - 8) {
    return invalid_argument(path + ": header length " + std::to_string(header_len) +
                            " runs past the end of the file (" + std::to_string(size) +
                            " bytes): truncated or not a safetensors file");
  }
  std::string_view header(reinterpret_cast<const char*>(base + 8), header_len);
  KVSPLIT_ASSIGN_OR_RETURN(common::Json j, common::parse_json(header, path + ": header"));
  if (!j.is_object()) return invalid_argument(path + ": header is not a JSON object");
  const uint8_t* data_begin = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    SafetensorsEntry e;
    KVSPLIT_RETURN_IF_ERROR(parse_entry(path, it.key(), it.value(), data_begin, data_size, &e));
    f.entries_.emplace(it.key(), std::move(e));
  }
  return check_tiling(path, f.entries_, data_begin, data_size);
}

StatusOr<WeightTensor> SafetensorsFile::tensor(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return not_found(path() + ": no tensor " + std::string(name));
  const SafetensorsEntry& e = it->second;
  auto dt = supported_dtype(e.dtype);
  if (!dt) {
    return unimplemented(path() + ": tensor " + std::string(name) + " has dtype " + e.dtype +
                         " (supported: F32, F16, BF16)");
  }
  const size_t align = backend::dtype_size(*dt);
  const void* data = e.data;
  if (reinterpret_cast<uintptr_t>(data) % align != 0) {
    // new[] memory is aligned for every fundamental type.
    auto c = copies_->find(name);
    if (c == copies_->end()) {
      const size_t bytes = static_cast<size_t>(e.nbytes);
      auto buf = std::make_unique<std::byte[]>(std::max<size_t>(bytes, 1));
      std::memcpy(buf.get(), e.data, bytes);
      c = copies_->emplace(std::string(name), std::move(buf)).first;
    }
    data = c->second.get();
  }
  WeightTensor t;
  t.data = data;
  t.dtype = *dt;
  t.shape = e.shape;
  t.name = std::string(name);
  return t;
}

}  // namespace kvsplit::model
