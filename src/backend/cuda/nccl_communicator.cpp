// NcclCommunicator (see backend/communicator.h): one NCCL rank per CUDA backend of one process.
// Built only with NCCL (KVSPLIT_WITH_NCCL; kernels/cuda.cmake leaves this file out otherwise).
//
// Several communicators on shared GPUs (each worker's shard group has its own: with 2 workers x 2
// shards on 2 GPUs the groups are (0, 1) and (1, 0)) are driven by different threads. NCCL's
// kernels block until their peer's run, so operations of different communicators on one device
// must not interleave without an order, else they can deadlock ("Using multiple NCCL
// communicators concurrently" in NCCL's docs). Every NCCL call of this file is made under one
// process-wide mutex (nccl_mutex), and a synchronized send keeps it until its receive completed,
// so the NCCL kernels of the process run one send at a time.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "backend/communicator.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"

namespace kvsplit::backend {
namespace {

// Orders the NCCL operations of every communicator of the process (see above).
std::mutex& nccl_mutex() {
  static std::mutex mu;
  return mu;
}

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return ok_status();
  std::string msg = std::string("nccl: ") + what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  switch (r) {
    case ncclInvalidArgument:
      return invalid_argument(msg);
    case ncclInvalidUsage:
      return failed_precondition(msg);
    case ncclSystemError:
    case ncclRemoteError:
      return unavailable(msg);
    default:
      return internal_error(msg);
  }
}

// Restores the calling thread's current CUDA device on scope exit: NCCL calls may switch it, and
// the backends' work assumes the device their owner bound (Backend::bind_thread).
class DeviceGuard {
 public:
  DeviceGuard() { ok_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~DeviceGuard() {
    if (ok_) cudaSetDevice(device_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_ = 0;
  bool ok_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::vector<cuda::CudaBackend*> ranks, std::vector<ncclComm_t> comms,
                   std::vector<ExchangeLink> links, const NcclCommunicatorOptions& options)
      : ranks_(std::move(ranks)),
        comms_(std::move(comms)),
        links_(std::move(links)),
        options_(options) {}

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    DeviceGuard guard;
    // Nothing may be in flight on a communicator being destroyed (send() without synchronize).
    for (cuda::CudaBackend* b : ranks_) cudaStreamSynchronize(b->stream());
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }

  Status send(Backend& to, void* dst, Backend& from, const void* src, size_t bytes) override {
    if (&to == &from) return invalid_argument("communicator: send to the same backend");
    if (bytes == 0) return ok_status();
    if (dst == nullptr || src == nullptr) return invalid_argument("communicator: null pointer");
    const int rank_to = rank_of(to), rank_from = rank_of(from);
    if (rank_to < 0 || rank_from < 0)
      return invalid_argument("nccl communicator: backend '" +
                              (rank_to < 0 ? to.name() : from.name()) + "' is not one of its " +
                              std::to_string(ranks_.size()) + " ranks");
    const auto t0 = std::chrono::steady_clock::now();
    if (options_.synchronize) {
      // The work queued ahead on both streams (the peer attention whose partial this sends) ends
      // before the lock is taken: under it only the transfer waits, or every worker's sharded
      // compute would take turns, not only their exchanges.
      KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(ranks_[rank_from]->stream()),
                          "nccl communicator: synchronize the sending stream");
      KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(ranks_[rank_to]->stream()),
                          "nccl communicator: synchronize the receiving stream");
    }
    // Held from the group's start to the end of its receive (synchronize) or of its enqueue (not
    // synchronized: its kernels may then overlap another communicator's; communicator.h). The
    // sender's kernel has nothing left to wait for once the receive completed.
    std::lock_guard<std::mutex> lock(nccl_mutex());
    DeviceGuard guard;
    KVSPLIT_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), "ncclGroupStart"));
    // The group is closed whatever fails. The receive is posted only after the send was: a
    // receive with no matching send would leave the receiving stream waiting for good.
    const Status sent = nccl_status(
        ncclSend(src, bytes, ncclUint8, rank_to, comms_[rank_from], ranks_[rank_from]->stream()),
        "ncclSend");
    const Status received = sent.ok()
                                ? nccl_status(ncclRecv(dst, bytes, ncclUint8, rank_from,
                                                       comms_[rank_to], ranks_[rank_to]->stream()),
                                              "ncclRecv")
                                : ok_status();
    const Status grouped = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    KVSPLIT_RETURN_IF_ERROR(sent);
    KVSPLIT_RETURN_IF_ERROR(received);
    KVSPLIT_RETURN_IF_ERROR(grouped);
    if (options_.synchronize) {
      KVSPLIT_CUDA_RETURN(cudaStreamSynchronize(ranks_[rank_to]->stream()),
                          "nccl communicator: synchronize the receiving stream");
    }
    ++stats_.transfers;
    stats_.bytes += static_cast<int64_t>(bytes);
    if (links_[static_cast<size_t>(rank_from) * ranks_.size() + rank_to] == ExchangeLink::kHost)
      stats_.host_bytes += static_cast<int64_t>(bytes);
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ok_status();
  }

  const char* name() const override { return "nccl"; }

 private:
  int rank_of(const Backend& b) const {
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (ranks_[r] == &b) return static_cast<int>(r);
    return -1;
  }

  std::vector<cuda::CudaBackend*> ranks_;  // rank r drives ranks_[r]; not owned
  std::vector<ncclComm_t> comms_;          // [num_ranks], owned
  // [from rank * num_ranks + to rank]: the link a send crosses. Without CUDA peer access between
  // the two devices NCCL moves the data through host memory (its shared-memory transport).
  std::vector<ExchangeLink> links_;
  NcclCommunicatorOptions options_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(
    std::span<Backend* const> devices, const NcclCommunicatorOptions& options) {
  if (devices.empty()) return invalid_argument("nccl communicator: no backends given");
  std::vector<cuda::CudaBackend*> ranks;
  std::vector<int> device_ids;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == nullptr)
      return invalid_argument("nccl communicator: backend " + std::to_string(i) + " is null");
    auto* b = dynamic_cast<cuda::CudaBackend*>(devices[i]);
    if (b == nullptr)
      return invalid_argument("nccl communicator: backend " + std::to_string(i) + " ('" +
                              devices[i]->name() + "') is not a CUDA backend");
    for (size_t j = 0; j < ranks.size(); ++j) {
      if (device_ids[j] == b->device())
        return invalid_argument(
            "nccl communicator: backends " + std::to_string(j) + " and " + std::to_string(i) +
            " are both on CUDA device " + std::to_string(b->device()) +
            "; NCCL takes one rank per GPU (virtual shards on one GPU use the in-process "
            "communicator)");
    }
    ranks.push_back(b);
    device_ids.push_back(b->device());
  }
  const size_t n = ranks.size();
  std::vector<ExchangeLink> links(n * n, ExchangeLink::kLocal);
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      if (from == to) continue;
      int peer = 0;  // a failed query reads as no peer access: staged through the host
      if (cudaDeviceCanAccessPeer(&peer, device_ids[to], device_ids[from]) != cudaSuccess) {
        (void)cudaGetLastError();
        peer = 0;
      }
      links[from * n + to] = exchange_link({DeviceKind::kCuda, device_ids[from]},
                                           {DeviceKind::kCuda, device_ids[to]}, peer != 0);
    }
  }
  std::vector<ncclComm_t> comms(ranks.size(), nullptr);
  {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    DeviceGuard guard;
    KVSPLIT_RETURN_IF_ERROR(nccl_status(
        ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), device_ids.data()),
        "ncclCommInitAll"));
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      std::move(ranks), std::move(comms), std::move(links), options));
}

}  // namespace kvsplit::backend
