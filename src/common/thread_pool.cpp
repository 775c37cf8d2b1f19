#include "common/thread_pool.h"

#include <algorithm>

namespace kvsplit {

// One job at a time: fn_, num_tasks_, next_task_ (next index to hand out) and active_ (tasks not
// yet finished) describe it, all guarded by mu_. The caller returns as soon as every task has
// finished; a worker that wakes late (e.g. descheduled on a busy machine) finds no task left and
// goes back to sleep without being waited for.

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_task_ < num_tasks_) {
    const int64_t task = next_task_++;
    const std::function<void(int64_t)>* fn = fn_;
    lock.unlock();
    (*fn)(task);
    lock.lock();
    if (--active_ == 0) cv_done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks();
  }
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    active_ = num_tasks;
    ++generation_;
  }
  if (num_tasks - 1 >= static_cast<int64_t>(workers_.size())) {
    cv_start_.notify_all();
  } else {
    for (int64_t i = 0; i < num_tasks - 1; ++i) cv_start_.notify_one();
  }
  run_tasks();
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
  num_tasks_ = 0;
  next_task_ = 0;
}

void ThreadPool::parallel_range(int64_t n, int64_t grain,
                                const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(units, num_threads_);
  const int64_t per = (units + parts - 1) / parts;
  parallel_for(parts, [&](int64_t p) {
    const int64_t begin = p * per * grain;
    const int64_t end = std::min(n, (p + 1) * per * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace kvsplit
