// bench_cpu_attention: CPU paged attention. Decode: no split vs the split-K planner on the same
// data (the ratio is the split-K speedup), KV bytes streamed per second as a fraction of the
// machine's read bandwidth measured in the same run, and of a read loop over the same pages in
// the same order (one load per cache line, no arithmetic: what memory gives this pattern).
// Prefill: causal FLOP/s as a fraction of the
// measured fp32 FMA peak. Quantized decode (semantic cut): the same decode over int8 and int4
// pages (kernels/common/kv_quant.h) vs full f32 pages in the same run, time ratios and KV bytes
// read per token and layer.
//
//   bench_cpu_attention [--threads N] [--heads 32] [--kv-heads 8] [--head-dim 128]
//                       [--block-size 16] [--seconds S] [--quant-only] [--repeats N]
//                       [--cpu-time | --best-call] [--cold] [--warm] [--cold-mb M]
//                       [--variant full|mixfl|int8|int4 --kv-len L --calls N] [--evicted]
//
// The quantized cases are timed cold by default: a buffer of --cold-mb MiB (default 4x the L3
// cache) is read on every thread before each timed call, untimed, so that the call reads its KV
// from memory as a layer does in a decode step (the other layers' KV and the weights pass through
// the caches between two reads of one layer's KV). Warm, a small int8/int4 KV stays in the L3
// between calls while the full one does not, and the ratios flatter the small pages. --warm times
// them without the flush (and warns for each variant whose KV fits the L3); --cpu-time (process
// CPU time / threads) applies only with --warm, --best-call (fastest single call) either way.
// --repeats N measures the quantized cases N times and prints the median of each ratio.
// --cold flushes the same way before each timed call of the (non-quantized) decode cases, which
// are warm by default.
// --variant runs only that quantized-decode variant on one sequence of --kv-len keys, --calls
// times, without probes or timing: for instruction counts (valgrind --tool=callgrind).
// --evicted runs only the decode over mostly evicted pages (the semantic cut's tables), split by
// the planner on kv_len and on the attended pages (run_evicted).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/kv_quant_ops.h"
#include "backend/cpu/machine_probe.h"
#include "backend/split_plan.h"
#include "common/cli_options.h"
#include "common/thread_pool.h"
#include "kernels/common/kv_quant.h"

namespace {

using kvsplit::ThreadPool;
using kvsplit::backend::AttentionArgs;
using Clock = std::chrono::steady_clock;

// Host arrays of one batch: every sequence has kv_len keys and q_len queries; pages shuffled.
struct Batch {
  std::vector<float> pages, q, out;
  std::vector<int32_t> query_start, kv_lens, tables;
  AttentionArgs args;

  Batch(int num_seqs, int kv_len, int q_len, int heads, int kv_heads, int head_dim, int bs) {
    const int per_seq = (kv_len + bs - 1) / bs;
    const int num_blocks = per_seq * num_seqs;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    pages.resize(static_cast<size_t>(num_blocks) * 2 * kv_heads * bs * head_dim);
    for (float& x : pages) x = u(rng);
    q.resize(static_cast<size_t>(num_seqs) * q_len * heads * head_dim);
    for (float& x : q) x = u(rng);
    out.resize(q.size());
    std::vector<int32_t> ids(num_blocks);
    for (int i = 0; i < num_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    tables = ids;
    for (int s = 0; s <= num_seqs; ++s) query_start.push_back(s * q_len);
    kv_lens.assign(num_seqs, kv_len);
    args.q = q.data();
    args.out = out.data();
    args.kv = {pages.data(), kvsplit::backend::DType::kF32, num_blocks, kv_heads, bs, head_dim};
    args.num_seqs = num_seqs;
    args.num_tokens = num_seqs * q_len;
    args.num_heads = heads;
    args.num_kv_heads = kv_heads;
    args.head_dim = head_dim;
    args.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    args.query_start = query_start.data();
    args.kv_lens = kv_lens.data();
    args.block_tables = tables.data();
    args.max_blocks_per_seq = per_seq;
    args.max_query_len = q_len;
    args.max_kv_len = kv_len;
  }
};

// Seconds per call, timed over at least `seconds` after one warm-up call: the mean (wall time,
// or with cpu_time the process CPU time over `threads`: what the threads do while they run, not
// how often a shared machine deschedules them), or with best_call the fastest single call (wall
// time; the least disturbed call on a shared machine). With `flush`, it runs before every call
// untimed, and the mean is of the calls' wall times (cpu_time does not apply).
double time_call(double seconds, const std::function<void()>& fn, bool cpu_time = false,
                 int threads = 1, bool best_call = false,
                 const std::function<void()>* flush = nullptr) {
  fn();
  int64_t n = 0;
  const kvsplit::backend::cpu::ProbeTimer timer(cpu_time, threads);
  const auto t0 = Clock::now();
  double elapsed = 0, best = 1e30, timed = 0;
  do {
    if (flush) (*flush)();
    const auto c0 = Clock::now();
    fn();
    ++n;
    const auto c1 = Clock::now();
    const double call = std::chrono::duration<double>(c1 - c0).count();
    best = std::min(best, call);
    timed += call;
    elapsed = std::chrono::duration<double>(c1 - t0).count();
  } while (flush ? timed < seconds && (n < 8 || elapsed < 4 * seconds) : elapsed < seconds);
  if (best_call) return best;
  return flush ? timed / static_cast<double>(n) : timer.seconds() / static_cast<double>(n);
}

// --cold: reads `bytes` (split over the pool's threads, so every core's own caches are passed
// through too) and keeps a sum the compiler cannot drop.
struct CacheFlush {
  std::vector<uint64_t> buf;
  ThreadPool& pool;
  int threads;
  volatile uint64_t sink = 0;

  CacheFlush(size_t bytes, ThreadPool& p, int t)
      : buf(bytes / sizeof(uint64_t), 1), pool(p), threads(t) {}
  void operator()() {
    std::vector<uint64_t> sums(static_cast<size_t>(threads), 0);
    const int64_t per = static_cast<int64_t>(buf.size()) / threads;
    pool.parallel_for(threads, [&](int64_t i) {
      uint64_t x = 0;
      const uint64_t* b = buf.data() + i * per;
      for (int64_t j = 0; j < per; j += 8) x += b[j];  // one load per 64-byte line
      sums[static_cast<size_t>(i)] = x;
    });
    for (uint64_t x : sums) sink = sink + x;
  }
};

// The decode calls' memory traffic without their arithmetic: every cache line of the K and V rows
// of every (sequence, kv head) in block-table order, one load per line, the items spread over the
// pool as the decode spreads them. What the machine's memory delivers to this access pattern.
uint64_t read_pages_in_order(const Batch& b, ThreadPool& pool) {
  const AttentionArgs& a = b.args;
  const int kv_heads = a.num_kv_heads, bs = a.kv.block_size, hd = a.head_dim;
  const int64_t items = int64_t{a.num_seqs} * kv_heads;
  std::vector<uint64_t> sums(static_cast<size_t>(items), 0);
  pool.parallel_for(items, [&](int64_t item) {
    const int s = static_cast<int>(item / kv_heads), h = static_cast<int>(item % kv_heads);
    const int nb = (a.kv_lens[s] + bs - 1) / bs;
    const int64_t row = int64_t{bs} * hd;  // floats of one page's K (or V) rows of one kv head
    uint64_t x = 0;
    for (int blk = 0; blk < nb; ++blk) {
      const int64_t id = a.block_tables[int64_t{s} * a.max_blocks_per_seq + blk];
      for (int kv = 0; kv < 2; ++kv) {
        const float* p = b.pages.data() + ((id * 2 + kv) * kv_heads + h) * row;
        uint32_t w;
        for (int64_t i = 0; i < row; i += 16) {  // one load per 64-byte line
          std::memcpy(&w, p + i, sizeof(w));
          x += w;
        }
      }
    }
    sums[static_cast<size_t>(item)] = x;
  });
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  return total;
}

// Bytes of the L3 cache cpu 0 sees: sysfs (Linux), else glibc's sysconf, else 0. (On the AMD
// development VM sysconf says 320 MiB where sysfs and lscpu say 32 MiB.)
int64_t l3_cache_bytes() {
  if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
    long long v = 0;
    char unit = 0;
    const int got = std::fscanf(f, "%lld%c", &v, &unit);
    std::fclose(f);
    if (got >= 1 && v > 0) {
      return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
    }
  }
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : 0;
}

// 4x the L3 cache (at least 64 MiB), else 256 MiB.
int default_cold_mb() {
  const int64_t l3 = l3_cache_bytes();
  return l3 > 0 ? static_cast<int>(std::max<int64_t>(64, 4 * (l3 >> 20))) : 256;
}

// The batch's pages quantized into an arena of precision p (same ids), and a precision table
// with every page at p.
struct QuantizedPages {
  std::vector<uint8_t> arena;
  std::vector<uint8_t> precision;

  QuantizedPages(const Batch& b, kvsplit::kernels::KvPrecision p) {
    const kvsplit::backend::LayerKv& kv = b.args.kv;
    const kvsplit::kernels::QuantPageLayout ql{kv.num_kv_heads, kv.block_size, kv.head_dim};
    const int64_t block_elems = int64_t{2} * kv.num_kv_heads * kv.block_size * kv.head_dim;
    precision.assign(b.tables.size(), static_cast<uint8_t>(p));
    if (p == kvsplit::kernels::KvPrecision::kFull) return;
    arena.resize(static_cast<size_t>(kv.num_blocks * ql.bytes(p)));
    for (int id = 0; id < kv.num_blocks; ++id) {
      const kvsplit::Status st = kvsplit::backend::cpu_quantize_kv_page(
          b.pages.data() + id * block_elems, kvsplit::backend::DType::kF32, ql, p,
          arena.data() + id * ql.bytes(p));
      if (!st.ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
    }
  }
};

// The quantized-decode variants over one batch: the plain path (full f32 pages), then the mixed
// path with every page full / int8 / int4.
struct QuantVariants {
  std::vector<QuantizedPages> pages;
  std::vector<AttentionArgs> args;

  explicit QuantVariants(const Batch& b) : args(4, b.args) {
    using kvsplit::kernels::KvPrecision;
    const KvPrecision precisions[3] = {KvPrecision::kFull, KvPrecision::kInt8, KvPrecision::kInt4};
    pages.reserve(3);
    for (int i = 0; i < 3; ++i) {
      pages.emplace_back(b, precisions[i]);
      AttentionArgs& a = args[i + 1];
      a.page_precision = pages[i].precision.data();
      a.int8_pages = precisions[i] == KvPrecision::kInt8 ? pages[i].arena.data() : nullptr;
      a.num_int8_blocks = a.int8_pages ? a.kv.num_blocks : 0;
      a.int4_pages = precisions[i] == KvPrecision::kInt4 ? pages[i].arena.data() : nullptr;
      a.num_int4_blocks = a.int4_pages ? a.kv.num_blocks : 0;
    }
  }
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// --variant: `calls` decode calls of one variant over one sequence of kv_len keys, untimed.
int run_variant(const std::string& variant, int kv_len, int calls, int threads, int heads,
                int kv_heads, int head_dim, int block_size) {
  const std::map<std::string, int> index = {{"full", 0}, {"mixfl", 1}, {"int8", 2}, {"int4", 3}};
  ThreadPool pool(threads);
  Batch b(1, kv_len, 1, heads, kv_heads, head_dim, block_size);
  const auto plan =
      kvsplit::backend::plan_decode_splits(b.kv_lens.data(), 1, kv_heads, block_size, threads);
  const QuantVariants v(b);
  for (int i = 0; i < calls; ++i) {
    const kvsplit::Status st = cpu_attention_decode(v.args[index.at(variant)], plan, pool);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
  }
  std::printf("%s: %d decode calls, kv_len %d\n", variant.c_str(), calls, kv_len);
  return 0;
}

// --evicted: decode over tables most of whose pages are evicted (the semantic cut's), planned by
// the split-K planner on kv_len (plan_decode_splits without the page precisions: the planner
// before 2026-12-07) and on the attended pages (with them), same data, interleaved rounds, best of
// each. Kept pages: the first and the most recent ones ("recent"), or the first, the last and a
// random draw ("scattered"). Both plans' outputs must agree (1e-4); else WRONG and exit 1.
int run_evicted(ThreadPool& pool, int threads, int heads, int kv_heads, int head_dim, int bs,
                double seconds) {
  struct Case {
    const char* name;
    int seqs, kv_len;
    double keep;  // fraction of the pages kept
    bool scattered;
  };
  const Case cases[] = {{"recent", 1, 16384, 0.10, false},
                        {"scattered", 1, 16384, 0.10, true},
                        {"recent", 1, 16384, 0.03, false},
                        {"recent", 1, 4096, 0.10, false},
                        {"recent", 2, 8192, 0.10, false}};
  std::printf("evicted %-9s %4s %6s %5s | %9s %9s | %10s %10s %8s\n", "kept", "seqs", "kv_len",
              "kept", "splits/kv", "splits/at", "us by kv", "us by att", "kv/att");
  constexpr auto kEvicted = static_cast<uint8_t>(kvsplit::kernels::KvPrecision::kEvicted);
  for (const Case& c : cases) {
    Batch b(c.seqs, c.kv_len, 1, heads, kv_heads, head_dim, bs);
    const int per_seq = b.args.max_blocks_per_seq;
    std::vector<uint8_t> prec(b.tables.size(), kEvicted);
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(0, 1);
    const int recent = std::max(1, static_cast<int>(c.keep * per_seq) - 1);
    for (int s = 0; s < c.seqs; ++s) {
      for (int p = 0; p < per_seq; ++p) {
        const bool keep =
            p == 0 || p == per_seq - 1 || (c.scattered ? u(rng) < c.keep : p >= per_seq - recent);
        if (keep) prec[static_cast<size_t>(s) * per_seq + p] = 0;  // kFull
      }
    }
    int kept = 0;
    for (uint8_t p : prec) kept += p != kEvicted;
    AttentionArgs a = b.args;
    a.page_precision = prec.data();
    const auto by_kv =
        kvsplit::backend::plan_decode_splits(b.kv_lens.data(), c.seqs, kv_heads, bs, threads);
    const auto by_att = kvsplit::backend::plan_decode_splits(
        b.kv_lens.data(), c.seqs, kv_heads, bs, threads, {}, 0, {prec.data(), per_seq});
    kvsplit::Status st = cpu_attention_decode(a, by_kv, pool);
    const std::vector<float> out_kv = b.out;
    if (st.ok()) st = cpu_attention_decode(a, by_att, pool);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    float diff = 0;
    for (size_t i = 0; i < out_kv.size(); ++i)
      diff = std::max(diff, std::fabs(out_kv[i] - b.out[i]));
    constexpr int kRounds = 5;
    double t_kv = 1e30, t_att = 1e30;
    for (int round = 0; round < kRounds; ++round) {
      t_kv = std::min(
          t_kv, time_call(seconds / kRounds, [&] { st = cpu_attention_decode(a, by_kv, pool); }));
      t_att = std::min(
          t_att, time_call(seconds / kRounds, [&] { st = cpu_attention_decode(a, by_att, pool); }));
    }
    std::printf("evicted %-9s %4d %6d %4.0f%% | %9d %9d | %10.1f %10.1f %7.2fx%s\n", c.name, c.seqs,
                c.kv_len, 100.0 * kept / prec.size(), by_kv.total_splits, by_att.total_splits,
                t_kv * 1e6, t_att * 1e6, t_kv / t_att, diff > 1e-4f ? " WRONG" : "");
    if (diff > 1e-4f) {
      std::fprintf(stderr, "evicted %s: the two plans' outputs differ by %g\n", c.name, diff);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU paged attention benchmark"};
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int heads = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  double seconds = 0.3;
  bool quant_only = false;
  int repeats = 1;
  bool cpu_time = false, best_call = false;
  std::string variant;
  int kv_len_only = 4096, calls = 3;
  bool cold = false, warm = false;
  int cold_mb = default_cold_mb();
  app.add_option("--threads", threads, "threads (default: hardware threads)")
      ->check(kvsplit::kPositive);
  app.add_option("--heads", heads, "query heads")->check(kvsplit::kPositive);
  app.add_option("--kv-heads", kv_heads, "kv heads (divides --heads)")->check(kvsplit::kPositive);
  app.add_option("--head-dim", head_dim, "head_dim")->check(kvsplit::kPositive);
  app.add_option("--block-size", block_size, "tokens per page")->check(kvsplit::kPositive);
  app.add_option("--seconds", seconds, "minimum timed seconds per case")->check(kvsplit::kPositive);
  app.add_flag("--quant-only", quant_only, "run only the quantized-page decode cases");
  app.add_flag("--cpu-time", cpu_time, "time the quantized cases by process CPU time / threads");
  app.add_flag("--best-call", best_call, "time the quantized cases by their fastest single call");
  app.add_option("--repeats", repeats, "measure the quantized cases N times, print median ratios")
      ->check(kvsplit::kPositive);
  app.add_flag("--cold", cold,
               "read --cold-mb MiB before each timed decode call (untimed): KV read from memory "
               "(the quantized cases are cold unless --warm)");
  app.add_flag("--warm", warm, "time the quantized cases warm (no flush; a small KV stays in L3)");
  app.add_option("--cold-mb", cold_mb, "buffer --cold reads (MiB; default 4x the L3 cache)")
      ->check(kvsplit::kPositive);
  app.add_option("--variant", variant, "run only this quantized-decode variant (no timing)")
      ->check(CLI::IsMember({"full", "mixfl", "int8", "int4"}));
  app.add_option("--kv-len", kv_len_only, "kv_len of --variant")->check(kvsplit::kPositive);
  app.add_option("--calls", calls, "decode calls of --variant")->check(kvsplit::kPositive);
  bool evicted = false;
  app.add_flag("--evicted", evicted,
               "run only the decode over mostly evicted pages, planned on kv_len and on the "
               "attended pages");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (!variant.empty()) {
    return run_variant(variant, kv_len_only, calls, threads, heads, kv_heads, head_dim, block_size);
  }

  ThreadPool pool(threads);
  if (evicted) {
    std::printf("threads %d, heads %d/%d, head_dim %d, block_size %d\n", threads, heads, kv_heads,
                head_dim, block_size);
    return run_evicted(pool, threads, heads, kv_heads, head_dim, block_size, seconds);
  }
  const double bw = kvsplit::backend::cpu::measure_read_bandwidth_gbs(pool);
  const double peak = kvsplit::backend::cpu::measure_fma_peak_gflops(pool);
  std::printf("threads %d, heads %d/%d, head_dim %d, block_size %d\n", threads, heads, kv_heads,
              head_dim, block_size);
  std::printf("measured read bandwidth %.1f GB/s, fp32 FMA peak %.1f GFLOP/s\n", bw, peak);
  std::optional<CacheFlush> flusher;
  std::function<void()> flush_fn;
  const bool quant_cold = !warm;
  if (cold || quant_cold) {
    flusher.emplace(static_cast<size_t>(cold_mb) << 20, pool, threads);
    flush_fn = [&] { (*flusher)(); };
  }
  const std::function<void()>* flush = cold ? &flush_fn : nullptr;
  const std::function<void()>* quant_flush = quant_cold ? &flush_fn : nullptr;
  const int64_t l3 = l3_cache_bytes();
  std::printf("L3 cache %.0f MiB; flush buffer %d MiB\n", static_cast<double>(l3) / (1 << 20),
              cold_mb);
  if (!quant_only) {
    std::printf("decode calls timed %s\n\n",
                cold ? "cold (caches flushed before each call, untimed; --cold)"
                     : "warm (a KV that fits the caches stays there between calls)");
  }

  std::printf("decode  %5s %7s | %10s %10s %8s | %6s %7s %7s %8s %8s\n", "seqs", "kv_len",
              "us nosplit", "us split", "speedup", "splits", "KV GB/s", "of BW", "read GB/s",
              "of read");
  const int decode_cases[][2] = {{1, 1024}, {1, 4096},  {1, 16384},
                                 {4, 4096}, {16, 1024}, {64, 512}};
  for (const auto& dc : decode_cases) {
    if (quant_only) break;
    Batch b(dc[0], dc[1], 1, heads, kv_heads, head_dim, block_size);
    const auto none = kvsplit::backend::make_split_plan(b.kv_lens.data(), dc[0], block_size, 0);
    const auto plan = kvsplit::backend::plan_decode_splits(b.kv_lens.data(), dc[0], kv_heads,
                                                           block_size, threads);
    kvsplit::Status st;
    const double t_none = time_call(
        seconds, [&] { st = cpu_attention_decode(b.args, none, pool); }, false, threads, false,
        flush);
    const double t_split = time_call(
        seconds, [&] { st = cpu_attention_decode(b.args, plan, pool); }, false, threads, false,
        flush);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    const double bytes = 2.0 * dc[0] * dc[1] * kv_heads * head_dim * sizeof(float);
    const double gbs = bytes / std::min(t_none, t_split) / 1e9;
    volatile uint64_t sink = 0;
    const double t_read = time_call(
        seconds, [&] { sink = sink + read_pages_in_order(b, pool); }, false, threads, false, flush);
    const double read_gbs = bytes / t_read / 1e9;
    std::printf("decode  %5d %7d | %10.1f %10.1f %7.2fx | %6d %7.1f %6.0f%% %8.1f %7.0f%%\n", dc[0],
                dc[1], t_none * 1e6, t_split * 1e6, t_none / t_split, plan.max_splits, gbs,
                100 * gbs / bw, read_gbs, 100 * gbs / read_gbs);
  }

  // Quantized pages: the same decode (split-K planner) over full f32 pages (the plain path),
  // the mixed path with every page full, and every page int8 / int4.
  using kvsplit::kernels::KvPrecision;
  const kvsplit::kernels::QuantPageLayout ql{kv_heads, block_size, head_dim};
  const double full_bpt = 2.0 * kv_heads * head_dim * sizeof(float);
  const double int8_bpt = static_cast<double>(ql.bytes(KvPrecision::kInt8)) / block_size;
  const double int4_bpt = static_cast<double>(ql.bytes(KvPrecision::kInt4)) / block_size;
  std::printf(
      "\nKV bytes read per token and layer: full %.0f, int8 %.0f (%.3fx), int4 %.0f (%.3fx)\n",
      full_bpt, int8_bpt, int8_bpt / full_bpt, int4_bpt, int4_bpt / full_bpt);
  // Cold, the mean wall time of the calls after each flush (cpu_time does not apply).
  std::printf("quant cases timed %s, by %s\n",
              quant_cold ? "cold (caches flushed before each call, untimed; --warm turns it off)"
                         : "warm (--warm: a KV that fits the L3 stays there between calls)",
              best_call    ? "the fastest single call (wall)"
              : quant_cold ? "the mean wall time of the cold calls"
              : cpu_time   ? "process CPU time / threads"
                           : "wall time");
  if (quant_cold && cpu_time && !best_call) {
    std::printf("note: --cpu-time applies only with --warm; the cold calls are timed by wall\n");
  }
  const int quant_cases[][2] = {{1, 4096}, {1, 16384}, {4, 4096}};
  constexpr int kCases = 3;
  if (!quant_cold) {
    const char* names[3] = {"full/mixfl", "int8", "int4"};
    const double bpt[3] = {full_bpt, int8_bpt, int4_bpt};
    for (const auto& qc : quant_cases) {
      for (int i = 0; i < 3; ++i) {
        const double kv_bytes = bpt[i] * qc[0] * qc[1];
        if (l3 > 0 && kv_bytes <= static_cast<double>(l3)) {
          std::printf(
              "warning: warm: %d x %d %s KV is %.1f MiB, within the %.0f MiB L3: it can stay "
              "cached between calls, so its time (and ratio) is not a read from memory\n",
              qc[0], qc[1], names[i], kv_bytes / (1 << 20), static_cast<double>(l3) / (1 << 20));
        }
      }
    }
  }
  std::printf("quant   %5s %7s | %9s %9s %9s %9s | %9s %9s %9s\n", "seqs", "kv_len", "us full",
              "us mixfl", "us int8", "us int4", "mixfl/f", "int8/f", "int4/f");
  std::vector<double> ratios[kCases][3];  // [case][mixfl, int8, int4 over full] per repeat
  for (int rep = 0; rep < repeats; ++rep) {
    for (int ci = 0; ci < kCases; ++ci) {
      const auto& qc = quant_cases[ci];
      Batch b(qc[0], qc[1], 1, heads, kv_heads, head_dim, block_size);
      const auto plan = kvsplit::backend::plan_decode_splits(b.kv_lens.data(), qc[0], kv_heads,
                                                             block_size, threads);
      const QuantVariants v(b);
      const std::vector<AttentionArgs>& args = v.args;
      // Interleaved rounds, best of each: a busy machine slows every variant alike.
      constexpr int kRounds = 5;
      double t[4] = {1e30, 1e30, 1e30, 1e30};
      kvsplit::Status st;
      for (int round = 0; round < kRounds && st.ok(); ++round) {
        for (int i = 0; i < 4 && st.ok(); ++i) {
          t[i] = std::min(
              t[i], time_call(
                        seconds / kRounds, [&] { st = cpu_attention_decode(args[i], plan, pool); },
                        cpu_time, threads, best_call, quant_flush));
        }
      }
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        return 1;
      }
      std::printf("quant   %5d %7d | %9.1f %9.1f %9.1f %9.1f | %8.2fx %8.2fx %8.2fx\n", qc[0],
                  qc[1], t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[3] * 1e6, t[1] / t[0], t[2] / t[0],
                  t[3] / t[0]);
      for (int i = 0; i < 3; ++i) ratios[ci][i].push_back(t[i + 1] / t[0]);
    }
  }
  if (repeats > 1) {
    std::printf("median of %d repeats (ratios measured in the same repeat):\n", repeats);
    for (int ci = 0; ci < kCases; ++ci) {
      std::printf("quant   %5d %7d | %9s %9s %9s %9s | %8.2fx %8.2fx %8.2fx\n", quant_cases[ci][0],
                  quant_cases[ci][1], "", "", "", "", median(ratios[ci][0]), median(ratios[ci][1]),
                  median(ratios[ci][2]));
    }
  }
  if (quant_only) return 0;

  std::printf("\nprefill %5s %7s | %10s %10s %7s\n", "seqs", "q_len", "ms/call", "GFLOP/s",
              "of peak");
  const int prefill_cases[][2] = {{1, 128}, {1, 512}, {1, 2048}, {4, 512}};
  for (const auto& pc : prefill_cases) {
    if (quant_only) break;
    Batch b(pc[0], pc[1], pc[1], heads, kv_heads, head_dim, block_size);
    kvsplit::Status st;
    const double t = time_call(seconds, [&] { st = cpu_attention_prefill(b.args, pool); });
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    // QK^T and PV: 2 * 2 * head_dim FLOPs per (query head, visible key) pair.
    const double pairs = static_cast<double>(pc[0]) * heads * pc[1] * (pc[1] + 1) / 2.0;
    const double gflops = 4.0 * head_dim * pairs / t / 1e9;
    std::printf("prefill %5d %7d | %10.2f %10.1f %6.0f%%\n", pc[0], pc[1], t * 1e3, gflops,
                100 * gflops / peak);
  }
  return 0;
}
