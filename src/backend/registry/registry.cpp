// create_backend(): the one place that knows every backend. Lives outside kvsplit_core so that
// the CUDA backend (a separate library built by nvcc) can be linked in when it exists; so does
// make_shard_communicator(), which may create the NCCL communicator (defined in kvsplit_cuda).
#include <algorithm>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#if defined(KVSPLIT_HAVE_CUDA_BACKEND)
#include "backend/cuda/cuda_backend_factory.h"
#endif

namespace kvsplit::backend {

StatusOr<std::unique_ptr<Backend>> create_backend(std::string_view name, int threads) {
  BackendOptions options;
  options.threads = threads;
  return create_backend(name, options);
}

StatusOr<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                  const BackendOptions& options) {
  if (name == "cpu") {
    if (options.weight_dtype && *options.weight_dtype != DType::kF32)
      return invalid_argument("backend 'cpu': weight dtype " +
                              std::string(dtype_name(*options.weight_dtype)) +
                              " is a CUDA option (the CPU backend keeps f32 weights f32 and 16-bit "
                              "weights of the file 16-bit; use auto or f32)");
    BackendOptions o = options;
    if (o.threads <= 0)
      o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::unique_ptr<Backend>(make_cpu_backend(o));
  }
  if (name == "cuda") {
#if defined(KVSPLIT_HAVE_CUDA_BACKEND)
    CudaBackendOptions cuda_options;
    if (options.weight_dtype) cuda_options.weight_dtype = *options.weight_dtype;
    return create_cuda_backend(options.device, cuda_options);
#else
    return unavailable(
        "backend 'cuda' is not built into this binary (nvcc was not found at build time)");
#endif
  }
  return invalid_argument("unknown backend '" + std::string(name) + "' (expected 'cpu' or 'cuda')");
}

int visible_devices(std::string_view name) {
  if (name == "cpu") return 1;
#if defined(KVSPLIT_HAVE_CUDA_BACKEND)
  if (name == "cuda") return cuda_device_count();
#endif
  return 0;
}

StatusOr<ShardCommunicator> make_shard_communicator(SpatialCommunicator mode,
                                                    std::span<Backend* const> shards) {
  std::vector<ShardDeviceInfo> info;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i] == nullptr)
      return invalid_argument("communicator: shard " + std::to_string(i) + " has no backend");
    info.push_back(ShardDeviceInfo{shards[i]->kind(), shards[i]->device()});
  }
  auto choice = choose_communicator(mode, info, nccl_communicator_built());
  if (!choice.ok()) return choice.status();
  ShardCommunicator out;
  out.reason = std::move(choice->reason);
  if (!choice->nccl) {
    out.comm = make_in_process_communicator();
    return out;
  }
  auto nccl = make_nccl_communicator(shards);
  if (nccl.ok()) {
    out.comm = std::move(nccl).value();
    return out;
  }
  if (mode == SpatialCommunicator::kNccl)
    return nccl.status().with_prefix("kv.cuts.spatial.communicator: nccl");
  out.comm = make_in_process_communicator();
  out.fell_back = true;
  out.reason =
      "in-process (auto: creating the NCCL communicator failed: " + nccl.status().to_string() + ")";
  return out;
}

}  // namespace kvsplit::backend
