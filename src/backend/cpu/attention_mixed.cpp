// Mixed-precision paged attention on the CPU (semantic cut): pages read at their own precision in
// the same tile loop as full pages, evicted pages skipped, and the scoring side outputs.
#include <math.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend::cpu_attention {
namespace {

using kernels::KvPrecision;
using kernels::QuantPageLayout;

// ---- row dequantization (bitwise equal to kernels::int8_dequantize / int4_dequantize) ----

#if defined(__AVX512F__)
// All lanes. The zero-masked intrinsics are used because GCC 12's unmasked forms trip
// -Wmaybe-uninitialized inside its own header (as Vec::sum in attention_tile.h).
constexpr __mmask16 kAll = 0xFFFF;
#endif

void dequant_int8_row(const int8_t* q, float scale, int n, float* out) {
  int d = 0;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(scale);
  for (; d + 16 <= n; d += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + d));
    _mm512_storeu_ps(
        out + d,
        _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, _mm512_maskz_cvtepi8_epi32(kAll, b)), s));
  }
#elif defined(__AVX2__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; d + 8 <= n; d += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + d));
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s));
  }
#endif
  for (; d < n; ++d) out[d] = kernels::int8_dequantize(q[d], scale);
}

#if defined(__AVX512F__)
constexpr int kNibbleStep = 16;
// Codes of channels [0, 16) of a packed row (8 bytes) as floats.
inline __m512 nibbles(const uint8_t* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i sh = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
  __m512i v = _mm512_maskz_permutexvar_epi32(
      kAll, idx, _mm512_zextsi128_si512(_mm_cvtsi64_si128(static_cast<int64_t>(x))));
  v = _mm512_and_si512(_mm512_maskz_srlv_epi32(kAll, v, sh), _mm512_set1_epi32(0xf));
  return _mm512_maskz_cvtepi32_ps(kAll, v);
}
#elif defined(__AVX2__)
constexpr int kNibbleStep = 8;
// Codes of channels [0, 8) of a packed row (4 bytes) as floats.
inline __m256 nibbles(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(x)), sh),
                                     _mm256_set1_epi32(0xf));
  return _mm256_cvtepi32_ps(v);
}
#endif

// out[d] = zero + scale * code[d] (values: one group per token).
void dequant_int4_row(const uint8_t* packed, float scale, float zero, int n, float* out) {
  int d = 0;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zero);
  for (; d + kNibbleStep <= n; d += kNibbleStep) {
    _mm512_storeu_ps(out + d, _mm512_fmadd_ps(s, nibbles(packed + d / 2), z));
  }
#elif defined(__AVX2__)
  const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero);
  for (; d + kNibbleStep <= n; d += kNibbleStep) {
    _mm256_storeu_ps(out + d, _mm256_fmadd_ps(s, nibbles(packed + d / 2), z));
  }
#endif
  for (; d < n; ++d)
    out[d] = kernels::int4_dequantize(kernels::int4_unpack(packed, d), scale, zero);
}

// out[d] = zero[d] + scale[d] * code[d] (keys: one group per channel).
void dequant_int4_row(const uint8_t* packed, const float* scale, const float* zero, int n,
                      float* out) {
  int d = 0;
#if defined(__AVX512F__)
  for (; d + kNibbleStep <= n; d += kNibbleStep) {
    _mm512_storeu_ps(out + d, _mm512_fmadd_ps(_mm512_loadu_ps(scale + d), nibbles(packed + d / 2),
                                              _mm512_loadu_ps(zero + d)));
  }
#elif defined(__AVX2__)
  for (; d + kNibbleStep <= n; d += kNibbleStep) {
    _mm256_storeu_ps(out + d, _mm256_fmadd_ps(_mm256_loadu_ps(scale + d), nibbles(packed + d / 2),
                                              _mm256_loadu_ps(zero + d)));
  }
#endif
  for (; d < n; ++d) {
    out[d] = kernels::int4_dequantize(kernels::int4_unpack(packed, d), scale[d], zero[d]);
  }
}

void decode_f16(const uint16_t* h, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = kernels::kvq_half_float(h[i]);
}

// Per-thread dequantization scratch: K and V rows [kKeyTile, head_dim], int4 key parameters.
struct MixedScratch {
  std::vector<float> k, v, k_scale, k_zero;
  std::vector<float> relevance;  // [block_size], scoring
  void reserve(int head_dim) {
    const size_t rows = static_cast<size_t>(kKeyTile) * head_dim;
    if (k.size() < rows) {
      k.resize(rows);
      v.resize(rows);
    }
    if (k_scale.size() < static_cast<size_t>(head_dim)) {
      k_scale.resize(head_dim);
      k_zero.resize(head_dim);
    }
  }
};

MixedScratch& mixed_scratch(int head_dim) {
  thread_local MixedScratch s;
  s.reserve(head_dim);
  return s;
}

KvPrecision precision_of(const AttentionArgs& a, int64_t row) {
  return a.page_precision ? static_cast<KvPrecision>(a.page_precision[row]) : KvPrecision::kFull;
}

// Row pointers kp/vp [s1 - s0] to K and V of slots [s0, s1) of kv head h of one resident page (p,
// id): into the full-precision pages, or rows [buf_row, buf_row + s1 - s0) of the scratch where
// the page is quantized (s1 - s0 <= kKeyTile - buf_row).
void page_rows(const AttentionArgs& a, KvPrecision p, int32_t id, int h, int s0, int s1,
               MixedScratch& ms, int buf_row, const float** kp, const float** vp) {
  const int hd = a.head_dim;
  const int bs = a.kv.block_size;
  if (p == KvPrecision::kFull) {
    const kernels::PagedKvLayout layout{a.kv.num_kv_heads, bs, hd};
    const float* pages = static_cast<const float*>(a.kv.data);
    const float* k_base = pages + layout.offset(id, 0, h, 0);
    const float* v_base = pages + layout.offset(id, 1, h, 0);
    for (int slot = s0; slot < s1; ++slot) {
      kp[slot - s0] = k_base + static_cast<int64_t>(slot) * hd;
      vp[slot - s0] = v_base + static_cast<int64_t>(slot) * hd;
    }
    return;
  }
  const QuantPageLayout ql{a.num_kv_heads, bs, hd};
  if (p == KvPrecision::kInt8) {
    const uint8_t* page = static_cast<const uint8_t*>(a.int8_pages) + id * ql.bytes(p);
    const int8_t* values = reinterpret_cast<const int8_t*>(page + ql.int8_values_offset());
    const uint16_t* scales = kernels::kvq_f16_at(page, ql.int8_scales_offset());
    for (int slot = s0; slot < s1; ++slot) {
      float* k = ms.k.data() + static_cast<size_t>(buf_row + slot - s0) * hd;
      float* v = ms.v.data() + static_cast<size_t>(buf_row + slot - s0) * hd;
      const int64_t tk = ql.token_index(0, h, slot), tv = ql.token_index(1, h, slot);
      dequant_int8_row(values + tk * hd, kernels::kvq_half_float(scales[tk]), hd, k);
      dequant_int8_row(values + tv * hd, kernels::kvq_half_float(scales[tv]), hd, v);
      kp[slot - s0] = k;
      vp[slot - s0] = v;
    }
    return;
  }
  const uint8_t* page = static_cast<const uint8_t*>(a.int4_pages) + id * ql.bytes(p);
  const uint8_t* values = page + ql.int4_values_offset();
  decode_f16(kernels::kvq_f16_at(page, ql.int4_k_scale_offset()) + int64_t{h} * hd, hd,
             ms.k_scale.data());
  decode_f16(kernels::kvq_f16_at(page, ql.int4_k_zero_offset()) + int64_t{h} * hd, hd,
             ms.k_zero.data());
  const uint16_t* v_scale = kernels::kvq_f16_at(page, ql.int4_v_scale_offset()) + int64_t{h} * bs;
  const uint16_t* v_zero = kernels::kvq_f16_at(page, ql.int4_v_zero_offset()) + int64_t{h} * bs;
  for (int slot = s0; slot < s1; ++slot) {
    float* k = ms.k.data() + static_cast<size_t>(buf_row + slot - s0) * hd;
    float* v = ms.v.data() + static_cast<size_t>(buf_row + slot - s0) * hd;
    dequant_int4_row(values + ql.token_index(0, h, slot) * (hd / 2), ms.k_scale.data(),
                     ms.k_zero.data(), hd, k);
    dequant_int4_row(values + ql.token_index(1, h, slot) * (hd / 2),
                     kernels::kvq_half_float(v_scale[slot]), kernels::kvq_half_float(v_zero[slot]),
                     hd, v);
    kp[slot - s0] = k;
    vp[slot - s0] = v;
  }
}

// out[r] = dot(q[r], k) for the n <= kRowBlock rows q[0 .. n), as fold_rows computes them.
void dot_block(const float* const* q, int n, const float* k, int hd, float* out) {
  switch (n) {
    case 4:
      dot_rows<4>(q, k, hd, out);
      break;
    case 3:
      dot_rows<3>(q, k, hd, out);
      break;
    case 2:
      dot_rows<2>(q, k, hd, out);
      break;
    default:
      dot_rows<1>(q, k, hd, out);
      break;
  }
}

std::string page_str(int s, int b) {
  return "page " + std::to_string(b) + " of sequence " + std::to_string(s);
}

}  // namespace

Status validate_mixed(const AttentionArgs& a, const char* op, bool decode) {
  const std::string where = std::string(op) + ": ";
  if (a.score_seqs && !decode) {
    return invalid_argument(where + "score_seqs (scoring side outputs) is decode-only");
  }
  if (!a.page_precision && !a.score_seqs) return ok_status();
  const bool bound = a.score_seqs && a.page_bound;
  if (bound && (!a.summary_slots || (a.num_summary_slots > 0 && !a.summaries))) {
    return invalid_argument(where + "page_bound needs summary_slots and summaries");
  }
  if (a.num_summary_slots < 0) return invalid_argument(where + "negative num_summary_slots");
  if (bound && !(a.scale > 0.f)) return invalid_argument(where + "page_bound needs scale > 0");
  for (int s = 0; s < a.num_seqs; ++s) {
    const int nb = (a.kv_lens[s] + a.kv.block_size - 1) / a.kv.block_size;
    const int64_t row0 = static_cast<int64_t>(s) * a.max_blocks_per_seq;
    for (int b = 0; b < nb; ++b) {
      const int p = a.page_precision ? a.page_precision[row0 + b] : 0;
      const int32_t id = a.block_tables[row0 + b];
      const void* arena = a.kv.data;
      int count = a.kv.num_blocks;
      const char* name = "kv";
      switch (p) {
        case static_cast<int>(KvPrecision::kFull):
          break;
        case static_cast<int>(KvPrecision::kInt8):
          arena = a.int8_pages, count = a.num_int8_blocks, name = "int8_pages";
          break;
        case static_cast<int>(KvPrecision::kInt4):
          arena = a.int4_pages, count = a.num_int4_blocks, name = "int4_pages";
          if (a.head_dim % 2 != 0)
            return invalid_argument(where + "int4 pages need an even head_dim");
          break;
        case static_cast<int>(KvPrecision::kEvicted):
          arena = nullptr, name = nullptr;
          break;
        default:
          return invalid_argument(where + page_str(s, b) + " has precision " + std::to_string(p) +
                                  ", not a KvPrecision (0..3)");
      }
      if (name && !arena) {
        return invalid_argument(where + page_str(s, b) + " needs the " + name +
                                " arena, which is null");
      }
      if (name && (id < 0 || id >= count)) {
        return invalid_argument(where + page_str(s, b) + " is id " + std::to_string(id) + " in " +
                                name + ", outside [0, " + std::to_string(count) + ")");
      }
      if (bound && a.score_seqs[s]) {
        const int32_t slot = a.summary_slots[row0 + b];
        if (slot < -1 || slot >= a.num_summary_slots) {
          return invalid_argument(where + page_str(s, b) + " has summary slot " +
                                  std::to_string(slot) + ", outside [0, " +
                                  std::to_string(a.num_summary_slots) + ") (or -1)");
        }
      }
    }
  }
  return ok_status();
}

void attend_mixed(const AttentionArgs& a, int seq, int kv_head, int key_begin, int key_end,
                  Rows& r) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const int64_t row0 = static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  MixedScratch& ms = mixed_scratch(hd);
  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  int n = 0;
  int tile_begin = key_begin;
  for (int blk = key_begin / bs; blk * bs < key_end; ++blk) {
    const KvPrecision p = precision_of(a, row0 + blk);
    if (p == KvPrecision::kEvicted) {  // a gap: the tile before it ends here
      if (n > 0) fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
      n = 0;
      tile_begin = (blk + 1) * bs;
      continue;
    }
    const int32_t id = a.block_tables[row0 + blk];
    int slot = std::max(key_begin - blk * bs, 0);
    const int s1 = std::min(bs, key_end - blk * bs);
    while (slot < s1) {
      const int take = std::min(s1 - slot, kKeyTile - n);
      page_rows(a, p, id, kv_head, slot, slot + take, ms, n, kp + n, vp + n);
      slot += take;
      n += take;
      if (n == kKeyTile) {
        fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
        tile_begin += n;
        n = 0;
      }
    }
  }
  if (n > 0) fold_tile(r, kp, vp, tile_begin, n, hd, a.scale);
}

void score_side_outputs(const AttentionArgs& a, const float* m, ThreadPool& pool) {
  const int bs = a.kv.block_size;
  const int hd = a.head_dim;
  const int nkv = a.num_kv_heads;
  const int group = a.num_heads / nkv;
  thread_local std::vector<std::pair<int, int>> items_tls;  // [(seq, page)]
  std::vector<std::pair<int, int>>& items = items_tls;
  items.clear();
  for (int s = 0; s < a.num_seqs; ++s) {
    if (!a.score_seqs[s]) continue;
    const int nb = (a.kv_lens[s] + bs - 1) / bs;
    for (int i = 0; i < nb; ++i) items.emplace_back(s, i);
  }
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t item) {
    const auto [s, i] = items[item];
    const int64_t row = static_cast<int64_t>(s) * a.max_blocks_per_seq + i;
    const float* q0 = a.q + static_cast<int64_t>(a.query_start[s]) * a.num_heads * hd;
    const float* mh = m + static_cast<int64_t>(s) * a.num_heads;
    if (a.page_bound && a.summary_slots[row] >= 0) {
      const float* summary =
          a.summaries + static_cast<int64_t>(a.summary_slots[row]) * 2 * nkv * hd;
      float best = 0.f;
      for (int h = 0; h < a.num_heads; ++h) {
        const float* kmin = summary + static_cast<int64_t>(h / group) * hd;
        const float* kmax = kmin + static_cast<int64_t>(nkv) * hd;
        const float* q = q0 + static_cast<int64_t>(h) * hd;
        double ub = 0.0;
        for (int d = 0; d < hd; ++d) {
          ub += std::max(static_cast<double>(q[d]) * kmin[d], static_cast<double>(q[d]) * kmax[d]);
        }
        best = std::max(best, expf(static_cast<float>(a.scale * ub) - mh[h]));
      }
      a.page_bound[row] = std::max(a.page_bound[row], best);
    }
    const KvPrecision p = precision_of(a, row);
    if (!a.token_relevance || p == KvPrecision::kEvicted) return;
    const int n = std::min(bs, a.kv_lens[s] - i * bs);
    MixedScratch& ms = mixed_scratch(hd);
    ms.relevance.assign(n, 0.f);
    const float* kp[kKeyTile];
    const float* vp[kKeyTile];
    for (int g = 0; g < nkv; ++g) {
      const float* q[kRowBlock];
      for (int t0 = 0; t0 < n; t0 += kKeyTile) {
        const int t1 = std::min(n, t0 + kKeyTile);
        page_rows(a, p, a.block_tables[row], g, t0, t1, ms, 0, kp, vp);
        for (int i0 = 0; i0 < group; i0 += kRowBlock) {
          const int nr = std::min(kRowBlock, group - i0);
          for (int k = 0; k < nr; ++k) q[k] = q0 + static_cast<int64_t>(g * group + i0 + k) * hd;
          for (int t = t0; t < t1; ++t) {
            float d[kRowBlock];
            dot_block(q, nr, kp[t - t0], hd, d);
            for (int k = 0; k < nr; ++k) {
              // z is bitwise the score fold_rows saw, so the head's most attended token gets
              // exactly 1 (tested explicitly: z - m may be contracted into an fma).
              const float z = d[k] * a.scale;
              const float m = mh[g * group + i0 + k];
              ms.relevance[t] = std::max(ms.relevance[t], z >= m ? 1.f : expf(z - m));
            }
          }
        }
      }
    }
    float* rel = a.token_relevance + static_cast<int64_t>(s) * a.max_blocks_per_seq * bs + i * bs;
    for (int t = 0; t < n; ++t) rel[t] = std::max(rel[t], ms.relevance[t]);
  });
}

}  // namespace kvsplit::backend::cpu_attention
