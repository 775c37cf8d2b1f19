// The CPU backend: f32, a thread pool, SIMD where measurement says it pays. Also the oracle the
// CUDA kernels are checked against.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace kvsplit::backend {

// `threads` >= 1. `spin_micros`: see BackendOptions::spin_micros.
std::unique_ptr<Backend> make_cpu_backend(int threads, int64_t spin_micros = -1, int device = 0,
                                          bool emulate_no_peer_access = false);
// From options (threads >= 1 here): also async_copies and fenced_copy_delay_us.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace kvsplit::backend
