#include "sched/step_cost.h"

#include <cmath>
#include <limits>

namespace kvsplit::sched {

void StepCostModel::observe(int tokens, double ms) {
  if (tokens <= 0 || !(ms >= 0) || !std::isfinite(ms)) return;
  const double x = tokens;
  w_ = kDecay * w_ + 1;
  x_ = kDecay * x_ + x;
  y_ = kDecay * y_ + ms;
  xx_ = kDecay * xx_ + x * x;
  xy_ = kDecay * xy_ + x * ms;
  if (steps_ < kMinSteps) ++steps_;  // only ready() reads it
}

StepCostModel::Fit StepCostModel::fit() const {
  if (w_ <= 0 || x_ <= 0) return {};
  const double mx = x_ / w_, my = y_ / w_;
  const double var = xx_ / w_ - mx * mx;
  // Spread below 1 token (relative to the mean's square: rounding) is no spread.
  if (var > 1e-9 * mx * mx && var > 0.25) {
    const double b = (xy_ / w_ - mx * my) / var;
    const double a = my - b * mx;
    if (b > 0 && a >= 0) return {a, b};
  }
  return {0, my / mx};
}

int StepCostModel::tokens_within(double budget_ms) const {
  if (!ready()) return 0;
  const auto [a, b] = fit();
  if (budget_ms <= a) return 0;
  if (b <= 0) return std::numeric_limits<int>::max();
  const double n = std::floor((budget_ms - a) / b);
  return n >= static_cast<double>(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max()
                                                                   : static_cast<int>(n);
}

}  // namespace kvsplit::sched
