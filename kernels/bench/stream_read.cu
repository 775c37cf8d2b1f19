// Read-bandwidth probe (see stream_read.h). Compiled by nvcc (kvsplit_cuda_bench) and by g++
// under the emulation harness (kernels/emulation/emulated_kernels.cpp).
#include <cstdint>

#include "kernels/bench/stream_read.h"
#include "kernels/common/cuda_compat.h"
#include "kernels/common/elem_type.h"
#include "kernels/common/launch_status.h"

namespace kvsplit::kernels {

__global__ void stream_read_kernel(const uint4* data, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint4 v = load16(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never true; keeps the loads alive
}

Status launch_stream_read(const void* data, size_t bytes, unsigned* sink, int num_sms,
                          cudaStream_t stream) {
  if (!data || !sink || bytes % 16 != 0) return invalid_argument("stream_read: bad arguments");
  // 16-byte loads: a misaligned one is a sticky device error on a GPU.
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0)
    return invalid_argument("stream_read: data must be 16-byte aligned");
  const unsigned blocks = static_cast<unsigned>(num_sms > 0 ? num_sms * 8 : 1024);
  return launch_status(launch(stream_read_kernel, dim3(blocks), dim3(512), 0, stream,
                              static_cast<const uint4*>(data), bytes / 16, sink),
                       "stream_read");
}

}  // namespace kvsplit::kernels
