#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvsplit {

// One job at a time: fn_, num_tasks_, next_task_ (next index to hand out) and active_ (tasks not
// yet finished) describe it; the first three are guarded by mu_. The caller returns as soon as
// every task has finished; a worker that wakes late (e.g. descheduled on a busy machine) finds no
// task left and goes back to waiting without being waited for.
//
// Waiting is two-phase. A thread first polls an atomic mirror (published_ for workers, active_
// for the caller) for up to spin_micros_, then sleeps on a condition variable whose predicate is
// checked under mu_. Every state change is made under mu_ and followed by a notify, so a thread
// that gives up polling and sleeps cannot miss a wakeup.

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads, int64_t spin_micros)
    : num_threads_(std::max(1, num_threads)),
      spin_micros_(std::clamp<int64_t>(spin_micros, 0, kMaxSpinMicros)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_.store(true, std::memory_order_release);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

template <typename Pred>
bool ThreadPool::spin_until(Pred pred) const {
  if (spin_micros_ == 0) return pred();
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::microseconds(spin_micros_);
  for (int64_t iter = 0;; ++iter) {
    if (pred()) return true;
    cpu_relax();
    if ((iter & 63) == 63) {
      if (Clock::now() >= deadline) return pred();
      // Past the first stretch, let other runnable threads (another pool, the server) have the
      // core: on an oversubscribed machine pure polling would delay the very work it waits for.
      if (iter >= 1024) std::this_thread::yield();
    }
  }
}

void ThreadPool::run_tasks() {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_task_ < num_tasks_) {
    const int64_t task = next_task_++;
    const std::function<void(int64_t)>* fn = fn_;
    lock.unlock();
    (*fn)(task);
    lock.lock();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] {
      return published_.load(std::memory_order_acquire) != seen ||
             stopping_.load(std::memory_order_acquire);
    });
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
    active_.store(num_tasks, std::memory_order_relaxed);
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  // Cheap when every worker is polling (no waiters on the condition variable).
  if (num_tasks - 1 >= static_cast<int64_t>(workers_.size())) {
    cv_start_.notify_all();
  } else {
    for (int64_t i = 0; i < num_tasks - 1; ++i) cv_start_.notify_one();
  }
  run_tasks();
  spin_until([&] { return active_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
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
