#include "sched/router.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace kvsplit::sched {
namespace {

void copy_cut_settings(const SlaClass& from, SlaClass* to) {
  to->semantic = from.semantic;
  to->swap = from.swap;
  to->temporal_step_size = from.temporal_step_size;
}

}  // namespace

Router::Router(std::vector<SlaClass> classes, std::function<void()> on_push)
    : classes_(std::move(classes)), queued_(classes_.size(), 0), on_push_(std::move(on_push)) {}

Status Router::push(std::unique_ptr<Sequence>& seq, bool notify) {
  std::vector<std::unique_ptr<Sequence>> one;
  one.push_back(std::move(seq));
  Status st = push_all(one, notify);
  if (!st.ok()) seq = std::move(one[0]);
  return st;
}

Status Router::push_all(std::vector<std::unique_ptr<Sequence>>& seqs, bool notify) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The class by name in the list of now: a reload (set_classes) between the caller's look-up
    // and this push may have reordered or shortened it, and its index would count the request
    // against another class's max_queue. A class gone since is counted nowhere (as set_classes
    // does with those queued). Every sequence must fit, or none is queued.
    std::vector<int> adding(queued_.size(), 0);
    for (std::unique_ptr<Sequence>& seq : seqs) {
      int c = static_cast<int>(classes_.size());
      for (size_t i = 0; i < classes_.size(); ++i) {
        if (classes_[i].name == seq->sla.name) c = static_cast<int>(i);
      }
      seq->class_index = c;
      if (c < static_cast<int>(queued_.size())) ++adding[c];
    }
    for (size_t c = 0; c < adding.size(); ++c) {
      if (adding[c] == 0) continue;
      if (adding[c] > classes_[c].max_queue) {  // never, however empty the queue
        return invalid_argument(
            fmt::format("{} sequences to queue at once exceed SLA class '{}' max_queue of {}",
                        adding[c], classes_[c].name, classes_[c].max_queue));
      }
      if (queued_[c] + adding[c] > classes_[c].max_queue) {
        return resource_exhausted(fmt::format(
            "SLA class '{}' queue is full ({} queued, max_queue {}{})", classes_[c].name,
            queued_[c], classes_[c].max_queue,
            seqs.size() > 1 ? fmt::format("; {} sequences to queue", seqs.size()) : ""));
      }
    }
    for (std::unique_ptr<Sequence>& seq : seqs) {
      const int c = seq->class_index;
      if (c < static_cast<int>(queued_.size())) {
        ++queued_[c];
        // The class's cut settings of now: a KV cache manager change between the caller's
        // look-up and this push (set_classes) reached only the requests already queued.
        copy_cut_settings(classes_[c], &seq->sla);
      }
      const int64_t arrival = seq->arrival;
      by_priority_.emplace(Key{{seq->priority, arrival}}, arrival);
      by_deadline_.emplace(seq->queue_deadline, arrival);
      by_key_.emplace(seq->ctl->key(), arrival);
      const Clock::time_point deadline = seq->queue_deadline;
      entries_.emplace(arrival, Entry{std::move(seq), deadline});
    }
  }
  if (notify) notify_pushed();
  return ok_status();
}

void Router::notify_pushed() const {
  if (on_push_) on_push_();
}

std::unique_ptr<Sequence> Router::erase_locked(int64_t arrival) {
  auto it = entries_.find(arrival);
  KVSPLIT_CHECK(it != entries_.end());
  std::unique_ptr<Sequence> seq = std::move(it->second.seq);
  by_priority_.erase(Key{{seq->priority, arrival}});
  by_deadline_.erase({it->second.deadline, arrival});
  by_key_.erase(seq->ctl->key());
  if (seq->class_index < static_cast<int>(queued_.size())) --queued_[seq->class_index];
  entries_.erase(it);
  return seq;
}

std::unique_ptr<Sequence> Router::pop_if(const std::function<bool(const Sequence&)>& fits) {
  std::lock_guard<std::mutex> lock(mu_);
  // The best sequence that may start: completions held for their first completion's prompt
  // (Sequence::held_for_prompt) are passed over, they would only compute it again.
  for (const auto& [key, arrival] : by_priority_) {
    const Sequence& seq = *entries_.at(arrival).seq;
    if (seq.held_for_prompt()) continue;
    if (!fits(seq)) return nullptr;
    return erase_locked(arrival);
  }
  return nullptr;
}

std::vector<std::unique_ptr<Sequence>> Router::take_expired(Clock::time_point now) {
  std::vector<std::unique_ptr<Sequence>> out;
  std::lock_guard<std::mutex> lock(mu_);
  // Not a completion held for its first completion's prompt: that one's own deadline (or its end)
  // releases it, and its wait counts from then on (its deadline moves by the time it was held).
  std::vector<int64_t> due;
  for (auto it = by_deadline_.begin(); it != by_deadline_.end() && it->first <= now; ++it) {
    const Sequence& seq = *entries_.at(it->second).seq;
    if (seq.held_for_prompt()) continue;
    const Clock::time_point released = seq.released_at();
    if (released > seq.submit_time && it->first + (released - seq.submit_time) > now) continue;
    due.push_back(it->second);
  }
  for (int64_t arrival : due) out.push_back(erase_locked(arrival));
  return out;
}

std::unique_ptr<Sequence> Router::remove(const RequestKey& key, const RequestControl* only) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  if (only != nullptr && entries_.at(it->second).seq->ctl.get() != only) return nullptr;
  return erase_locked(it->second);
}

std::vector<std::unique_ptr<Sequence>> Router::take_all() {
  std::vector<std::unique_ptr<Sequence>> out;
  std::lock_guard<std::mutex> lock(mu_);
  while (!by_priority_.empty()) out.push_back(erase_locked(by_priority_.begin()->second));
  return out;
}

int Router::num_queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_.size());
}

std::vector<Router::ClassQueue> Router::class_queues(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ClassQueue> out(classes_.size());
  for (size_t k = 0; k < out.size(); ++k) {
    out[k].name = classes_[k].name;
    if (k < queued_.size()) out[k].queued = queued_[k];
  }
  for (const auto& [arrival, entry] : entries_) {
    const size_t k = static_cast<size_t>(entry.seq->class_index);
    if (k >= out.size()) continue;
    out[k].oldest_wait_ms =
        std::max(out[k].oldest_wait_ms,
                 std::chrono::duration<double, std::milli>(now - entry.seq->submit_time).count());
  }
  return out;
}

std::vector<SlaClass> Router::classes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return classes_;
}

bool Router::refresh_cut_settings(SlaClass* sla) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const SlaClass& c : classes_) {
    if (c.name != sla->name) continue;
    copy_cut_settings(c, sla);
    return true;
  }
  return false;
}

void Router::set_classes(std::vector<SlaClass> classes) {
  std::lock_guard<std::mutex> lock(mu_);
  // Re-count queued sequences by class name under the new list.
  std::vector<int> queued(classes.size(), 0);
  for (auto& [arrival, entry] : entries_) {
    int idx = -1;
    for (size_t i = 0; i < classes.size(); ++i) {
      if (classes[i].name == entry.seq->sla.name) idx = static_cast<int>(i);
    }
    entry.seq->class_index = idx >= 0 ? idx : static_cast<int>(classes.size());
    if (idx >= 0) {
      ++queued[idx];
      copy_cut_settings(classes[static_cast<size_t>(idx)], &entry.seq->sla);
    }
  }
  classes_ = std::move(classes);
  queued_ = std::move(queued);
}

}  // namespace kvsplit::sched
