// The time limit for a call's request message (server.request_message_timeout_ms). The
// Generation methods admit a call from its headers, and an admitted Generate call holds a stream
// slot while it waits for its message: without a limit a client sending only headers would hold
// the slot for as long as its connection lives. One thread of its own sleeps until the earliest
// pending limit and ends the calls past theirs. Every call gets the same limit, so the pending
// ones expire in the order they started. Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace kvsplit::server {

// A call that may be waiting for its request message.
class MessageWaiter {
 public:
  // Ends the call with `status` when it is still waiting (nothing else will finish it); whether
  // it did. Any thread, any number of times: a call is finished once.
  virtual bool end_waiting(const grpc::Status& status) = 0;

 protected:
  ~MessageWaiter() = default;
};

class MessageTimer {
 public:
  explicit MessageTimer(std::chrono::milliseconds timeout);
  ~MessageTimer();  // joins; pending calls are left alone (the gRPC server is shut down)

  // Starts the limit of `call`: an id for done(). `generate`: a Generate call (end_generate).
  uint64_t start(std::weak_ptr<MessageWaiter> call, bool generate);
  // `call`'s message arrived, or it ended (an id done already, or 0: no-op).
  void done(uint64_t id);
  // Ends every Generate call still waiting with `status` (drain); the number ended.
  int end_generate(const grpc::Status& status);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Pending {
    std::chrono::steady_clock::time_point deadline;
    std::weak_ptr<MessageWaiter> call;
    bool generate = false;
  };
  void run();

  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Pending> pending_;  // by start order = deadline order; guarded by mu_
  uint64_t next_id_ = 1;                 // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  std::thread thread_;                   // last: started once the rest is set up
};

}  // namespace kvsplit::server
