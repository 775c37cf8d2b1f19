// The reactor of one Generate stream and the pump thread that drives the reactors' writes.
// Engine threads never build messages or call into gRPC: an event only queues its reactor on the
// PumpThread, which drains every queued event of a stream into one message per write. A client
// cancel or deadline aborts the request in the engine at once (its KV is freed).
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvsplit/engine.h"
#include "server/message_timer.h"

namespace kvsplit::server {

class GenerationService;
class GenerateReactor;

// Runs GenerateReactor::pump() for the engine's event notifications on one thread of its own, so
// an engine thread only takes a lock and appends a pointer per event (the condition variable is
// signalled only when the thread sleeps); building messages and starting gRPC writes overlap with
// the engine's next step. Duplicate entries are harmless: pump() drains everything queued.
class PumpThread {
 public:
  PumpThread();
  ~PumpThread();  // joins; reactors still queued are not pumped (the server is shut down)
  void post(std::weak_ptr<GenerateReactor> reactor);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<GenerateReactor>> queue_;  // guarded by mu_
  bool sleeping_ = false;                              // guarded by mu_
  bool stop_ = false;                                  // guarded by mu_
  std::thread thread_;                                 // last: starts after the fields above
};

// Starts the reactor of one Generate call as its headers arrive: it finishes at once when
// GenerationService::admit_stream refuses the call (no message is read), else reads the one
// request message, submits it to the engine and streams its events as serialized GenerateResponse
// messages. The reactor owns itself until gRPC calls OnDone; the call's stream slots (the
// server's and its tenant's) go back as it finishes.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* start_generate(
    GenerationService* service, grpc::CallbackServerContext* context);

// Ends the Generate call of `reactor` with UNAUTHENTICATED, its request cancelled in the engine
// (its key was revoked); no-op when it is finishing already. Whether it ended the call. Any
// thread.
bool revoke_generate(GenerateReactor* reactor);

}  // namespace kvsplit::server
