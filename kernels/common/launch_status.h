// cudaError_t -> Status for launchers (device code never returns Status).
#pragma once

#include <string>

#include "kernels/common/cuda_compat.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

inline Status launch_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  std::string msg = std::string(what) + ": " + cudaGetErrorString(e);
  const std::string detail = launch_error_detail();
  if (!detail.empty()) msg += " (" + detail + ")";
  return internal_error(std::move(msg));
}

}  // namespace kvsplit::kernels
