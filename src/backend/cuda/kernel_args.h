// Backend op arguments -> kernel launch parameters, shared by CudaBackend and the test-only
// emulated kernel backend (tests/kernels/emulated_backend.h). Host-only: no CUDA device header.
#pragma once

#include <cstdint>

#include "backend/backend.h"
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
  return p;
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
  p.top_k = r.top_k;
  p.seed = r.seed;
  p.step = r.step;
  return p;
}

}  // namespace kvsplit::backend::cuda
