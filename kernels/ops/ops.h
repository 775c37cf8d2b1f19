// Host API of the element-wise / row-wise kernels the forward pass needs. No CUDA device header.
// Every pointer is device memory; activations are f32 and row-major. Optional `error_flag`
// (device int, zeroed by the caller) is set to 1 when an index input is out of range; the kernel
// then skips that item (kv_append) or writes zeros (embedding) instead of touching memory it does
// not own.
#pragma once

#include <cstdint>

#include "kernels/common/cuda_stream.h"
#include "kernels/common/elem_type.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

// Scatters k, v [num_tokens, num_kv_heads, head_dim] (f32) into pages
// [num_blocks, 2, num_kv_heads, block_size, head_dim] of `dtype` at slot_mapping[t]
// (= block * block_size + offset); a negative slot skips the token.
struct KvAppendParams {
  void* pages = nullptr;
  ElemType dtype = ElemType::kF32;
  int num_blocks = 0;
  int num_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  const int32_t* slot_mapping = nullptr;  // [num_tokens]
  int num_tokens = 0;
  int* error_flag = nullptr;
};
Status launch_kv_append(const KvAppendParams& p, cudaStream_t stream);

// out[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * weight; x, out [num_tokens, dim], weight [dim].
// With `residual` non-null: residual += x first and the norm is taken of the new residual
// (one pass over memory for the add and the norm).
Status launch_rmsnorm(const float* x, const float* weight, int num_tokens, int dim, float eps,
                      float* out, float* residual, cudaStream_t stream);

// In-place rotary embedding of q [num_tokens, num_heads, head_dim] and
// k [num_tokens, num_kv_heads, head_dim] at positions [num_tokens]; inv_freq [rotary_dim / 2].
struct RopeParams {
  float* q = nullptr;
  float* k = nullptr;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;
  bool interleaved =
      true;  // llama2.c pairs (2i, 2i+1); false: HF rotate_half (i, i + rotary_dim/2)
  float attention_factor = 1.0f;  // multiplies cos and sin (YaRN); finite and > 0
};
Status launch_rope(const RopeParams& p, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i], n elements.
Status launch_swiglu(const float* gate, const float* up, int64_t n, float* out,
                     cudaStream_t stream);

// out[t, :] = table[ids[t], :] as f32; table [rows, cols] of `dtype`.
Status launch_embedding(const int32_t* ids, int num_tokens, const void* table, ElemType dtype,
                        int64_t rows, int64_t cols, float* out, int* error_flag,
                        cudaStream_t stream);

// ids[r] = argmax over logits[r, 0..vocab) (lowest index on exact ties; NaN never wins unless the
// row is all NaN, then 0); logits [num_rows, vocab].
Status launch_argmax(const float* logits, int num_rows, int vocab, int32_t* ids,
                     cudaStream_t stream);

// out[i] = in[i] converted to `dtype` (round to nearest even), n elements.
Status launch_convert_f32(const float* in, int64_t n, void* out, ElemType dtype,
                          cudaStream_t stream);

// out[r, c] += bias[c]; out [rows, cols].
Status launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols,
                       cudaStream_t stream);

}  // namespace kvsplit::kernels
