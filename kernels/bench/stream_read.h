// A read-only streaming kernel: the achievable read bandwidth that bench_attention divides by.
#pragma once

#include <cstddef>

#include "kernels/common/cuda_stream.h"
#include "kvsplit/status.h"

namespace kvsplit::kernels {

// Reads `bytes` (a multiple of 16) from device memory `data` (16-byte aligned) with 16-byte loads;
// writes one value to `sink` (device) only so the loads cannot be removed. kInvalidArgument for a
// null pointer, a size not a multiple of 16 or a misaligned `data`.
Status launch_stream_read(const void* data, size_t bytes, unsigned* sink, int num_sms,
                          cudaStream_t stream);

}  // namespace kvsplit::kernels
