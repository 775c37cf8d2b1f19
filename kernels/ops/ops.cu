// Launchers of the element-wise / row-wise kernels (one dispatch site per family). Compiled by
// nvcc (kvsplit_cuda) and by g++ under the emulation harness.
#include <cmath>
#include <string>

#include "kernels/common/launch_status.h"
#include "kernels/ops/ops.cuh"

namespace kvsplit::kernels {
namespace {
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr int kElementwiseThreads = 256;
constexpr int64_t kElementwiseMaxBlocks = 4096;
}  // namespace

Status launch_kv_append(const KvAppendParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0) return invalid_argument("kv_append: negative num_tokens");
  if (p.num_tokens == 0) return ok_status();
  if (!p.pages || !p.k || !p.v || !p.slot_mapping)
    return invalid_argument("kv_append: null pointer");
  if (p.num_blocks <= 0 || p.num_kv_heads <= 0 || p.block_size <= 0 || p.head_dim <= 0)
    return invalid_argument("kv_append: page shape must be positive");
  const dim3 grid(static_cast<unsigned>(p.num_tokens));
  switch (p.dtype) {
    case ElemType::kF32:
      return launch_status(launch(kv_append_kernel<float>, grid, dim3(kRowThreads), 0, stream, p),
                           "kv_append");
    case ElemType::kF16:
      return launch_status(launch(kv_append_kernel<__half>, grid, dim3(kRowThreads), 0, stream, p),
                           "kv_append");
    case ElemType::kBF16:
      return launch_status(
          launch(kv_append_kernel<__nv_bfloat16>, grid, dim3(kRowThreads), 0, stream, p),
          "kv_append");
  }
  return invalid_argument("kv_append: unknown page dtype");
}

Status launch_rmsnorm(const float* x, const float* weight, int num_tokens, int dim, float eps,
                      float* out, float* residual, cudaStream_t stream) {
  if (num_tokens < 0 || dim <= 0) return invalid_argument("rmsnorm: bad shape");
  if (num_tokens == 0) return ok_status();
  if (!x || !weight || !out) return invalid_argument("rmsnorm: null pointer");
  return launch_status(launch(rmsnorm_kernel, dim3(static_cast<unsigned>(num_tokens)),
                              dim3(kRowThreads), 0, stream, x, weight, dim, eps, out, residual),
                       residual ? "add_rmsnorm" : "rmsnorm");
}

Status launch_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0) return invalid_argument("rope: negative num_tokens");
  if (p.num_tokens == 0) return ok_status();
  if (!p.q || !p.k || !p.positions || !p.inv_freq) return invalid_argument("rope: null pointer");
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim)
    return invalid_argument("rope: rotary_dim " + std::to_string(p.rotary_dim) +
                            " must be even and in (0, head_dim]");
  if (!(std::isfinite(p.attention_factor) && p.attention_factor > 0.0f))
    return invalid_argument("rope: attention_factor " + std::to_string(p.attention_factor) +
                            " must be finite and > 0");
  return launch_status(
      launch(rope_kernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(128), 0, stream, p),
      "rope");
}

Status launch_swiglu(const float* gate, const float* up, int64_t n, float* out,
                     cudaStream_t stream) {
  if (n < 0) return invalid_argument("swiglu: negative size");
  if (n == 0) return ok_status();
  if (!gate || !up || !out) return invalid_argument("swiglu: null pointer");
  int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  if (blocks > kElementwiseMaxBlocks) blocks = kElementwiseMaxBlocks;
  return launch_status(launch(swiglu_kernel, dim3(static_cast<unsigned>(blocks)),
                              dim3(kElementwiseThreads), 0, stream, gate, up, n, out),
                       "swiglu");
}

Status launch_embedding(const int32_t* ids, int num_tokens, const void* table, ElemType dtype,
                        int64_t rows, int64_t cols, float* out, int* error_flag,
                        cudaStream_t stream) {
  if (num_tokens < 0 || rows <= 0 || cols <= 0) return invalid_argument("embedding: bad shape");
  if (num_tokens == 0) return ok_status();
  if (num_tokens > kMaxGridX) return invalid_argument("embedding: too many tokens");
  if (!ids || !table || !out) return invalid_argument("embedding: null pointer");
  const dim3 grid(static_cast<unsigned>(num_tokens));
  switch (dtype) {
    case ElemType::kF32:
      return launch_status(launch(embedding_kernel<float>, grid, dim3(kRowThreads), 0, stream, ids,
                                  static_cast<const float*>(table), rows, cols, out, error_flag),
                           "embedding");
    case ElemType::kF16:
      return launch_status(launch(embedding_kernel<__half>, grid, dim3(kRowThreads), 0, stream, ids,
                                  static_cast<const __half*>(table), rows, cols, out, error_flag),
                           "embedding");
    case ElemType::kBF16:
      return launch_status(
          launch(embedding_kernel<__nv_bfloat16>, grid, dim3(kRowThreads), 0, stream, ids,
                 static_cast<const __nv_bfloat16*>(table), rows, cols, out, error_flag),
          "embedding");
  }
  return invalid_argument("embedding: unknown table dtype");
}

Status launch_argmax(const float* logits, int num_rows, int vocab, int32_t* ids,
                     cudaStream_t stream) {
  if (num_rows < 0 || vocab <= 0) return invalid_argument("argmax: bad shape");
  if (num_rows == 0) return ok_status();
  if (!logits || !ids) return invalid_argument("argmax: null pointer");
  return launch_status(launch(argmax_kernel, dim3(static_cast<unsigned>(num_rows)),
                              dim3(kRowThreads), 0, stream, logits, vocab, ids),
                       "argmax");
}

namespace {
unsigned elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(blocks < kElementwiseMaxBlocks ? blocks : kElementwiseMaxBlocks);
}
}  // namespace

Status launch_convert_f32(const float* in, int64_t n, void* out, ElemType dtype,
                          cudaStream_t stream) {
  if (n < 0) return invalid_argument("convert: negative size");
  if (n == 0) return ok_status();
  if (!in || !out) return invalid_argument("convert: null pointer");
  const dim3 grid(elementwise_blocks(n)), block(kElementwiseThreads);
  switch (dtype) {
    case ElemType::kF32:
      return launch_status(launch(convert_f32_kernel<float>, grid, block, 0, stream, in, n,
                                  static_cast<float*>(out)),
                           "convert");
    case ElemType::kF16:
      return launch_status(launch(convert_f32_kernel<__half>, grid, block, 0, stream, in, n,
                                  static_cast<__half*>(out)),
                           "convert");
    case ElemType::kBF16:
      return launch_status(launch(convert_f32_kernel<__nv_bfloat16>, grid, block, 0, stream, in, n,
                                  static_cast<__nv_bfloat16*>(out)),
                           "convert");
  }
  return invalid_argument("convert: unknown dtype");
}

Status launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols,
                       cudaStream_t stream) {
  if (rows < 0 || cols <= 0) return invalid_argument("add_bias: bad shape");
  if (rows == 0) return ok_status();
  if (!out || !bias) return invalid_argument("add_bias: null pointer");
  return launch_status(launch(add_bias_kernel, dim3(elementwise_blocks(rows * cols)),
                              dim3(kElementwiseThreads), 0, stream, out, bias, rows, cols),
                       "add_bias");
}

}  // namespace kvsplit::kernels
