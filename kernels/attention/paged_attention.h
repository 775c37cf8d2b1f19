// Host API of the paged attention kernels (prefill and split-K decode) and the split-state merge.
// No CUDA device header: callable from host code compiled by g++ (src/backend/cuda, tests).
//
// Page layout of one layer: [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim] of
// `kv_dtype` (kernels/common/paged_kv.h). Every pointer is device memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/cuda_stream.h"
#include "kernels/common/elem_type.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

// Sequences of one call. Queries of sequence s are rows [query_start[s], query_start[s+1]) of q,
// at positions kv_lens[s] - q_len .. kv_lens[s] - 1, attending causally to keys [0, position], or
// with a sliding window to [window_first_key(position, window), position] (paged_kv.h).
struct PagedAttentionParams {
  const float* q = nullptr;  // [num_tokens, num_heads, head_dim]
  float* out = nullptr;      // [num_tokens, num_heads, head_dim]
  const void* kv = nullptr;  // pages, see above
  ElemType kv_dtype = ElemType::kF32;
  int num_seqs = 0;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int num_blocks = 0;
  float scale = 0.f;
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* kv_lens = nullptr;       // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int max_query_len = 0;
  int window = 0;  // sliding window (backend::AttentionArgs::window); 0: full causal attention
  // Set by the kernel to 1 when a block table names a block outside [0, num_blocks) (the keys of
  // that page are then ignored). Optional (nullptr); the caller zeroes and checks it.
  int* error_flag = nullptr;
  // K/V pipeline stages: 0 (auto) picks by occupancy (attention_stages in paged_attention.cuh:
  // two only where the whole grid is resident at once with them); 1 or 2 forces that many
  // (kUnimplemented when two do not fit). For benchmarks.
  int pipeline_stages = 0;
  // Optional (nullptr: not written): lse[t, h] = log sum_j exp(scale * q_th . k_j) over the keys
  // row t, head h attends (m + log l of its softmax state), -inf when it attends none (its `out`
  // row is then 0). backend::AttentionArgs::lse; merged across key sets by launch_merge_partials.
  // Decode with splits: written by the merge (launch_merge_states), else by the attention kernel.
  float* lse = nullptr;  // [num_tokens, num_heads]
  // Decode only (nullptr: not written; the prefill launchers reject it): head_max[s, h] = the
  // final max score m_h of sequence s, head h over the keys it attends (-inf: none), i.e. the m of
  // its softmax state (backend::AttentionArgs::head_max). With splits: written by the merge
  // (launch_merge_states), else by the attention kernel.
  float* head_max = nullptr;  // [num_seqs, num_heads]

  // ---- split-K decode (FlashDecoding); used by launch_paged_decode only ----
  // Split j of sequence s covers keys window_decode_base(kv_len, window, block_size) +
  // [j * chunk_tokens, (j + 1) * chunk_tokens) (backend::SplitPlan), or, with split_begin,
  // [split_begin[split_offset[s] + j], the next split's begin, or kv_len for the last).
  int chunk_tokens = 0;                   // keys per split, multiple of block_size
  int max_splits = 1;                     // grid extent; max over num_splits
  const int32_t* num_splits = nullptr;    // [num_seqs] (backend::SplitPlan::num_splits)
  const int32_t* split_offset = nullptr;  // [num_seqs] (backend::SplitPlan::split_offset)
  const int32_t* split_begin = nullptr;  // [total_splits] or null (backend::SplitPlan::split_begin)
  float* part_o = nullptr;  // [total_splits, num_heads, head_dim] unnormalized partial outputs
  float* part_m = nullptr;  // [total_splits, num_heads] partial max score
  float* part_l = nullptr;  // [total_splits, num_heads] partial sum of exp(score - m)
};

// Shapes the kernels are compiled for; anything else is kUnimplemented.
inline constexpr int kAttentionBlockSize = 16;
bool attention_head_dim_supported(int head_dim);
// Whether the kernels are compiled for a model's attention shape: its head_dim, and a GQA group
// (query heads per KV head) whose query rows fit one block's P.V threads in decode and in
// prefill. kUnimplemented naming what is not compiled. Needs no device: the CUDA backend checks a
// model with it when the model is created, so an unsupported one is refused at start instead of
// failing every request at its first attention launch.
Status attention_shape_supported(int head_dim, int gqa_group);

// Host-side checks every attention launcher runs first: shapes (kUnimplemented where not
// compiled), null pointers, scale, pipeline_stages.
Status validate_paged_attention(const PagedAttentionParams& p);

// Causal attention of every query row (prefill and chunked prefill; decode rows work too).
// One thread block per (query tile, kv head, sequence) handles the whole GQA group.
Status launch_paged_prefill(const PagedAttentionParams& p, cudaStream_t stream);

// Decode: one query per sequence (num_tokens == num_seqs, query_start[s] == s). One thread block
// per (split, kv head, sequence) handling the whole GQA group; a sequence with num_splits[s] == 1
// writes `out` directly, others write partial states then launch_merge_states combines them.
// num_splits == nullptr means no split (max_splits must be 1).
Status launch_paged_decode(const PagedAttentionParams& p, cudaStream_t stream);

// out[s, h, :] (and lse[s, h], head_max[s, h] when set) = merge over the num_splits[s] partial
// states of sequence s (skips s with one split).
Status launch_merge_states(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace kvsplit::kernels
