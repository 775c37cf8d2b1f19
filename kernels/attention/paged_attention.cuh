// Paged attention kernel bodies (compiled by nvcc in attention.cu, and by g++ under the emulation
// harness). Host API and shapes: kernels/attention/paged_attention.h.
//
// One thread block handles `rows` query vectors that share one KV head: for decode the whole GQA
// group of one token (every KV byte is read once per split), for prefill a tile of tokens times
// the GQA group. Keys are walked in tiles of kAttnTileKeys: the block table entries of the tile's
// pages are read once into shared memory, K and V are staged with 16-byte asynchronous copies
// (cp.async) into one of two shared-memory stages, then scores, an online-softmax update
// (kernels/common/softmax_state.h) and the P·V accumulation run from shared memory in fp32. The
// pipeline is two deep: the copies of tile i+1 are in flight while tile i is computed, so a block
// keeps HBM busy instead of alternating between loading and computing.
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
// Prefill: query rows per block (tokens x GQA group), at least one token.
inline constexpr int kPrefillMaxRows = 16;

// Pipeline stages of the K/V tile buffers: 2 (double buffering) where the device's shared memory
// per block allows it, else 1 (the next tile is loaded after this one is computed).
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
  at = align16(at + stages * kAttnTileKeys * head_dim * elem_bytes);
  L.total = at;
  return L;
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
    const int n_split = p.num_splits ? p.num_splits[s] : 1;
    if (bx >= n_split || q_len < 1) return;
    tok_count = 1;
    key_end = kv_len;
    if (n_split > 1) {
      key_begin = bx * p.chunk_tokens;
      key_end = key_begin + p.chunk_tokens < kv_len ? key_begin + p.chunk_tokens : kv_len;
      split_slot = p.split_offset[s] + bx;
    }
  } else {
    tok_begin = bx * tokens_per_block;
    if (tok_begin >= q_len) return;
    tok_count = q_len - tok_begin < tokens_per_block ? q_len - tok_begin : tokens_per_block;
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
    o_s[i] = 0.f;
  }
  for (int r = tid; r < rows; r += blockDim.x) {
    const SoftmaxState empty = softmax_state_empty();
    m_s[r] = empty.m;
    l_s[r] = empty.l;
  }

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
    KT* vd = v_s + st * kAttnTileKeys * D;
    for (int i = tid; i < n * kVecsPerRow; i += blockDim.x) {
      const int t = i / kVecsPerRow, c = i % kVecsPerRow;
      const int key = k0 + t;
      const int b = blk_s[st * kAttnTileKeys + key / p.block_size - first_page];
      if (b >= 0) {
        const int slot = key % p.block_size;
        cp_async16(kd + t * kKStride + c * kVec, kv + layout.offset(b, 0, kvh, slot) + c * kVec);
        cp_async16(vd + t * D + c * kVec, kv + layout.offset(b, 1, kvh, slot) + c * kVec);
      } else {
        store16(kd + t * kKStride + c * kVec, make_uint4(0, 0, 0, 0));
        store16(vd + t * D + c * kVec, make_uint4(0, 0, 0, 0));
      }
    }
    cp_async_commit();
  };

  const int num_tiles =
      key_end > key_begin ? (key_end - key_begin + kAttnTileKeys - 1) / kAttnTileKeys : 0;
  if (num_tiles > 0) {
    load_page_ids(key_begin, 0);
    __syncthreads();  // also: q_s, o_s, m_s, l_s are initialised
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
    const KT* vt = v_s + cur * kAttnTileKeys * D;
    for (int i = tid; i < rows * kAttnTileKeys; i += blockDim.x) {
      const int r = i / kAttnTileKeys, t = i % kAttnTileKeys;
      const int limit = decode ? kv_len : kv_len - q_len + tok_begin + r / group + 1;
      float score = -INFINITY;
      if (t < n && k0 + t < limit && blk[(k0 + t) / p.block_size - first_page] >= 0) {
        const float* qr = q_s + r * D;
        const KT* kr = kt + t * kKStride;
        float acc = 0.f;
#pragma unroll 4
        for (int c = 0; c < kVecsPerRow; ++c) {
          float kf[kVec];
          Vec16<KT>::to_floats(load16(kr + c * kVec), kf);
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc += qr[c * kVec + e] * kf[e];
        }
        score = acc;
      }
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
    for (int i = tid; i < rows * D; i += blockDim.x) {
      const int r = i / D, d = i % D;
      const float* pr = s_s + r * kAttnTileKeys;
      float acc = o_s[i] * alpha_s[r];
      for (int t = 0; t < n; ++t) acc += pr[t] * Elem<KT>::to_float(vt[t * D + d]);
      o_s[i] = acc;
    }
    if (S == 1 && more) {  // one stage: the next tile's loads start once this one is consumed
      __syncthreads();
      load_page_ids(k0 + kAttnTileKeys, 0);
      __syncthreads();
      issue_tile(k0 + kAttnTileKeys, 0);
    }
  }
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
