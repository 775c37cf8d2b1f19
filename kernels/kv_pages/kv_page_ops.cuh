// Quantized-KV page kernel bodies (nvcc in kv_page_ops.cu; g++ under the emulation harness). Host
// API and contracts: kernels/kv_pages/kv_page_ops.h. Every value goes through the group functions
// of kernels/common/kv_quant.h on f32 inputs, exactly as the CPU backend calls them, so the bytes
// match the CPU backend's bit for bit.
#pragma once

#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/kv_quant.h"
#include "kernels/kv_pages/kv_page_ops.h"

namespace kvsplit::kernels {

inline constexpr int kPageOpThreads = 128;

// grid ceil(n16 / kPageOpThreads) (capped), block kPageOpThreads: n16 16-byte words of dst = 0.
__global__ void __launch_bounds__(kPageOpThreads) zero_words_kernel(void* dst, int64_t n16) {
  unsigned char* out = static_cast<unsigned char*>(dst);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16;
       i += stride) {
    store16(out + i * 16, make_uint4(0, 0, 0, 0));
  }
}

// grid (2 (K, V), num_kv_heads), block kPageOpThreads, dynamic shared memory block_size * head_dim
// f32: the [block_size, head_dim] section of one (K or V, kv head) widened to f32 in shared memory,
// then one group per thread: int8 a token row; int4 keys a pair of channels (one packed byte per
// slot), int4 values a token row. dst was zeroed (padding) by zero_words_kernel.
template <typename T>
__global__ void __launch_bounds__(kPageOpThreads)
    quantize_kv_page_kernel(const T* src, QuantPageLayout l, int to_int4, uint8_t* dst) {
  const int sel = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int bs = l.block_size, hd = l.head_dim;
  KVSPLIT_DYNAMIC_SMEM(float, x);  // [block_size, head_dim]
  const T* section = src + l.token_index(sel, h, 0) * hd;
  for (int i = tid; i < bs * hd; i += blockDim.x) x[i] = Elem<T>::to_float(section[i]);
  __syncthreads();
  if (!to_int4) {
    int8_t* values = reinterpret_cast<int8_t*>(dst + l.int8_values_offset());
    uint16_t* scales = reinterpret_cast<uint16_t*>(dst + l.int8_scales_offset());
    for (int slot = tid; slot < bs; slot += blockDim.x) {
      const int64_t t = l.token_index(sel, h, slot);
      scales[t] = int8_quantize_group(x + slot * hd, hd, 1, values + t * hd);
    }
    return;
  }
  uint8_t* values = dst + l.int4_values_offset();
  if (sel == 0) {  // keys: one group per channel over the page's slots
    uint16_t* k_scale = reinterpret_cast<uint16_t*>(dst + l.int4_k_scale_offset());
    uint16_t* k_zero = reinterpret_cast<uint16_t*>(dst + l.int4_k_zero_offset());
    for (int c = tid; c < hd / 2; c += blockDim.x) {
      const Int4Params pe = int4_group_params(x + 2 * c, bs, hd);
      const Int4Params po = int4_group_params(x + 2 * c + 1, bs, hd);
      const int64_t ch = int64_t{h} * hd + 2 * c;
      k_scale[ch] = pe.scale_bits;
      k_zero[ch] = pe.zero_bits;
      k_scale[ch + 1] = po.scale_bits;
      k_zero[ch + 1] = po.zero_bits;
      const float se = kvq_half_float(pe.scale_bits), ze = kvq_half_float(pe.zero_bits);
      const float so = kvq_half_float(po.scale_bits), zo = kvq_half_float(po.zero_bits);
      for (int slot = 0; slot < bs; ++slot) {
        const float* row = x + slot * hd;
        values[l.token_index(0, h, slot) * (hd / 2) + c] =
            int4_pack(int4_quantize(row[2 * c], se, ze), int4_quantize(row[2 * c + 1], so, zo));
      }
    }
  } else {  // values: one group per token
    uint16_t* v_scale = reinterpret_cast<uint16_t*>(dst + l.int4_v_scale_offset());
    uint16_t* v_zero = reinterpret_cast<uint16_t*>(dst + l.int4_v_zero_offset());
    for (int slot = tid; slot < bs; slot += blockDim.x) {
      const float* row = x + slot * hd;
      const Int4Params p = int4_group_params(row, hd, 1);
      v_scale[int64_t{h} * bs + slot] = p.scale_bits;
      v_zero[int64_t{h} * bs + slot] = p.zero_bits;
      const float s = kvq_half_float(p.scale_bits), z = kvq_half_float(p.zero_bits);
      uint8_t* out = values + l.token_index(1, h, slot) * (hd / 2);
      for (int c = 0; c < hd / 2; ++c)
        out[c] = int4_pack(int4_quantize(row[2 * c], s, z), int4_quantize(row[2 * c + 1], s, z));
    }
  }
}

// grid ceil(n / kPageOpThreads), block kPageOpThreads: element i of the full page
// (= token_index(sel, head, slot) * head_dim + d), n = 2 * num_kv_heads * block_size * head_dim.
template <typename T>
__global__ void __launch_bounds__(kPageOpThreads)
    dequantize_kv_page_kernel(const uint8_t* src, QuantPageLayout l, int from_int4, T* dst) {
  const int64_t n = 2 * l.values_per_kv();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / l.head_dim;
  const int d = static_cast<int>(i % l.head_dim);
  const int slot = static_cast<int>(t % l.block_size);
  const int h = static_cast<int>((t / l.block_size) % l.num_kv_heads);
  const int sel = static_cast<int>(t / (int64_t{l.block_size} * l.num_kv_heads));
  const float v =
      from_int4 ? int4_page_elem(l, src, sel, h, slot, d) : int8_page_elem(l, src, sel, h, slot, d);
  dst[i] = Elem<T>::from_float(v);
}

// grid (num_kv_heads, summary_parts), block kPageOpThreads: channel d of kv head blockIdx.x over
// part blockIdx.y's slots per thread (kv_quant.h "key summaries").
template <typename T>
__global__ void __launch_bounds__(kPageOpThreads)
    summarize_kv_page_kernel(const T* src, QuantPageLayout l, KvSummaryElem* dst) {
  const int h = blockIdx.x, part = blockIdx.y, hd = l.head_dim;
  const int part_slots = l.block_size / l.summary_parts;
  const T* keys = src + l.token_index(0, h, part * part_slots) * hd;
  KvSummaryElem* out = dst + int64_t{part} * 2 * l.num_kv_heads * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float mn = INFINITY, mx = -INFINITY;
    for (int slot = 0; slot < part_slots; ++slot) {
      const float k = Elem<T>::to_float(keys[slot * hd + d]);
      mn = k < mn ? k : mn;  // std::min(mn, k): a NaN key keeps the running value
      mx = mx < k ? k : mx;  // std::max(mx, k)
    }
    out[int64_t{h} * hd + d] = kvq_summary_min_bits(mn);  // f16, rounded outwards
    out[int64_t{l.num_kv_heads + h} * hd + d] = kvq_summary_max_bits(mx);
  }
}

}  // namespace kvsplit::kernels
