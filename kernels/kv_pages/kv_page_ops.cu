// Launchers of the quantized-KV page kernels: validation, the one dispatch site over the page
// dtype, grid shapes. Compiled by nvcc (kvsplit_cuda) and by g++ under the emulation harness
// (kernels/emulation/emulated_kernels.cpp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/common/launch_status.h"
#include "kernels/kv_pages/kv_page_ops.cuh"

namespace kvsplit::kernels {
namespace {

constexpr unsigned kMaxZeroBlocks = 1024;

Status validate_layout(const QuantPageLayout& l, const char* op) {
  if (l.num_kv_heads <= 0 || l.block_size <= 0 || l.head_dim <= 0 || l.head_dim % 2 != 0) {
    return invalid_argument(std::string(op) + ": bad quantized page layout (num_kv_heads " +
                            std::to_string(l.num_kv_heads) + ", block_size " +
                            std::to_string(l.block_size) + ", head_dim " +
                            std::to_string(l.head_dim) + "; head_dim must be even)");
  }
  if (l.num_kv_heads > 65535)
    return invalid_argument(std::string(op) + ": more than 65535 kv heads");
  return ok_status();
}

// A misaligned access is a sticky device error on a GPU (the emulator's memcpy loads hide it), so
// the launchers refuse one. Quantized pages are written with 16-byte stores (zero_words_kernel),
// and their sections sit 16-byte aligned from the page's start (QuantPageLayout), so a quantized
// page must start 16-byte aligned on either side (cudaMalloc and the pools' arenas are); full
// pages and summaries are read and written per element, so they need their element's alignment.
Status check_aligned(const void* p, size_t alignment, const char* op, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignment == 0) return ok_status();
  return invalid_argument(std::string(op) + ": " + what + " must be " + std::to_string(alignment) +
                          "-byte aligned");
}

Status check_quantized(KvPrecision p, const char* op) {
  if (p == KvPrecision::kInt8 || p == KvPrecision::kInt4) return ok_status();
  return invalid_argument(std::string(op) + ": precision " + std::to_string(static_cast<int>(p)) +
                          " is not int8 (1) or int4 (2)");
}

template <typename T>
Status quantize_typed(const void* src, const QuantPageLayout& l, KvPrecision to, void* dst,
                      cudaStream_t stream) {
  const int64_t n16 = l.bytes(to) / 16;
  const unsigned zero_blocks = static_cast<unsigned>(
      std::min<int64_t>((n16 + kPageOpThreads - 1) / kPageOpThreads, kMaxZeroBlocks));
  KVSPLIT_RETURN_IF_ERROR(launch_status(
      launch(zero_words_kernel, dim3(zero_blocks), dim3(kPageOpThreads), 0, stream, dst, n16),
      "quantize_kv_page (zero)"));
  const size_t smem = static_cast<size_t>(l.block_size) * l.head_dim * sizeof(float);
  return launch_status(
      launch(quantize_kv_page_kernel<T>, dim3(2, static_cast<unsigned>(l.num_kv_heads)),
             dim3(kPageOpThreads), smem, stream, static_cast<const T*>(src), l,
             to == KvPrecision::kInt4 ? 1 : 0, static_cast<uint8_t*>(dst)),
      "quantize_kv_page");
}

template <typename T>
Status dequantize_typed(const void* src, const QuantPageLayout& l, KvPrecision from, void* dst,
                        cudaStream_t stream) {
  const int64_t n = 2 * l.values_per_kv();
  const unsigned blocks = static_cast<unsigned>((n + kPageOpThreads - 1) / kPageOpThreads);
  return launch_status(launch(dequantize_kv_page_kernel<T>, dim3(blocks), dim3(kPageOpThreads), 0,
                              stream, static_cast<const uint8_t*>(src), l,
                              from == KvPrecision::kInt4 ? 1 : 0, static_cast<T*>(dst)),
                       "dequantize_kv_page");
}

template <typename T>
Status summarize_typed(const void* src, const QuantPageLayout& l, KvSummaryElem* dst,
                       cudaStream_t stream) {
  return launch_status(
      launch(summarize_kv_page_kernel<T>,
             dim3(static_cast<unsigned>(l.num_kv_heads), static_cast<unsigned>(l.summary_parts)),
             dim3(kPageOpThreads), 0, stream, static_cast<const T*>(src), l, dst),
      "summarize_kv_page");
}

}  // namespace

Status launch_quantize_kv_page(const void* src, ElemType src_dtype, const QuantPageLayout& layout,
                               KvPrecision to, void* dst, cudaStream_t stream) {
  constexpr const char* kOp = "quantize_kv_page";
  KVSPLIT_RETURN_IF_ERROR(check_quantized(to, kOp));
  KVSPLIT_RETURN_IF_ERROR(validate_layout(layout, kOp));
  if (!src || !dst) return invalid_argument(std::string(kOp) + ": null src or dst");
  KVSPLIT_RETURN_IF_ERROR(check_aligned(src, elem_size(src_dtype), kOp, "src (a full page)"));
  KVSPLIT_RETURN_IF_ERROR(check_aligned(dst, 16, kOp, "dst (a quantized page)"));
  const size_t smem = static_cast<size_t>(layout.block_size) * layout.head_dim * sizeof(float);
  if (smem > max_dynamic_smem_per_block()) {
    return unimplemented(
        std::string(kOp) + ": a page section of block_size " + std::to_string(layout.block_size) +
        " x head_dim " + std::to_string(layout.head_dim) + " needs " + std::to_string(smem) +
        " B of shared memory; this device allows " + std::to_string(max_dynamic_smem_per_block()));
  }
  switch (src_dtype) {
    case ElemType::kF32:
      return quantize_typed<float>(src, layout, to, dst, stream);
    case ElemType::kF16:
      return quantize_typed<__half>(src, layout, to, dst, stream);
    case ElemType::kBF16:
      return quantize_typed<__nv_bfloat16>(src, layout, to, dst, stream);
  }
  return invalid_argument(std::string(kOp) + ": unknown page dtype");
}

Status launch_dequantize_kv_page(const void* src, KvPrecision from, const QuantPageLayout& layout,
                                 void* dst, ElemType dst_dtype, cudaStream_t stream) {
  constexpr const char* kOp = "dequantize_kv_page";
  KVSPLIT_RETURN_IF_ERROR(check_quantized(from, kOp));
  KVSPLIT_RETURN_IF_ERROR(validate_layout(layout, kOp));
  if (!src || !dst) return invalid_argument(std::string(kOp) + ": null src or dst");
  KVSPLIT_RETURN_IF_ERROR(check_aligned(src, 16, kOp, "src (a quantized page)"));
  KVSPLIT_RETURN_IF_ERROR(check_aligned(dst, elem_size(dst_dtype), kOp, "dst (a full page)"));
  switch (dst_dtype) {
    case ElemType::kF32:
      return dequantize_typed<float>(src, layout, from, dst, stream);
    case ElemType::kF16:
      return dequantize_typed<__half>(src, layout, from, dst, stream);
    case ElemType::kBF16:
      return dequantize_typed<__nv_bfloat16>(src, layout, from, dst, stream);
  }
  return invalid_argument(std::string(kOp) + ": unknown page dtype");
}

Status launch_summarize_kv_page(const void* src, ElemType src_dtype, const QuantPageLayout& layout,
                                KvSummaryElem* dst, cudaStream_t stream) {
  constexpr const char* kOp = "summarize_kv_page";
  KVSPLIT_RETURN_IF_ERROR(validate_layout(layout, kOp));
  if (!layout.valid_summary_parts() || layout.summary_parts > 65535) {
    return invalid_argument(std::string(kOp) + ": summary_parts " +
                            std::to_string(layout.summary_parts) + " must be >= 1 and divide " +
                            "block_size " + std::to_string(layout.block_size));
  }
  if (!src || !dst) return invalid_argument(std::string(kOp) + ": null src or dst");
  KVSPLIT_RETURN_IF_ERROR(check_aligned(src, elem_size(src_dtype), kOp, "src (a full page)"));
  KVSPLIT_RETURN_IF_ERROR(check_aligned(dst, sizeof(KvSummaryElem), kOp, "dst (the summary)"));
  switch (src_dtype) {
    case ElemType::kF32:
      return summarize_typed<float>(src, layout, dst, stream);
    case ElemType::kF16:
      return summarize_typed<__half>(src, layout, dst, stream);
    case ElemType::kBF16:
      return summarize_typed<__nv_bfloat16>(src, layout, dst, stream);
  }
  return invalid_argument(std::string(kOp) + ": unknown page dtype");
}

}  // namespace kvsplit::kernels
