// Mixed-precision paged attention kernel bodies (nvcc in mixed_attention.cu; g++ under the
// emulation harness). Host API: kernels/attention/mixed_attention.h.
//
// Same thread mapping and pipeline as paged_attention.cuh: one block per (query tile or split, kv
// head, sequence), tiles of kAttnTileKeys keys (whole pages: kMixedTilePages of
// kAttentionBlockSize), an online softmax (kernels/common/softmax_state.h), K/V staged by
// cp.async into one of one or two shared-memory stages while the previous tile is computed
// (attention_stages picks). What differs is what is staged: the RAW bytes of every row at the
// precision of its page. A row slot holds D full-precision elements (f32/f16/bf16), or D int8
// codes, or D / 2 int4 nibble bytes at its start; each page of the tile also stages its
// quantization parameters (int8: the f16 scale of each token; int4: the per-channel f16 scale and
// zero point of the keys and the per-token ones of the values) in a small "meta" slot. The
// scores and P.V then decode 8 channels at a time in registers (mixed_for_chunks) with the
// functions of kv_quant.h, so shared memory and the bytes moved are those of the stored format,
// and every load is asynchronous. Rows of evicted pages are not read (their scores are -inf and
// their V rows decode as zeros).
//
// Scoring side outputs. The relevance of a token needs the final per-head max m_h, which a split
// only knows after the merge. Chosen method: a second kernel after the merge. The attention
// kernel (one split) or the merge (several) writes m_h to `score_max`; mixed_score_kernel then
// re-stages the scored sequences' K rows (no V) and recomputes every score with the very same
// code: the same q * scale in shared memory and mixed_tile_scores with the same rows (the GQA
// group) and threads, so every score is the same fixed chain of fmaf in channel order (no
// contraction freedom left to the compiler) whichever tile or split it falls in. So each
// recomputed score equals the one the softmax saw bit for bit, m_h is exactly the max of those
// scores, and the most attended token of each head gets exp(0) = 1. Cost: one extra read of the K
// rows of the scored sequences' resident pages (half of their KV bytes) on scored steps only, and
// no sequence-sized workspace (writing raw scores instead would need num_heads floats per token).
#pragma once

#include "kernels/attention/mixed_attention.h"
#include "kernels/attention/paged_attention.cuh"
#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"
#include "kernels/common/softmax_state.h"
#include "kernels/common/warp_reduce.cuh"

namespace kvsplit::kernels {

inline constexpr int kMixedChunk = 8;  // channels decoded at a time (one P.V chunk: kPvChunk)
static_assert(kMixedChunk == kPvChunk);
inline constexpr int kMixedBs = kAttentionBlockSize;
static_assert(kAttnTileKeys % kMixedBs == 0, "tiles are whole pages");
inline constexpr int kMixedTilePages = kAttnTileKeys / kMixedBs;

// Bytes of one staged row slot: D full-precision elements plus 16 of padding (rows of
// consecutive keys then start in different banks); int8 / int4 rows use its first D / D / 2.
KVSPLIT_HOST_DEVICE constexpr int mixed_row_bytes(int head_dim, int elem_bytes) {
  return head_dim * elem_bytes + 16;
}
// One page's parameter slot: key parameters at 0 (int8: f16 scale [kMixedBs]; int4: f16 scale
// [D] then zero point [D]), value parameters at mixed_meta_v (int8: f16 scale [kMixedBs]; int4:
// f16 scale [kMixedBs] then zero point [kMixedBs]).
KVSPLIT_HOST_DEVICE constexpr int mixed_meta_v(int head_dim) {
  return 4 * head_dim > 2 * kMixedBs ? 4 * head_dim : 2 * kMixedBs;
}
KVSPLIT_HOST_DEVICE constexpr int mixed_meta_bytes(int head_dim) {
  return mixed_meta_v(head_dim) + 4 * kMixedBs;
}

// Byte offsets of one block's shared memory (16-byte aligned). with_v: the attention kernel (V
// rows, o accumulators); otherwise the scoring kernel (its page-bound scratch). info: the page
// ids and precisions of kMixedInfoSlots tiles (a tile's P.V still reads its own while the ids of
// the tile after next are loaded). `stages` stages of stage_bytes each start at `stage`; within
// one: the pages' parameter slots (meta), the K row slots (k) and the V row slots (v). kpar: the
// current tile's int4 key parameters as f32 (mixed_convert_key_params).
inline constexpr int kMixedInfoSlots = 3;
struct MixedSmemLayout {
  int q, o, s, m, l, alpha, bnd, info, kpar, stage, stage_bytes, meta, k, v, total;
};
KVSPLIT_HOST_DEVICE MixedSmemLayout mixed_smem_layout(int rows, int head_dim, int elem_bytes,
                                                      bool with_v, int stages) {
  MixedSmemLayout L;
  int at = 0;
  L.q = at;
  at = align16(at + rows * head_dim * 4);  // f32 q * scale [rows, D]
  L.o = at;
  at = align16(at + (with_v ? rows * head_dim * 4 : 0));  // f32 accumulators [rows, D]
  L.s = at;
  at = align16(at + rows * kAttnTileKeys * 4);  // scores / probs [rows, tile]
  L.m = at;
  at = align16(at + rows * 4);
  L.l = at;
  at = align16(at + rows * 4);
  L.alpha = at;
  at = align16(at + rows * 4);
  L.bnd = at;
  at = align16(at + (with_v ? 0 : kMixedTilePages * rows * 4));  // page bounds [pages, rows]
  L.info = at;  // per slot: arena id (-1: skip) of each page, then its precision
  at = align16(at + kMixedInfoSlots * 2 * kMixedTilePages * 4);
  L.kpar = at;
  at = align16(at + kMixedTilePages * 2 * head_dim * 4);
  L.stage = at;
  const int row = mixed_row_bytes(head_dim, elem_bytes);
  int in = 0;
  L.meta = in;
  in = align16(in + kMixedTilePages * mixed_meta_bytes(head_dim));
  L.k = in;
  in = align16(in + kAttnTileKeys * row);
  L.v = in;
  in = align16(in + (with_v ? kAttnTileKeys * row : 0));
  L.stage_bytes = in;
  L.total = at + stages * in;
  return L;
}

__device__ __forceinline__ uint2 mixed_load8(const void* p) {
#if defined(KVSPLIT_EMULATE_CUDA)
  uint2 v;
  std::memcpy(&v, p, 8);
  return v;
#else
  return *reinterpret_cast<const uint2*>(p);
#endif
}
__device__ __forceinline__ uint32_t mixed_load4(const void* p) {
#if defined(KVSPLIT_EMULATE_CUDA)
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}
__device__ __forceinline__ uint16_t mixed_load2(const void* p) {
#if defined(KVSPLIT_EMULATE_CUDA)
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#else
  return *reinterpret_cast<const uint16_t*>(p);
#endif
}

// Precision and arena id of pages [first_page, first_page + num_pages) of sequence s (pid -1:
// nothing to read). A precision value > 3, an id outside its arena, a missing arena or a page past
// the table row is flagged and the page skipped. Pages before `first_read` (before a sliding
// window) are skipped without reading their entries: they may have been freed.
__device__ __forceinline__ void mixed_load_page_info(const MixedAttentionParams& mp, int s,
                                                     int first_page, int num_pages, int first_read,
                                                     int* pid, int* pprec) {
  const PagedAttentionParams& p = mp.base;
  for (int j = threadIdx.x; j < num_pages; j += blockDim.x) {
    const int64_t row = static_cast<int64_t>(s) * p.max_blocks_per_seq + first_page + j;
    if (first_page + j < first_read) {
      pid[j] = -1;
      pprec[j] = static_cast<int>(KvPrecision::kEvicted);
      continue;
    }
    // A kv_len longer than the table row is flagged, never read from the next row.
    const bool in_row = first_page + j < p.max_blocks_per_seq;
    const int prec = in_row && mp.page_precision ? mp.page_precision[row] : 0;
    int id = -1;
    bool bad = !in_row;
    if (in_row) {
      switch (static_cast<KvPrecision>(prec)) {
        case KvPrecision::kFull:
          id = p.block_tables[row];
          bad = id < 0 || id >= p.num_blocks;
          break;
        case KvPrecision::kInt8:
          id = p.block_tables[row];
          bad = !mp.int8_pages || id < 0 || id >= mp.num_int8_blocks;
          break;
        case KvPrecision::kInt4:
          id = p.block_tables[row];
          bad = !mp.int4_pages || id < 0 || id >= mp.num_int4_blocks;
          break;
        case KvPrecision::kEvicted:
          break;
        default:
          bad = true;
      }
    }
    if (bad) {
      if (p.error_flag) atomicMax(p.error_flag, 1);
      id = -1;
    }
    pid[j] = id;
    pprec[j] = prec;
  }
}

// Stages the raw rows of the n keys of a tile (whole pages from its first) of kv head kvh (K into
// krows, and V into vrows unless it is null) and the parameters of their quantized pages into
// `meta`, by cp.async (the caller commits and waits). Page j of the tile is pid[j] / pprec[j];
// pages with pid -1 are not read. A full row is D * sizeof(KT) / 16 copies of 16 bytes; an int8 row
// D bytes and an int4 row D / 2 (one copy of 8 / 4 bytes at head_dim 8). Consecutive threads copy
// consecutive pieces of a row, then the next row: a page's rows are contiguous in its arena.
template <typename KT, int D>
__device__ __forceinline__ void mixed_issue_tile(const MixedAttentionParams& mp, int kvh, int n,
                                                 const int* pid, const int* pprec,
                                                 unsigned char* meta, unsigned char* krows,
                                                 unsigned char* vrows) {
  constexpr int kRow = mixed_row_bytes(D, static_cast<int>(sizeof(KT)));
  constexpr int kUnits = D * static_cast<int>(sizeof(KT)) / 16;  // 16-byte pieces per full row
  constexpr int kVec = Vec16<KT>::kElems;
  constexpr int kInt8Units = D >= 16 ? D / 16 : 1;
  constexpr int kInt4Units = D >= 32 ? D / 32 : 1;
  constexpr int kMetaBytes = mixed_meta_bytes(D);
  static_assert(kMetaBytes % 16 == 0 && kUnits >= 1);
  const PagedAttentionParams& p = mp.base;
  const PagedKvLayout full{p.num_kv_heads, kMixedBs, D};
  const QuantPageLayout ql{p.num_kv_heads, kMixedBs, D};
  const int sels = vrows ? 2 : 1;
  // One flat loop over full-row pieces: a quantized page's threads past its row skip. A loop per
  // page with a piece count per precision took the attention kernel from 112 registers to 128
  // with spills (ptxas, sm_90).
  for (int sel = 0; sel < sels; ++sel) {
    for (int i = threadIdx.x; i < n * kUnits; i += blockDim.x) {
      const int c = i % kUnits, t = i / kUnits;
      const int j = t / kMixedBs, slot = t % kMixedBs;
      const int id = pid[j];
      if (id < 0) continue;
      unsigned char* dst = (sel == 0 ? krows : vrows) + t * kRow + c * 16;
      const int prec = pprec[j];
      if (prec == static_cast<int>(KvPrecision::kFull)) {
        cp_async16(dst, static_cast<const KT*>(p.kv) + full.offset(id, sel, kvh, slot) + c * kVec);
      } else if (prec == static_cast<int>(KvPrecision::kInt8)) {
        if (c >= kInt8Units) continue;
        const uint8_t* src = static_cast<const uint8_t*>(mp.int8_pages) +
                             id * ql.bytes(KvPrecision::kInt8) + ql.int8_values_offset() +
                             ql.token_index(sel, kvh, slot) * D + c * 16;
        if (D >= 16) {
          cp_async16(dst, src);
        } else {
          cp_async8(dst, src);
        }
      } else {  // int4 (an id >= 0 is full, int8 or int4: mixed_load_page_info)
        if (c >= kInt4Units) continue;
        const uint8_t* src = static_cast<const uint8_t*>(mp.int4_pages) +
                             id * ql.bytes(KvPrecision::kInt4) + ql.int4_values_offset() +
                             ql.token_index(sel, kvh, slot) * (D / 2) + c * 16;
        if (D >= 32) {
          cp_async16(dst, src);
        } else {
          cp_async4(dst, src);
        }
      }
    }
  }
  // Parameters, 16-byte pieces per page: int8 K scales (2), V scales (2); int4 K scales and zero
  // points (D / 8 each), V scales and zero points (2 each). Every section of a quantized page and
  // every (head, K or V) run in it starts 16-byte aligned (kv_quant.h, kMixedBs = 16).
  constexpr int kMaxPieces = 2 * (D / 8) + 4;
  for (int i = threadIdx.x; i < kMixedTilePages * kMaxPieces; i += blockDim.x) {
    const int j = i / kMaxPieces, u = i % kMaxPieces;
    if (j * kMixedBs >= n) break;
    const int id = pid[j];
    if (id < 0) continue;
    unsigned char* m = meta + j * kMetaBytes;
    const int prec = pprec[j];
    if (prec == static_cast<int>(KvPrecision::kInt8)) {
      const uint8_t* page =
          static_cast<const uint8_t*>(mp.int8_pages) + id * ql.bytes(KvPrecision::kInt8);
      if (u < 2) {
        cp_async16(m + u * 16,
                   page + ql.int8_scales_offset() + ql.token_index(0, kvh, 0) * 2 + u * 16);
      } else if (vrows && u < 4) {
        cp_async16(m + mixed_meta_v(D) + (u - 2) * 16,
                   page + ql.int8_scales_offset() + ql.token_index(1, kvh, 0) * 2 + (u - 2) * 16);
      }
    } else if (prec == static_cast<int>(KvPrecision::kInt4)) {
      const uint8_t* page =
          static_cast<const uint8_t*>(mp.int4_pages) + id * ql.bytes(KvPrecision::kInt4);
      const int64_t kpar = static_cast<int64_t>(kvh) * D * 2;
      const int64_t vpar = static_cast<int64_t>(kvh) * kMixedBs * 2;
      if (u < D / 8) {
        cp_async16(m + u * 16, page + ql.int4_k_scale_offset() + kpar + u * 16);
      } else if (u < D / 4) {
        cp_async16(m + u * 16, page + ql.int4_k_zero_offset() + kpar + (u - D / 8) * 16);
      } else if (vrows && u < D / 4 + 2) {
        cp_async16(m + mixed_meta_v(D) + (u - D / 4) * 16,
                   page + ql.int4_v_scale_offset() + vpar + (u - D / 4) * 16);
      } else if (vrows) {
        cp_async16(m + mixed_meta_v(D) + 32 + (u - D / 4 - 2) * 16,
                   page + ql.int4_v_zero_offset() + vpar + (u - D / 4 - 2) * 16);
      }
    }
  }
}

// What each page of a tile decodes as (byte j: page j's KvPrecision, kEvicted for a page not
// read), read once per tile into a register; pages past the tile's keys are never asked for.
__device__ __forceinline__ uint32_t mixed_tile_kinds(const int* pid, const int* pprec) {
  uint32_t kinds = 0;
#pragma unroll
  for (int j = 0; j < kMixedTilePages; ++j) {
    const int k = pid[j] < 0 ? static_cast<int>(KvPrecision::kEvicted) : pprec[j];
    kinds |= static_cast<uint32_t>(k & 0xff) << (8 * j);
  }
  return kinds;
}
// The kind of key t of the tile.
__device__ __forceinline__ int mixed_kind(uint32_t kinds, int t) {
  return static_cast<int>((kinds >> (8 * (t / kMixedBs))) & 0xffu);
}

// Calls f(c, x) for the 8-channel chunks c in [c_begin, c_end) of staged row `row` (slot `slot`
// of its page; sel 0 = K, 1 = V) with x the chunk as f32, decoded at precision `kind` with
// `pmeta` (its page's parameter slot). kind is kFull, kInt8 or kInt4 (the callers skip kEvicted).
// The exact float of an integer b in [0, 2^23): its bits under 2^23's exponent, minus 2^23. One
// logic op and one add, where an int-to-float conversion runs at a quarter of the FMA rate.
__device__ __forceinline__ float mixed_small_float(uint32_t b) {
  return __uint_as_float(0x4B000000u | b) - 8388608.f;
}

template <typename KT, int D, typename F>
__device__ __forceinline__ void mixed_for_chunks(int kind, const unsigned char* row,
                                                 const unsigned char* pmeta, const float* pkpar,
                                                 int sel, int slot, int c_begin, int c_end,
                                                 const F& f) {
  constexpr int kVec = Vec16<KT>::kElems;
  float x[kMixedChunk];
  if (kind == static_cast<int>(KvPrecision::kFull)) {
    const KT* r = reinterpret_cast<const KT*>(row);
#pragma unroll 4
    for (int c = c_begin; c < c_end; ++c) {
#pragma unroll
      for (int u = 0; u < kMixedChunk / kVec; ++u)
        Vec16<KT>::to_floats(load16(r + c * kMixedChunk + u * kVec), x + u * kVec);
      f(c, x);
    }
  } else if (kind == static_cast<int>(KvPrecision::kInt8)) {
    const float scale =
        kvq_half_float(mixed_load2(pmeta + (sel == 0 ? 0 : mixed_meta_v(D)) + slot * 2));
#pragma unroll 4
    for (int c = c_begin; c < c_end; ++c) {
      const uint2 w = mixed_load8(row + c * kMixedChunk);
#pragma unroll
      for (int e = 0; e < kMixedChunk; ++e) {
        // Code q (byte e, two's complement) biased to q + 128 in [0, 255]: float(q) exactly.
        const uint32_t b = (((e < 4 ? w.x : w.y) >> (8 * (e & 3))) & 0xffu) ^ 0x80u;
        x[e] = (__uint_as_float(0x4B000000u | b) - 8388736.f) * scale;  // int8_dequantize
      }
      f(c, x);
    }
  } else if (sel == 0) {
    // Keys: scale and zero point per channel, as f32 (mixed_convert_key_params).
#pragma unroll 4
    for (int c = c_begin; c < c_end; ++c) {
      const uint32_t w = mixed_load4(row + c * (kMixedChunk / 2));
      float sc[kMixedChunk], zp[kMixedChunk];
      const uint4 s0 = load16(pkpar + c * kMixedChunk), s1 = load16(pkpar + c * kMixedChunk + 4);
      const uint4 z0 = load16(pkpar + D + c * kMixedChunk);
      const uint4 z1 = load16(pkpar + D + c * kMixedChunk + 4);
      memcpy(sc, &s0, 16);
      memcpy(sc + 4, &s1, 16);
      memcpy(zp, &z0, 16);
      memcpy(zp + 4, &z1, 16);
#pragma unroll
      for (int e = 0; e < kMixedChunk; ++e)  // int4_dequantize(u, scale, zero)
        x[e] = fmaf(sc[e], mixed_small_float((w >> (4 * e)) & 0xfu), zp[e]);
      f(c, x);
    }
  } else {
    // Values: scale and zero point per token.
    const float scale = kvq_half_float(mixed_load2(pmeta + mixed_meta_v(D) + slot * 2));
    const float zero = kvq_half_float(mixed_load2(pmeta + mixed_meta_v(D) + 32 + slot * 2));
#pragma unroll 4
    for (int c = c_begin; c < c_end; ++c) {
      const uint32_t w = mixed_load4(row + c * (kMixedChunk / 2));
#pragma unroll
      for (int e = 0; e < kMixedChunk; ++e)
        x[e] = fmaf(scale, mixed_small_float((w >> (4 * e)) & 0xfu), zero);
      f(c, x);
    }
  }
}

// The int4 pages' key parameters of a staged tile as f32 (kpar [kMixedTilePages, 2 (scale, zero),
// D]), converted once per tile instead of once per key: exact (every f16 is an f32). Call between
// the barrier that makes the tile's meta visible and one before the scores.
template <int D>
__device__ __forceinline__ void mixed_convert_key_params(uint32_t kinds, int n,
                                                         const unsigned char* meta, float* kpar) {
  for (int i = threadIdx.x; i < kMixedTilePages * 2 * D; i += blockDim.x) {
    const int j = i / (2 * D), e = i % (2 * D);
    if (j * kMixedBs >= n ||
        mixed_kind(kinds, j * kMixedBs) != static_cast<int>(KvPrecision::kInt4))
      continue;
    kpar[i] = kvq_half_float(mixed_load2(meta + j * mixed_meta_bytes(D) + e * 2));
  }
}
// True when a page of the tile's n keys is int4 (the same for every thread of the block).
__device__ __forceinline__ bool mixed_tile_has_int4(uint32_t kinds, int n) {
  for (int j = 0; j * kMixedBs < n; ++j)
    if (mixed_kind(kinds, j * kMixedBs) == static_cast<int>(KvPrecision::kInt4)) return true;
  return false;
}

// Scores of one staged tile of n keys into s_s [rows, kAttnTileKeys]: q . k for every (row, key)
// with valid(r, t) and a resident page, -inf otherwise (0 with no_products: the stage probe).
// Item (row block of kPvRows rows, key t, part of D) as in paged_attention_kernel: each K chunk
// decoded feeds the block's rows; with one row block the two halves of D are two lanes, summed by
// a shuffle (every thread then has exactly one item, so whole warps shuffle). Each score is the
// fixed fmaf chain of its part in channel order, then the two parts' sum: the attention and the
// scoring kernel call this with the same rows, so their scores are equal bit for bit.
template <typename KT, int D, typename Valid>
__device__ __forceinline__ void mixed_tile_scores(const float* q_s, int rows, int n, uint32_t kinds,
                                                  const unsigned char* meta, const float* kpar,
                                                  const unsigned char* krows, float* s_s,
                                                  bool no_products, const Valid& valid) {
  constexpr int kChunks = D / kMixedChunk;
  constexpr int kRow = mixed_row_bytes(D, static_cast<int>(sizeof(KT)));
  constexpr int kMetaBytes = mixed_meta_bytes(D);
  const int row_blocks = (rows + kPvRows - 1) / kPvRows;
  const int parts = row_blocks == 1 && kChunks % 2 == 0 && D >= 64 ? 2 : 1;
  const int items = row_blocks * kAttnTileKeys * parts;
  for (int i = threadIdx.x; i < items; i += blockDim.x) {
    const int part = i % parts, t = i / parts % kAttnTileKeys;
    const int r0 = i / (parts * kAttnTileKeys) * kPvRows;
    const int kind = t < n ? mixed_kind(kinds, t) : static_cast<int>(KvPrecision::kEvicted);
    float acc[kPvRows];
#pragma unroll
    for (int j = 0; j < kPvRows; ++j) acc[j] = 0.f;
    if (!no_products && kind != static_cast<int>(KvPrecision::kEvicted)) {
      const float* qr[kPvRows];
#pragma unroll
      for (int j = 0; j < kPvRows; ++j) qr[j] = q_s + (r0 + j < rows ? r0 + j : rows - 1) * D;
      const int c_begin = part * (kChunks / parts);
      mixed_for_chunks<KT, D>(kind, krows + t * kRow, meta + t / kMixedBs * kMetaBytes,
                              kpar + t / kMixedBs * 2 * D, 0, t % kMixedBs, c_begin,
                              c_begin + kChunks / parts, [&](int c, const float* x) {
#pragma unroll
                                for (int j = 0; j < kPvRows; ++j)
#pragma unroll
                                  for (int e = 0; e < kMixedChunk; ++e)
                                    acc[j] = fmaf(qr[j][c * kMixedChunk + e], x[e], acc[j]);
                              });
    }
    if (parts == 2) {
#pragma unroll
      for (int j = 0; j < kPvRows; ++j) acc[j] += __shfl_xor_sync(kFullWarpMask, acc[j], 1);
    }
    if (part != 0) continue;
#pragma unroll
    for (int j = 0; j < kPvRows; ++j) {
      const int r = r0 + j;
      if (r >= rows) break;
      const bool ok = kind != static_cast<int>(KvPrecision::kEvicted) && valid(r, t);
      s_s[r * kAttnTileKeys + t] = ok ? acc[j] : -INFINITY;
    }
  }
}

// grid (x: split for decode / query tile for prefill, y: kv head, z: sequence), block
// kAttnThreads, dynamic shared memory mixed_smem_layout(rows, D, sizeof(KT), true, S).
// S: pipeline stages (1 or 2), as paged_attention_kernel.
template <typename KT, int D, int S>
__global__ void __launch_bounds__(kAttnThreads)
    mixed_attention_kernel(MixedAttentionParams mp, int tokens_per_block, int decode) {
  static_assert(S == 1 || S == 2, "one or two pipeline stages");
  constexpr int kRow = mixed_row_bytes(D, static_cast<int>(sizeof(KT)));
  constexpr int kMetaBytes = mixed_meta_bytes(D);
  const PagedAttentionParams& p = mp.base;
  const int s = blockIdx.z;
  const int kvh = blockIdx.y;
  const int bx = blockIdx.x;
  const int tid = threadIdx.x;
  const int group = p.num_heads / p.num_kv_heads;
  const int q_begin = p.query_start[s];
  const int q_len = p.query_start[s + 1] - q_begin;
  const int kv_len = p.kv_lens[s];

  int tok_begin = 0, tok_count = 0, key_begin = 0, key_end = 0, split_slot = -1;
  if (decode) {
    if (q_len < 1 || !decode_split_keys(p, s, bx, kv_len, &key_begin, &key_end, &split_slot))
      return;
    tok_count = 1;
  } else {
    tok_begin = bx * tokens_per_block;
    if (tok_begin >= q_len) return;
    tok_count = q_len - tok_begin < tokens_per_block ? q_len - tok_begin : tokens_per_block;
    // From the page of the first row's first key (a split's keys start on a page too).
    key_begin = window_first_key(kv_len - q_len + tok_begin, p.window);
    key_begin -= key_begin % p.block_size;
    key_end = kv_len - q_len + tok_begin + tok_count;  // last row's position + 1
  }
  const int rows = tok_count * group;
  const MixedSmemLayout L = mixed_smem_layout(rows, D, static_cast<int>(sizeof(KT)), true, S);
  KVSPLIT_DYNAMIC_SMEM(unsigned char, smem);
  float* q_s = reinterpret_cast<float*>(smem + L.q);
  float* o_s = reinterpret_cast<float*>(smem + L.o);
  float* s_s = reinterpret_cast<float*>(smem + L.s);
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  float* l_s = reinterpret_cast<float*>(smem + L.l);
  float* alpha_s = reinterpret_cast<float*>(smem + L.alpha);
  float* kpar = reinterpret_cast<float*>(smem + L.kpar);
  auto stage = [&](int st) { return smem + L.stage + st * L.stage_bytes; };
  // Page info of tile `it` (slot it % kMixedInfoSlots): with two stages it is loaded during tile
  // it - 1, before the barrier that ends tile it - 2's P.V, which still reads its own slot.
  auto pid_of = [&](int it) {
    return reinterpret_cast<int*>(smem + L.info) + it % kMixedInfoSlots * 2 * kMixedTilePages;
  };
  auto prec_of = [&](int it) { return pid_of(it) + kMixedTilePages; };

  for (int i = tid; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    const int h = kvh * group + r % group;
    const int64_t row = q_begin + tok_begin + r / group;
    q_s[i] = p.q[(row * p.num_heads + h) * D + d] * p.scale;  // as in mixed_score_kernel
  }
  for (int r = tid; r < rows; r += blockDim.x) {
    const SoftmaxState empty = softmax_state_empty();
    m_s[r] = empty.m;
    l_s[r] = empty.l;
  }
  PvAccum<D> pv;  // o, in registers until the end
  pv.init(rows, tid);

  const int lane = tid % 32, warp = tid / 32, num_warps = blockDim.x / 32;
  auto tile_len = [&](int k0) {
    return key_end - k0 < kAttnTileKeys ? key_end - k0 : kAttnTileKeys;
  };
  auto tile_start = [&](int it) { return key_begin + it * kAttnTileKeys; };
  auto load_info = [&](int it) {
    // The page-info probe reads each slot's ids once (its first tile) and reuses them.
    if ((mp.probe & kMixedProbeNoPageInfo) && it >= kMixedInfoSlots) return;
    const int k0 = tile_start(it);
    mixed_load_page_info(mp, s, k0 / kMixedBs, (tile_len(k0) + kMixedBs - 1) / kMixedBs, 0,
                         pid_of(it), prec_of(it));
  };
  auto issue_tile = [&](int it, int st) {
    if (!(mp.probe & kMixedProbeNoRows)) {
      mixed_issue_tile<KT, D>(mp, kvh, tile_len(tile_start(it)), pid_of(it), prec_of(it),
                              stage(st) + L.meta, stage(st) + L.k, stage(st) + L.v);
    }
    cp_async_commit();
  };

  const int num_tiles =
      key_end > key_begin ? (key_end - key_begin + kAttnTileKeys - 1) / kAttnTileKeys : 0;
  if (num_tiles > 0) {
    load_info(0);
    __syncthreads();  // also: q_s, m_s, l_s are initialised
    issue_tile(0, 0);
  }
  for (int it = 0; it < num_tiles; ++it) {
    const int cur = it % S, nxt = (it + 1) % S;
    const int k0 = tile_start(it);
    const int n = tile_len(k0);
    const bool more = it + 1 < num_tiles;
    // Two stages: info slot it + 1 was last read by tile it - 2 (ended at a barrier); stage nxt
    // was last read by tile it - 1, whose readers are done at the barrier below.
    if (S == 2 && more) load_info(it + 1);
    cp_async_wait<0>();  // this thread's copies of tile it have landed ...
    __syncthreads();     // ... and everyone's; tile it-1's readers of stage nxt are done
    if (S == 2 && more) issue_tile(it + 1, nxt);  // in flight while tile it is computed
    const uint32_t kinds = mixed_tile_kinds(pid_of(it), prec_of(it));
    const unsigned char* meta = stage(cur) + L.meta;
    const unsigned char* vrows = stage(cur) + L.v;
    if (mixed_tile_has_int4(kinds, n)) {  // block-uniform
      mixed_convert_key_params<D>(kinds, n, meta, kpar);
      __syncthreads();
    }
    mixed_tile_scores<KT, D>(q_s, rows, n, kinds, meta, kpar, stage(cur) + L.k, s_s,
                             (mp.probe & kMixedProbeNoScores) != 0, [&](int r, int t) {
                               const int limit =
                                   decode ? kv_len : kv_len - q_len + tok_begin + r / group + 1;
                               const int first = window_first_key(limit - 1, p.window);
                               return k0 + t < limit && k0 + t >= first;
                             });
    __syncthreads();
    // Online softmax: fold this tile's (max, sum) into the row state; probs overwrite scores.
    for (int r = warp; r < rows; r += num_warps) {
      float* sr = s_s + r * kAttnTileKeys;
      float mx = -INFINITY;
      for (int t = lane; t < kAttnTileKeys; t += 32) mx = fmaxf(mx, sr[t]);
      mx = warp_max(mx);
      float sum = 0.f;
      for (int t = lane; t < kAttnTileKeys; t += 32)
        sum += sr[t] == -INFINITY ? 0.f : expf(sr[t] - mx);
      sum = warp_sum(sum);
      float scale_old = 1.f, scale_tile = 0.f;
      const SoftmaxState merged = softmax_state_merge(
          SoftmaxState{m_s[r], l_s[r]}, SoftmaxState{mx, sum}, &scale_old, &scale_tile);
      for (int t = lane; t < kAttnTileKeys; t += 32)
        sr[t] = sr[t] == -INFINITY ? 0.f : expf(sr[t] - mx) * scale_tile;
      __syncwarp();
      if (lane == 0) {
        m_s[r] = merged.m;
        l_s[r] = merged.l;
        alpha_s[r] = scale_old;
      }
    }
    __syncthreads();
    if (!(mp.probe & kMixedProbeNoPv)) {
      pv.add_tile(s_s, alpha_s, n, [&](int t, int c0, float* v) {
        const int kind = mixed_kind(kinds, t);
        if (kind == static_cast<int>(KvPrecision::kEvicted)) {
#pragma unroll
          for (int e = 0; e < kMixedChunk; ++e) v[e] = 0.f;
          return;
        }
        mixed_for_chunks<KT, D>(kind, vrows + t * kRow, meta + t / kMixedBs * kMetaBytes, nullptr,
                                1, t % kMixedBs, c0 / kMixedChunk, c0 / kMixedChunk + 1,
                                [&](int, const float* x) {
#pragma unroll
                                  for (int e = 0; e < kMixedChunk; ++e) v[e] = x[e];
                                });
      });
    }
    if (S == 1 && more) {  // one stage: the next tile's loads start once this one is consumed
      __syncthreads();
      load_info(it + 1);
      __syncthreads();
      issue_tile(it + 1, 0);
    }
  }
  pv.finish(o_s);
  __syncthreads();
  for (int i = tid; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    const int h = kvh * group + r % group;
    if (split_slot >= 0) {
      const int64_t sh = static_cast<int64_t>(split_slot) * p.num_heads + h;
      p.part_o[sh * D + d] = o_s[i];
      if (d == 0) {
        p.part_m[sh] = m_s[r];
        p.part_l[sh] = l_s[r];
      }
    } else {
      const int64_t row = q_begin + tok_begin + r / group;
      const float l = l_s[r];
      p.out[(row * p.num_heads + h) * D + d] = l > 0.f ? o_s[i] / l : 0.f;
      if (d == 0 && p.lse)
        p.lse[row * p.num_heads + h] = softmax_state_lse(SoftmaxState{m_s[r], l});
      if (decode && d == 0 && mp.score_max)
        mp.score_max[static_cast<int64_t>(s) * p.num_heads + h] = m_s[r];
      if (decode && d == 0 && p.head_max)
        p.head_max[static_cast<int64_t>(s) * p.num_heads + h] = m_s[r];
    }
  }
}

// grid (num_heads, num_seqs), block head_dim threads: merge_states_kernel (lse and head_max
// included), plus the merged max of each head into score_max (when set) for the scoring kernel.
template <int D>
__global__ void __launch_bounds__(D) mixed_merge_kernel(MixedAttentionParams mp) {
  const PagedAttentionParams& p = mp.base;
  const int h = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
  const int n = p.num_splits[s];
  if (n <= 1) return;
  const int off = p.split_offset[s];
  SoftmaxState st = softmax_state_empty();
  float acc = 0.f;
  for (int j = 0; j < n; ++j) {
    const int64_t sh = static_cast<int64_t>(off + j) * p.num_heads + h;
    float scale_a = 1.f, scale_b = 0.f;
    st = softmax_state_merge(st, SoftmaxState{p.part_m[sh], p.part_l[sh]}, &scale_a, &scale_b);
    acc = acc * scale_a + p.part_o[sh * D + d] * scale_b;
  }
  const int64_t row = p.query_start[s];
  p.out[(row * p.num_heads + h) * D + d] = st.l > 0.f ? acc / st.l : 0.f;
  if (d == 0 && p.lse) p.lse[row * p.num_heads + h] = softmax_state_lse(st);
  if (d == 0 && mp.score_max) mp.score_max[static_cast<int64_t>(s) * p.num_heads + h] = st.m;
  if (d == 0 && p.head_max) p.head_max[static_cast<int64_t>(s) * p.num_heads + h] = st.m;
}

// grid (ceil(max_blocks_per_seq * block_size / kAttnTileKeys), num_seqs), block kAttnThreads,
// dynamic shared memory mixed_smem_layout(group, D, sizeof(KT), false, 1). For a scored sequence
// s and its keys [k0, k0 + kAttnTileKeys): loops over the kv heads, stages the tile's K rows,
// recomputes the scores of the group's query heads (bit-identical to the attention pass, see the
// file comment) and, with
// m_h = head_max[s, h] (score_max after the attention pass, or the maxima a scoring-only call is
// given: launch_mixed_score),
//   token_relevance[s, t] = max(token_relevance[s, t], max_h exp(z_h(t) - m_h)) (resident t),
//   page_bound[s, i] = max(page_bound[s, i], max_{h,p} exp(sum_d max(q'_hd kmin_pd, q'_hd kmax_pd)
//   - m_h)) for the pages i starting in the tile with a summary, p over its summary_parts parts
//   (q' = q * scale),
// one writer per element (no atomics).
template <typename KT, int D>
__global__ void __launch_bounds__(kAttnThreads)
    mixed_score_kernel(MixedAttentionParams mp, const float* head_max) {
  const PagedAttentionParams& p = mp.base;
  const int s = blockIdx.y, k0 = blockIdx.x * kAttnTileKeys, tid = threadIdx.x;
  if (!mp.score_seqs[s]) return;
  const int kv_len = p.kv_lens[s];
  // With a sliding window only the keys the query attends are scored, and the pages they are in.
  const int first = window_first_key(kv_len - 1, p.window);
  if (k0 >= kv_len || k0 + kAttnTileKeys <= first - first % p.block_size) return;
  const int n = kv_len - k0 < kAttnTileKeys ? kv_len - k0 : kAttnTileKeys;
  const int bs = p.block_size, group = p.num_heads / p.num_kv_heads;
  const int first_page = k0 / bs;
  const int num_pages = (k0 + n - 1) / bs - first_page + 1;
  const int seq_pages = (kv_len + bs - 1) / bs;
  const int64_t row = p.query_start[s];
  const MixedSmemLayout L = mixed_smem_layout(group, D, static_cast<int>(sizeof(KT)), false, 1);
  KVSPLIT_DYNAMIC_SMEM(unsigned char, smem);
  float* q_s = reinterpret_cast<float*>(smem + L.q);
  float* s_s = reinterpret_cast<float*>(smem + L.s);
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  int* pid = reinterpret_cast<int*>(smem + L.info);
  int* pprec = pid + kMixedTilePages;
  float* bnd = reinterpret_cast<float*>(smem + L.bnd);
  unsigned char* meta = smem + L.stage + L.meta;
  unsigned char* krows = smem + L.stage + L.k;
  float* kpar = reinterpret_cast<float*>(smem + L.kpar);

  // Pages before the window are neither read nor scored (whole tiles before it returned above).
  mixed_load_page_info(mp, s, first_page, num_pages, first / bs, pid, pprec);
  float best = -1.f;       // thread t < n: relevance of key k0 + t so far (-1: not resident)
  float page_best = -1.f;  // thread j < num_pages: bound of page first_page + j (-1: none)
  for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
    __syncthreads();  // the previous head's readers are done; page info visible
    for (int i = tid; i < group * D; i += blockDim.x) {
      const int r = i / D, d = i % D;
      const int h = kvh * group + r;
      q_s[i] = p.q[(row * p.num_heads + h) * D + d] * p.scale;  // as in mixed_attention_kernel
    }
    for (int r = tid; r < group; r += blockDim.x)
      m_s[r] = head_max[static_cast<int64_t>(s) * p.num_heads + kvh * group + r];
    mixed_issue_tile<KT, D>(mp, kvh, n, pid, pprec, meta, krows, nullptr);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    // Raw scores (-inf: not resident or before the window), as the attention pass computed them.
    const uint32_t kinds = mixed_tile_kinds(pid, pprec);
    if (mixed_tile_has_int4(kinds, n)) {  // block-uniform
      mixed_convert_key_params<D>(kinds, n, meta, kpar);
      __syncthreads();
    }
    mixed_tile_scores<KT, D>(q_s, group, n, kinds, meta, kpar, krows, s_s, false,
                             [&](int, int t) { return k0 + t >= first; });
    for (int i = tid; i < num_pages * group; i += blockDim.x) {
      const int j = i / group, r = i % group, page = first_page + j;
      float b = -1.f;
      // Each page is bounded by the tile it starts in; a page past the table row (a kv_len longer
      // than the row, flagged by mixed_load_page_info) has no slot to read nor bound to write.
      if (page * bs >= k0 && page >= first / bs && page < seq_pages &&
          page < p.max_blocks_per_seq) {
        const int32_t slot =
            mp.summary_slots[static_cast<int64_t>(s) * p.max_blocks_per_seq + page];
        if (slot >= 0 && (slot >= mp.num_summary_slots || !mp.summaries)) {
          if (p.error_flag) atomicMax(p.error_flag, 1);
        } else if (slot >= 0) {
          // The page's bound is the largest of its parts' (kv_quant.h "key summaries").
          const float* qr = q_s + r * D;
          for (int part = 0; part < mp.summary_parts; ++part) {
            const KvSummaryElem* kmin =
                mp.summaries +
                ((static_cast<int64_t>(slot) * mp.summary_parts + part) * 2 * p.num_kv_heads +
                 kvh) *
                    D;
            const KvSummaryElem* kmax = kmin + static_cast<int64_t>(p.num_kv_heads) * D;
            float ub = 0.f;
            for (int d = 0; d < D; ++d) {
              if (qr[d] == 0.f) continue;  // no term, whatever the range (0 x inf would be NaN)
              ub += fmaxf(qr[d] * kvq_half_float(kmin[d]), qr[d] * kvq_half_float(kmax[d]));
            }
            const float e = expf(ub - m_s[r]);
            b = e > b ? e : b;
          }
        }
      }
      bnd[i] = b;
    }
    __syncthreads();
    // A resident key in the window has a relevance even when its score is -inf (e = 0).
    if (tid < n && mixed_kind(kinds, tid) != static_cast<int>(KvPrecision::kEvicted) &&
        k0 + tid >= first) {
      for (int r = 0; r < group; ++r) {
        const float e = expf(s_s[r * kAttnTileKeys + tid] - m_s[r]);
        best = e > best ? e : best;
      }
    }
    if (tid < num_pages) {
      for (int r = 0; r < group; ++r) {
        const float b = bnd[tid * group + r];
        page_best = b > page_best ? b : page_best;
      }
    }
  }
  if (tid < n && best >= 0.f) {
    float* out =
        mp.token_relevance + static_cast<int64_t>(s) * p.max_blocks_per_seq * bs + k0 + tid;
    *out = *out < best ? best : *out;
  }
  if (tid < num_pages && page_best >= 0.f) {
    float* out = mp.page_bound + static_cast<int64_t>(s) * p.max_blocks_per_seq + first_page + tid;
    *out = *out < page_best ? page_best : *out;
  }
}

}  // namespace kvsplit::kernels
