// Warp-wide reductions (all 32 lanes take part and get the result). Device code; include after
// kernels/common/cuda_compat.h.
#pragma once

namespace kvsplit::kernels {

inline constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarpMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  return v;
}

}  // namespace kvsplit::kernels
