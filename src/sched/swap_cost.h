// The temporal cut's choice between swap and recompute for a preempted sequence (kv-cuts.md §3):
// restore bytes over the measured copy bandwidths against its prefill time at the measured
// prefill speed. Plain functions, tested without a model.
#pragma once

#include <cstdint>

#include "kv/kv_pool.h"
#include "kvsplit/kv_cuts.h"

namespace kvsplit::sched {

// Measured on a worker: copy bandwidths between its device and the host tier (bytes/s, at
// start-up) and its prefill speed (tokens/s; an EWMA over its prefill steps). 0: not measured.
struct SwapCosts {
  double d2h_bytes_per_s = 0;
  double h2d_bytes_per_s = 0;
  double prefill_tokens_per_s = 0;
};

struct SwapChoice {
  bool swap = false;
  double swap_ms = 0;       // predicted: copy out now + copy in at resume
  double recompute_ms = 0;  // predicted: prefill of the tokens again
};

// kAlways: swap; kNever: recompute; kAuto: the cheaper prediction (swap while a cost is not
// measured yet: recompute always redoes work). swap_bytes: the pages' bytes (all layers);
// recompute_tokens: the positions a recompute prefills.
SwapChoice choose_swap(SwapMode mode, const SwapCosts& costs, int64_t swap_bytes,
                       int recompute_tokens);

// Updates an exponentially weighted mean (weight `alpha` for the new sample; `mean` 0: first).
double ewma(double mean, double sample, double alpha);

const char* swap_mode_name(SwapMode mode);

// Measures the device -> host and host -> device copy bandwidths of `pool`'s backend with copies
// of sixteen of its pages (1 to 16 MiB; best of 3, a few ms). Fills the two copy fields of
// *costs; false (unchanged) on an error.
bool measure_copy_bandwidth(const kv::KvPool& pool, SwapCosts* costs);

}  // namespace kvsplit::sched
