// How a shard group's backends exchange data (the spatial cut, kv-cuts.md §4): the home worker
// sends each shard the step's queries and the new K/V rows of the positions it owns, and each
// shard sends back its partial attention (normalized output and log-sum-exp). One interface, so
// the model's sharded attention is written once; every transfer is counted (bytes, calls, time).
//
// InProcessCommunicator: shards in one process (CPU backends, which share host memory, or
// virtual shards on one GPU): a direct copy on the destination's stream (Backend::copy_from)
// when it can read the source, else staged through host memory (counted in host_bytes).
//
// NcclCommunicator (make_nccl_communicator): one NCCL rank per GPU of one process, built only with
// NCCL (KVSPLIT_WITH_NCCL, docs/cuda.md "NCCL communicator (spatial cut)").
//
// Which one a shard group uses (kv.cuts.spatial.communicator): choose_communicator, a pure rule,
// and make_shard_communicator, which applies it to the group's backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kvsplit/kv_cuts.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

struct ExchangeStats {
  int64_t transfers = 0;  // send() calls that moved bytes
  int64_t bytes = 0;      // bytes moved
  // Of `bytes`, those staged through host memory (ExchangeLink::kHost): they crossed the host
  // link, the one tier swaps use. The rest stayed in one memory or went GPU to GPU directly.
  int64_t host_bytes = 0;
  double seconds = 0;  // wall time inside send(), synchronization included
  void add(const ExchangeStats& o) {
    transfers += o.transfers;
    bytes += o.bytes;
    host_bytes += o.host_bytes;
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

struct NcclCommunicatorOptions {
  // true: send() waits for the receive to finish (cudaStreamSynchronize on the destination's
  // stream), so stats().seconds is the transfer's wall time, as for the in-process communicator.
  // false: send() returns once both halves are enqueued; stream order alone makes the data usable
  // by work queued on `to` afterwards, and seconds counts only the enqueue. Risk: the process-wide
  // order of NCCL operations (below) then covers only their enqueue, so the kernels of this
  // communicator's sends may run beside those of another communicator on the same GPUs, which
  // NCCL says can deadlock. Use false only where no other communicator of the process shares a
  // GPU with this one (one worker; the engine and the CLI keep true).
  bool synchronize = true;
};

// One NCCL rank per backend, rank i = devices[i] (ncclCommInitAll on their CUDA devices). Every
// backend must be a CUDA backend, on distinct devices (virtual shards on one GPU use the in-process
// communicator), and must outlive the communicator (not owned). send(to, dst, from, src, bytes)
// runs ncclSend on `from`'s stream and ncclRecv on `to`'s stream in one NCCL group, so the send
// starts after the work queued on `from` and the data is there for the work queued on `to` after
// it; a backend not among the ranks, or to == from, is kInvalidArgument. Not thread-safe (one
// thread drives a communicator), but several communicators may be driven by several threads: every
// NCCL call of the process (init, each send's group, destroy) holds one process-wide mutex, and a
// synchronized send holds it until its receive completed, so the NCCL operations of communicators
// sharing GPUs (several workers' shard groups) run one at a time, never interleaved.
// Errors: kInvalidArgument for the list above, kUnimplemented when built without NCCL (or without
// CUDA), NCCL / CUDA failures with NCCL's error string (kInternal, kUnavailable for system errors).
// Defined in kvsplit_cuda with NCCL: link kvsplit_backend_registry (or kvsplit_runtime).
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(
    std::span<Backend* const> devices, const NcclCommunicatorOptions& options = {});

// True when this binary has the NCCL communicator (KVSPLIT_WITH_NCCL): make_nccl_communicator
// can succeed.
bool nccl_communicator_built();

// One shard of a group as the communicator rule sees it.
struct ShardDeviceInfo {
  DeviceKind kind = DeviceKind::kCpu;
  int device = 0;  // Backend::device(): the CUDA device index (CPU: a virtual id)
};

// Which link one send between two shards' backends crosses (docs/kv-cuts.md "Which link an
// exchange crosses"; the KVM's link_use counts only kHost):
//   kLocal: one memory, no link: CPU shards (host memory, shared by every CPU backend) or virtual
//     shards on one GPU (a device copy).
//   kPeer: GPU to GPU directly (peer access: NVLink, or PCIe peer to peer), the host not involved.
//   kHost: staged through host memory (device -> host -> device): over the devices' host links.
// A pure rule of the two shards and whether the destination reads the source directly
// (Backend::can_read_from; for NCCL, CUDA peer access between the two devices, without which
// NCCL moves the data through host memory): without direct reads kHost (CPU backends built with
// emulate_no_peer_access take the staged route of GPUs without peer access and count as it);
// else kLocal for one device or two CPU backends, kPeer for two GPUs.
enum class ExchangeLink : uint8_t { kLocal, kPeer, kHost };
ExchangeLink exchange_link(const ShardDeviceInfo& from, const ShardDeviceInfo& to,
                           bool direct_access);
const char* exchange_link_name(ExchangeLink link);

struct CommunicatorChoice {
  bool nccl = false;   // false: the in-process communicator
  std::string reason;  // why, in words, for the start-up log
};

// The rule (docs/kv-cuts.md "Communicator"), a pure function of the group's shards in shard
// order (0: home) and whether the binary has NCCL:
//   kInProcess: in-process.
//   kAuto: NCCL when nccl_built, every shard is a CUDA backend and their devices are pairwise
//     distinct; else in-process, the reason naming the first condition that failed.
//   kNccl: NCCL under the same conditions, else an error naming the condition: kUnimplemented
//     when not built with NCCL, kInvalidArgument for a shard that is not a CUDA backend or two
//     shards on one device (virtual shards: NCCL takes one rank per GPU). Never a fallback.
// kInvalidArgument for an empty group.
StatusOr<CommunicatorChoice> choose_communicator(SpatialCommunicator mode,
                                                 std::span<const ShardDeviceInfo> shards,
                                                 bool nccl_built);

struct ShardCommunicator {
  std::unique_ptr<Communicator> comm;  // never null on success
  std::string reason;                  // choose_communicator's reason (and a fallback's cause)
  bool fell_back = false;              // auto chose NCCL, which could not be created
};

// The communicator of a shard group whose backends are `shards` (shard order, 0: home): the rule
// above with nccl_communicator_built(), then make_in_process_communicator() or
// make_nccl_communicator(shards). The backends are not owned and must outlive the communicator
// (the group's owner destroys it first). Under kAuto a failure to create the NCCL communicator
// (e.g. ncclCommInitAll) falls back to in-process with the error in `reason` and fell_back set
// (the caller logs a warning); under kNccl it is returned. choose_communicator's errors.
// Defined in kvsplit_backend_registry (it links the NCCL communicator when built).
StatusOr<ShardCommunicator> make_shard_communicator(SpatialCommunicator mode,
                                                    std::span<Backend* const> shards);

}  // namespace kvsplit::backend
