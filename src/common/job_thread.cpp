#include "common/job_thread.h"

#include <string>
#include <system_error>
#include <utility>

#include "common/check.h"

namespace kvsplit {

JobThread::JobThread() : thread_([this] { loop(); }) {}

StatusOr<std::unique_ptr<JobThread>> JobThread::create() {
  try {
    return std::make_unique<JobThread>();
  } catch (const std::system_error& e) {
    return resource_exhausted(std::string("cannot start a job thread: ") + e.what());
  }
}

JobThread::~JobThread() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !running_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void JobThread::post(std::function<Status()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVSPLIT_CHECK_MSG(!posted_, "JobThread::post: the previous job was not waited for");
    job_ = std::move(job);
    posted_ = running_ = true;
  }
  cv_.notify_all();
}

Status JobThread::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!posted_) return ok_status();
  cv_.wait(lock, [&] { return !running_; });
  posted_ = false;
  return std::exchange(result_, ok_status());
}

void JobThread::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || running_; });
    if (stop_) return;
    std::function<Status()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    Status st = job();
    job = nullptr;  // the job's captures die on this thread, before the owner is told
    lock.lock();
    result_ = std::move(st);
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace kvsplit
