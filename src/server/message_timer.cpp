#include "server/message_timer.h"

#include <fmt/format.h>

#include <vector>

namespace kvsplit::server {

MessageTimer::MessageTimer(std::chrono::milliseconds timeout)
    : timeout_(timeout), thread_([this] { run(); }) {}

MessageTimer::~MessageTimer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

uint64_t MessageTimer::start(std::weak_ptr<MessageWaiter> call, bool generate) {
  bool wake;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    wake = pending_.empty();  // else the thread waits for an earlier deadline already
    pending_.emplace(
        id, Pending{std::chrono::steady_clock::now() + timeout_, std::move(call), generate});
  }
  if (wake) cv_.notify_one();
  return id;
}

void MessageTimer::done(uint64_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(id);
}

int MessageTimer::end_generate(const grpc::Status& status) {
  std::vector<std::shared_ptr<MessageWaiter>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (!it->second.generate) {
        ++it;
        continue;
      }
      if (auto call = it->second.call.lock()) calls.push_back(std::move(call));
      it = pending_.erase(it);
    }
  }
  int ended = 0;
  for (const auto& call : calls) ended += call->end_waiting(status) ? 1 : 0;
  return ended;
}

void MessageTimer::run() {
  const grpc::Status expired(grpc::StatusCode::DEADLINE_EXCEEDED,
                             fmt::format("no request message within {} ms "
                                         "(server.request_message_timeout_ms)",
                                         timeout_.count()));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (pending_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      continue;
    }
    const auto first = pending_.begin();
    const auto deadline = first->second.deadline;  // a copy: the entry may go while waiting
    if (std::chrono::steady_clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    std::weak_ptr<MessageWaiter> weak = std::move(first->second.call);
    pending_.erase(first);
    lock.unlock();
    // Not under mu_: the call takes its own lock, and finishing it may run its callbacks.
    if (auto call = weak.lock()) call->end_waiting(expired);
    lock.lock();
  }
}

}  // namespace kvsplit::server
