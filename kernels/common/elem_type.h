// Element types of KV pages and weights as the kernels see them, and their conversions to and from
// f32 in device code. Host-visible part (ElemType, elem_size) needs no CUDA header; the device part
// is available once kernels/common/cuda_compat.h has been included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

enum class ElemType : uint8_t { kF32, kF16, kBF16 };

constexpr size_t elem_size(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }
constexpr const char* elem_name(ElemType t) {
  return t == ElemType::kF32 ? "f32" : (t == ElemType::kF16 ? "f16" : "bf16");
}

}  // namespace kvsplit::kernels

#if defined(KVSPLIT_EMULATE_CUDA) || defined(__CUDACC__)
#include "kernels/common/cuda_compat.h"

namespace kvsplit::kernels {

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  __device__ __forceinline__ static float to_float(float x) { return x; }
  __device__ __forceinline__ static float from_float(float x) { return x; }
};
template <>
struct Elem<__half> {
  __device__ __forceinline__ static float to_float(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half from_float(float x) { return __float2half_rn(x); }
};
template <>
struct Elem<__nv_bfloat16> {
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// 16-byte vector memory access (one 128-bit load/store on the device; memcpy under emulation,
// where the harness must not rely on type punning). `p` must be 16-byte aligned.
__device__ __forceinline__ uint4 load16(const void* p) {
#if defined(KVSPLIT_EMULATE_CUDA)
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}
__device__ __forceinline__ void store16(void* p, uint4 v) {
#if defined(KVSPLIT_EMULATE_CUDA)
  std::memcpy(p, &v, 16);
#else
  *reinterpret_cast<uint4*>(p) = v;
#endif
}

// Elements of T in one 16-byte vector, and their f32 values.
template <typename T>
struct Vec16 {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  __device__ __forceinline__ static void to_floats(uint4 v, float* out) {
    T e[kElems];
    memcpy(e, &v, 16);
#pragma unroll
    for (int i = 0; i < kElems; ++i) out[i] = Elem<T>::to_float(e[i]);
  }
};

}  // namespace kvsplit::kernels
#endif
