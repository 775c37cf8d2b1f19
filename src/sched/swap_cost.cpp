#include "sched/swap_cost.h"

namespace kvsplit::sched {

SwapChoice choose_swap(SwapMode mode, const SwapCosts& costs, int64_t swap_bytes,
                       int recompute_tokens) {
  SwapChoice c;
  const double bytes = static_cast<double>(swap_bytes);
  const bool copies_known = costs.d2h_bytes_per_s > 0 && costs.h2d_bytes_per_s > 0;
  if (copies_known)
    c.swap_ms = 1e3 * (bytes / costs.d2h_bytes_per_s + bytes / costs.h2d_bytes_per_s);
  if (costs.prefill_tokens_per_s > 0)
    c.recompute_ms = 1e3 * recompute_tokens / costs.prefill_tokens_per_s;
  switch (mode) {
    case SwapMode::kAlways:
      c.swap = true;
      break;
    case SwapMode::kNever:
      c.swap = false;
      break;
    case SwapMode::kAuto:
      c.swap = !copies_known || costs.prefill_tokens_per_s <= 0 || c.swap_ms < c.recompute_ms;
      break;
  }
  return c;
}

double ewma(double mean, double sample, double alpha) {
  return mean <= 0 ? sample : mean + alpha * (sample - mean);
}

const char* swap_mode_name(SwapMode mode) {
  switch (mode) {
    case SwapMode::kAuto:
      return "auto";
    case SwapMode::kAlways:
      return "always";
    case SwapMode::kNever:
      return "never";
  }
  return "?";
}

}  // namespace kvsplit::sched
