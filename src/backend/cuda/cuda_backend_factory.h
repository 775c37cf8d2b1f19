// Creates the CUDA backend. No CUDA header here: src/backend/registry includes this file.
// Built only with KVSPLIT_WITH_CUDA (nvcc found); see docs/cuda.md.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

struct CudaBackendOptions {
  // Storage (and GEMM input) type of weights given to upload_matrix(): kBF16 (default) or kF16
  // GEMMs run on tensor cores with fp32 accumulation; kF32 keeps fp32 weights and fp32 GEMMs
  // (for bit-closer parity with the CPU backend, e.g. the stories260K goldens).
  DType weight_dtype = DType::kBF16;
};

// kUnavailable when no CUDA device (or driver) is present, kInvalidArgument for a device index
// outside [0, device count). Never falls back to another backend.
StatusOr<std::unique_ptr<Backend>> create_cuda_backend(int device);
// cudaGetDeviceCount, 0 when it fails (no driver or no device).
int cuda_device_count();
StatusOr<std::unique_ptr<Backend>> create_cuda_backend(int device,
                                                       const CudaBackendOptions& options);

}  // namespace kvsplit::backend
