// Launcher of the partial-attention merge: validation and grid shape. Compiled by nvcc
// (kvsplit_cuda) and by g++ under the emulation harness (kernels/emulation/emulated_kernels.cpp).
#include <string>

#include "kernels/attention/merge_partials.cuh"
#include "kernels/common/launch_status.h"

namespace kvsplit::kernels {

Status launch_merge_partials(const MergePartialsParams& p, cudaStream_t stream) {
  if (p.num_parts < 1 || p.num_parts > kMergeMaxParts)
    return invalid_argument("merge partials: num_parts " + std::to_string(p.num_parts) +
                            " outside [1, " + std::to_string(kMergeMaxParts) + "]");
  if (p.rows < 0 || p.head_dim <= 0)
    return invalid_argument("merge partials: negative rows or non-positive head_dim");
  if (p.rows == 0) return ok_status();
  if (!p.out) return invalid_argument("merge partials: null out");
  for (int i = 0; i < p.num_parts; ++i)
    if (!p.o[i] || !p.lse[i])
      return invalid_argument("merge partials: null part " + std::to_string(i));
  const int64_t blocks = (p.rows + kMergeRowsPerBlock - 1) / kMergeRowsPerBlock;
  if (blocks > 0x7fffffff) return invalid_argument("merge partials: too many rows for one grid");
  const cudaError_t e = launch(merge_partials_kernel, dim3(static_cast<unsigned>(blocks)),
                               dim3(kMergeThreads), 0, stream, p);
  return launch_status(e, "merge partials");
}

}  // namespace kvsplit::kernels
