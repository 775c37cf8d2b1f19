#include "sched/prefix_routes.h"

#include <algorithm>

namespace kvsplit::sched {

std::vector<int> PrefixRoutes::leading_pages(std::span<const uint64_t> hashes, int workers) const {
  std::vector<int> out(static_cast<size_t>(std::max(0, workers)), 0);
  const int known = std::clamp(workers, 0, kMaxWorkers);
  uint64_t still = known >= 64 ? ~uint64_t{0} : (uint64_t{1} << known) - 1;
  for (size_t k = 0; k < hashes.size() && still != 0; ++k) {
    const auto it = pages_.find(hashes[k]);
    still &= it == pages_.end() ? 0 : it->second.workers;
    for (int i = 0; i < known; ++i)
      if (still & (uint64_t{1} << i)) out[static_cast<size_t>(i)] = static_cast<int>(k) + 1;
  }
  return out;
}

void PrefixRoutes::record(std::span<const uint64_t> hashes, int worker) {
  if (worker < 0 || worker >= kMaxWorkers || capacity_ == 0) return;
  // Last page first, so the first pages are the most recently sent: forgetting trims a prompt
  // from its end (a later page is of no use once an earlier one is forgotten).
  for (auto it = hashes.rbegin(); it != hashes.rend(); ++it) {
    const uint64_t h = *it;
    Page& p = pages_[h];
    p.workers |= uint64_t{1} << worker;
    p.tick = ++tick_;
    order_.emplace_back(h, p.tick);
  }
  // Forget the least recently sent pages beyond the capacity.
  while (pages_.size() > capacity_ && !order_.empty()) {
    const auto [h, tick] = order_.front();
    order_.pop_front();
    const auto it = pages_.find(h);
    if (it != pages_.end() && it->second.tick == tick) pages_.erase(it);
  }
  // Pages sent again leave stale entries behind: compact once they are most of the queue
  // (amortized O(1) per page sent).
  if (order_.size() > 4 * pages_.size() + 64) {
    std::deque<std::pair<uint64_t, uint64_t>> live;
    for (const auto& [h, tick] : order_) {
      const auto it = pages_.find(h);
      if (it != pages_.end() && it->second.tick == tick) live.emplace_back(h, tick);
    }
    order_.swap(live);
  }
}

void PrefixRoutes::forget(std::span<const uint64_t> hashes, int worker) {
  if (worker < 0 || worker >= kMaxWorkers) return;
  for (uint64_t h : hashes) {
    const auto it = pages_.find(h);
    if (it == pages_.end()) continue;
    it->second.workers &= ~(uint64_t{1} << worker);
    if (it->second.workers == 0) pages_.erase(it);  // its queue entries are stale now
  }
}

}  // namespace kvsplit::sched
