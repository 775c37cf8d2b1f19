// A worker step's forward time against the tokens it carries, measured on the steps the worker
// runs: the time-based fair-prefill cap (pools.max_chunk_ms, docs/kv-cuts.md "Fair time
// slicing") sizes a long prompt's chunk from it, so the cap follows what a step costs on this
// backend and model instead of being one token count for every device.
#pragma once

namespace kvsplit::sched {

// Exponentially weighted least squares of t = fixed_ms + ms_per_token * tokens over the steps
// observed (each older step's weight decays by kDecay per step: about the last 20 steps count).
// A GPU step's time is mostly fixed (the weight pass) and grows little per token; a CPU step's
// is mostly per token; late in a long prefill a token costs more (its queries attend to every
// token before the chunk), which the recent steps show.
class StepCostModel {
 public:
  static constexpr double kDecay = 0.95;
  static constexpr int kMinSteps = 4;

  void observe(int tokens, double ms);
  // At least kMinSteps steps observed.
  bool ready() const { return steps_ >= kMinSteps; }
  // The fit. Without spread in the steps' token counts (or a fit with a negative slope or
  // intercept) the whole time is taken as per-token: fixed 0, ms_per_token = mean time / mean
  // tokens. That overestimates a step larger than the observed ones (smaller chunks), and
  // underestimates a smaller one where the backend has a large fixed cost: with a budget below
  // the observed steps' time it may promise tokens that do not fit.
  double fixed_ms() const { return fit().fixed_ms; }
  double ms_per_token() const { return fit().ms_per_token; }
  // The most tokens a step may carry to be predicted to last at most budget_ms; 0 when not
  // even the fixed part fits (and before ready()).
  int tokens_within(double budget_ms) const;

 private:
  struct Fit {
    double fixed_ms = 0, ms_per_token = 0;
  };
  Fit fit() const;

  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // decayed sums of 1, x, y, x^2, xy
  int steps_ = 0;                                   // observed, counted up to kMinSteps
};

}  // namespace kvsplit::sched
