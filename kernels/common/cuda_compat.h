// The one header kernel sources (*.cuh, *.cu) include for CUDA features. Two builds of the same
// source:
//   - nvcc (the real build): the CUDA headers, plus `launch()` = kernel<<<grid, block, smem,
//   stream>>>.
//   - KVSPLIT_EMULATE_CUDA under g++ (tests/kernels): the emulation harness in kernels/emulation/,
//     which runs the threads of each block as fibers on the CPU (docs/kernel-emulation.md).
// Host-only code that merely names a stream includes kernels/common/cuda_stream.h instead.
#pragma once

#include <cstddef>

#if defined(KVSPLIT_EMULATE_CUDA)

#include "kernels/emulation/emu_runtime.h"

namespace kvsplit::kernels {
using ::kvsplit::emu::launch;
// The emulated device's opt-in dynamic shared memory per block (227 KiB unless a test lowers it
// with emu::set_max_dynamic_smem_bytes to stand in for a smaller GPU).
inline size_t max_dynamic_smem_per_block() { return ::kvsplit::emu::max_dynamic_smem_bytes(); }
// The emulated device's multiprocessors and shared memory per multiprocessor: an H100/H200's.
inline int multiprocessor_count() { return 132; }
inline size_t smem_per_multiprocessor() { return 228 * 1024; }
// Message of the last failed emulated launch (the device has no equivalent: "" there).
inline std::string launch_error_detail() { return ::kvsplit::emu::last_error_message(); }
}  // namespace kvsplit::kernels

#elif defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <string>
#include <utility>

// Pointer to the dynamic shared memory of the running block.
#define KVSPLIT_DYNAMIC_SMEM(type, name)                             \
  extern __shared__ __align__(16) unsigned char kvsplit_smem_raw_[]; \
  type* name = reinterpret_cast<type*>(kvsplit_smem_raw_)

namespace kvsplit::kernels {
inline constexpr size_t kDefaultDynamicSmemBytes = 48 * 1024;

// Dynamic shared memory one block of the current device may opt into (227 KiB on sm_90 and
// 163 KiB on sm_80, 99 KiB on sm_86/89); 48 KiB when it cannot be queried.
inline size_t max_dynamic_smem_per_block() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      bytes <= 0) {
    (void)cudaGetLastError();  // a failed query is not the caller's error
    return kDefaultDynamicSmemBytes;
  }
  return static_cast<size_t>(bytes);
}

// Multiprocessors of the current device, and shared memory per multiprocessor (1 and 48 KiB when
// they cannot be queried).
inline int multiprocessor_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    return 1;
  }
  return n;
}
inline size_t smem_per_multiprocessor() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
          cudaSuccess ||
      bytes <= 0) {
    (void)cudaGetLastError();
    return kDefaultDynamicSmemBytes;
  }
  return static_cast<size_t>(bytes);
}

// Launches `kernel` and returns the launch error (configuration errors surface here; faults during
// execution surface at the next synchronizing call). Opts into > 48 KiB of dynamic shared memory.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, Args&&... args) {
  // An earlier failed runtime call on this thread (already reported as a Status, or tolerated)
  // must not come back as this launch's error. A sticky error stays and is reported below.
  (void)cudaGetLastError();
  if (smem_bytes > kDefaultDynamicSmemBytes) {
    // The attribute belongs to the kernel on the device, shared by every host thread launching it
    // there: it is set once per (kernel, device), to the device's limit, never to one launch's
    // size (threads setting different sizes would fail each other's larger launches). Kernels of
    // one signature share this template instance, so the key is the kernel's address.
    static std::mutex mu;
    static std::set<std::pair<const void*, int> > done;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return cudaGetLastError();
    const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), dev};
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(key) == 0) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(max_dynamic_smem_per_block()));
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
      }
      done.insert(key);
    }
  }
  // A .h is formatted as C++, which would split the launch brackets.
  // clang-format off
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
  return cudaGetLastError();
}
inline std::string launch_error_detail() { return {}; }
}  // namespace kvsplit::kernels

#else
#error "cuda_compat.h needs nvcc or KVSPLIT_EMULATE_CUDA (the emulation harness)"
#endif
