// create_backend(): the one place that knows every backend. Lives outside kvsplit_core so that
// the CUDA backend (a separate library built by nvcc) can be linked in when it exists.
#include <string>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#if defined(KVSPLIT_HAVE_CUDA_BACKEND)
#include "backend/cuda/cuda_backend_factory.h"
#endif

namespace kvsplit::backend {

StatusOr<std::unique_ptr<Backend>> create_backend(std::string_view name, int threads) {
  if (name == "cpu") {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::unique_ptr<Backend>(make_cpu_backend(threads));
  }
  if (name == "cuda") {
#if defined(KVSPLIT_HAVE_CUDA_BACKEND)
    return create_cuda_backend(/*device=*/0);
#else
    return unavailable("backend 'cuda' is not built into this binary (nvcc was not found at build time)");
#endif
  }
  return invalid_argument("unknown backend '" + std::string(name) + "' (expected 'cpu' or 'cuda')");
}

}  // namespace kvsplit::backend
