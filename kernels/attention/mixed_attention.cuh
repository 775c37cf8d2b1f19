// Mixed-precision paged attention kernel bodies (nvcc in mixed_attention.cu; g++ under the
// emulation harness). Host API: kernels/attention/mixed_attention.h.
//
// Same thread mapping as paged_attention.cuh (one block per (query tile or split, kv head,
// sequence), tiles of kAttnTileKeys keys, online softmax from kernels/common/softmax_state.h), but
// each tile is staged in shared memory as f32: every thread loads 8 channels of one K or V row at
// the precision of its page (f32/f16/bf16 full pages, int8 codes + f16 scale, int4 nibbles + f16
// scale and zero point), converts them in registers with the functions of kv_quant.h and stores
// f32. Rows of evicted pages are not read (V rows become zeros, their scores -inf). Loads are
// synchronous (no cp.async pipeline): the formats differ per page, and this path only runs when
// a cut changed some page or a step is scored.
//
// Scoring side outputs. The relevance of a token needs the final per-head max m_h, which a split
// only knows after the merge. Chosen method: a second kernel after the merge. The attention
// kernel (one split) or the merge (several) writes m_h to `score_max`; mixed_score_kernel then
// re-reads the scored sequences' K rows (no V) and recomputes every score with the very same
// code: the same q * scale in shared memory, the same loader, and mixed_dot, a fixed chain of
// fmaf in channel order (no contraction freedom left to the compiler). So each recomputed score
// equals the one the softmax saw bit for bit, m_h is exactly the max of those scores, and the
// most attended token of each head gets exp(0) = 1. Cost: one extra read of the K rows of the
// scored sequences' resident pages (half of their KV bytes) on scored steps only, and no
// sequence-sized workspace (writing raw scores instead would need num_heads floats per token).
#pragma once

#include "kernels/attention/mixed_attention.h"
#include "kernels/attention/paged_attention.cuh"
#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"
#include "kernels/common/softmax_state.h"
#include "kernels/common/warp_reduce.cuh"

namespace kvsplit::kernels {

inline constexpr int kMixedChunk = 8;  // channels one thread loads and converts at a time

// Pages a tile of kAttnTileKeys keys can touch.
KVSPLIT_HOST_DEVICE int mixed_tile_pages(int block_size) {
  const int n = kAttnTileKeys / block_size + 1;
  return n < kAttnTileKeys ? n : kAttnTileKeys;
}

// Byte offsets of one block's shared memory (16-byte aligned). with_v: the attention kernel (V
// rows, o accumulators); bound_rows: the scoring kernel's page-bound scratch rows.
struct MixedSmemLayout {
  int q, o, s, m, l, alpha, pid, pprec, bnd, k, v, total;
};
KVSPLIT_HOST_DEVICE MixedSmemLayout mixed_smem_layout(int rows, int head_dim, int block_size,
                                                      bool with_v) {
  const int pages = mixed_tile_pages(block_size);
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
  L.pid = at;
  at = align16(at + pages * 4);  // arena id per page of the tile (-1: skip)
  L.pprec = at;
  at = align16(at + pages * 4);  // KvPrecision per page of the tile
  L.bnd = at;
  at = align16(at + (with_v ? 0 : pages * rows * 4));  // page bounds [pages, rows]
  L.k = at;
  at = align16(at + kAttnTileKeys * (head_dim + 4) * 4);  // f32 K rows, padded
  L.v = at;
  at = align16(at + (with_v ? kAttnTileKeys * (head_dim + 4) * 4 : 0));  // f32 V rows, padded
  L.total = at;
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
// 8 f32 to 16-byte aligned shared memory.
__device__ __forceinline__ void mixed_store8(float* dst, const float* x) {
  uint4 a, b;
  memcpy(&a, x, 16);
  memcpy(&b, x + 4, 16);
  store16(dst, a);
  store16(dst + 4, b);
}

// q . k over D channels as one fmaf chain in channel order: the attention and the scoring kernel
// both score through it, so their scores are equal bit for bit. q, k 16-byte aligned.
template <int D>
__device__ __forceinline__ float mixed_dot(const float* q, const float* k) {
  float acc = 0.f;
#if defined(__CUDACC__)
#pragma unroll
  for (int c = 0; c < D / 4; ++c) {
    const float4 a = reinterpret_cast<const float4*>(q)[c];
    const float4 b = reinterpret_cast<const float4*>(k)[c];
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    acc = fmaf(a.w, b.w, acc);
  }
#else
  for (int d = 0; d < D; ++d) acc = fmaf(q[d], k[d], acc);
#endif
  return acc;
}

// Precision and arena id of pages [first_page, first_page + num_pages) of sequence s (pid -1:
// nothing to read). A precision value > 3, an id outside its arena, a missing arena or a page past
// the table row is flagged and the page skipped.
__device__ __forceinline__ void mixed_load_page_info(const MixedAttentionParams& mp, int s,
                                                     int first_page, int num_pages, int* pid,
                                                     int* pprec) {
  const PagedAttentionParams& p = mp.base;
  for (int j = threadIdx.x; j < num_pages; j += blockDim.x) {
    const int64_t row = static_cast<int64_t>(s) * p.max_blocks_per_seq + first_page + j;
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

// The raw bytes of one load unit (8 channels of one K or V row at its page's precision): full
// pages 16 bytes (two loads for f32), int8 8 code bytes + the token's f16 scale, int4 4 nibble
// bytes + the f16 scale and zero point (per channel for K: 16 bytes each; per token for V).
struct MixedRaw {
  uint4 a, b;  // full: the values; int8: a.x, a.y codes; int4 K: a scales, b zero points
  uint32_t c;  // int8: the scale; int4: the nibbles
  uint32_t d;  // int4 V: scale | zero << 16
};

// Rows [k0, k0 + n) of kv head kvh as f32: K into ks and V into vs (row stride D + 4 both) unless
// vs is null. One unit per (K or V, row, 8 channels); a thread fetches kMixedBatch units (their
// loads all in flight), then decodes and stores them: global latency is paid once per batch.
template <typename KT, int D>
__device__ __forceinline__ void mixed_load_rows(const MixedAttentionParams& mp, int kvh, int k0,
                                                int n, int first_page, const int* pid,
                                                const int* pprec, float* ks, float* vs) {
  constexpr int kChunks = D / kMixedChunk;
  constexpr int kVec = Vec16<KT>::kElems;
  constexpr int kMixedBatch = 4;
  const PagedAttentionParams& p = mp.base;
  const int bs = p.block_size;
  const PagedKvLayout full{p.num_kv_heads, bs, D};
  const QuantPageLayout ql{p.num_kv_heads, bs, D};
  const int per_sel = n * kChunks;
  const int units = vs ? 2 * per_sel : per_sel;
  const int stride = static_cast<int>(blockDim.x);
  for (int base = threadIdx.x; base < units; base += kMixedBatch * stride) {
    MixedRaw raw[kMixedBatch] = {};
    // 1. Issue every load of the batch.
#pragma unroll
    for (int u = 0; u < kMixedBatch; ++u) {
      const int i = base + u * stride;
      if (i >= units) break;
      const int sel = i / per_sel, rem = i % per_sel, t = rem / kChunks, c = rem % kChunks;
      const int key = k0 + t, j = key / bs - first_page, slot = key % bs;
      const int id = pid[j];
      if (id < 0) continue;
      if (pprec[j] == static_cast<int>(KvPrecision::kFull)) {
        const KT* src = static_cast<const KT*>(p.kv) + full.offset(id, sel, kvh, slot) + c * 8;
        raw[u].a = load16(src);
        if (kMixedChunk / kVec > 1) raw[u].b = load16(src + kVec);
      } else if (pprec[j] == static_cast<int>(KvPrecision::kInt8)) {
        const uint8_t* page =
            static_cast<const uint8_t*>(mp.int8_pages) + id * ql.bytes(KvPrecision::kInt8);
        const int64_t tok = ql.token_index(sel, kvh, slot);
        const uint2 codes = mixed_load8(page + ql.int8_values_offset() + tok * D + c * 8);
        raw[u].a.x = codes.x;
        raw[u].a.y = codes.y;
        raw[u].c = kvq_f16_at(page, ql.int8_scales_offset())[tok];
      } else {  // int4
        const uint8_t* page =
            static_cast<const uint8_t*>(mp.int4_pages) + id * ql.bytes(KvPrecision::kInt4);
        const int64_t tok = ql.token_index(sel, kvh, slot);
        raw[u].c = mixed_load4(page + ql.int4_values_offset() + tok * (D / 2) + c * 4);
        if (sel == 0) {  // keys: scale and zero point per channel
          const int64_t ch = static_cast<int64_t>(kvh) * D + c * 8;
          raw[u].a = load16(kvq_f16_at(page, ql.int4_k_scale_offset()) + ch);
          raw[u].b = load16(kvq_f16_at(page, ql.int4_k_zero_offset()) + ch);
        } else {  // values: scale and zero point per token
          const int64_t tv = static_cast<int64_t>(kvh) * bs + slot;
          raw[u].d = kvq_f16_at(page, ql.int4_v_scale_offset())[tv] |
                     uint32_t{kvq_f16_at(page, ql.int4_v_zero_offset())[tv]} << 16;
        }
      }
    }
    // 2. Decode and store them.
#pragma unroll
    for (int u = 0; u < kMixedBatch; ++u) {
      const int i = base + u * stride;
      if (i >= units) break;
      const int sel = i / per_sel, rem = i % per_sel, t = rem / kChunks, c = rem % kChunks;
      const int j = (k0 + t) / bs - first_page;
      float x[kMixedChunk];
      if (pid[j] < 0) {
#pragma unroll
        for (int e = 0; e < kMixedChunk; ++e) x[e] = 0.f;
      } else if (pprec[j] == static_cast<int>(KvPrecision::kFull)) {
        Vec16<KT>::to_floats(raw[u].a, x);
        if (kMixedChunk / kVec > 1) Vec16<KT>::to_floats(raw[u].b, x + kVec);
      } else if (pprec[j] == static_cast<int>(KvPrecision::kInt8)) {
        int8_t codes[8];
        memcpy(codes, &raw[u].a.x, 4);
        memcpy(codes + 4, &raw[u].a.y, 4);
        const float scale = kvq_half_float(static_cast<uint16_t>(raw[u].c));
#pragma unroll
        for (int e = 0; e < kMixedChunk; ++e) x[e] = int8_dequantize(codes[e], scale);
      } else if (sel == 0) {  // int4 keys
        uint16_t sb[8], zb[8];
        memcpy(sb, &raw[u].a, 16);
        memcpy(zb, &raw[u].b, 16);
#pragma unroll
        for (int e = 0; e < kMixedChunk; ++e) {
          x[e] = int4_dequantize(static_cast<uint8_t>((raw[u].c >> (4 * e)) & 0xfu),
                                 kvq_half_float(sb[e]), kvq_half_float(zb[e]));
        }
      } else {  // int4 values
        const float scale = kvq_half_float(static_cast<uint16_t>(raw[u].d & 0xffffu));
        const float zero = kvq_half_float(static_cast<uint16_t>(raw[u].d >> 16));
#pragma unroll
        for (int e = 0; e < kMixedChunk; ++e)
          x[e] = int4_dequantize(static_cast<uint8_t>((raw[u].c >> (4 * e)) & 0xfu), scale, zero);
      }
      mixed_store8((sel == 0 ? ks : vs) + t * (D + 4) + c * 8, x);
    }
  }
}

// grid (x: split for decode / query tile for prefill, y: kv head, z: sequence), block
// kAttnThreads, dynamic shared memory mixed_smem_layout(rows, D, block_size, true).
template <typename KT, int D>
__global__ void __launch_bounds__(kAttnThreads)
    mixed_attention_kernel(MixedAttentionParams mp, int tokens_per_block, int decode) {
  const PagedAttentionParams& p = mp.base;
  const int s = blockIdx.z;
  const int kvh = blockIdx.y;
  const int bx = blockIdx.x;
  const int tid = threadIdx.x;
  const int group = p.num_heads / p.num_kv_heads;
  const int q_begin = p.query_start[s];
  const int q_len = p.query_start[s + 1] - q_begin;
  const int kv_len = p.kv_lens[s];
  const int bs = p.block_size;

  int tok_begin = 0, tok_count = 0, key_begin = 0, key_end = 0, split_slot = -1;
  if (decode) {
    const int n_split = p.num_splits ? p.num_splits[s] : 1;
    if (bx >= n_split || q_len < 1) return;
    tok_count = 1;
    // With a sliding window the splits start at the page of the first key the query attends.
    key_begin = window_decode_base(kv_len, p.window, p.block_size);
    key_end = kv_len;
    if (n_split > 1) {
      key_begin += bx * p.chunk_tokens;
      key_end = key_begin + p.chunk_tokens < kv_len ? key_begin + p.chunk_tokens : kv_len;
      split_slot = p.split_offset[s] + bx;
    }
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
  const MixedSmemLayout L = mixed_smem_layout(rows, D, bs, true);
  KVSPLIT_DYNAMIC_SMEM(unsigned char, smem);
  float* q_s = reinterpret_cast<float*>(smem + L.q);
  float* o_s = reinterpret_cast<float*>(smem + L.o);
  float* s_s = reinterpret_cast<float*>(smem + L.s);
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  float* l_s = reinterpret_cast<float*>(smem + L.l);
  float* alpha_s = reinterpret_cast<float*>(smem + L.alpha);
  int* pid = reinterpret_cast<int*>(smem + L.pid);
  int* pprec = reinterpret_cast<int*>(smem + L.pprec);
  float* k_s = reinterpret_cast<float*>(smem + L.k);
  float* v_s = reinterpret_cast<float*>(smem + L.v);

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
  for (int k0 = key_begin; k0 < key_end; k0 += kAttnTileKeys) {
    const int n = key_end - k0 < kAttnTileKeys ? key_end - k0 : kAttnTileKeys;
    const int first_page = k0 / bs;
    const int num_pages = (k0 + n - 1) / bs - first_page + 1;
    __syncthreads();  // the previous tile's readers are done (first tile: q_s, m_s, l_s written)
    if (!(mp.probe & kMixedProbeNoPageInfo) || k0 == key_begin)
      mixed_load_page_info(mp, s, first_page, num_pages, pid, pprec);
    __syncthreads();
    if (!(mp.probe & kMixedProbeNoRows))
      mixed_load_rows<KT, D>(mp, kvh, k0, n, first_page, pid, pprec, k_s, v_s);
    __syncthreads();
    for (int i = tid; i < rows * kAttnTileKeys; i += blockDim.x) {
      const int r = i / kAttnTileKeys, t = i % kAttnTileKeys;
      const int limit = decode ? kv_len : kv_len - q_len + tok_begin + r / group + 1;
      const int first = window_first_key(limit - 1, p.window);
      float score = -INFINITY;
      if (t < n && k0 + t < limit && k0 + t >= first && pid[(k0 + t) / bs - first_page] >= 0)
        score = mp.probe & kMixedProbeNoScores ? 0.f : mixed_dot<D>(q_s + r * D, k_s + t * (D + 4));
      s_s[i] = score;
    }
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
    if (mp.probe & kMixedProbeNoPv) continue;
    pv.add_tile(s_s, alpha_s, n, [&](int t, int c0, float* v) {
      const float* src = v_s + t * (D + 4) + c0;
      const uint4 a = load16(src), b = load16(src + 4);
      memcpy(v, &a, 16);
      memcpy(v + 4, &b, 16);
    });
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
// dynamic shared memory mixed_smem_layout(group, D, block_size, false). For a scored sequence s
// and its keys [k0, k0 + kAttnTileKeys): loops over the kv heads, recomputes the scores of the
// group's query heads (bit-identical to the attention pass, see the file comment) and, with
// m_h = head_max[s, h] (score_max after the attention pass, or the maxima a scoring-only call is
// given: launch_mixed_score),
//   token_relevance[s, t] = max(token_relevance[s, t], max_h exp(z_h(t) - m_h)) (resident t),
//   page_bound[s, i] = max(page_bound[s, i], max_h exp(sum_d max(q'_hd kmin_d, q'_hd kmax_d)
//   - m_h)) for the pages i starting in the tile with a summary (q' = q * scale),
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
  const MixedSmemLayout L = mixed_smem_layout(group, D, bs, false);
  KVSPLIT_DYNAMIC_SMEM(unsigned char, smem);
  float* q_s = reinterpret_cast<float*>(smem + L.q);
  float* s_s = reinterpret_cast<float*>(smem + L.s);
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  int* pid = reinterpret_cast<int*>(smem + L.pid);
  int* pprec = reinterpret_cast<int*>(smem + L.pprec);
  float* bnd = reinterpret_cast<float*>(smem + L.bnd);
  float* k_s = reinterpret_cast<float*>(smem + L.k);

  mixed_load_page_info(mp, s, first_page, num_pages, pid, pprec);
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
    mixed_load_rows<KT, D>(mp, kvh, k0, n, first_page, pid, pprec, k_s, nullptr);
    __syncthreads();
    for (int i = tid; i < group * kAttnTileKeys; i += blockDim.x) {
      const int r = i / kAttnTileKeys, t = i % kAttnTileKeys;
      float e = -1.f;
      if (t < n && k0 + t >= first && pid[(k0 + t) / bs - first_page] >= 0)
        e = expf(mixed_dot<D>(q_s + r * D, k_s + t * (D + 4)) - m_s[r]);
      s_s[i] = e;
    }
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
          const KvSummaryElem* kmin =
              mp.summaries + (static_cast<int64_t>(slot) * 2 * p.num_kv_heads + kvh) * D;
          const KvSummaryElem* kmax = kmin + static_cast<int64_t>(p.num_kv_heads) * D;
          const float* qr = q_s + r * D;
          float ub = 0.f;
          for (int d = 0; d < D; ++d) {
            if (qr[d] == 0.f) continue;  // no term, whatever the range (0 x inf would be NaN)
            ub += fmaxf(qr[d] * kvq_half_float(kmin[d]), qr[d] * kvq_half_float(kmax[d]));
          }
          b = expf(ub - m_s[r]);
        }
      }
      bnd[i] = b;
    }
    __syncthreads();
    if (tid < n) {
      for (int r = 0; r < group; ++r) {
        const float e = s_s[r * kAttnTileKeys + tid];
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
