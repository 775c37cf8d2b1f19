// CUDA runtime / cuBLAS error -> Status mapping for the CUDA backend (host code, g++).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kvsplit/status.h"

namespace kvsplit::backend::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  // Reported here: clear it from the thread's last-error slot, so that a later launch's
  // cudaGetLastError does not report it again (a sticky error stays regardless).
  (void)cudaGetLastError();
  const std::string msg = std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) return resource_exhausted(msg);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return unavailable(msg);
  return internal_error(msg);
}

// Whether cudaMemcpyBatchAsync's error says the API itself is missing (a driver older than the
// runtime's batch API), after which the backend copies piece by piece for good. Any other error
// (an invalid value, a bad address, cudaErrorNotSupported for pageable host memory under stream
// order) belongs to the batch: its pieces are copied one by one, where a really bad one fails with
// its own error.
inline bool batch_copy_api_missing(cudaError_t e) { return e == cudaErrorCallRequiresNewerDriver; }

// cudaErrorNotSupported on every batch from the first one says the platform lacks the feature:
// after this many refusals in a row, with no batch ever accepted, batching goes off for good (each
// refused batch costs one failed call before its pieces go one by one).
inline constexpr int kBatchNotSupportedRun = 16;
inline bool batch_copy_unsupported_here(cudaError_t e, int not_supported_in_a_row,
                                        bool any_accepted) {
  return e == cudaErrorNotSupported && !any_accepted &&
         not_supported_in_a_row >= kBatchNotSupportedRun;
}

// Makes the backend's device current on the calling thread for one call and restores the
// thread's device after. A backend is also called from threads bound to another device (the home
// worker drives a peer shard's page ops and copies; a decode worker reads a prefill worker's
// pages): its streams, events and kernels belong to its own device, and a launch or record there
// from another current device fails. Costs a cudaGetDevice when the device is already current.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device && cudaSetDevice(device) == cudaSuccess) switched_ = true;
  }
  ~DeviceScope() {
    if (switched_ && prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
  bool switched_ = false;
};

inline Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  const std::string msg = std::string("cublas: ") + what + ": " + cublasGetStatusName(s) + " (" +
                          cublasGetStatusString(s) + ")";
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return resource_exhausted(msg);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return unimplemented(msg);
  if (s == CUBLAS_STATUS_INVALID_VALUE) return invalid_argument(msg);
  return internal_error(msg);
}

}  // namespace kvsplit::backend::cuda

#define KVSPLIT_CUDA_RETURN(expr, what) \
  KVSPLIT_RETURN_IF_ERROR(::kvsplit::backend::cuda::cuda_status((expr), (what)))
#define KVSPLIT_CUBLAS_RETURN(expr, what) \
  KVSPLIT_RETURN_IF_ERROR(::kvsplit::backend::cuda::cublas_status((expr), (what)))
