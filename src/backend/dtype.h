// Element types of weights, activations and KV pages. One enum for the host and the kernels:
// backend::DType is kernels::ElemType (kernels/common/elem_type.h).
#pragma once

#include <cstddef>
#include <string_view>

#include "kernels/common/elem_type.h"

namespace kvsplit::backend {

using DType = kernels::ElemType;

constexpr size_t dtype_size(DType t) { return kernels::elem_size(t); }
constexpr std::string_view dtype_name(DType t) { return kernels::elem_name(t); }

}  // namespace kvsplit::backend
