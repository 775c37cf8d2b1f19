// Host API of mixed-precision paged attention (semantic cut): every page of a sequence is read at
// its own precision in one pass (full pages from `kv`, int8 / int4 pages from their arenas,
// dequantized in registers with kernels/common/kv_quant.h), evicted pages are skipped, and decode
// can emit the scoring side outputs (token relevance, Quest page bounds). The contract is
// backend::AttentionArgs (src/backend/backend.h); this header has no CUDA device header.
//
// The all-full path (launch_paged_prefill / launch_paged_decode) is a separate kernel and is not
// touched by anything here.
#pragma once

#include <cstdint>

#include "kernels/attention/paged_attention.h"
#include "kernels/common/kv_quant.h"

namespace kvsplit::kernels {

struct MixedAttentionParams {
  // Shapes, q, out, lse, the full-precision pages `kv`, kv_lens, query_start and split-K fields as
  // for the all-full kernels. block_tables[s, i] is the page's id in the arena of its precision.
  PagedAttentionParams base;

  // [num_seqs, max_blocks_per_seq] KvPrecision values; nullptr: every page is full precision
  // (used when only the scoring outputs are asked for).
  const uint8_t* page_precision = nullptr;
  const void* int8_pages = nullptr;  // [num_int8_blocks, QuantPageLayout::bytes(kInt8)]
  int num_int8_blocks = 0;
  const void* int4_pages = nullptr;  // [num_int4_blocks, QuantPageLayout::bytes(kInt4)]
  int num_int4_blocks = 0;

  // ---- scoring side outputs (decode only), exactly as backend::AttentionArgs ----
  const uint8_t* score_seqs = nullptr;     // [num_seqs]; nullptr: none
  float* token_relevance = nullptr;        // [num_seqs, max_blocks_per_seq * block_size]
  const int32_t* summary_slots = nullptr;  // [num_seqs, max_blocks_per_seq], -1: none
  // f16 bits [num_summary_slots, summary_parts, 2, num_kv_heads, head_dim] (kv_quant.h "key
  // summaries")
  const KvSummaryElem* summaries = nullptr;
  int num_summary_slots = 0;
  int summary_parts = 1;        // >= 1, divides block_size
  float* page_bound = nullptr;  // [num_seqs, max_blocks_per_seq]
  // Workspace [num_seqs, num_heads] f32 (needed with score_seqs): the final max score m_h of each
  // decode query head, written by the attention kernel (one split) or the merge (several).
  float* score_max = nullptr;

  // ---- benchmarks only: stages of the attention kernel left out (kMixedProbe*) ----
  // To time a stage, time the kernel without it (METHOD.md: no hardware counters on every
  // device machine). The outputs are then meaningless. 0 (the default) runs every stage.
  int probe = 0;
};

// MixedAttentionParams::probe bits (bench_attention --mode mixed --probe).
inline constexpr int kMixedProbeNoRows = 1;      // no K/V row loads (the tile is not staged)
inline constexpr int kMixedProbeNoScores = 2;    // no q.k products (every valid score 0)
inline constexpr int kMixedProbeNoPv = 4;        // no P.V accumulation
inline constexpr int kMixedProbeNoPageInfo = 8;  // page ids and precisions loaded once per block

// Page ids outside their arena, precision values > 3 and summary slots outside
// [0, num_summary_slots) cannot be checked on the host (device arrays): the kernels skip that
// page (or bound) and set base.error_flag. Host-visible errors (null outputs, score_seqs on
// prefill, shapes) are kInvalidArgument; uncompiled shapes kUnimplemented.

// Causal prefill over mixed pages (score_seqs must be null).
Status launch_mixed_prefill(const MixedAttentionParams& p, cudaStream_t stream);

// Decode over mixed pages: the split-K attention kernel, the merge when base.max_splits > 1, then,
// with score_seqs, the scoring kernel (a second read of the scored sequences' keys that recomputes
// every score exactly as the attention pass did, see mixed_attention.cuh).
Status launch_mixed_decode(const MixedAttentionParams& p, cudaStream_t stream);

// The scoring kernel alone (spatial cut: backend::AttentionArgs::score_max): the side outputs of
// the score_seqs sequences against the given maxima head_max [num_seqs, num_heads] (device
// memory; -inf allowed) instead of the call's own. out, lse, score_max and the split-K fields
// are not used (the decode shape checks still apply); base.head_max must be null.
Status launch_mixed_score(const MixedAttentionParams& p, const float* head_max,
                          cudaStream_t stream);

}  // namespace kvsplit::kernels
