#include "sched/request_stream.h"

#include "common/check.h"

namespace kvsplit {

void RequestStream::push(TokenEvent event) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVSPLIT_CHECK_MSG(!last_pushed_, "event pushed after the last event");
    if (event.final) ++finals_;
    event.last = event.final && finals_ >= completions_;
    last_pushed_ = event.last;
    events_.push_back(std::move(event));
    notify = notifier_;
  }
  cv_.notify_all();
  if (notify) notify();
}

bool RequestStream::next(TokenEvent* event, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestStream::try_next(TokenEvent* event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestStream::set_notifier(std::function<void()> notifier) {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notifier_ = notifier;
    pending = !events_.empty();
  }
  if (pending && notifier) notifier();
}

size_t RequestStream::unread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

bool RequestStream::last_pushed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_pushed_;
}

// ---- RequestHandle (public API) ----

const std::string& RequestHandle::request_id() const {
  static const std::string kEmpty;
  return stream_ ? stream_->request_id() : kEmpty;
}

bool RequestHandle::next(TokenEvent* event, std::chrono::milliseconds timeout) {
  return stream_ && stream_->next(event, timeout);
}

bool RequestHandle::try_next(TokenEvent* event) { return stream_ && stream_->try_next(event); }

void RequestHandle::set_notifier(std::function<void()> notifier) {
  if (stream_) stream_->set_notifier(std::move(notifier));
}

}  // namespace kvsplit
