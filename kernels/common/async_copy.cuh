// Asynchronous global -> shared copies (cp.async, sm_80+) for software pipelining: a kernel issues
// the copies of its next tile, computes on the current one while they are in flight, then waits.
//
//   cp_async16(smem_dst, gmem_src);  // 16 bytes, both 16-byte aligned; L2 only (.cg)
//   cp_async8 / cp_async4            // 8 / 4 bytes, aligned to their size (.ca: the only form)
//   cp_async_commit();               // closes this thread's group of copies
//   cp_async_wait<N>();              // until at most N of this thread's groups are in flight
//   __syncthreads();                 // ... and other threads' copies are visible
//
// Under the emulation harness the copies are queued and performed at the wait, so a read of the
// destination before the wait (and the barrier, for other threads' copies) sees stale bytes.
#pragma once

#include "kernels/common/cuda_compat.h"

namespace kvsplit::kernels {

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
#if defined(KVSPLIT_EMULATE_CUDA)
  ::kvsplit::emu::async_copy(smem_dst, gmem_src, 16);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#endif
}

__device__ __forceinline__ void cp_async8(void* smem_dst, const void* gmem_src) {
#if defined(KVSPLIT_EMULATE_CUDA)
  ::kvsplit::emu::async_copy(smem_dst, gmem_src, 8);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#endif
}

__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {
#if defined(KVSPLIT_EMULATE_CUDA)
  ::kvsplit::emu::async_copy(smem_dst, gmem_src, 4);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(KVSPLIT_EMULATE_CUDA)
  ::kvsplit::emu::async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(KVSPLIT_EMULATE_CUDA)
  ::kvsplit::emu::async_wait_prior(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace kvsplit::kernels
