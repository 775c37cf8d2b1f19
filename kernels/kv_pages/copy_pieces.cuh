// Batched copy kernel body (nvcc in copy_pieces.cu; g++ under the emulation harness). Host API and
// contract: kernels/kv_pages/copy_pieces.h.
#pragma once

#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/kv_pages/copy_pieces.h"

namespace kvsplit::kernels {

inline constexpr int kCopyThreads = 256;
inline constexpr int kCopyVecsPerThread = kCopyChunkBytes / 16 / kCopyThreads;  // 8
static_assert(kCopyVecsPerThread * 16 * kCopyThreads == kCopyChunkBytes);

// One launch's pieces, by value. first_chunk[i]: the index of piece i's first kCopyChunkBytes
// chunk over the launch (a prefix sum); first_chunk[n] is the total.
struct CopyPieceBatch {
  int n = 0;
  uint32_t first_chunk[kCopyPiecesPerLaunch + 1] = {};
  CopyPiece piece[kCopyPiecesPerLaunch];
};

// grid <= total chunks, block kCopyThreads. The batch is a __grid_constant__ parameter: read in
// place (uniform across the block, so the constant cache broadcasts it), never copied per thread.
// Thread blocks stride over the launch's chunks; a chunk is found by binary search over
// first_chunk. Each thread issues all its loads before its stores (kCopyVecsPerThread 16-byte
// vectors in flight): reads from host memory cross the link, so latency is hidden by having many of
// them outstanding, not by the block count.
__global__ void __launch_bounds__(kCopyThreads)
    copy_pieces_kernel(const __grid_constant__ CopyPieceBatch b) {
  const uint32_t total = b.first_chunk[b.n];
  for (uint64_t c = blockIdx.x; c < total; c += gridDim.x) {  // 64-bit: no wrap
    int lo = 0, hi = b.n - 1;  // the last piece whose first chunk is <= c
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (b.first_chunk[mid] <= c)
        lo = mid;
      else
        hi = mid - 1;
    }
    const CopyPiece& p = b.piece[lo];
    const uint64_t base = (c - b.first_chunk[lo]) * kCopyChunkBytes;
    const uint64_t end =
        p.bytes - base < uint64_t(kCopyChunkBytes) ? p.bytes : base + kCopyChunkBytes;
    const unsigned char* src = static_cast<const unsigned char*>(p.src);
    unsigned char* dst = static_cast<unsigned char*>(p.dst);
    uint4 v[kCopyVecsPerThread] = {};
#pragma unroll
    for (int i = 0; i < kCopyVecsPerThread; ++i) {
      const uint64_t at = base + (uint64_t(i) * kCopyThreads + threadIdx.x) * 16;
      if (at < end) v[i] = load16(src + at);
    }
#pragma unroll
    for (int i = 0; i < kCopyVecsPerThread; ++i) {
      const uint64_t at = base + (uint64_t(i) * kCopyThreads + threadIdx.x) * 16;
      if (at < end) store16(dst + at, v[i]);
    }
  }
}

}  // namespace kvsplit::kernels
