// Paged attention kernel bodies (compiled by nvcc in attention.cu, and by g++ under the emulation
// harness). Host API and shapes: kernels/attention/paged_attention.h.
//
// One thread block handles `rows` query vectors that share one KV head: for decode the whole GQA
// group of one token (every KV byte is read once per split), for prefill a tile of tokens times
// the GQA group. Keys are walked in tiles of kAttnTileKeys: the block table entries of the tile's
// pages are read once into shared memory, K and V are staged with 16-byte asynchronous copies
// (cp.async) into one of two shared-memory stages, then scores, an online-softmax update
// (kernels/common/softmax_state.h) and the P·V accumulation (into registers: PvAccum) run in fp32.
// With two stages the copies of tile i+1 are in flight while tile i is computed; with one, a block
// alternates, and the smaller footprint fits more blocks per SM to hide each other's loads (the
// launcher picks: attention_stages).
#pragma once

#include "kernels/attention/paged_attention.h"
#include "kernels/common/async_copy.cuh"
#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/paged_kv.h"
#include "kernels/common/softmax_state.h"
#include "kernels/common/warp_reduce.cuh"

namespace kvsplit::kernels {

inline constexpr int kAttnThreads = 128;
inline constexpr int kAttnTileKeys = 64;
// Score items of one row block, two per key, are one per thread (paged_attention_kernel).
static_assert(2 * kAttnTileKeys == kAttnThreads);
// Prefill: query rows per block (tokens x GQA group), at least one token.
inline constexpr int kPrefillMaxRows = 16;

// Pipeline stages of the K/V tile buffers: 2 (double buffering) or 1 (the next tile is loaded after
// this one is computed); attention_stages picks.
inline constexpr int kAttnMaxStages = 2;

// Byte offsets of the shared-memory regions of one block (16-byte aligned). blk, k and v hold
// `stages` stages each, one after the other.
struct AttnSmemLayout {
  int q, o, s, m, l, alpha, blk, k, v, total;
};
KVSPLIT_HOST_DEVICE int align16(int x) { return (x + 15) & ~15; }
KVSPLIT_HOST_DEVICE AttnSmemLayout attn_smem_layout(int rows, int head_dim, int elem_bytes,
                                                    int stages) {
  AttnSmemLayout L;
  int at = 0;
  L.q = at;
  at = align16(at + rows * head_dim * 4);  // f32 q * scale  [rows, D]
  L.o = at;
  at = align16(at + rows * head_dim * 4);  // f32 accumulators [rows, D]
  L.s = at;
  at = align16(at + rows * kAttnTileKeys * 4);  // scores / probs [rows, tile]
  L.m = at;
  at = align16(at + rows * 4);
  L.l = at;
  at = align16(at + rows * 4);
  L.alpha = at;
  at = align16(at + rows * 4);
  L.blk = at;
  at = align16(at + stages * kAttnTileKeys * 4);  // physical block ids per tile
  L.k = at;
  at = align16(at + stages * kAttnTileKeys * (head_dim * elem_bytes + 16));  // padded
  L.v = at;
  at = align16(at + stages * kAttnTileKeys * (head_dim * elem_bytes + 16));  // padded as K
  L.total = at;
  return L;
}

// Pipeline stages of a launch of `blocks` blocks needing `one` / `two` bytes of shared memory with
// one / two stages, on a device allowing `limit` per block: `requested` when 1 or 2 (2 only where
// it fits: the caller reports that), else (0, auto) two stages only where every block of the grid
// is resident at once with them (no other block would hide a block's loads) or where one stage fits
// no more blocks per multiprocessor; otherwise one stage, whose smaller footprint fits more blocks
// to hide each other's loads (measured on an H200, 64 x 8K bf16 decode: 1.41x faster than two).
inline int attention_stages(long long blocks, size_t one, size_t two, size_t limit, int requested) {
  if (two > limit || requested == 1) return 1;
  if (requested == 2) return 2;
  const size_t per_sm = smem_per_multiprocessor();
  auto resident = [&](size_t bytes) {  // blocks per multiprocessor (1 KiB reserved per block)
    const size_t by_smem = per_sm / (bytes + 1024);
    const size_t by_threads = 2048 / kAttnThreads;
    return static_cast<long long>(by_smem < by_threads ? by_smem : by_threads);
  };
  const long long with_two = resident(two);
  if (blocks <= with_two * multiprocessor_count() || resident(one) <= with_two) return 2;
  return 1;
}

// ---- P·V with the accumulators in registers (both attention kernels) ----
// A thread owns kPvRows query rows [r0, r0 + kPvRows) x kPvChunk channels [c0, c0 + kPvChunk) (a
// "combo") and one of `slices` key slices (keys t = slice, slice + slices, ... of each tile):
// thread tid is slice tid % slices of combo tid / slices. So each V vector read from shared memory
// feeds kPvRows rows, o stays in registers across tiles (rescaled by each tile's alpha), and the
// slices of a combo are consecutive lanes of one warp, summed by shuffles once at the end. V rows
// are padded like K rows (one 16-byte vector), so the lanes of a phase (consecutive keys) hit
// distinct banks.
inline constexpr int kPvRows = 4;
inline constexpr int kPvChunk = 8;
KVSPLIT_HOST_DEVICE int pv_combos(int rows, int head_dim) {
  return (rows + kPvRows - 1) / kPvRows * (head_dim / kPvChunk);
}
// Key slices per combo: the largest power of two (at most a warp) with every combo's slices in
// the block; 1 when combos fill it (pv_combos must not exceed kAttnThreads: the launchers check).
KVSPLIT_HOST_DEVICE int pv_slices(int rows, int head_dim) {
  const int combos = pv_combos(rows, head_dim);
  int s = 1;
  while (s < 32 && 2 * s * combos <= kAttnThreads) s *= 2;
  return s;
}

template <int D>
struct PvAccum {
  float acc[kPvRows][kPvChunk];
  int rows, r0, c0, slice, slices;
  bool active;

  __device__ __forceinline__ void init(int num_rows, int tid) {
    rows = num_rows;
    slices = pv_slices(rows, D);
    const int combo = tid / slices;
    slice = tid % slices;
    active = combo < pv_combos(rows, D);
    r0 = combo / (D / kPvChunk) * kPvRows;
    c0 = combo % (D / kPvChunk) * kPvChunk;
#pragma unroll
    for (int j = 0; j < kPvRows; ++j)
#pragma unroll
      for (int e = 0; e < kPvChunk; ++e) acc[j][e] = 0.f;
  }
  // One tile of n keys: acc = acc * alpha[r] + sum over the slice's keys t of p[r][t] * V[t].
  // p: [rows, kAttnTileKeys] probabilities; load_v(t, c0, float[kPvChunk]) reads V row t.
  template <typename LoadV>
  __device__ __forceinline__ void add_tile(const float* p, const float* alpha, int n,
                                           const LoadV& load_v) {
    if (!active) return;
    const float* pr[kPvRows];
#pragma unroll
    for (int j = 0; j < kPvRows; ++j) {
      const int r = r0 + j < rows ? r0 + j : rows - 1;  // rows past the end: computed, not stored
      pr[j] = p + r * kAttnTileKeys;
      const float a = alpha[r];
#pragma unroll
      for (int e = 0; e < kPvChunk; ++e) acc[j][e] *= a;
    }
    for (int t = slice; t < n; t += slices) {
      float v[kPvChunk];
      load_v(t, c0, v);
#pragma unroll
      for (int j = 0; j < kPvRows; ++j) {
        const float pj = pr[j][t];
#pragma unroll
        for (int e = 0; e < kPvChunk; ++e) acc[j][e] = fmaf(pj, v[e], acc[j][e]);
      }
    }
  }
  // Sums the slices and writes the rows' accumulators to o [rows, D]. Every thread of the block
  // calls it (the shuffles take whole warps).
  __device__ __forceinline__ void finish(float* o) {
    for (int off = slices / 2; off > 0; off /= 2) {
#pragma unroll
      for (int j = 0; j < kPvRows; ++j)
#pragma unroll
        for (int e = 0; e < kPvChunk; ++e)
          acc[j][e] += __shfl_xor_sync(kFullWarpMask, acc[j][e], off);
    }
    if (!active || slice != 0) return;
#pragma unroll
    for (int j = 0; j < kPvRows; ++j) {
      if (r0 + j >= rows) break;
#pragma unroll
      for (int e = 0; e < kPvChunk; ++e) o[(r0 + j) * D + c0 + e] = acc[j][e];
    }
  }
};

// Keys [key_begin, key_end) and partial slot (-1: the sequence is not split) of split bx of
// decode sequence s; false when bx is past the sequence's splits. With a sliding window the splits
// start at the page of the first key the query attends; with split_begin, at the plan's bounds. A
// plan that leaves keys out (made for other kv_lens, or with more splits than the grid runs) is
// flagged, as the host checks a plan against host kv_lens: those keys would be skipped silently.
// Bounds are taken in 64 bits.
__device__ __forceinline__ bool decode_split_keys(const PagedAttentionParams& p, int s, int bx,
                                                  int kv_len, int* key_begin, int* key_end,
                                                  int* split_slot) {
  const int n_split = p.num_splits ? p.num_splits[s] : 1;
  if (bx >= n_split) return false;
  const int base = window_decode_base(kv_len, p.window, p.block_size);
  *key_begin = base;
  *key_end = kv_len;
  *split_slot = -1;
  if (n_split > 1) {
    // Uniform chunks from the base, or the plan's bounds (splits over the attended pages).
    const int32_t* bounds = p.split_begin ? p.split_begin + p.split_offset[s] : nullptr;
    const int64_t begin = bounds ? bounds[bx] : base + static_cast<int64_t>(bx) * p.chunk_tokens;
    const int64_t end =
        bounds ? (bx + 1 < n_split ? bounds[bx + 1] : kv_len) : begin + p.chunk_tokens;
    const int last = n_split < static_cast<int>(gridDim.x) ? n_split : gridDim.x;
    if (bx == last - 1 && (end < kv_len || last < n_split) && p.error_flag)
      atomicMax(p.error_flag, 1);
    // Bounds made for another kv_len (window base) would skip the keys before the first split.
    if (bounds && bx == 0 && begin > base && p.error_flag) atomicMax(p.error_flag, 1);
    *key_begin = begin < kv_len ? static_cast<int>(begin) : kv_len;
    *key_end = end < kv_len ? static_cast<int>(end) : kv_len;
    *split_slot = p.split_offset[s] + bx;
  }
  return true;
}

// grid (x: split for decode / query tile for prefill, y: kv head, z: sequence), block kAttnThreads.
// S: pipeline stages (1 or 2).
template <typename KT, int D, int S>
__global__ void __launch_bounds__(kAttnThreads)
    paged_attention_kernel(PagedAttentionParams p, int tokens_per_block, int decode) {
  constexpr int kVec = Vec16<KT>::kElems;
  constexpr int kVecsPerRow = D / kVec;
  constexpr int kKStride = D + kVec;  // elements; one extra vector per row against bank conflicts
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
  static_assert(S == 1 || S == 2, "one or two pipeline stages");
  const AttnSmemLayout L = attn_smem_layout(rows, D, static_cast<int>(sizeof(KT)), S);
  KVSPLIT_DYNAMIC_SMEM(unsigned char, smem);
  float* q_s = reinterpret_cast<float*>(smem + L.q);
  float* o_s = reinterpret_cast<float*>(smem + L.o);
  float* s_s = reinterpret_cast<float*>(smem + L.s);
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  float* l_s = reinterpret_cast<float*>(smem + L.l);
  float* alpha_s = reinterpret_cast<float*>(smem + L.alpha);
  int* blk_s = reinterpret_cast<int*>(smem + L.blk);
  KT* k_s = reinterpret_cast<KT*>(smem + L.k);
  KT* v_s = reinterpret_cast<KT*>(smem + L.v);

  for (int i = tid; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    const int h = kvh * group + r % group;
    const int64_t row = q_begin + tok_begin + r / group;
    q_s[i] = p.q[(row * p.num_heads + h) * D + d] * p.scale;
  }
  for (int r = tid; r < rows; r += blockDim.x) {
    const SoftmaxState empty = softmax_state_empty();
    m_s[r] = empty.m;
    l_s[r] = empty.l;
  }
  PvAccum<D> pv;  // o, in registers until the end
  pv.init(rows, tid);
  // Score items per tile (below): two parts of D when one row block leaves threads free.
  const int row_blocks = (rows + kPvRows - 1) / kPvRows;
  const int qk_parts = row_blocks == 1 && kVecsPerRow % 2 == 0 && D >= 64 ? 2 : 1;
  const int qk_items = row_blocks * kAttnTileKeys * qk_parts;

  const PagedKvLayout layout{p.num_kv_heads, p.block_size, D};
  const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.max_blocks_per_seq;
  const KT* kv = static_cast<const KT*>(p.kv);
  const int lane = tid % 32, warp = tid / 32, num_warps = blockDim.x / 32;

  // Stage `st` of the tile starting at key k0: its block ids (read once from the table), then its
  // K and V rows by cp.async; a page whose id is out of range (or past the table row) is flagged
  // and reads as zeros.
  auto tile_len = [&](int k0) {
    return key_end - k0 < kAttnTileKeys ? key_end - k0 : kAttnTileKeys;
  };
  auto load_page_ids = [&](int k0, int st) {
    const int n = tile_len(k0);
    const int first_page = k0 / p.block_size;
    const int num_pages = (k0 + n - 1) / p.block_size - first_page + 1;
    if (tid < num_pages) {
      // A kv_len longer than the table row (device data the host cannot check) is flagged too,
      // never read from the next row or past the table.
      int32_t b = first_page + tid < p.max_blocks_per_seq ? table[first_page + tid] : -1;
      if (b < 0 || b >= p.num_blocks) {
        if (p.error_flag) atomicMax(p.error_flag, 1);
        b = -1;
      }
      blk_s[st * kAttnTileKeys + tid] = b;
    }
  };
  auto issue_tile = [&](int k0, int st) {
    const int n = tile_len(k0);
    const int first_page = k0 / p.block_size;
    KT* kd = k_s + st * kAttnTileKeys * kKStride;
    KT* vd = v_s + st * kAttnTileKeys * kKStride;
    for (int i = tid; i < n * kVecsPerRow; i += blockDim.x) {
      const int t = i / kVecsPerRow, c = i % kVecsPerRow;
      const int key = k0 + t;
      const int b = blk_s[st * kAttnTileKeys + key / p.block_size - first_page];
      if (b >= 0) {
        const int slot = key % p.block_size;
        cp_async16(kd + t * kKStride + c * kVec, kv + layout.offset(b, 0, kvh, slot) + c * kVec);
        cp_async16(vd + t * kKStride + c * kVec, kv + layout.offset(b, 1, kvh, slot) + c * kVec);
      } else {
        store16(kd + t * kKStride + c * kVec, make_uint4(0, 0, 0, 0));
        store16(vd + t * kKStride + c * kVec, make_uint4(0, 0, 0, 0));
      }
    }
    cp_async_commit();
  };

  const int num_tiles =
      key_end > key_begin ? (key_end - key_begin + kAttnTileKeys - 1) / kAttnTileKeys : 0;
  if (num_tiles > 0) {
    load_page_ids(key_begin, 0);
    __syncthreads();  // also: q_s, m_s, l_s are initialised
    issue_tile(key_begin, 0);
  }
  for (int it = 0; it < num_tiles; ++it) {
    const int cur = it % S, nxt = (it + 1) % S;
    const int k0 = key_begin + it * kAttnTileKeys;
    const int n = tile_len(k0);
    const int first_page = k0 / p.block_size;
    const bool more = it + 1 < num_tiles;
    // Two stages: stage nxt was last read by tile it-1, whose every phase ended at a barrier.
    if (S == 2 && more) load_page_ids(k0 + kAttnTileKeys, nxt);
    cp_async_wait<0>();  // this thread's copies of tile it have landed ...
    __syncthreads();     // ... and everyone's; tile it-1's readers of stage nxt are done
    if (S == 2 && more) issue_tile(k0 + kAttnTileKeys, nxt);  // in flight while tile it is computed
    const int* blk = blk_s + cur * kAttnTileKeys;
    const KT* kt = k_s + cur * kAttnTileKeys * kKStride;
    const KT* vt = v_s + cur * kAttnTileKeys * kKStride;
    // Scores. Item (row block of kPvRows rows, key t, part of D): each K vector read from shared
    // memory feeds the block's rows; with one row block the two halves of D are two lanes, summed
    // by a shuffle (then every thread has exactly one item, so whole warps shuffle).
    for (int i = tid; i < qk_items; i += blockDim.x) {
      const int part = i % qk_parts, t = i / qk_parts % kAttnTileKeys;
      const int r0 = i / (qk_parts * kAttnTileKeys) * kPvRows;
      const bool key_ok = t < n && blk[(k0 + t) / p.block_size - first_page] >= 0;
      float acc[kPvRows];
#pragma unroll
      for (int j = 0; j < kPvRows; ++j) acc[j] = 0.f;
      if (key_ok) {
        const int c_begin = part * (kVecsPerRow / qk_parts);
        const KT* kr = kt + t * kKStride;
        const float* qr[kPvRows];
#pragma unroll
        for (int j = 0; j < kPvRows; ++j) qr[j] = q_s + (r0 + j < rows ? r0 + j : rows - 1) * D;
#pragma unroll 4
        for (int c = c_begin; c < c_begin + kVecsPerRow / qk_parts; ++c) {
          float kf[kVec];
          Vec16<KT>::to_floats(load16(kr + c * kVec), kf);
#pragma unroll
          for (int j = 0; j < kPvRows; ++j)
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[j] += qr[j][c * kVec + e] * kf[e];
        }
      }
      if (qk_parts == 2) {
#pragma unroll
        for (int j = 0; j < kPvRows; ++j) acc[j] += __shfl_xor_sync(kFullWarpMask, acc[j], 1);
      }
      if (part != 0) continue;
#pragma unroll
      for (int j = 0; j < kPvRows; ++j) {
        const int r = r0 + j;
        if (r >= rows) break;
        const int limit = decode ? kv_len : kv_len - q_len + tok_begin + r / group + 1;
        const int first = window_first_key(limit - 1, p.window);
        s_s[r * kAttnTileKeys + t] =
            key_ok && k0 + t < limit && k0 + t >= first ? acc[j] : -INFINITY;
      }
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
    pv.add_tile(s_s, alpha_s, n, [&](int t, int c0, float* v) {
      const KT* src = vt + t * kKStride + c0;
#pragma unroll
      for (int u = 0; u < kPvChunk / kVec; ++u)
        Vec16<KT>::to_floats(load16(src + u * kVec), v + u * kVec);
    });
    if (S == 1 && more) {  // one stage: the next tile's loads start once this one is consumed
      __syncthreads();
      load_page_ids(k0 + kAttnTileKeys, 0);
      __syncthreads();
      issue_tile(k0 + kAttnTileKeys, 0);
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
      if (decode && d == 0 && p.head_max)
        p.head_max[static_cast<int64_t>(s) * p.num_heads + h] = m_s[r];
    }
  }
}

// grid (num_heads, num_seqs), block head_dim threads: merges the partial states of one
// (sequence, head) in split order with softmax_state_merge; writes lse and head_max when set.
template <int D>
__global__ void __launch_bounds__(D) merge_states_kernel(PagedAttentionParams p) {
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
  if (d == 0 && p.head_max) p.head_max[static_cast<int64_t>(s) * p.num_heads + h] = st.m;
}

}  // namespace kvsplit::kernels
