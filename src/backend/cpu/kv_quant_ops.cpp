#include "backend/cpu/kv_quant_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"

namespace kvsplit::backend {
namespace {

using kernels::KvPrecision;
using kernels::QuantPageLayout;

Status check_f32(DType dtype, const char* op) {
  if (dtype == DType::kF32) return ok_status();
  return unimplemented(std::string(op) + ": the CPU backend handles f32 pages only, got " +
                       std::string(dtype_name(dtype)));
}

Status check_quantized(KvPrecision p, const char* op) {
  if (p == KvPrecision::kInt8 || p == KvPrecision::kInt4) return ok_status();
  return invalid_argument(std::string(op) + ": precision " + std::to_string(static_cast<int>(p)) +
                          " is not int8 (1) or int4 (2)");
}

// f32 page [2, num_kv_heads, block_size, head_dim] -> int8 page.
void quantize_int8(const float* src, const QuantPageLayout& l, uint8_t* dst) {
  int8_t* values = reinterpret_cast<int8_t*>(dst + l.int8_values_offset());
  uint16_t* scales = reinterpret_cast<uint16_t*>(dst + l.int8_scales_offset());
  const int64_t tokens = 2 * int64_t{l.num_kv_heads} * l.block_size;  // [2, nkv, bs] rows
  for (int64_t t = 0; t < tokens; ++t) {
    scales[t] =
        kernels::int8_quantize_group(src + t * l.head_dim, l.head_dim, 1, values + t * l.head_dim);
  }
}

// f32 page -> int4 page: keys per channel over the page's tokens, values per token.
void quantize_int4(const float* src, const QuantPageLayout& l, uint8_t* dst) {
  const int hd = l.head_dim;
  const int bs = l.block_size;
  uint8_t* values = dst + l.int4_values_offset();
  uint16_t* k_scale = reinterpret_cast<uint16_t*>(dst + l.int4_k_scale_offset());
  uint16_t* k_zero = reinterpret_cast<uint16_t*>(dst + l.int4_k_zero_offset());
  uint16_t* v_scale = reinterpret_cast<uint16_t*>(dst + l.int4_v_scale_offset());
  uint16_t* v_zero = reinterpret_cast<uint16_t*>(dst + l.int4_v_zero_offset());
  std::vector<float> scale(hd), zero(hd);  // decoded parameters of the current group(s)
  std::vector<uint8_t> codes(hd);
  for (int h = 0; h < l.num_kv_heads; ++h) {
    // Keys: one group per channel d, tokens [0, block_size) of head h.
    const float* k = src + static_cast<int64_t>(l.token_index(0, h, 0)) * hd;
    for (int d = 0; d < hd; ++d) {
      const kernels::Int4Params p = kernels::int4_group_params(k + d, bs, hd);
      k_scale[int64_t{h} * hd + d] = p.scale_bits;
      k_zero[int64_t{h} * hd + d] = p.zero_bits;
      scale[d] = kernels::kvq_half_float(p.scale_bits);
      zero[d] = kernels::kvq_half_float(p.zero_bits);
    }
    for (int slot = 0; slot < bs; ++slot) {
      const float* x = k + int64_t{slot} * hd;
      uint8_t* out = values + l.token_index(0, h, slot) * (hd / 2);
      for (int d = 0; d < hd; ++d) codes[d] = kernels::int4_quantize(x[d], scale[d], zero[d]);
      for (int c = 0; c < hd / 2; ++c) out[c] = kernels::int4_pack(codes[2 * c], codes[2 * c + 1]);
    }
    // Values: one group per token.
    for (int slot = 0; slot < bs; ++slot) {
      const int64_t t = l.token_index(1, h, slot);
      const float* x = src + t * hd;
      const kernels::Int4Params p = kernels::int4_group_params(x, hd, 1);
      v_scale[int64_t{h} * bs + slot] = p.scale_bits;
      v_zero[int64_t{h} * bs + slot] = p.zero_bits;
      const float s = kernels::kvq_half_float(p.scale_bits);
      const float z = kernels::kvq_half_float(p.zero_bits);
      uint8_t* out = values + t * (hd / 2);
      for (int c = 0; c < hd / 2; ++c) {
        out[c] = kernels::int4_pack(kernels::int4_quantize(x[2 * c], s, z),
                                    kernels::int4_quantize(x[2 * c + 1], s, z));
      }
    }
  }
}

}  // namespace

Status validate_quant_layout(const QuantPageLayout& l, const char* op) {
  if (l.num_kv_heads <= 0 || l.block_size <= 0 || l.head_dim <= 0 || l.head_dim % 2 != 0) {
    return invalid_argument(std::string(op) + ": bad quantized page layout (num_kv_heads " +
                            std::to_string(l.num_kv_heads) + ", block_size " +
                            std::to_string(l.block_size) + ", head_dim " +
                            std::to_string(l.head_dim) + "; head_dim must be even)");
  }
  return ok_status();
}

Status cpu_quantize_kv_page(const void* src, DType src_dtype, const QuantPageLayout& layout,
                            KvPrecision to, void* dst) {
  constexpr const char* kOp = "quantize_kv_page";
  KVSPLIT_RETURN_IF_ERROR(check_f32(src_dtype, kOp));
  KVSPLIT_RETURN_IF_ERROR(check_quantized(to, kOp));
  KVSPLIT_RETURN_IF_ERROR(validate_quant_layout(layout, kOp));
  if (!src || !dst) return invalid_argument(std::string(kOp) + ": null src or dst");
  const float* f = static_cast<const float*>(src);
  uint8_t* out = static_cast<uint8_t*>(dst);
  const int64_t bytes = layout.bytes(to);
  KVSPLIT_CHECK(bytes > 0);
  std::memset(out, 0, static_cast<size_t>(bytes));  // padding bytes are defined
  if (to == KvPrecision::kInt8) {
    quantize_int8(f, layout, out);
  } else {
    quantize_int4(f, layout, out);
  }
  return ok_status();
}

Status cpu_dequantize_kv_page(const void* src, KvPrecision from, const QuantPageLayout& layout,
                              void* dst, DType dst_dtype) {
  constexpr const char* kOp = "dequantize_kv_page";
  KVSPLIT_RETURN_IF_ERROR(check_f32(dst_dtype, kOp));
  KVSPLIT_RETURN_IF_ERROR(check_quantized(from, kOp));
  KVSPLIT_RETURN_IF_ERROR(validate_quant_layout(layout, kOp));
  if (!src || !dst) return invalid_argument(std::string(kOp) + ": null src or dst");
  const uint8_t* page = static_cast<const uint8_t*>(src);
  float* out = static_cast<float*>(dst);
  for (int sel = 0; sel < 2; ++sel) {
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      for (int slot = 0; slot < layout.block_size; ++slot) {
        float* row = out + layout.token_index(sel, h, slot) * layout.head_dim;
        for (int d = 0; d < layout.head_dim; ++d) {
          row[d] = from == KvPrecision::kInt8
                       ? kernels::int8_page_elem(layout, page, sel, h, slot, d)
                       : kernels::int4_page_elem(layout, page, sel, h, slot, d);
        }
      }
    }
  }
  return ok_status();
}

Status cpu_summarize_kv_page(const void* src, DType src_dtype, const QuantPageLayout& layout,
                             kernels::KvSummaryElem* dst) {
  constexpr const char* kOp = "summarize_kv_page";
  KVSPLIT_RETURN_IF_ERROR(check_f32(src_dtype, kOp));
  KVSPLIT_RETURN_IF_ERROR(validate_quant_layout(layout, kOp));
  if (!src || !dst) return invalid_argument(std::string(kOp) + ": null src or dst");
  if (!layout.valid_summary_parts()) {
    return invalid_argument(std::string(kOp) + ": summary_parts " +
                            std::to_string(layout.summary_parts) + " must be >= 1 and divide " +
                            "block_size " + std::to_string(layout.block_size));
  }
  const float* keys = static_cast<const float*>(src);  // K section: [num_kv_heads, bs, hd]
  const int hd = layout.head_dim;
  const int part_slots = layout.block_size / layout.summary_parts;
  const int64_t per_kv = int64_t{layout.num_kv_heads} * hd;
  std::vector<float> mn(static_cast<size_t>(hd)), mx(static_cast<size_t>(hd));
  for (int part = 0; part < layout.summary_parts; ++part) {
    kernels::KvSummaryElem* out = dst + 2 * per_kv * part;
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      std::fill(mn.begin(), mn.end(), INFINITY);
      std::fill(mx.begin(), mx.end(), -INFINITY);
      for (int slot = part * part_slots; slot < (part + 1) * part_slots; ++slot) {
        const float* k = keys + layout.token_index(0, h, slot) * hd;
        for (int d = 0; d < hd; ++d) {
          mn[d] = std::min(mn[d], k[d]);
          mx[d] = std::max(mx[d], k[d]);
        }
      }
      // f16, rounded outwards: the stored range still covers every key of the part.
      for (int d = 0; d < hd; ++d) {
        out[int64_t{h} * hd + d] = kernels::kvq_summary_min_bits(mn[d]);
        out[per_kv + int64_t{h} * hd + d] = kernels::kvq_summary_max_bits(mx[d]);
      }
    }
  }
  return ok_status();
}

}  // namespace kvsplit::backend
