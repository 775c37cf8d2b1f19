// ThreadPool, the pool every CPU backend op and the workers' parallel sampling run on. Labelled
// concurrency with the scheduler tests, so it also runs under TSan.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvsplit {
namespace {

// The pool every op runs on: each task of each job runs exactly once, jobs back to back, whether
// idle workers poll (default), never poll (0) or poll briefly and then sleep (1 us); the pauses
// between some jobs make polling workers fall asleep so that the next job has to wake them.
TEST(ThreadPool, EveryTaskRunsOncePerJob) {
  for (int64_t spin : {ThreadPool::kDefaultSpinMicros, int64_t{0}, int64_t{1}}) {
    for (int threads : {1, 2, 4}) {
      ThreadPool pool(threads, spin);
      for (int job = 0; job < 3000; ++job) {
        const int64_t num_tasks = job % 11;
        std::vector<std::atomic<int>> hits(num_tasks);
        pool.parallel_for(num_tasks, [&](int64_t t) { hits[t].fetch_add(1); });
        for (int64_t t = 0; t < num_tasks; ++t)
          ASSERT_EQ(hits[t].load(), 1) << spin << " " << threads << " " << job;
        if (job % 500 == 0) std::this_thread::sleep_for(std::chrono::microseconds(400));
      }
      std::vector<std::atomic<int>> covered(1001);
      pool.parallel_range(1001, 16, [&](int64_t b, int64_t e) {
        EXPECT_EQ(b % 16, 0);
        for (int64_t i = b; i < e; ++i) covered[i].fetch_add(1);
      });
      for (auto& c : covered) ASSERT_EQ(c.load(), 1);
    }
  }
}

// A pool destroyed while its workers poll, and one destroyed while they sleep, joins cleanly.
TEST(ThreadPool, DestroysWhetherWorkersPollOrSleep) {
  for (int64_t spin : {ThreadPool::kDefaultSpinMicros, int64_t{0}, int64_t{1}}) {
    std::atomic<int> ran{0};
    {
      ThreadPool pool(3, spin);
      pool.parallel_for(3, [&](int64_t) { ran.fetch_add(1); });
    }
    {
      ThreadPool pool(3, spin);
      pool.parallel_for(3, [&](int64_t) { ran.fetch_add(1); });
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(ran.load(), 6) << spin;
  }
}

}  // namespace
}  // namespace kvsplit
