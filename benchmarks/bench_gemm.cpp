// bench_gemm: CPU GEMM speed on llama-110m shapes as fractions of the speed of a simple read loop
// (measure_read_bandwidth_gbs: one sequential stream per thread, no prefetch; not a ceiling, the
// GEMM can read W faster) and of the fp32 FMA peak, both measured in the same run.
//
//   bench_gemm [--threads N] [--m 1,4,16,64,128,256] [--seconds S] [--warm] [--cold-mib MiB]
//              [--cpu-time]
//
// By default ("cold") each shape has enough packed copies of W (>= --cold-mib in all) to rotate
// through, so W streams from DRAM as it does in a real decode step whose weights exceed the LLC;
// --warm reuses one copy (W may then sit in the 260 MB L3). --cpu-time times everything (probes
// included) by process CPU time / threads instead of wall time, for a machine shared with other
// jobs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/machine_probe.h"
#include "backend/cpu/simd.h"
#include "common/cli_options.h"
#include "common/thread_pool.h"

namespace {

using kvsplit::ThreadPool;
namespace cpu = kvsplit::backend::cpu;

struct Shape {
  const char* name;
  int64_t n, k;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU GEMM benchmark (llama-110m shapes)"};
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int64_t> ms = {1, 4, 16, 64, 128, 256};
  double seconds = 0.3;
  bool warm = false;
  int64_t cold_mib = 1024;
  app.add_option("--threads", threads, "threads (default: hardware threads)")
      ->check(kvsplit::kPositive);
  app.add_option("--m", ms, "batch sizes (rows of x)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--seconds", seconds, "minimum timed seconds per case")->check(kvsplit::kPositive);
  app.add_flag("--warm", warm, "reuse one copy of W (may be cache resident)");
  bool cpu_time = false;
  app.add_flag("--cpu-time", cpu_time, "time by process CPU seconds / threads (busy machine)");
  app.add_option("--cold-mib", cold_mib, "MiB of W copies to rotate through when cold")
      ->check(kvsplit::kPositive);
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;

  ThreadPool pool(threads);
  const double bw = cpu::measure_read_bandwidth_gbs(pool, size_t{1} << 30, 3, cpu_time);
  const double peak = cpu::measure_fma_peak_gflops(pool, 3, cpu_time);
  std::printf("threads %d, simd %s, panel %d, mr %d\n", threads, cpu::kSimdName, cpu::kGemmPanel,
              cpu::kGemmMr);
  std::printf(
      "simple read loop %.1f GB/s (one stream per thread, not a ceiling: 'of read' can pass "
      "100%%), fp32 FMA peak %.1f GFLOP/s, W %s, clock %s\n",
      bw, peak, warm ? "warm (one copy)" : "cold (rotating copies)",
      cpu_time ? "process CPU time / threads" : "wall");
  std::printf("%-12s %5s %10s %9s %7s %10s %7s\n", "W [n,k]", "m", "us/call", "W GB/s", "of read",
              "GFLOP/s", "of peak");

  const Shape shapes[] = {{"768x768", 768, 768},
                          {"2048x768", 2048, 768},
                          {"768x2048", 768, 2048},
                          {"32000x768", 32000, 768}};
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (const Shape& s : shapes) {
    std::vector<float> w(s.n * s.k);
    for (auto& v : w) v = dist(rng);
    const int64_t psize = cpu::packed_size(s.n, s.k);
    const size_t pbytes = (psize * sizeof(float) + 63) / 64 * 64;
    const int64_t copies =
        warm ? 1 : std::max<int64_t>(2, (cold_mib << 20) / static_cast<int64_t>(pbytes) + 1);
    std::vector<float*> packed(copies);
    for (int64_t c = 0; c < copies; ++c) {
      packed[c] = static_cast<float*>(std::aligned_alloc(64, pbytes));
      if (c == 0)
        cpu::pack_matrix(w.data(), kvsplit::backend::DType::kF32, s.n, s.k, packed[0], &pool);
      else
        std::memcpy(packed[c], packed[0], psize * sizeof(float));
    }
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    std::vector<float> x(max_m * s.k), out(max_m * s.n);
    for (auto& v : x) v = dist(rng);
    for (int64_t m : ms) {
      int64_t calls = 0;
      const cpu::ProbeTimer timer(cpu_time, threads);
      double elapsed = 0;
      while (elapsed < seconds || calls < 3) {
        const cpu::GemmWeights gw{packed[calls % copies], nullptr, kvsplit::backend::DType::kF32,
                                  s.n, s.k};
        cpu::gemm(x.data(), m, gw, nullptr, out.data(), false, pool);
        ++calls;
        elapsed = timer.seconds();
      }
      const double t = elapsed / calls;
      const double gbs = static_cast<double>(s.n) * s.k * sizeof(float) / t / 1e9;
      const double gflops = 2.0 * m * s.n * s.k / t / 1e9;
      std::printf("%-12s %5lld %10.1f %9.1f %6.0f%% %10.1f %6.0f%%\n", s.name,
                  static_cast<long long>(m), t * 1e6, gbs, 100 * gbs / bw, gflops,
                  100 * gflops / peak);
    }
    for (float* p : packed) std::free(p);
  }
  return 0;
}
