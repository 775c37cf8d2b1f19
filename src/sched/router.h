// Router: the bounded per-SLA-class queues of admitted requests waiting for a prefill (or
// colocated) worker. Workers pull the best request (priority, then age) when they have room.
// Thread-safe (one mutex; every operation is O(log n)).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvsplit/engine.h"
#include "sched/policy.h"
#include "sched/sequence.h"

namespace kvsplit::sched {

class Router {
 public:
  // `classes` must have passed validate_sla_classes. `on_push` (may be empty) is called after a
  // push, outside the lock, to wake the workers.
  Router(std::vector<SlaClass> classes, std::function<void()> on_push);

  // Queues `seq` (its class_index and queue_deadline set by the caller). kResourceExhausted
  // naming the class and its limit when the class queue is full; `seq` is then left untouched.
  // `notify` false skips the on_push wake-up (a caller holding a lock of its own calls
  // notify_pushed() once it has released it).
  Status push(std::unique_ptr<Sequence>& seq, bool notify = true);
  // Queues every sequence of `seqs` (the completions of one request), or none: the error of the
  // first that does not fit (kResourceExhausted; kInvalidArgument when more than the class's
  // max_queue are asked for at once), `seqs` left untouched.
  Status push_all(std::vector<std::unique_ptr<Sequence>>& seqs, bool notify = true);
  void notify_pushed() const;

  // Pops the best queued sequence if `fits(best)` is true; nullptr otherwise (no skipping past the
  // best one, so large requests are not starved by small ones). Completions held for their first
  // completion's prompt (Sequence::held_for_prompt) are not candidates.
  std::unique_ptr<Sequence> pop_if(const std::function<bool(const Sequence&)>& fits);

  // Removes and returns every sequence whose queue deadline is <= now, but a completion held for
  // its first completion's prompt (Sequence::held_for_prompt; it is due once released).
  std::vector<std::unique_ptr<Sequence>> take_expired(Clock::time_point now);
  // Removes the sequence `key` (tenant and request id) if it is still queued (cancellation).
  // With `only`, only if it is that request (its RequestControl), not a later one that reuses
  // the id after it finished.
  std::unique_ptr<Sequence> remove(const RequestKey& key, const RequestControl* only = nullptr);
  std::vector<std::unique_ptr<Sequence>> take_all();

  int num_queued() const;
  // Per class, in the router's class order and named, read under one lock: its queued sequences
  // and how long the oldest of them has waited since submit at `now` (0: none). Callers pair them
  // with their own per-class figures by name: a SIGHUP may reorder the classes between two reads
  // (the queue depth and wait of one class were reported under another).
  struct ClassQueue {
    std::string name;
    int queued = 0;
    double oldest_wait_ms = 0;
  };
  std::vector<ClassQueue> class_queues(Clock::time_point now) const;
  std::vector<SlaClass> classes() const;
  // Replaces the classes; queued sequences keep their other settings (their counts are dropped
  // when the class list shrinks past their index) and take their class's cut settings (semantic,
  // swap, temporal_step_size: what the KV cache manager moves per class).
  void set_classes(std::vector<SlaClass> classes);
  // Copies the current cut settings of `sla`'s class (by name) into it; false when the class is
  // gone. A handoff admitted on a decode worker takes them (a class-scoped change reaches a
  // request wherever it was when the change came: queued, prefilling or in flight).
  bool refresh_cut_settings(SlaClass* sla) const;

 private:
  struct Key {
    PriorityKey prio;
    bool operator<(const Key& o) const { return serves_before(prio, o.prio); }
  };
  struct Entry {
    std::unique_ptr<Sequence> seq;
    Clock::time_point deadline;
  };
  std::unique_ptr<Sequence> erase_locked(int64_t arrival);

  mutable std::mutex mu_;
  std::vector<SlaClass> classes_;
  std::vector<int> queued_;             // per class
  std::map<Key, int64_t> by_priority_;  // -> arrival
  std::set<std::pair<Clock::time_point, int64_t>> by_deadline_;
  std::unordered_map<int64_t, Entry> entries_;  // arrival -> entry
  std::unordered_map<RequestKey, int64_t, RequestKeyHash> by_key_;
  std::function<void()> on_push_;
};

}  // namespace kvsplit::sched
