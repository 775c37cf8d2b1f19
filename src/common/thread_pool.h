// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops).
// parallel_for is called from one thread at a time (the owner); it blocks until done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvsplit {

class ThreadPool {
 public:
  // How long an idle worker polls for the next job before it sleeps on a condition variable.
  // A decode step issues ~100 short jobs back to back; waking a sleeping thread costs tens of
  // microseconds on a VM, which is as long as a whole 768x768 GEMV. Polling is bounded so an idle
  // engine does not burn a core.
  static constexpr int64_t kDefaultSpinMicros = 200;
  static constexpr int64_t kMaxSpinMicros = 1'000'000;  // larger values are clamped to this

  // num_threads >= 1 counts the calling thread: num_threads - 1 workers are started.
  // spin_micros = 0 turns polling off (every job wakes sleeping workers).
  explicit ThreadPool(int num_threads, int64_t spin_micros = kDefaultSpinMicros);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(task) for task in [0, num_tasks), spread over the threads (the caller takes part).
  // Tasks are handed out dynamically; fn must be safe to call concurrently for different tasks.
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& fn);

  // Static partition: fn(begin, end) on at most num_threads contiguous ranges of [0, n), each a
  // multiple of `grain` long (except the last).
  void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_tasks();
  // Polls pred for up to spin_micros_; true as soon as it holds.
  template <typename Pred>
  bool spin_until(Pred pred) const;

  int num_threads_;
  int64_t spin_micros_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;    // guarded by mu_
  uint64_t generation_ = 0;  // job counter (guarded by mu_)
  bool stop_ = false;        // guarded by mu_
  // Lock-free mirrors that polling threads read; written under mu_.
  std::atomic<uint64_t> published_{0};  // == generation_
  std::atomic<bool> stopping_{false};   // == stop_
  std::atomic<int64_t> active_{0};      // tasks of the current job not yet finished
};

}  // namespace kvsplit
