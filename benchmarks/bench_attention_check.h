// Host-side helpers of bench_attention (no CUDA): per-page, per-KV-head V values that make a page
// (or a KV head) read in place of another visible in the output whenever their values differ, the
// output a decode row must then produce, and the copies of a row's pages that its timed launches
// rotate over so that a small working set is not served from L2 while the streaming reference it is
// divided by reads HBM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/common/paged_kv.h"

namespace kvsplit::bench {

// Value of every V element of physical page `page` (K is constant, see bench_attention.cpp):
// (1 + page % 127) / 16, in [1/16, 8]. At most 7 significant bits, so exact in bf16; multiples of
// 1/16, so with uniform scores the fp32 sum of V over up to 2^17 keys (< 2^20) is exact in any
// order (24 significant bits), and the output is the mean below up to the final division.
inline float page_v_value(int64_t page) { return static_cast<float>(1 + page % 127) / 16.f; }
constexpr int kPageValueCount = 127;  // distinct page_v_value values: page % 127
// The value index of KV head `kv_head`'s V on page `page`: heads of one page differ, so a query
// head read against the wrong KV head (a GQA mapping error) changes the output.
constexpr int kKvHeadValueStride = 16;
inline int64_t head_v_index(int64_t page, int kv_head) {
  return (page % kPageValueCount + int64_t{kKvHeadValueStride} * kv_head) % kPageValueCount;
}

// bf16 bits of a value page_v_value returns (exact: the low 16 bits of its f32 bits are zero).
inline uint16_t page_v_bits(int64_t page) {
  const float v = page_v_value(page);
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

// Decode output of one sequence's query heads that read KV head `kv_head` (every dim of them) when
// all its keys score the same: the mean of that head's V value over the keys its query at
// kv_len - 1 attends, window_first_key(kv_len - 1, window) .. kv_len - 1 (window 0: all), each
// key's page taken from `table_row`.
inline double expected_decode_mean(const int32_t* table_row, int kv_len, int window, int block_size,
                                   int kv_head) {
  const int first = kernels::window_first_key(kv_len - 1, window);
  double sum = 0;
  for (int t = first; t < kv_len; ++t)
    sum += page_v_value(head_v_index(table_row[t / block_size], kv_head));
  return sum / (kv_len - first);
}

// Relative tolerance of a decode output against expected_decode_mean. The exact-sum argument
// above leaves a few fp32 roundings (the division by the key count; a split-K merge that weighs
// partials by exp of their log-sum-exp, ~1e-6): far under 2e-5, which still catches one page of
// 16 keys read in place of another in a 4096-key window whenever their values differ (a change of
// at least (1/16) * 16 / 4096 = 2.4e-4 on a mean of at most 8: 3e-5 relative), and any KV head
// read in place of another. Over a full 128K context one wrong page moves the mean by less than
// the tolerance: there the check catches wrong heads and wholesale errors, not a single page.
constexpr double kOutputRelTol = 2e-5;

// Copies of a row's pages that its timed launches rotate over: 1 when the row reads at least
// 2 x L2 (it streams from HBM anyway, and so does the reference), else ceil(4 x L2 / read_bytes),
// so that between two launches over the same copy the others read more than 2 x L2 of other
// memory. l2_bytes <= 0 (unknown): 1.
inline int rotation_copies(double read_bytes, double l2_bytes) {
  if (l2_bytes <= 0 || read_bytes <= 0 || read_bytes >= 2 * l2_bytes) return 1;
  return static_cast<int>(std::ceil(4 * l2_bytes / read_bytes));
}

// Block tables of `copies` copies of a decode row where every sequence has kv_len keys:
// [copies, num_seqs, blocks_per_seq]. Copy 0 is `base` (pages in [0, num_blocks)); copy c > 0 maps
// the pages a decode query reads (from window_decode_base on) to pages of its own, shuffled, in
// [num_blocks + (c - 1) * read_pages, num_blocks + c * read_pages) with read_pages = the read
// pages of all sequences; the other entries stay as in copy 0 (never read). Returns the tables;
// *total_pages gets num_blocks + (copies - 1) * read_pages.
inline std::vector<int32_t> rotation_tables(const std::vector<int32_t>& base, int num_seqs,
                                            int blocks_per_seq, int kv_len, int window,
                                            int block_size, int copies, int num_blocks,
                                            int64_t* total_pages) {
  const int first_page = kernels::window_decode_base(kv_len, window, block_size) / block_size;
  const int read_per_seq = blocks_per_seq - first_page;
  const int64_t read_pages = int64_t{read_per_seq} * num_seqs;
  const size_t per_copy = size_t(num_seqs) * blocks_per_seq;
  std::vector<int32_t> tabs(per_copy * copies);
  std::mt19937 rng(7);
  for (int c = 0; c < copies; ++c) {
    std::copy(base.begin(), base.end(), tabs.begin() + per_copy * c);
    if (c == 0) continue;
    std::vector<int32_t> fresh(read_pages);
    std::iota(fresh.begin(), fresh.end(), static_cast<int32_t>(num_blocks + (c - 1) * read_pages));
    std::shuffle(fresh.begin(), fresh.end(), rng);
    for (int s = 0; s < num_seqs; ++s)
      for (int b = first_page; b < blocks_per_seq; ++b)
        tabs[per_copy * c + size_t(s) * blocks_per_seq + b] =
            fresh[size_t(s) * read_per_seq + (b - first_page)];
  }
  *total_pages = num_blocks + (copies - 1) * read_pages;
  return tabs;
}

}  // namespace kvsplit::bench
