#include "sched/policy.h"

#include <algorithm>

namespace kvsplit::sched {

std::vector<int> plan_prefill_chunks(std::span<const int> remaining, int budget, int min_chunk) {
  std::vector<int> chunk(remaining.size(), 0);
  min_chunk = std::max(min_chunk, 1);
  int left = std::max(budget, 0);
  while (left > 0) {
    int active = 0;
    for (size_t i = 0; i < remaining.size(); ++i) active += remaining[i] > chunk[i];
    if (active == 0) break;
    const int share = std::max(min_chunk, left / active);
    for (size_t i = 0; i < remaining.size() && left > 0; ++i) {
      const int give = std::min({remaining[i] - chunk[i], share, left});
      if (give <= 0) continue;
      chunk[i] += give;
      left -= give;
    }
  }
  return chunk;
}

ServiceSums::ServiceSums(std::vector<PriorityKey> keys)
    : keys_(std::move(keys)), tree_(keys_.size() + 1, 0) {
  std::sort(keys_.begin(), keys_.end(),
            [](const PriorityKey& a, const PriorityKey& b) { return serves_before(a, b); });
}

size_t ServiceSums::slot(const PriorityKey& key) const {
  return static_cast<size_t>(std::lower_bound(keys_.begin(), keys_.end(), key,
                                              [](const PriorityKey& a, const PriorityKey& b) {
                                                return serves_before(a, b);
                                              }) -
                             keys_.begin());
}

void ServiceSums::add(const PriorityKey& key, int n) {
  for (size_t i = slot(key) + 1; i < tree_.size(); i += i & (~i + 1)) tree_[i] += n;
}

int ServiceSums::before(const PriorityKey& key) const {
  int64_t sum = 0;
  for (size_t i = slot(key); i > 0; i -= i & (~i + 1)) sum += tree_[i];
  return static_cast<int>(sum);
}

int choose_preemption_victim(std::span<const PriorityKey> candidates) {
  int victim = -1;
  for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
    // The victim is the one served last.
    if (victim < 0 || serves_before(candidates[victim], candidates[i])) victim = i;
  }
  return victim;
}

int choose_decode_worker(std::span<const DecodeLoad> workers, std::span<const int> cached,
                         int need) {
  int best = -1;
  double best_load = 0;
  const bool aware = cached.size() == workers.size();
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    const DecodeLoad& w = workers[i];
    const int total = std::max(w.kv_blocks_total, 1);
    // The pages it would share count only where the offer fits whole: an idle cached page (free
    // here) still takes a block when shared.
    const bool fits = w.kv_blocks_free - w.kv_blocks_incoming >= need;
    const int shared = aware && fits ? std::min(std::max(0, cached[i]), need) : 0;
    const double load =
        static_cast<double>(w.kv_blocks_total - w.kv_blocks_free + w.kv_blocks_incoming - shared) /
        total;
    const bool full = w.slots_full();
    const bool best_full = best >= 0 && workers[best].slots_full();
    if (best < 0 || (!full && best_full) ||
        (full == best_full &&
         (load < best_load || (load == best_load && w.running < workers[best].running)))) {
      best = i;
      best_load = load;
    }
  }
  return best;
}

void RecentMax::add(int64_t v) {
  values_[next_] = v;
  next_ = (next_ + 1) % kWindow;
  max_ = *std::max_element(values_.begin(), values_.end());
}

}  // namespace kvsplit::sched
