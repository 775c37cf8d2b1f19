// CPU paged attention: causal prefill (chunked prefill included) and split-K decode
// (FlashDecoding), f32 pages. Called by CpuBackend; tested directly against tests/oracle.
//
// Both read K and V only through the block tables of `args` (layout in kernels/common/paged_kv.h)
// and use the online-softmax math of kernels/common/softmax_state.h. All pointers in `args` are
// host memory. Work is spread over `pool` (the caller's thread takes part); one call at a time per
// calling thread (the split-K workspace is per calling thread and reused between calls).
//
// Mixed-precision pages (AttentionArgs::page_precision, semantic cut): both read every resident
// page at its own precision in the same tile loop (quantized codes are converted in registers,
// never into a sequence-sized buffer) and skip evicted pages; split-K works as with full pages.
// The scoring side outputs (AttentionArgs::score_seqs) are decode-only and cost a second read of
// the scored sequences' resident keys after the merge (attention_tile.h).
//
// Errors: kInvalidArgument for inconsistent args (head counts that do not divide, kv_len < q_len,
// block ids outside [0, num_blocks) or outside their precision's arena, precision values > 3,
// summary slots outside [0, num_summary_slots), a plan that does not match kv_lens, null pointers,
// score_seqs on prefill);
// kUnimplemented for pages other than f32.
#pragma once

#include "backend/backend.h"
#include "backend/split_plan.h"
#include "common/thread_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

// q, out [num_tokens, num_heads, head_dim]; sequence s owns rows [query_start[s],
// query_start[s+1]) at positions kv_lens[s] - q_len .. kv_lens[s] - 1; q_len may be 0.
Status cpu_attention_prefill(const backend::AttentionArgs& args, ThreadPool& pool);

// One query per sequence (query_start[s+1] - query_start[s] == 1, kv_lens[s] >= 1). Sequence s is
// cut into plan.num_splits[s] chunks of plan.chunk_tokens keys, or at plan.split_begin when the
// plan has bounds; plan must come from backend::make_split_plan / backend::plan_decode_splits
// over the same kv_lens, block_size and (for bounds) page precisions.
Status cpu_attention_decode(const backend::AttentionArgs& args, const backend::SplitPlan& plan,
                            ThreadPool& pool);

}  // namespace kvsplit::backend
