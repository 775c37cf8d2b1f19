// How a shard group's backends exchange data (the spatial cut, kv-cuts.md §4): the home worker
// sends each shard the step's queries and new K/V rows, and each shard sends back its partial
// attention (normalized output and log-sum-exp). One interface, so the model's sharded attention
// is written once; every transfer is counted (bytes, calls, wall time).
//
// InProcessCommunicator: shards in one process (CPU backends, which share host memory, or
// virtual shards on one GPU): a direct copy on the destination's stream (Backend::copy_from)
// when it can read the source, else staged through host memory. An NCCL communicator (one rank
// per GPU) implements the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

struct ExchangeStats {
  int64_t transfers = 0;  // send() calls that moved bytes
  int64_t bytes = 0;      // bytes moved
  double seconds = 0;     // wall time inside send(), synchronization included
  void add(const ExchangeStats& o) {
    transfers += o.transfers;
    bytes += o.bytes;
    seconds += o.seconds;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // Copies `bytes` from `src` (memory of `from`) to `dst` (memory of `to`) after the work already
  // queued on `from`; the data is usable by work queued on `to` after this returns. A same-backend
  // call is the caller's bug (kInvalidArgument). bytes == 0 moves nothing.
  virtual Status send(Backend& to, void* dst, Backend& from, const void* src, size_t bytes) = 0;
  virtual const char* name() const = 0;
  const ExchangeStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  ExchangeStats stats_;
};

// Shards of one process (see above).
std::unique_ptr<Communicator> make_in_process_communicator();

}  // namespace kvsplit::backend
