// Page-state transitions of one sequence's pages (kv-cuts.md §1), executed on the pool that owns
// them with the Backend's copy and quantize ops. Cuts plan transitions as plain structs
// (src/cuts/); the worker that owns the pool applies them between steps.
#pragma once

#include <cstdint>
#include <span>

#include "kv/block_allocator.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::kv {

enum class PageOp : uint8_t {
  kDemote,  // down the ladder to `to` (full -> int8 -> int4); to int4 when int8 has no page
  kEvict,   // drop the resident copy; the summary and the host original stay (reversible)
  kDrop,    // drop the resident copy and keep nothing: irreversible (the baselines' eviction)
  // Back on the device from the host original at `to`: kFull copies it back (a quantized or
  // evicted page); kInt8 / kInt4 (an evicted page only; a resident one is left as it is)
  // requantize it into that arena, keeping the original and the summary, and fall back to the
  // next rung, then to kFull, when the arena has no free page.
  kRestore,
};

struct PageTransition {
  int32_t page = 0;  // logical page index in the block table
  PageOp op = PageOp::kDemote;
  // kDemote: kInt8 or kInt4; kRestore: kFull, kInt8 or kInt4.
  kernels::KvPrecision to = kernels::KvPrecision::kInt8;
};

// Counters of applied (and refused) transitions; add up over calls.
struct PageOpStats {
  int64_t demoted_to_int8 = 0;
  int64_t demoted_to_int4 = 0;
  int64_t evicted = 0;             // kEvict and kDrop
  int64_t restored = 0;            // recalls, at any rung
  int64_t restored_quantized = 0;  // of which evicted pages brought back at int8 or int4
  // Of those, judged since: taken on to full by their measured relevance (the bound's call was
  // right), or evicted again first (it was not). The rest were still undecided at release.
  int64_t recalls_confirmed = 0;
  int64_t recalls_cold = 0;
  int64_t originals_written = 0;  // full-precision copies written to the host tier
  // Refused, nothing changed: the host tier or the summary slots are full (a page leaving kFull
  // needs both), or the destination arena / the full pool has no free page.
  int64_t refused_host_full = 0;
  int64_t refused_no_space = 0;
  int64_t refused_no_original = 0;  // restore of a page whose original is gone
  // Wall time of the applied restores, from queuing the copy to its commit (the recall
  // latency; with asynchronous copies it includes the steps that ran while it landed).
  double restore_seconds = 0;
  // Asynchronous restores not landed when a bounded wait for them expired (complete_restores):
  // the step that asked for the page ran with its resident copy (or without it, evicted).
  int64_t restores_late = 0;
  // Pages freed because every layer's sliding window had passed them (drop_behind_window).
  int64_t window_dropped = 0;

  void add(const PageOpStats& o);  // field by field
  int64_t refused() const { return refused_host_full + refused_no_space + refused_no_original; }
};

// Applies `transitions` in order to `table`, whose first `num_tokens` tokens are written. A
// transition that cannot be applied (tier full, no page free) is refused and counted; the page
// keeps its state and nothing is lost. A page with a restore in flight is left alone. Pages that
// are not full (the partial last page) are never demoted or evicted. Errors: kInvalidArgument for a
// page index out of range, a transition that goes up the ladder by kDemote, or a kRestore to
// kEvicted; backend errors as they come.
Status apply_page_transitions(KvPool& pool, BlockTable& table, int num_tokens,
                              std::span<const PageTransition> transitions, PageOpStats* stats);

// kRestore queues its copy as a fenced batch (Backend::copy_batch_fenced). Where the backend
// copies asynchronously, the page keeps its resident copy and state (PageEntry::restoring) until
// this commits it: waits at most `wait_us` microseconds in all (0: polls; < 0: until every copy
// has landed) and commits the restores that landed; the rest stay pending (counted once in
// restores_late). A failed copy frees its block, leaves the page as it was and is returned.
Status complete_restores(KvPool& pool, BlockTable& table, int64_t wait_us, PageOpStats* stats);

// Sliding windows: frees the pages of `table` (num_tokens written) that no query will read again
// because every layer's window has passed them: with `window` the largest layer window
// (ModelConfig::kv_window; 0 does nothing), the next query sits at position num_tokens and reads
// keys from num_tokens - window + 1 on, so pages ending at or before that key go. Each one's
// resident copy, host original and summary are freed (nothing is kept: unlike kEvict this is not
// reversible, nor needs to be), its block becomes -1 and table.window_dropped grows. Pages with a
// restore in flight, or swapped out of the device, wait for a later call. Counted in
// stats->window_dropped; returns how many went.
int drop_behind_window(KvPool& pool, BlockTable& table, int num_tokens, int window,
                       PageOpStats* stats);

// Bytes of KV resident on the device for `table` (every layer, each page at its precision, the
// key summary of each page that has one, and the full block of each restore in flight).
int64_t resident_bytes(const KvPool& pool, const BlockTable& table);

}  // namespace kvsplit::kv
