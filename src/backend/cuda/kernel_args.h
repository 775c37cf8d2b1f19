// Backend op arguments -> kernel launch parameters, shared by CudaBackend and the test-only
// emulated kernel backend (tests/kernels/emulated_backend.h). Host-only: no CUDA device header.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "kernels/attention/merge_partials.h"
#include "kernels/attention/mixed_attention.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/ops/ops.h"
#include "kernels/sampling/sampling.h"

namespace kvsplit::backend::cuda {

// Everything but the error flag and the split-K fields.
inline kernels::PagedAttentionParams attention_params(const AttentionArgs& a) {
  kernels::PagedAttentionParams p;
  p.q = a.q;
  p.out = a.out;
  p.kv = a.kv.data;
  p.kv_dtype = a.kv.dtype;
  p.num_seqs = a.num_seqs;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.head_dim = a.head_dim;
  p.block_size = a.kv.block_size;
  p.num_blocks = a.kv.num_blocks;
  p.scale = a.scale;
  p.query_start = a.query_start;
  p.kv_lens = a.kv_lens;
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.max_query_len = a.max_query_len;
  p.window = a.window;
  p.lse = a.lse;
  p.head_max = a.head_max;
  return p;
}

// The rules on AttentionArgs::head_max / score_max both backends check before launching (the
// CPU backend's, same messages). decode: the call is attention_decode.
inline Status check_sharded_scoring_args(const AttentionArgs& a, bool decode) {
  if (!decode && (a.head_max != nullptr || a.score_max != nullptr))
    return invalid_argument("attention_prefill: head_max and score_max are for decode only");
  if (a.score_max != nullptr && (a.score_seqs == nullptr || a.head_max != nullptr))
    return invalid_argument("attention_decode: score_max needs score_seqs and no head_max");
  return ok_status();
}

static_assert(kernels::kMergeMaxParts == Backend::kMaxMergeParts);

// Backend::merge_attention_states arguments -> launch parameters: the host arrays of device
// pointers are copied into the parameter struct (at most kMergeMaxParts entries; a count outside
// [1, kMergeMaxParts] is kept as is for launch_merge_partials to reject, and null arrays leave the
// parts null, which it rejects too unless rows == 0).
inline kernels::MergePartialsParams merge_partials_params(const float* const* o,
                                                          const float* const* lse, int num_parts,
                                                          int64_t rows, int head_dim, float* out,
                                                          float* lse_out) {
  kernels::MergePartialsParams p;
  const int n = num_parts < kernels::kMergeMaxParts ? num_parts : kernels::kMergeMaxParts;
  for (int i = 0; i < n && o != nullptr && lse != nullptr; ++i) {
    p.o[i] = o[i];
    p.lse[i] = lse[i];
  }
  p.num_parts = num_parts;
  p.rows = rows;
  p.head_dim = head_dim;
  p.out = out;
  p.lse_out = lse_out;
  return p;
}

// The mixed-precision fields on top of `base` (attention_params(a) plus split-K and error flag);
// score_max (a workspace) is left to the caller.
inline kernels::MixedAttentionParams mixed_attention_params(
    const AttentionArgs& a, const kernels::PagedAttentionParams& base) {
  kernels::MixedAttentionParams mp;
  mp.base = base;
  mp.page_precision = a.page_precision;
  mp.int8_pages = a.int8_pages;
  mp.num_int8_blocks = a.num_int8_blocks;
  mp.int4_pages = a.int4_pages;
  mp.num_int4_blocks = a.num_int4_blocks;
  mp.score_seqs = a.score_seqs;
  mp.token_relevance = a.token_relevance;
  mp.summary_slots = a.summary_slots;
  mp.summaries = a.summaries;
  mp.num_summary_slots = a.num_summary_slots;
  mp.summary_parts = a.summary_parts;
  mp.page_bound = a.page_bound;
  return mp;
}

// True when a call needs the mixed-precision kernels (some page not full, or scoring outputs).
inline bool needs_mixed_attention(const AttentionArgs& a) {
  return a.page_precision != nullptr || a.score_seqs != nullptr;
}

inline kernels::KvAppendParams kv_append_params(const LayerKv& kv, const float* k, const float* v,
                                                const int32_t* slot_mapping, int num_tokens,
                                                int* error_flag) {
  kernels::KvAppendParams p;
  p.pages = kv.data;
  p.dtype = kv.dtype;
  p.num_blocks = kv.num_blocks;
  p.num_kv_heads = kv.num_kv_heads;
  p.block_size = kv.block_size;
  p.head_dim = kv.head_dim;
  p.k = k;
  p.v = v;
  p.slot_mapping = slot_mapping;
  p.num_tokens = num_tokens;
  p.error_flag = error_flag;
  return p;
}

inline kernels::SampleRowParams sample_row_params(const SamplingRow& r) {
  kernels::SampleRowParams p;
  p.temperature = r.temperature;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.top_k = r.top_k < 0 ? 0 : r.top_k;  // -1: off, as 0
  p.seed = r.seed;
  p.step = r.step;
  return p;
}

}  // namespace kvsplit::backend::cuda
