// Paged KV index math shared by the CPU backend and the CUDA kernels.
// Page layout of one layer: [num_blocks, 2 (0 = K, 1 = V), num_kv_heads, block_size, head_dim].
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace kvsplit::kernels {

struct PagedKvLayout {
  int num_kv_heads;
  int block_size;
  int head_dim;

  // Elements in one page (one block of one layer, K and V).
  KVSPLIT_HOST_DEVICE int64_t block_elems() const {
    return int64_t{2} * num_kv_heads * block_size * head_dim;
  }
  // Element offset of (block, kv, head, slot_in_block, dim 0).
  KVSPLIT_HOST_DEVICE int64_t offset(int32_t block, int kv, int head, int slot) const {
    return int64_t{block} * block_elems() +
           (int64_t{kv} * num_kv_heads + head) * int64_t{block_size} * head_dim +
           int64_t{slot} * head_dim;
  }
};

// Physical slot of logical token position `pos` given a block table row.
KVSPLIT_HOST_DEVICE int64_t slot_of(const int32_t* block_table_row, int block_size, int pos) {
  return int64_t{block_table_row[pos / block_size]} * block_size + pos % block_size;
}

// Sliding-window attention (backend::AttentionArgs::window): the first key position a query at
// `pos` attends, max(0, pos - window + 1) (transformers masks key k for query q when
// k <= q - window); window 0 means full causal attention (0).
KVSPLIT_HOST_DEVICE int window_first_key(int pos, int window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// Where the split-K decode of a sequence of kv_len keys starts: the first key its query (at
// position kv_len - 1) attends, rounded down to a page boundary so that splits stay whole pages
// (backend::SplitPlan). 0 without a window.
KVSPLIT_HOST_DEVICE int window_decode_base(int kv_len, int window, int block_size) {
  const int first = window_first_key(kv_len - 1, window);
  return first - first % block_size;
}

}  // namespace kvsplit::kernels
