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
    const auto t0 = std::chrono::steady_clock::now();
    KVSPLIT_RETURN_IF_ERROR(from.synchronize());  // the source's queued work wrote `src`
    if (to.can_read_from(from)) {
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
