// CPU implementations of Backend::quantize_kv_page / dequantize_kv_page / summarize_kv_page
// (contracts in backend/backend.h, page layouts and math in kernels/common/kv_quant.h). f32 pages
// only (other dtypes: kUnimplemented); bad layouts, precisions or null pointers: kInvalidArgument.
// Single-threaded: a page is a few tens of KB.
#pragma once

#include "backend/backend.h"
#include "kernels/common/kv_quant.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

Status cpu_quantize_kv_page(const void* src, DType src_dtype,
                            const kernels::QuantPageLayout& layout, kernels::KvPrecision to,
                            void* dst);
Status cpu_dequantize_kv_page(const void* src, kernels::KvPrecision from,
                              const kernels::QuantPageLayout& layout, void* dst, DType dst_dtype);
Status cpu_summarize_kv_page(const void* src, DType src_dtype,
                             const kernels::QuantPageLayout& layout, kernels::KvSummaryElem* dst);

// kInvalidArgument unless the layout is usable (positive dims, even head_dim).
Status validate_quant_layout(const kernels::QuantPageLayout& layout, const char* op);

}  // namespace kvsplit::backend
