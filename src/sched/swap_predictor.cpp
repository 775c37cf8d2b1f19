#include "sched/swap_predictor.h"

#include <algorithm>
#include <numeric>

namespace kvsplit::sched {

int SwapPredictor::choose_victim(std::span<const SchedSeq* const> candidates) const {
  if (candidates.empty()) return -1;
  return rank_victims(candidates).front();
}

bool DefaultSwapPredictor::needed_after(const SchedSeq& a, const SchedSeq& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.slack_ms != b.slack_ms) return a.slack_ms > b.slack_ms;
  if (a.step_interval_ewma_ms != b.step_interval_ewma_ms)
    return a.step_interval_ewma_ms > b.step_interval_ewma_ms;
  return a.arrival > b.arrival;
}

std::vector<int> DefaultSwapPredictor::rank_victims(
    std::span<const SchedSeq* const> candidates) const {
  std::vector<int> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return needed_after(*candidates[a], *candidates[b]); });
  return order;
}

std::vector<int> DefaultSwapPredictor::prefetch(std::span<const SchedSeq> waiting,
                                                int64_t next_step, int free_blocks) const {
  std::vector<int> due;
  for (int i = 0; i < static_cast<int>(waiting.size()); ++i)
    if (waiting[i].swapped_pages > 0 && waiting[i].resume_step <= next_step) due.push_back(i);
  std::stable_sort(due.begin(), due.end(), [&](int a, int b) {
    return serves_before({waiting[a].priority, waiting[a].arrival},
                         {waiting[b].priority, waiting[b].arrival});
  });
  std::vector<int> out;
  int pages = 0;
  for (int i : due) {
    pages += waiting[i].swapped_pages;
    if (!out.empty() && pages > free_blocks) break;
    out.push_back(i);
  }
  return out;
}

std::shared_ptr<const SwapPredictor> default_swap_predictor() {
  static const std::shared_ptr<const SwapPredictor> instance =
      std::make_shared<DefaultSwapPredictor>();
  return instance;
}

}  // namespace kvsplit::sched
