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
  kDemote,   // down the ladder to `to` (full -> int8 -> int4); to int4 when int8 has no page
  kEvict,    // drop the resident copy; the summary and the host original stay (reversible)
  kDrop,     // drop the resident copy and keep nothing: irreversible (the baselines' eviction)
  kRestore,  // back to full precision on the device, from the host original
};

struct PageTransition {
  int32_t page = 0;  // logical page index in the block table
  PageOp op = PageOp::kDemote;
  kernels::KvPrecision to = kernels::KvPrecision::kInt8;  // kDemote only: kInt8 or kInt4
};

// Counters of applied (and refused) transitions; add up over calls.
struct PageOpStats {
  int64_t demoted_to_int8 = 0;
  int64_t demoted_to_int4 = 0;
  int64_t evicted = 0;  // kEvict and kDrop
  int64_t restored = 0;
  int64_t originals_written = 0;  // full-precision copies written to the host tier
  // Refused, nothing changed: the host tier or the summary slots are full (a page leaving kFull
  // needs both), or the destination arena / the full pool has no free page.
  int64_t refused_host_full = 0;
  int64_t refused_no_space = 0;
  int64_t refused_no_original = 0;  // restore of a page whose original is gone
  double restore_seconds = 0;       // wall time of the applied restores (copies included)

  void add(const PageOpStats& o);  // field by field
  int64_t refused() const { return refused_host_full + refused_no_space + refused_no_original; }
};

// Applies `transitions` in order to `table`, whose first `num_tokens` tokens are written. A
// transition that cannot be applied (tier full, no page free) is refused and counted; the page
// keeps its state and nothing is lost. Pages that are not full (the partial last page) are never
// demoted or evicted. Errors: kInvalidArgument for a page index out of range or a transition that
// goes up the ladder by kDemote; backend errors as they come.
Status apply_page_transitions(KvPool& pool, BlockTable& table, int num_tokens,
                              std::span<const PageTransition> transitions, PageOpStats* stats);

// Bytes of KV resident on the device for `table` (every layer, each page at its precision).
int64_t resident_bytes(const KvPool& pool, const BlockTable& table);

}  // namespace kvsplit::kv
