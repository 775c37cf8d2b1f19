// Host API of the merge of partial attention results over disjoint key sets (the spatial cut's
// shard partials, kv-cuts.md §4; backend::Backend::merge_attention_states). No CUDA device header:
// callable from host code compiled by g++ (src/backend/cuda, tests).
//
// For each row r in [0, rows) (one query token and head) and parts p in [0, num_parts), with
// M = max_p lse[p][r] and w_p = exp(lse[p][r] - M):
//   out[r, :] = sum_p w_p * o[p][r, :] / sum_p w_p   (0 when every lse[p][r] is -inf),
//   lse_out[r] = M + log(sum_p w_p)                   (-inf then).
// The math is kernels/common/merge_states.h, shared with the CPU backend (same sums, same order).
// A part whose lse is -inf for a row is skipped for that row (its o row is not read into the sum).
#pragma once

#include <cstdint>

#include "kernels/common/cuda_stream.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

inline constexpr int kMergeMaxParts = 16;

// Passed to the kernel by value: the pointer arrays live in the kernel's parameter space, so the
// caller's host arrays of device pointers need no device copy. Every pointer is device memory.
struct MergePartialsParams {
  const float* o[kMergeMaxParts] = {};    // part p: [rows, head_dim] normalized outputs
  const float* lse[kMergeMaxParts] = {};  // part p: [rows] log-sum-exp of its scores
  int num_parts = 0;                      // [1, kMergeMaxParts]
  int64_t rows = 0;
  int head_dim = 0;          // any positive value
  float* out = nullptr;      // [rows, head_dim]; aliases no input
  float* lse_out = nullptr;  // [rows]; optional (nullptr: not written)
};

// kInvalidArgument for num_parts outside [1, kMergeMaxParts], rows < 0, head_dim <= 0, a null
// pointer among the first num_parts parts or out. rows == 0 launches nothing.
Status launch_merge_partials(const MergePartialsParams& p, cudaStream_t stream);

}  // namespace kvsplit::kernels
