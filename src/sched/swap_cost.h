// The temporal cut's choice between swap and recompute for a preempted sequence (kv-cuts.md §3):
// restore bytes over the measured copy bandwidths against its prefill time at the measured
// prefill speed. Plain functions, tested without a model.
#pragma once

#include <cstdint>

#include "kv/kv_pool.h"
#include "kvsplit/kv_cuts.h"

namespace kvsplit::sched {

// Measured on a worker: copy bandwidths between its device and the host tier and the disk
// tier's record write and read bandwidths (bytes/s, at start-up), and its prefill speed
// (tokens/s; an EWMA over its prefill steps). 0: not measured (or no disk tier).
struct SwapCosts {
  double d2h_bytes_per_s = 0;
  double h2d_bytes_per_s = 0;
  double disk_write_bytes_per_s = 0;
  double disk_read_bytes_per_s = 0;
  // A disk swap on a backend whose device memory is not host memory goes through a host
  // staging buffer (kv/swap.cpp: KvPool::take_staging, alloc_host memory as the host tier's):
  // these are its copy bandwidths, the host tier's. 0: no staging (the CPU backend writes and
  // reads the record in place).
  double disk_staging_d2h_bytes_per_s = 0;
  double disk_staging_h2d_bytes_per_s = 0;
  // The pool's disk swap-outs are written behind (KvPool::disk_write_behind): the swap-out costs
  // the copy into its staging buffer (alloc_host memory, as the host tier: d2h_bytes_per_s), not
  // the disk write, which goes on while the worker does.
  bool disk_write_behind = false;
  double prefill_tokens_per_s = 0;
};

// Where a swap-out goes (kv::swap_out): the host tier while it has room, else the disk tier.
enum class SwapTier : uint8_t { kHost, kDisk };

struct SwapChoice {
  bool swap = false;
  SwapTier tier = SwapTier::kHost;
  double swap_ms = 0;       // predicted: copy out now + copy in at resume, to and from `tier`
  double recompute_ms = 0;  // predicted: prefill of the tokens again
  bool priced = false;      // both predictions come from measured costs
};

// kAlways: swap; kNever: recompute; kAuto: the cheaper prediction (swap while a cost is not
// measured yet: recompute always redoes work). swap_bytes: the pages' bytes (all layers);
// recompute_tokens: the positions a recompute prefills; tier: where the swap would go
// (swap_tier), priced with that tier's bandwidths.
SwapChoice choose_swap(SwapMode mode, const SwapCosts& costs, int64_t swap_bytes,
                       int recompute_tokens, SwapTier tier = SwapTier::kHost);

// The tier kv::swap_out would put `pages` full pages of `pool` in now.
SwapTier swap_tier(const kv::KvPool& pool, int pages);

// Updates an exponentially weighted mean (weight `alpha` for the new sample; `mean` 0: first).
double ewma(double mean, double sample, double alpha);

const char* swap_mode_name(SwapMode mode);

// Measures the device -> host and host -> device copy bandwidths of `pool`'s backend with copies
// of sixteen of its pages (1 to 16 MiB; best of 3, a few ms). Fills the two copy fields of
// *costs; false (unchanged) on an error.
bool measure_copy_bandwidth(const kv::KvPool& pool, SwapCosts* costs);

// Measures `pool`'s disk tier as a swap uses it: four records of sixteen pages (1 to 8 MiB)
// written, then read back cold (DiskTier::drop_cache between), then freed; where the pool's device
// memory is not host memory, the staging copies cost the host tier's rates of *costs
// (measure_copy_bandwidth first). Fills the disk fields of *costs; false (unchanged) without a disk
// tier or on a disk error (e.g. no room for a record).
bool measure_disk_swap_bandwidth(kv::KvPool& pool, SwapCosts* costs);

}  // namespace kvsplit::sched
