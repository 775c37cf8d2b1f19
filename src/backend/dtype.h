// Element types of weights, activations and KV pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvsplit::backend {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kF16 ? "f16" : "bf16");
}

}  // namespace kvsplit::backend
