// RequestStream: the engine-internal, unbounded event queue of one request. Engine threads push
// (never blocking beyond a short mutex); one consumer drains it through a RequestHandle.
// Thread-safe. Exactly one final event per completion (Request::n) may be pushed; the stream marks
// the last of them `last`, and pushing after it is a programmer error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "kvsplit/engine.h"

namespace kvsplit {

class RequestStream {
 public:
  explicit RequestStream(std::string request_id, int completions = 1)
      : request_id_(std::move(request_id)), completions_(completions) {}

  const std::string& request_id() const { return request_id_; }
  int completions() const { return completions_; }

  // Queues `event` and wakes the consumer (condition variable + notifier, called outside the
  // lock). Sets event.last on the final event of the last completion to end; KVSPLIT_CHECKs that
  // no event follows it.
  void push(TokenEvent event);
  bool next(TokenEvent* event, std::chrono::milliseconds timeout);
  bool try_next(TokenEvent* event);
  void set_notifier(std::function<void()> notifier);
  // True once the last event has been pushed.
  bool last_pushed() const;
  // Events pushed and not yet taken by the consumer.
  size_t unread() const;

 private:
  const std::string request_id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;   // guarded by mu_
  std::function<void()> notifier_;  // guarded by mu_
  const int completions_;
  int finals_ = 0;            // guarded by mu_
  bool last_pushed_ = false;  // guarded by mu_
};

}  // namespace kvsplit
