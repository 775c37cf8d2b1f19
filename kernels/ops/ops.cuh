// Element-wise and row-wise kernel bodies (nvcc in ops.cu; g++ under the emulation harness).
// Host API and shapes: kernels/ops/ops.h.
#pragma once

#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/paged_kv.h"
#include "kernels/common/rope.h"
#include "kernels/common/warp_reduce.cuh"
#include "kernels/ops/ops.h"

namespace kvsplit::kernels {

inline constexpr int kRowThreads = 256;

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] shared */) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];  // same order in every thread
  return total;
}

// grid num_tokens, block kRowThreads.
template <typename T>
__global__ void kv_append_kernel(KvAppendParams p) {
  const int t = blockIdx.x;
  const int32_t slot = p.slot_mapping[t];
  if (slot < 0) return;
  const int32_t block = slot / p.block_size;
  if (block >= p.num_blocks) {
    if (threadIdx.x == 0 && p.error_flag) atomicMax(p.error_flag, 1);
    return;
  }
  const PagedKvLayout layout{p.num_kv_heads, p.block_size, p.head_dim};
  T* pages = static_cast<T*>(p.pages);
  const int n = p.num_kv_heads * p.head_dim;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / p.head_dim, d = i % p.head_dim;
    const int64_t src = static_cast<int64_t>(t) * n + i;
    pages[layout.offset(block, 0, h, slot % p.block_size) + d] = Elem<T>::from_float(p.k[src]);
    pages[layout.offset(block, 1, h, slot % p.block_size) + d] = Elem<T>::from_float(p.v[src]);
  }
}

// grid num_tokens, block kRowThreads.
__global__ void rmsnorm_kernel(const float* x, const float* weight, int dim, float eps, float* out,
                               float* residual) {
  __shared__ float scratch[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = x[row + i];
    if (residual) {
      v += residual[row + i];
      residual[row + i] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(dim) + eps);
  const float* src = residual ? residual : x;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[row + i] = src[row + i] * inv * weight[i];
}

// grid num_tokens, block 128: one thread per rotated pair of one head.
__global__ void rope_kernel(RopeParams p) {
  const int t = blockIdx.x;
  const int half_rot = p.rotary_dim / 2;
  const int pos = p.positions[t];
  const int n = (p.num_heads + p.num_kv_heads) * half_rot;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int head = i / half_rot, pair = i % half_rot;
    float* x =
        head < p.num_heads
            ? p.q + (static_cast<int64_t>(t) * p.num_heads + head) * p.head_dim
            : p.k + (static_cast<int64_t>(t) * p.num_kv_heads + (head - p.num_heads)) * p.head_dim;
    int a = 0, b = 0;
    rope_pair(p.interleaved, p.rotary_dim, pair, &a, &b);
    rope_rotate(x, a, b, pos, p.inv_freq[pair], p.attention_factor);
  }
}

// Grid-stride over n elements.
__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

// grid num_tokens, block kRowThreads.
template <typename T>
__global__ void embedding_kernel(const int32_t* ids, const T* table, int64_t rows, int64_t cols,
                                 float* out, int* error_flag) {
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < rows;
  if (!valid && threadIdx.x == 0 && error_flag) atomicMax(error_flag, 1);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[static_cast<int64_t>(t) * cols + c] = valid ? Elem<T>::to_float(table[id * cols + c]) : 0.f;
}

// (value, index) with NaN losing and lowest index winning exact ties.
__device__ __forceinline__ bool argmax_better(float v, int i, float best_v, int best_i) {
  if (v != v) return false;
  if (best_v != best_v) return true;
  return v > best_v || (v == best_v && i < best_i);
}

// grid num_rows, block kRowThreads.
__global__ void argmax_kernel(const float* logits, int vocab, int32_t* ids) {
  __shared__ float best_vs[32];
  __shared__ int best_is[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best_v = NAN;
  int best_i = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (argmax_better(row[i], i, best_v, best_i)) {
      best_v = row[i];
      best_i = i;
    }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(kFullWarpMask, best_v, offset);
    const int oi = __shfl_xor_sync(kFullWarpMask, best_i, offset);
    if (argmax_better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    best_vs[warp] = best_v;
    best_is[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
      if (argmax_better(best_vs[w], best_is[w], best_v, best_i)) {
        best_v = best_vs[w];
        best_i = best_is[w];
      }
    ids[blockIdx.x] = best_i;
  }
}

// Grid-stride over n elements.
template <typename T>
__global__ void convert_f32_kernel(const float* in, int64_t n, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = Elem<T>::from_float(in[i]);
}

// Grid-stride over rows * cols elements.
__global__ void add_bias_kernel(float* out, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] += bias[i % cols];
}

}  // namespace kvsplit::kernels
