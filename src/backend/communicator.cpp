#include "backend/communicator.h"

#include <chrono>
#include <string>

namespace kvsplit::backend {
namespace {

class InProcessCommunicator final : public Communicator {
 public:
  Status send(Backend& to, void* dst, Backend& from, const void* src, size_t bytes) override {
    if (&to == &from) return invalid_argument("communicator: send to the same backend");
    if (bytes == 0) return ok_status();
    if (dst == nullptr || src == nullptr) return invalid_argument("communicator: null pointer");
    KVSPLIT_RETURN_IF_ERROR(from.synchronize());  // the source's queued work wrote `src`
    // Timed from here: waiting for that work (the peer's attention on CUDA) is not the exchange.
    const auto t0 = std::chrono::steady_clock::now();
    const bool direct = to.can_read_from(from);
    if (direct) {
      KVSPLIT_RETURN_IF_ERROR(to.copy_from(dst, from, src, bytes));
    } else {
      staging_.resize(bytes);
      KVSPLIT_RETURN_IF_ERROR(from.copy_d2h(staging_.data(), src, bytes));
      KVSPLIT_RETURN_IF_ERROR(from.synchronize());
      KVSPLIT_RETURN_IF_ERROR(to.copy_h2d(dst, staging_.data(), bytes));
      KVSPLIT_RETURN_IF_ERROR(to.synchronize());  // the staging buffer is reused
    }
    ++stats_.transfers;
    stats_.bytes += static_cast<int64_t>(bytes);
    if (exchange_link({from.kind(), from.device()}, {to.kind(), to.device()}, direct) ==
        ExchangeLink::kHost)
      stats_.host_bytes += static_cast<int64_t>(bytes);
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ok_status();
  }
  const char* name() const override { return "in-process"; }

 private:
  std::vector<std::byte> staging_;
};

}  // namespace

std::unique_ptr<Communicator> make_in_process_communicator() {
  return std::make_unique<InProcessCommunicator>();
}

ExchangeLink exchange_link(const ShardDeviceInfo& from, const ShardDeviceInfo& to,
                           bool direct_access) {
  if (!direct_access) return ExchangeLink::kHost;
  const bool one_memory = (from.kind == to.kind && from.device == to.device) ||
                          (from.kind == DeviceKind::kCpu && to.kind == DeviceKind::kCpu);
  return one_memory ? ExchangeLink::kLocal : ExchangeLink::kPeer;
}

const char* exchange_link_name(ExchangeLink link) {
  switch (link) {
    case ExchangeLink::kLocal:
      return "local";
    case ExchangeLink::kPeer:
      return "peer";
    case ExchangeLink::kHost:
      return "host";
  }
  return "?";
}

bool nccl_communicator_built() {
#if defined(KVSPLIT_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

StatusOr<CommunicatorChoice> choose_communicator(SpatialCommunicator mode,
                                                 std::span<const ShardDeviceInfo> shards,
                                                 bool nccl_built) {
  if (shards.empty()) return invalid_argument("communicator: a shard group has no shards");
  if (mode == SpatialCommunicator::kInProcess)
    return CommunicatorChoice{false, "in-process (kv.cuts.spatial.communicator: in_process)"};
  const bool must = mode == SpatialCommunicator::kNccl;
  // The first condition NCCL needs that fails, with its status code under kNccl.
  StatusCode code = StatusCode::kOk;
  std::string why;
  if (!nccl_built) {
    code = StatusCode::kUnimplemented;
    why = "this binary is built without NCCL";
  }
  for (size_t i = 0; code == StatusCode::kOk && i < shards.size(); ++i) {
    if (shards[i].kind != DeviceKind::kCuda) {
      code = StatusCode::kInvalidArgument;
      why = "shard " + std::to_string(i) + " is not a CUDA backend (NCCL connects GPUs)";
      break;
    }
    for (size_t j = 0; j < i; ++j) {
      if (shards[j].device == shards[i].device) {
        code = StatusCode::kInvalidArgument;
        why = "shards " + std::to_string(j) + " and " + std::to_string(i) +
              " are both on CUDA device " + std::to_string(shards[i].device) +
              " (virtual shards; NCCL takes one rank per GPU)";
        break;
      }
    }
  }
  if (code == StatusCode::kOk) {
    return CommunicatorChoice{
        true, std::string("nccl (") + (must ? "kv.cuts.spatial.communicator: nccl" : "auto") +
                  ": " + std::to_string(shards.size()) + " CUDA shards on distinct devices)"};
  }
  if (must) return Status(code, "kv.cuts.spatial.communicator: nccl: " + why);
  return CommunicatorChoice{false, "in-process (auto: " + why + ")"};
}

#if !defined(KVSPLIT_WITH_NCCL)
// Built without NCCL: the real one is src/backend/cuda/nccl_communicator.cpp.
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(
    std::span<Backend* const> devices, const NcclCommunicatorOptions& options) {
#if defined(KVSPLIT_WITH_CUDA)
  return unimplemented(
      "nccl communicator: not built into this binary (NCCL was not found at configure time, or "
      "KVSPLIT_NCCL=OFF; see docs/cuda.md)");
#else
  return unimplemented(
      "nccl communicator: not built into this binary (built without CUDA: nvcc was not found at "
      "configure time)");
#endif
}
#endif

}  // namespace kvsplit::backend
