// Cache-aware handoff routing (disaggregated mode with the prefix cache on): what a prefill worker
// remembers of the pages it sent to each decode worker, so that an offer whose prompt a decode
// worker is likely to hold in its prefix cache goes there (choose_decode_worker's `cached`).
//
// An approximation by design, as a request router's view of its workers' caches is: the decode
// worker may have evicted the pages since, and other prefill workers' handoffs are not seen. A
// wrong guess costs only the copy the handoff makes anyway (the decode worker's own lookup,
// KvPool::share_device_prefix, decides what is shared). Owned by one prefill worker's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvsplit::sched {

class PrefixRoutes {
 public:
  // At most `capacity` pages remembered (the least recently sent forgotten first); decode
  // workers of index >= kMaxWorkers are not remembered.
  static constexpr int kMaxWorkers = 64;
  explicit PrefixRoutes(size_t capacity) : capacity_(capacity) {}

  // For each of `workers` decode workers: how many leading pages of a prompt (`hashes`: its
  // pages' chained hashes in page order, PrefixCache::next) were sent to it.
  std::vector<int> leading_pages(std::span<const uint64_t> hashes, int workers) const;
  // Remembers that the pages `hashes` were sent to decode worker `worker`.
  void record(std::span<const uint64_t> hashes, int worker);
  // Forgets that: the offer was not delivered there (taken back and offered to another).
  void forget(std::span<const uint64_t> hashes, int worker);
  size_t size() const { return pages_.size(); }

 private:
  struct Page {
    uint64_t workers = 0;  // bit i: sent to decode worker i
    uint64_t tick = 0;     // last sent
  };
  size_t capacity_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Page> pages_;
  // (hash, tick) in sending order; an entry whose tick is no longer its page's is stale (the
  // page was sent again since) and skipped when forgetting.
  std::deque<std::pair<uint64_t, uint64_t>> order_;
};

}  // namespace kvsplit::sched
