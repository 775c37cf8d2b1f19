// One persistent thread that runs jobs for one owner thread, one job at a time. The spatial cut
// uses one per peer shard of a CPU shard group: the job thread drives that shard's backend (it is
// the calling thread of the backend's ThreadPool), so each shard's partial attention runs on its
// own thread group while the owner computes the home shard's (model/sharded_attention.h).
//
// Thread-safety: post() and wait() are called by the owner only, alternately (post, wait, post,
// ...); a second post() before wait() is a programmer error (KVSPLIT_CHECK). Everything the owner
// wrote before post() is visible to the job, and everything the job wrote is visible to the owner
// after wait() returns (the hand-over is under a mutex). The job thread sleeps on a condition
// variable between jobs (it never polls, so an idle shard holds no core). The destructor waits for
// a job still running, then joins the thread.
//
// Creating one starts a thread, which the system may refuse (e.g. ulimit -u): the constructor then
// throws std::system_error, as std::thread does; create() returns the refusal as a Status instead.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "kvsplit/status.h"

namespace kvsplit {

class JobThread {
 public:
  JobThread();  // throws std::system_error when the thread cannot be started
  ~JobThread();
  // A started JobThread, or kResourceExhausted naming the system's error when it refuses the
  // thread. Never throws.
  static StatusOr<std::unique_ptr<JobThread>> create();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // Hands `job` to the thread and returns at once. `job` must outlive the matching wait().
  void post(std::function<Status()> job);
  // Blocks until the posted job has run; returns its Status (ok when nothing was posted).
  Status wait();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;   // job posted, job done, stop
  std::function<Status()> job_;  // guarded by mu_
  bool posted_ = false;          // a job was posted and wait() has not returned yet
  bool running_ = false;         // the thread has a job to run (set by post, cleared when done)
  bool stop_ = false;
  Status result_;
  std::thread thread_;  // last: started once the fields above exist
};

}  // namespace kvsplit
