// Host API of the quantized-KV page kernels (semantic cut): quantize one full-precision page of one
// layer to int8 / int4, dequantize it back, and summarize its keys. Page layouts and the
// per-element math are kernels/common/kv_quant.h, shared with the CPU backend
// (src/backend/cpu/kv_quant_ops.cpp): for the same f32 values the bytes written are identical.
// No CUDA device header: callable from host code compiled by g++.
//
// A full page is [2 (K, V), num_kv_heads, block_size, head_dim] of `dtype` (f32, f16 or bf16;
// f16/bf16 elements are widened exactly to f32 before quantizing). Every pointer is device memory.
// Alignment: a quantized page (quantize's dst, dequantize's src) starts 16-byte aligned (it is
// written with 16-byte stores and its sections are 16-byte aligned from its start); a full page and
// a summary are aligned to their element. Anything else is kInvalidArgument (on a GPU a misaligned
// access is a sticky error). Launchers validate shapes and alignment and return Status; kernels
// run asynchronously on `stream`.
#pragma once

#include "kernels/common/cuda_stream.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/kv_quant.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

// dst: layout.bytes(to) bytes, every byte written (padding zero). to: kInt8 or kInt4.
Status launch_quantize_kv_page(const void* src, ElemType src_dtype, const QuantPageLayout& layout,
                               KvPrecision to, void* dst, cudaStream_t stream);

// dst: a full page of dst_dtype (f32 values as int8_page_elem / int4_page_elem compute them,
// rounded to nearest even for f16 / bf16). from: kInt8 or kInt4.
Status launch_dequantize_kv_page(const void* src, KvPrecision from, const QuantPageLayout& layout,
                                 void* dst, ElemType dst_dtype, cudaStream_t stream);

// dst: f16 bits [2 (min, max), num_kv_heads, head_dim], per-channel min and max of the page's keys
// over its block_size slots (NaN keys ignored, as std::min / std::max with the running value
// first), the min rounded down and the max up (kvq_summary_min_bits / _max_bits).
Status launch_summarize_kv_page(const void* src, ElemType src_dtype, const QuantPageLayout& layout,
                                KvSummaryElem* dst, cudaStream_t stream);

}  // namespace kvsplit::kernels
