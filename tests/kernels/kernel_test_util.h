// Device memory for the kernel parity tests, so one test source runs against the emulated kernels
// (tests/kernels, label `emulated`: "device" memory is host memory) and against the real ones
// (tests/gpu, built with KVSPLIT_TEST_GPU: cudaMalloc / cudaMemcpy; skips without a device).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/cuda_stream.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/float_bits.h"

#if defined(KVSPLIT_TEST_GPU)
#include <cuda_runtime_api.h>
#endif

namespace kvsplit::testing {

#if defined(KVSPLIT_TEST_GPU)
inline bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
    return false;
  }
  return true;
}
inline void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return nullptr;
  return p;
}
inline void dev_free(void* p) { cudaFree(p); }
// A failed copy (a device fault earlier, a bad pointer) fails the test here, not later on data
// that was never copied.
inline void h2d(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) ADD_FAILURE() << "cudaMemcpy host to device: " << cudaGetErrorString(e);
}
inline void d2h(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) ADD_FAILURE() << "cudaMemcpy device to host: " << cudaGetErrorString(e);
}
inline std::string device_sync() {
  const cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? std::string() : cudaGetErrorString(e);
}
#else
inline bool device_available(std::string*) { return true; }
inline void* dev_alloc(size_t bytes) {
  return ::operator new (bytes ? bytes : 1, std::align_val_t{64});
}
inline void dev_free(void* p) { ::operator delete (p, std::align_val_t{64}); }
inline void h2d(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
inline void d2h(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
inline std::string device_sync() { return {}; }
#endif

#define KVSPLIT_REQUIRE_DEVICE()                                                            \
  do {                                                                                      \
    std::string kvsplit_why_;                                                               \
    if (!::kvsplit::testing::device_available(&kvsplit_why_)) GTEST_SKIP() << kvsplit_why_; \
  } while (0)

// An array in device memory, filled from / read back to host vectors.
template <typename T>
class DevArray {
 public:
  DevArray() = default;
  explicit DevArray(size_t n) : n_(n), p_(static_cast<T*>(dev_alloc(n * sizeof(T)))) {}
  explicit DevArray(const std::vector<T>& v) : DevArray(v.size()) {
    h2d(p_, v.data(), v.size() * sizeof(T));
  }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  DevArray(DevArray&& o) noexcept : n_(o.n_), p_(o.p_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DevArray& operator=(DevArray&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  ~DevArray() {
    if (p_) dev_free(p_);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    d2h(v.data(), p_, n_ * sizeof(T));
    return v;
  }

 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

// f32 values -> raw element bytes of `t` (f16/bf16 rounded to nearest even).
inline std::vector<unsigned char> encode(const std::vector<float>& v, kernels::ElemType t) {
  std::vector<unsigned char> out(v.size() * kernels::elem_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == kernels::ElemType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t b = t == kernels::ElemType::kF16 ? kernels::float_to_half_bits(v[i])
                                                      : kernels::float_to_bf16_bits(v[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}
// The f32 value of every element of an encoded array.
inline std::vector<float> decode(const std::vector<unsigned char>& raw, kernels::ElemType t) {
  const size_t n = raw.size() / kernels::elem_size(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == kernels::ElemType::kF32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      out[i] = t == kernels::ElemType::kF16 ? kernels::half_bits_to_float(b)
                                            : kernels::bf16_bits_to_float(b);
    }
  }
  return out;
}

}  // namespace kvsplit::testing
