#include "common/fair_prefill.h"

#include <algorithm>

namespace kvsplit::common {

std::vector<int> plan_fair_prefill(std::span<const PrefillDemand> prompts, int budget,
                                   int min_chunk, int max_chunk, int64_t step) {
  const size_t n = prompts.size();
  std::vector<int> chunk(n, 0);
  min_chunk = std::max(min_chunk, 1);
  int left = std::max(budget, 0);
  // What each prompt may take this step: its remaining work, under the cap.
  std::vector<int> limit(n);
  for (size_t i = 0; i < n; ++i) {
    limit[i] = std::max(prompts[i].remaining, 0);
    if (max_chunk > 0) limit[i] = std::min(limit[i], max_chunk);
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  // 1. Progress: one chunk each, round robin within a priority. A prompt never served ranks by
  // the step it started waiting, not first: short prompts that keep arriving would otherwise take
  // the whole budget, step after step, ahead of a starving long prompt that came before them.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (prompts[a].priority != prompts[b].priority)
      return prompts[a].priority > prompts[b].priority;
    return prompts[a].since() < prompts[b].since();
  });
  auto is_long = [&](size_t i) { return max_chunk > 0 && prompts[i].remaining > max_chunk; };
  for (size_t i : order) {
    // A long prompt that was served within the last kMaxPrefillYieldSteps steps takes no part: it
    // may yield to shorter prompts below.
    if (is_long(i) && step >= 0 && step - prompts[i].last_served <= kMaxPrefillYieldSteps) continue;
    const int give = std::min({limit[i], min_chunk, left});
    chunk[i] += give;
    left -= give;
  }
  // 2. The rest: higher priority first, the least remaining first within a priority (ties: the
  // least recently served, then input order), each up to its limit.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (prompts[a].priority != prompts[b].priority)
      return prompts[a].priority > prompts[b].priority;
    if (prompts[a].remaining != prompts[b].remaining)
      return prompts[a].remaining < prompts[b].remaining;
    return prompts[a].last_served < prompts[b].last_served;
  });
  for (size_t k = 0; k < n; ++k) {
    const size_t i = order[k];
    // A long prompt yields to a shorter one of at least its priority that has a chunk in this
    // step (listed before it): it keeps only what the progress pass gave it (its min chunk when
    // starving, else nothing).
    const bool long_prompt = is_long(i);
    bool yields = false;
    for (size_t j = 0; j < k && long_prompt && !yields; ++j) {
      yields = chunk[order[j]] > 0 && prompts[order[j]].priority >= prompts[i].priority;
    }
    if (yields) continue;
    const int give = std::min(limit[i] - chunk[i], left);
    chunk[i] += give;
    left -= give;
  }
  return chunk;
}

}  // namespace kvsplit::common
