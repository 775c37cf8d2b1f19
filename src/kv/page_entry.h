// The page entry of kv-cuts.md §1: the state of one page (one block of block_size tokens of one
// sequence, all layers) that every KV cut changes through planned transitions.
#pragma once

#include <cstdint>

#include "kernels/common/kv_quant.h"

namespace kvsplit::kv {

// Where a page's resident copy lives. kHost: swapped out by the temporal cut (kv/swap.h): the
// page is in the host slot `original` and holds no device block; kDisk: swapped out to the disk
// tier, at index `original` of its table's disk record (BlockTable::disk_record); kEvicted: nothing
// resident but the key summary (semantic cut).
enum class PageLocation : uint8_t { kDevice, kHost, kDisk, kEvicted };

struct PageEntry {
  PageLocation location = PageLocation::kDevice;
  // Precision of the resident copy (kFull: the pool's dtype; kInt8 / kInt4: the pool's quantized
  // arenas). kEvicted when location is kEvicted.
  kernels::KvPrecision precision = kernels::KvPrecision::kFull;
  // Host-tier slot of the full-precision copy, written when the page first leaves kFull or is
  // swapped out (kHost: its only copy); -1 none.
  int32_t original = -1;
  // Summary slot (per-channel key min/max, every layer) kept while the page is not kFull; -1 none.
  int32_t summary = -1;
  // Semantic relevance in [0, 1] (smoothed; 1 until scored) and how many consecutive scored steps
  // it has been below the demotion / eviction thresholds.
  float relevance = 1.f;
  int32_t low_steps = 0;
  int32_t very_low_steps = 0;
  // The spatial cut: the shard of the worker's shard group whose pool holds the page while it is
  // on a device (kv-cuts.md §1 "device(shard s, block b)"); 0 = the worker's own (home) pool.
  uint8_t shard = 0;
  // A restore to full precision is in flight (BlockTable::restoring): the page keeps its state,
  // and no other transition touches it, until complete_restores commits it.
  bool restoring = false;
  // Recalled at int8 / int4 on its summary's bound and not yet judged: its next full restore
  // confirms the call, its next eviction shows it was cold (PageOpStats::recalls_confirmed /
  // _cold).
  bool probed = false;
  // Brought back by a restore (a recall on its bound, or a quantized page's relevance): scored
  // and planned even once it is behind the scoring window (semantic_window), so a recall of an
  // old page never pins it at full precision for good (pages behind the window are otherwise
  // left as they are).
  bool recalled = false;
  // Recalled at int8 / int4 and not scored since: its next score replaces its relevance instead
  // of being averaged with the value it had when it was evicted (the design resets relevance on
  // a recall; a restore to full sets it to 1).
  bool rescore = false;

  bool resident() const { return location == PageLocation::kDevice; }
};

}  // namespace kvsplit::kv
