// Swapping a sequence's pages between the device pool and the host tier (the temporal cut,
// kv-cuts.md §3): a paused sequence gives its full-precision device pages back to the pool and
// resumes later, bit-exactly, without recompute.
//
// Page states (kv/page_entry.h): a swapped-out page has location kHost, precision kFull, its
// block set to -1 and `original` naming the host slot that holds it (its only copy). Pages the
// semantic cut moved into the int8 / int4 arenas stay there (they are small and hold no full-pool
// block); evicted pages stay evicted. So a swap out and in leaves every page bit-exact.
#pragma once

#include <cstdint>

#include "kv/block_allocator.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::kv {

struct SwapStats {
  int64_t swaps_out = 0;          // sequences swapped out
  int64_t swaps_in = 0;           // sequences swapped back in
  int64_t pages_out = 0;          // pages copied device -> host
  int64_t pages_in = 0;           // pages copied host -> device
  int64_t bytes_out = 0;          // bytes copied device -> host (all layers)
  int64_t bytes_in = 0;           // bytes copied host -> device
  int64_t refused_host_full = 0;  // swap-outs refused: too few free host slots and no disk room
  int64_t to_disk = 0;            // swap-outs that went to the disk tier (host tier full)
  int64_t from_disk = 0;          // swap-ins read back from the disk tier
  int64_t disk_faults = 0;        // disk writes or reads that failed (the caller recomputes)
  int64_t fallbacks = 0;          // swap-ins that failed and were recomputed (callers count)
  int64_t refused_no_blocks = 0;  // swap-ins refused: too few free device blocks
  int64_t refused_sharded = 0;    // swap-outs refused: the table spans a shard group
  double out_seconds = 0;         // wall time of the swap-outs (copies included)
  double in_seconds = 0;          // wall time of the swap-ins

  void add(const SwapStats& o);
};

// Pages of `table` that a swap_out would copy to the host (full precision, on the device).
int swappable_pages(const BlockTable& table);
// Pages of `table` on the host that a swap_in needs device blocks for.
int swapped_pages(const BlockTable& table);

// Copies every full-precision device page of `table` to host-tier slots and frees their blocks;
// when the host tier has too few free slots and the pool has a disk tier, to one checksummed disk
// record instead (one large write; pages kDisk). All or nothing: false (counted, the table
// unchanged) when neither has room or the disk write fails (a fault, counted: the caller
// recomputes). A backend error leaves the table unchanged too.
StatusOr<bool> swap_out(KvPool& pool, BlockTable& table, SwapStats* stats);

// Inverse of swap_out: allocates a device block for every swapped-out page, copies it back and
// frees its host slot or disk record. All or nothing: false (counted, the table unchanged) when
// the pool has too few free blocks. A backend error, or a disk fault (checksum, I/O: counted),
// returns its Status with the table unchanged: the caller releases it and recomputes.
StatusOr<bool> swap_in(KvPool& pool, BlockTable& table, SwapStats* stats);

}  // namespace kvsplit::kv
