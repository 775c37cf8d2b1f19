// The CUDA execution model for host compilers: the threads of a block run as fibers on the
// calling OS thread, blocks run one after another. Included only through
// kernels/common/cuda_compat.h when KVSPLIT_EMULATE_CUDA is defined (docs/kernel-emulation.md).
//
// What it checks: a __syncthreads() reached by only part of a block, warp operations whose mask
// names lanes that do not arrive (or excludes the caller), shuffles that read a lane outside the
// mask, launch bounds (block <= 1024 threads, grid limits, dynamic shared memory <= 227 KiB), and a
// fiber stack overflow (guard page). Dynamic shared memory is filled with 0xFF bytes (NaN as
// float) before every block so reads of unwritten shared memory show up as NaN.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/emulation/emu_types.h"

// ---- runtime API subset ----
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorLaunchFailure = 719,
  cudaErrorInvalidConfiguration = 9,
};
using cudaStream_t = struct CUstream_st*;
const char* cudaGetErrorString(cudaError_t e);
// Returns and clears the error of the last emulated launch on this OS thread.
cudaError_t cudaGetLastError();

namespace kvsplit::emu {

inline constexpr int kWarpSize = 32;
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr size_t kMaxDynamicSmemBytes = 227 * 1024;
// The emulated device's dynamic shared memory limit per block (launches above it fail):
// kMaxDynamicSmemBytes (sm_90) by default; tests lower it to stand in for smaller GPUs. Per OS
// thread, like the rest of the emulated device state.
size_t max_dynamic_smem_bytes();
void set_max_dynamic_smem_bytes(size_t bytes);
// How cp.async copies are performed: kDeferred (default) at the wait that retires their group, so
// reading a stage too early sees stale bytes; kEager at issue, so issuing into a stage that other
// threads still read corrupts what they read. A pipeline correct under both modes has its waits
// and barriers in the right places on both sides. Per OS thread.
enum class AsyncCopyMode { kDeferred, kEager };
void set_async_copy_mode(AsyncCopyMode mode);
// The order the threads of a block run in between their barriers and warp operations:
// kInOrder (the default) runs thread 0, 1, ... each up to its next barrier, and releases a warp
// operation only when every thread of the block has stopped; kReverse runs the highest-numbered
// runnable thread first; kRandom picks a runnable thread at random (from the same warp seven times
// in eight, so warps run ahead of each other). kReverse and kRandom release a warp operation as
// soon as its lanes have all arrived, as a GPU does. A kernel that is right whatever the order has
// no race the harness can see: a read of shared memory before the barrier that orders it after its
// write gives a wrong answer in some order. Per OS thread; the default comes from the environment
// variable KVSPLIT_EMU_SCHEDULE (inorder, reverse, random or random:SEED) when it is set.
enum class ScheduleOrder { kInOrder, kReverse, kRandom };
void set_schedule_order(ScheduleOrder order, uint64_t seed = 1);
ScheduleOrder schedule_order();

struct ThreadState {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  unsigned char* dynamic_smem;
};

// The fiber running now on this OS thread (nullptr outside a launch).
ThreadState* current();

void syncthreads();
// Warp exchange: the calling lane publishes `value`, waits until every lane of `mask` has arrived
// at the same warp operation, and gets the array of all 32 lanes' published values (valid until
// this lane's next warp operation). Errors (bad mask) abort the launch.
const uint64_t* warp_exchange(unsigned mask, uint64_t value);
void syncwarp(unsigned mask);
int lane_id();
// cp.async: queues a copy of 4/8/16 aligned bytes from global to the block's dynamic shared
// memory in the calling thread's open group; async_commit closes the group; async_wait_prior(n)
// performs every committed group but the newest n (cp.async.wait_group n). Copies are performed
// only there, so reading a destination before the wait (or, for another thread, before the wait
// and a __syncthreads) sees stale bytes, as it may on the device.
void async_copy(void* dst, const void* src, size_t bytes);
void async_commit();
void async_wait_prior(int newest_pending);
// Reports a kernel fault (e.g. a shuffle from a lane outside the mask): record_fault() stores the
// message, then abandon() leaves the launch. Two statements, so that the caller's temporaries are
// destroyed before its fiber stack is abandoned (nothing leaks).
void record_fault(const std::string& message);
[[noreturn]] void abandon();

// Type-erased kernel body run by every thread of every block.
using KernelThunk = void (*)(const void* ctx);
cudaError_t run_grid(KernelThunk thunk, const void* ctx, dim3 grid, dim3 block, size_t smem_bytes);
// Details of the last launch failure on this OS thread ("" if none).
const std::string& last_error_message();

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp ops move <= 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
template <typename T>
T shfl_from(unsigned mask, T var, int src) {
  const uint64_t* vals = warp_exchange(mask, to_bits(var));
  if (src < 0 || src >= kWarpSize || !((mask >> src) & 1u)) {
    record_fault("shuffle reads lane " + std::to_string(src) + " outside mask");
    abandon();
  }
  return from_bits<T>(vals[src]);
}

}  // namespace kvsplit::emu

#define threadIdx (::kvsplit::emu::current()->thread_idx)
#define blockIdx (::kvsplit::emu::current()->block_idx)
#define blockDim (::kvsplit::emu::current()->block_dim)
#define gridDim (::kvsplit::emu::current()->grid_dim)
#define warpSize 32
// `__shared__` variables are per-OS-thread statics: blocks run one at a time, so each block sees
// one instance shared by its threads.
#define __shared__ static thread_local

inline void __syncthreads() { kvsplit::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { kvsplit::emu::syncwarp(mask); }

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  const int lane = kvsplit::emu::lane_id();
  return kvsplit::emu::shfl_from(mask, var, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int lane = kvsplit::emu::lane_id();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return kvsplit::emu::shfl_from(mask, var, src);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = kvsplit::emu::lane_id();
  int src = lane + static_cast<int>(delta);
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return kvsplit::emu::shfl_from(mask, var, src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = kvsplit::emu::lane_id();
  int src = lane - static_cast<int>(delta);
  if (src < (lane & ~(width - 1))) src = lane;
  return kvsplit::emu::shfl_from(mask, var, src);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const uint64_t* vals = kvsplit::emu::warp_exchange(mask, pred != 0);
  unsigned out = 0;
  for (int i = 0; i < kvsplit::emu::kWarpSize; ++i)
    if (((mask >> i) & 1u) && vals[i]) out |= 1u << i;
  return out;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
inline unsigned __activemask() { return 0xffffffffu; }

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline float atomicMax(float* p, float v) {
  std::atomic_ref<float> a(*p);
  float old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline int atomicCAS(int* p, int compare, int val) {
  std::atomic_ref<int>(*p).compare_exchange_strong(compare, val);
  return compare;
}

// Pointer to the dynamic shared memory of the running block (`extern __shared__` under nvcc).
#define KVSPLIT_DYNAMIC_SMEM(type, name) \
  type* name = reinterpret_cast<type*>(::kvsplit::emu::current()->dynamic_smem)

namespace kvsplit::emu {
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t /*stream*/, Args&&... args) {
  struct Ctx {
    void (*kernel)(KArgs...);
    std::tuple<std::decay_t<KArgs>...> args;
  };
  const Ctx ctx{kernel, std::tuple<std::decay_t<KArgs>...>(std::forward<Args>(args)...)};
  const KernelThunk thunk = [](const void* p) {
    const Ctx* c = static_cast<const Ctx*>(p);
    std::apply(c->kernel, c->args);  // every thread gets its own copy of the parameters
  };
  return run_grid(thunk, &ctx, grid, block, smem_bytes);
}
}  // namespace kvsplit::emu
