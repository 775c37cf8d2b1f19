// RequestStream: the engine-internal, unbounded event queue of one request. Engine threads push
// (never blocking beyond a short mutex); one consumer drains it through a RequestHandle.
// Thread-safe. Exactly one final event may be pushed; pushing after it is a programmer error.
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
  explicit RequestStream(std::string request_id) : request_id_(std::move(request_id)) {}

  const std::string& request_id() const { return request_id_; }

  // Queues `event` and wakes the consumer (condition variable + notifier, called outside the
  // lock). KVSPLIT_CHECKs that no event follows the final one.
  void push(TokenEvent event);
  bool next(TokenEvent* event, std::chrono::milliseconds timeout);
  bool try_next(TokenEvent* event);
  void set_notifier(std::function<void()> notifier);
  // True once the final event has been pushed.
  bool final_pushed() const;
  // Events pushed and not yet taken by the consumer.
  size_t unread() const;

 private:
  const std::string request_id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;   // guarded by mu_
  std::function<void()> notifier_;  // guarded by mu_
  bool final_pushed_ = false;       // guarded by mu_
};

}  // namespace kvsplit
