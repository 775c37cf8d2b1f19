// Kernel body of the partial-attention merge (nvcc in merge_partials.cu; g++ under the emulation
// harness). Host API: kernels/attention/merge_partials.h.
#pragma once

#include "kernels/attention/merge_partials.h"
#include "kernels/common/cuda_compat.h"
#include "kernels/common/merge_states.h"

namespace kvsplit::kernels {

inline constexpr int kMergeThreads = 128;
inline constexpr int kMergeRowsPerBlock = kMergeThreads / 32;  // one warp per row

// grid ceil(rows / kMergeRowsPerBlock), block kMergeThreads. Warp w of block b merges row
// b * kMergeRowsPerBlock + w: every lane computes the row's weights (merge_weights reads the
// num_parts lse values, a broadcast), then lane l writes channels l, l + 32, ... (coalesced), each
// through merge_row so the per-channel sums are the CPU backend's.
__global__ void __launch_bounds__(kMergeThreads) merge_partials_kernel(MergePartialsParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kMergeRowsPerBlock + warp;
  if (r >= p.rows) return;
  float w[kMergeMaxParts];
  const float m = merge_weights(p.lse, p.num_parts, r, w);
  float* out = p.out + r * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32)
    merge_row(p.o, w, p.num_parts, r, p.head_dim, d, d + 1, out);
  if (lane == 0 && p.lse_out) p.lse_out[r] = merged_lse(m, w, p.num_parts);
}

}  // namespace kvsplit::kernels
