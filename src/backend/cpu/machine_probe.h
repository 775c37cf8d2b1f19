// Measures what the machine can do, so benchmarks can report achieved speed as fractions of it
// (bench_gemm, bench_engine). Both run on every thread of `pool` and take ~0.2-1 s.
#pragma once

#include <cstddef>

#include "common/thread_pool.h"

namespace kvsplit::backend::cpu {

// Multithreaded vectorized read-sum over a `bytes` buffer (default 1 GiB, ~4x this machine's
// 260 MB L3, so it measures DRAM, not cache); best of `repeats` timed passes after one warm-up
// pass. Returns GB/s (1e9 bytes/s). A buffer that cannot be allocated is halved until it can.
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 3,
                                  bool cpu_time = false);

// fp32 FMA peak: independent FMA chains in registers with the widest SIMD compiled in
// (AVX-512 / AVX2 / scalar), on all threads at once; best of `repeats`. Returns GFLOP/s
// (an FMA counts 2 flops).
double measure_fma_peak_gflops(ThreadPool& pool, int repeats = 3, bool cpu_time = false);

// cpu_time = true times a pass by the process CPU time it used divided by the thread count
// instead of wall time: on a machine shared with other jobs this measures what the threads do
// while they run, not how often they are descheduled. Use the same clock for the numbers you
// compare against (bench_gemm --cpu-time).
class ProbeTimer {
 public:
  explicit ProbeTimer(bool cpu_time, int threads);
  double seconds() const;  // since construction

 private:
  bool cpu_time_;
  int threads_;
  double start_;
};

}  // namespace kvsplit::backend::cpu
