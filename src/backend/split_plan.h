// Split-K plan for paged decode attention (FlashDecoding). Made on the host as a plain struct and
// executed identically by the CPU and CUDA backends.
//
// Sequence s (kv_len tokens) is cut into num_splits[s] contiguous chunks of `chunk_tokens` tokens
// (the last one shorter); chunk_tokens is a multiple of block_size so a split never shares a page
// with another. With a sliding window (AttentionArgs::window, which must equal the plan's) the
// chunks start at kernels::window_decode_base(kv_len, window, block_size), the page of the first
// key the query attends, instead of 0: the pages before it get no work item. Partial states of
// sequence s occupy split slots [split_offset[s], split_offset[s] + num_splits[s]) of the backend's
// partial workspace (o [total_splits, num_heads, head_dim], m and l [total_splits, num_heads]).
//
// A plan made over the pages the sequences attend (plan_decode_splits with page precisions, some
// pages evicted) has explicit bounds instead: split j of sequence s covers keys
// [split_begin[split_offset[s] + j], the next split's begin, or kv_len for the last), page
// aligned, the first at the window base; each split but the last holds chunk_tokens attended keys
// (evicted pages, which attention skips, lie inside whichever split they fall in).
#pragma once

#include <cstdint>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::backend {

struct SplitPlanConfig {
  // Do not split a sequence into chunks shorter than this (tokens); rounded up to block_size.
  // 512: on the 2-thread CPU a 1024-token sequence split in 4 x 256 ran 0.88x of no split (the
  // merge cost more than it saved); 4K+ contexts gain 1.5-1.7x (bench_cpu_attention).
  int min_chunk_tokens = 512;
  // Upper bound on splits per sequence.
  int max_splits_per_seq = 64;
  // Aim for at least this many work items (seq x kv_head x split) per parallel unit.
  int work_items_per_unit = 2;
  // Whether the model sizes decode splits on the pages attention reads (plan_decode_splits with
  // PlanPages) or on kv_len. kAuto: on the attended pages where the decode kernel skips an evicted
  // page at no cost (the CPU backend's page loop), on kv_len on CUDA, whose mixed decode kernel
  // steps through every tile of a split's key range, evicted tiles included (scores, softmax and
  // P.V over zeros, no loads): there a mostly evicted sequence sized on its attended pages gets a
  // few splits, each stepping serially through long evicted runs that kv_len sizing spread over
  // many thread blocks (docs/kv-cache.md "Split-K plan"; not measured on a GPU yet). kOn / kOff
  // force it either way.
  enum class Attended : uint8_t { kAuto, kOn, kOff };
  Attended attended = Attended::kAuto;
};

// Whether a decode call under `config` is planned on its attended pages, on a backend whose decode
// kernel skips evicted pages at no cost (`skips_evicted`: the CPU backend) or not.
inline bool plan_on_attended(const SplitPlanConfig& config, bool skips_evicted) {
  return config.attended == SplitPlanConfig::Attended::kOn ||
         (config.attended == SplitPlanConfig::Attended::kAuto && skips_evicted);
}

struct SplitPlan {
  int chunk_tokens = 0;               // tokens per split, multiple of block_size
  std::vector<int32_t> num_splits;    // [num_seqs], >= 1 (a sequence with kv_len 0 gets 1)
  std::vector<int32_t> split_offset;  // [num_seqs], prefix sum of num_splits
  int total_splits = 0;
  int max_splits = 0;  // max over sequences
  int window = 0;      // the sliding window planned for (AttentionArgs::window); 0: none
  // [total_splits] first key of each split (see above), or empty: uniform chunks of chunk_tokens
  // keys from the window base.
  std::vector<int32_t> split_begin;

  int num_seqs() const { return static_cast<int>(num_splits.size()); }
  bool has_splits() const { return max_splits > 1; }

  // The plan as one array of int32 words, as a device kernel reads it: num_splits, split_offset,
  // then split_begin. A backend keeps the image it uploaded and compares in place, once per layer,
  // without building a new one.
  size_t image_words() const {
    return num_splits.size() + split_offset.size() + split_begin.size();
  }
  void write_image(int32_t* out) const;
  bool image_equals(const std::vector<int32_t>& image) const;
};

// Plan with an explicit chunk size (tests, benchmarks). chunk_tokens <= 0 means "no split".
// chunk_tokens is rounded up to a multiple of block_size. window: the attention's sliding window
// (0: none).
SplitPlan make_split_plan(const int32_t* kv_lens, int num_seqs, int block_size, int chunk_tokens,
                          int window = 0);

// The pages of the decode sequences, for planning: page b of sequence s is attended unless
// precision[s * max_blocks_per_seq + b] is kernels::KvPrecision::kEvicted (the layout of
// AttentionArgs::page_precision). Null precision: every page is attended.
struct PlanPages {
  const uint8_t* precision = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
};

// The heuristic planner: picks chunk_tokens from the batch shape and the device's parallelism
// (threads or SMs), counting only the keys each query attends: those within the window, on pages
// that are not evicted (`pages`). No split when the batch already fills the device (it would not
// pay). Splits are sized on those keys: a sequence of P pages of which E are evicted gets the
// plan of P - E resident pages (num_splits, split_offset, chunk_tokens), with split_begin placing
// each split's attended pages; a batch with no evicted page in any span gets the uniform plan,
// exactly as without `pages`.
SplitPlan plan_decode_splits(const int32_t* kv_lens, int num_seqs, int num_kv_heads, int block_size,
                             int parallelism, const SplitPlanConfig& config = {}, int window = 0,
                             PlanPages pages = {});

// Keys of [window_decode_base, kv_len) on pages `pages` does not mark evicted (row `seq`).
int attended_keys(int kv_len, int window, int block_size, const PlanPages& pages, int seq);

// Keys [window_decode_base, kv_len) the splits of a sequence cover.
int split_span(int kv_len, int window, int block_size);

// Checks a plan (made here or by hand) against a decode call: one entry per sequence, at least
// one split each, offsets the prefix sum of the splits, total_splits and max_splits consistent
// with them (the partial workspace and the merge follow those), chunk_tokens a positive multiple
// of block_size, the call's window, split_begin empty or one page-aligned entry per split,
// increasing within a sequence. With host kv_lens (null where they live on a device: the
// kernels flag a plan that leaves keys out) each sequence's splits must also cover its span:
// uniform, keeping every split bound, base + n * chunk_tokens, within an int; with split_begin,
// starting at the window base with every split non-empty (its begin below kv_len).
Status check_split_plan(const SplitPlan& plan, int num_seqs, int block_size, int window,
                        const int32_t* host_kv_lens);

}  // namespace kvsplit::backend
