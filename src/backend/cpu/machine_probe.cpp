#include "backend/cpu/machine_probe.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/simd.h"

namespace kvsplit::backend::cpu {
namespace {

double now_seconds(bool cpu_time) {
  timespec ts;
  clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Sum of floats in [p, p + n); n a multiple of 128. Eight independent vector accumulators.
float read_sum(const float* p, int64_t n) {
#if defined(KVSPLIT_CPU_AVX512)
  __m512 a[8];
  for (auto& v : a) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 128)
    for (int j = 0; j < 8; ++j) a[j] = _mm512_add_ps(a[j], _mm512_load_ps(p + i + 16 * j));
  for (int j = 1; j < 8; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  return _mm512_reduce_add_ps(a[0]);
#elif defined(KVSPLIT_CPU_AVX2)
  __m256 a[8];
  for (auto& v : a) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 64)
    for (int j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_load_ps(p + i + 8 * j));
  for (int j = 1; j < 8; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  alignas(32) float t[8];
  _mm256_store_ps(t, a[0]);
  float s = 0;
  for (float v : t) s += v;
  return s;
#else
  float a[8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  float s = 0;
  for (float v : a) s += v;
  return s;
#endif
}

// `iters` rounds of kChains independent FMAs per thread; returns a value that depends on all.
constexpr int kChains = 12;  // > FMA latency (4) x ports (2): keeps both FMA units busy
float fma_chains(int64_t iters, float seed) {
#if defined(KVSPLIT_CPU_AVX512)
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(seed + j);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  for (int j = 1; j < kChains; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return _mm512_reduce_add_ps(acc[0]);
#elif defined(KVSPLIT_CPU_AVX2)
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(seed + j);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  for (int j = 1; j < kChains; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float t[8];
  _mm256_store_ps(t, acc[0]);
  return t[0] + t[7];
#else
  float acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = seed + j;
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = std::fma(acc[j], 0.999999f, 1e-7f);
  float s = 0;
  for (float v : acc) s += v;
  return s;
#endif
}

std::atomic<float> g_sink{0.f};  // keeps results observable

}  // namespace

ProbeTimer::ProbeTimer(bool cpu_time, int threads)
    : cpu_time_(cpu_time), threads_(std::max(1, threads)), start_(now_seconds(cpu_time)) {}

double ProbeTimer::seconds() const {
  const double s = now_seconds(cpu_time_) - start_;
  return cpu_time_ ? s / threads_ : s;
}

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, int repeats, bool cpu_time) {
  const int threads = pool.num_threads();
  const size_t unit = size_t{512} * threads;  // 128 floats per thread chunk granule
  float* buf = nullptr;
  for (; bytes >= (size_t{1} << 20); bytes /= 2) {
    bytes = bytes / unit * unit;
    buf = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (buf) break;
  }
  if (!buf) return 0.0;
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  const int64_t per = n / threads;  // multiple of 128
  // First touch by the thread that reads the chunk later.
  pool.parallel_for(threads, [&](int64_t t) {
    float* p = buf + t * per;
    for (int64_t i = 0; i < per; ++i) p[i] = static_cast<float>(i & 7);
  });
  std::vector<float> sums(threads);
  double best = 0.0;
  for (int r = 0; r < std::max(1, repeats) + 1; ++r) {
    const ProbeTimer timer(cpu_time, threads);
    pool.parallel_for(threads, [&](int64_t t) { sums[t] = read_sum(buf + t * per, per); });
    const double s = timer.seconds();
    float total = 0;
    for (float v : sums) total += v;
    g_sink.store(total, std::memory_order_relaxed);
    if (r > 0) best = std::max(best, static_cast<double>(per) * threads * sizeof(float) / s / 1e9);
  }
  std::free(buf);
  return best;
}

double measure_fma_peak_gflops(ThreadPool& pool, int repeats, bool cpu_time) {
  const int threads = pool.num_threads();
  const int64_t iters = 20'000'000 / std::max(1, kSimdWidth / 4);  // ~0.1 s per pass
  std::vector<float> sums(threads);
  double best = 0.0;
  for (int r = 0; r < std::max(1, repeats) + 1; ++r) {
    const ProbeTimer timer(cpu_time, threads);
    pool.parallel_for(threads, [&](int64_t t) { sums[t] = fma_chains(iters, 1.0f + t); });
    const double s = timer.seconds();
    g_sink.store(sums[0], std::memory_order_relaxed);
    const double flops = 2.0 * kChains * kSimdWidth * static_cast<double>(iters) * threads;
    if (r > 0) best = std::max(best, flops / s / 1e9);
  }
  return best;
}

}  // namespace kvsplit::backend::cpu
