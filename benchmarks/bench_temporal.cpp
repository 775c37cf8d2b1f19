// Temporal cut benchmarks (issue 12), each a ratio measured in the same run:
//   --restore  restoring one sequence's KV (default 2048 tokens) from the host tier and from the
//              disk tier, against recomputing it (its prefill); the disk swap-out also with
//              write-behind (kv.disk.write_behind: the time the worker waits, against the
//              synchronous write's, and when the record was complete). --disk-direct-io opens the
//              tier with O_DIRECT (writes reach the device). The disk swap-in follows its own
//              buffered swap-out, so it reads the page cache (memory); --cold adds a disk round
//              trip whose record is written back and dropped from the page cache
//              (DiskTier::drop_cache) before the timed swap-in. Every swap-in's pages are compared
//              byte for byte with the prefill's (temporal_restore.cpp);
//   --prefix   TTFT of requests that share a system prompt (default 400 tokens) with the prefix
//              cache on: the first request against the later ones (and the cache off as control).
//              Greedy, EOS ignored: every request's tokens must equal the cache-off run's
//              (checked; a difference fails the run, naming the request).
//              --prefix-spill host|disk adds a run whose device pool is just big enough for one
//              request: between two requests another tenant's long prompt pushes the prefix out
//              to the host tier (or, with `disk`, no host tier: the disk tier), so every later
//              request swaps it back in from there.
//   --swap-bandwidth  swapping a sequence of --pages pages out to the host tier and back in,
//              against one contiguous copy of the same bytes between a device buffer and the
//              host tier's own memory (the reference the ratio is quoted against), per
//              direction; also against a copy into a second alloc_host buffer (pinned on CUDA:
//              where it lies in host memory can change the link's rate from buffer to buffer),
//              and the swap with each batch copy method (Backend::BatchCopyMethod: on CUDA the
//              copy kernel and the copy engines; one way on the CPU backend).
//   --spill-alloc  the allocation path when it evicts prefix-cache pages to the disk tier (no host
//              tier): each allocation of one block spills the least recently used cached page.
//              Synchronous spills (the write completes before the allocation returns) against
//              asynchronous ones (the write is in flight when it returns), alternating in one run:
//              allocation latency, and pages/s including the time until every write completed.
//   --spill-ahead  prefix-cache spills to the host tier as a worker makes them: each "step" reads
//              a --step-mb buffer (memory-bound, like a decode step) and then allocates --alloc
//              blocks out of a pool full of cached pages. Spills on the allocation path (the copy
//              made when the block is needed) against spill-ahead (kv.prefix_spill_ahead_blocks:
//              the copies started at the end of the previous step on the backend's copy thread,
//              landing during the step), alternating in one run: allocation latency and step time.
//   --resume-step  the step that resumes a sequence swapped out to the host tier (its swap-in,
//              then a decode step of another sequence of the same context), with the host
//              prefetch (kv::start_host_prefetch: blocks reserved and the copy queued on the
//              CPU backend's copy thread before the previous step's forward pass) against
//              without (the swap-in copies), alternating in one run on one backend
//              (async_copies on).
//
//   bench_temporal --model synthetic:llama-110m --restore --tokens 2048 --threads 2 --cold
//   bench_temporal --model synthetic:llama-110m --resume-step --tokens 1024 --threads 2 --reps 9
//   bench_temporal --model synthetic:llama-110m --spill-alloc --pages 64 --reps 5
//   bench_temporal --model synthetic:llama-110m --spill-ahead --pages 64 --alloc 2 --reps 5
//   bench_temporal --model synthetic:llama-110m --swap-bandwidth --pages 128 --backend cuda
//   bench_temporal --model synthetic:llama-110m --prefix --prefix-tokens 400 --threads 2
//   bench_temporal --model synthetic:llama-110m --prefix --prefix-tokens 400 --requests 8
//       --threads 2 --prefix-spill host
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/cli_options.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "kv/swap.h"
#include "kvsplit/engine.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "temporal.h"
#include "token_check.h"

namespace {

using kvsplit::bench_temporal::Clock;
using kvsplit::bench_temporal::CpuModel;
using kvsplit::bench_temporal::load_cpu_model;
using kvsplit::bench_temporal::ms_since;
using kvsplit::bench_temporal::Options;
using kvsplit::bench_temporal::run_restore;

int run_spill_alloc(const Options& o) {
  CpuModel m;
  if (!load_cpu_model(o, &m)) return 1;
  kvsplit::kv::KvPoolConfig pc;
  pc.block_size = 16;
  pc.num_blocks = o.pages;
  auto pool = kvsplit::kv::KvPool::create(*m.be, pc, m.model->kv_shape());
  if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().to_string().c_str()), 1;
  kvsplit::kv::KvPool& p = **pool;
  p.enable_prefix_cache();
  std::filesystem::remove_all(o.disk_path + "-spill");
  // Room for two rounds of pages: older records are dropped to make room as the cache's own.
  const kvsplit::Status st =
      p.open_disk_tier(o.disk_path + "-spill", int64_t{2} * o.pages * (p.bytes_per_block() + 8192));
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  kvsplit::kv::PrefixCache& cache = *p.prefix_cache();
  struct Result {
    std::vector<double> alloc_us;
    double total_s = 0;  // allocations + waiting for the writes
    int64_t pages = 0;
  };
  Result res[2];  // [0] synchronous, [1] asynchronous
  int32_t next_token = 3;
  for (int r = 0; r < 2 * o.reps; ++r) {
    const bool async = r % 2 == 1;
    cache.set_async_spills(async);
    // Cache every block as one prompt's pages, then end the sequence: all evictable.
    std::vector<int32_t> toks(static_cast<size_t>(o.pages) * 16);
    for (int32_t& t : toks) t = next_token++;
    kvsplit::kv::BlockTable table;
    if (!p.reserve(table, static_cast<int>(toks.size()))) return 1;
    p.cache_prefix(table, kvsplit::kv::PrefixCache::salt_of("bench"), toks, o.pages);
    p.release(table);
    Result& out = res[async];
    std::vector<int32_t> held;
    const auto t0 = Clock::now();
    for (int i = 0; i < o.pages; ++i) {
      const auto a0 = Clock::now();
      auto b = p.allocate_blocks(1);  // evicts (spills) one cached page
      out.alloc_us.push_back(ms_since(a0) * 1e3);
      if (!b) return std::fprintf(stderr, "allocation refused\n"), 1;
      held.push_back((*b)[0]);
    }
    cache.wait_spills();
    out.total_s += ms_since(t0) / 1e3;
    out.pages += o.pages;
    for (int32_t b : held) p.allocator().decref(b);
  }
  const auto& cs = cache.stats();
  if (cs.spill_faults != 0 || cs.spilled_disk == 0)
    return std::fprintf(stderr, "spill faults %lld\n", static_cast<long long>(cs.spill_faults)), 1;
  auto pct = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
  };
  auto mean = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return t / static_cast<double>(v.size());
  };
  std::printf(
      "spill-alloc: %s, %d-block pool, %.2f MiB pages, disk tier only (backend %s), %d rounds "
      "each, alternating\n",
      o.model.c_str(), o.pages, p.bytes_per_block() / 1048576.0,
      std::string(kvsplit::kv::io_backend_name(p.disk()->io_backend())).c_str(), o.reps);
  for (int a = 0; a < 2; ++a)
    std::printf(
        "  %-5s allocation latency mean %8.1f us, p50 %8.1f, p99 %8.1f; %7.0f pages/s until "
        "every write completed\n",
        a ? "async" : "sync", mean(res[a].alloc_us), pct(res[a].alloc_us, 0.5),
        pct(res[a].alloc_us, 0.99), static_cast<double>(res[a].pages) / res[a].total_s);
  std::printf("  spills that waited for an older write (the in-flight cap, disk room): %lld\n",
              static_cast<long long>(cs.spill_waits));
  std::printf("  async/sync: allocation latency mean %.2fx, p50 %.2fx; throughput %.2fx\n",
              mean(res[1].alloc_us) / mean(res[0].alloc_us),
              pct(res[1].alloc_us, 0.5) / pct(res[0].alloc_us, 0.5),
              (static_cast<double>(res[1].pages) / res[1].total_s) /
                  (static_cast<double>(res[0].pages) / res[0].total_s));
  pool->reset();
  std::filesystem::remove_all(o.disk_path + "-spill");
  return 0;
}

int run_spill_ahead(const Options& o) {
  auto loaded = kvsplit::model::load_model(o.model);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 1;
  const kvsplit::model::ModelConfig& mc = loaded->config;
  const kvsplit::kv::KvShape shape{mc.num_layers, mc.num_kv_heads, mc.head_dim};
  struct Side {
    std::unique_ptr<kvsplit::backend::Backend> be;
    std::unique_ptr<kvsplit::kv::KvPool> pool;
    std::vector<double> alloc_us, step_us;
  };
  Side side[2];  // [0] on the allocation path, [1] spill-ahead
  for (int a = 0; a < 2; ++a) {
    kvsplit::backend::BackendOptions bo;
    bo.threads = o.threads;
    bo.async_copies = a == 1;
    auto be = kvsplit::backend::create_backend("cpu", bo);
    if (!be.ok()) return std::fprintf(stderr, "%s\n", be.status().to_string().c_str()), 1;
    side[a].be = std::move(be).value();
    kvsplit::kv::KvPoolConfig pc;
    pc.block_size = 16;
    pc.num_blocks = o.pages;
    pc.host_bytes = int64_t{4} * o.pages * kvsplit::kv::KvPool::block_bytes(pc, shape);
    pc.prefix_free_target = a == 1 ? o.alloc : 0;
    auto pool = kvsplit::kv::KvPool::create(*side[a].be, pc, shape);
    if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().to_string().c_str()), 1;
    side[a].pool = std::move(pool).value();
    side[a].pool->enable_prefix_cache();
  }
  // The step's own work: one pass over a buffer bigger than the caches.
  std::vector<float> work(static_cast<size_t>(o.step_mb) << 18, 1.f);
  volatile float sink = 0;
  auto step_work = [&] {
    float s = 0;
    for (size_t i = 0; i < work.size(); i += 16) s += work[i];
    sink = sink + s;
  };
  int32_t next_token = 3;
  const int steps = o.pages / o.alloc;
  for (int r = 0; r < 2 * o.reps; ++r) {
    Side& sd = side[r % 2];
    kvsplit::kv::KvPool& p = *sd.pool;
    // Every block cached as one prompt's pages, the sequence ended: all evictable, none free.
    std::vector<int32_t> toks(static_cast<size_t>(o.pages) * 16);
    for (int32_t& t : toks) t = next_token++;
    kvsplit::kv::BlockTable table;
    if (!p.reserve(table, static_cast<int>(toks.size()))) return 1;
    p.cache_prefix(table, kvsplit::kv::PrefixCache::salt_of("bench"), toks, o.pages);
    p.release(table);
    p.spill_prefix_ahead();  // the end of the step before the first
    std::vector<int32_t> held;
    for (int s = 0; s < steps; ++s) {
      const auto s0 = Clock::now();
      p.poll_prefix_spills();  // Worker::step's order: poll, the step's work, spill-ahead
      step_work();
      const auto a0 = Clock::now();
      auto b = p.allocate_blocks(o.alloc);
      sd.alloc_us.push_back(ms_since(a0) * 1e3);
      if (!b) return std::fprintf(stderr, "allocation refused\n"), 1;
      held.insert(held.end(), b->begin(), b->end());
      p.spill_prefix_ahead();
      sd.step_us.push_back(ms_since(s0) * 1e3);
    }
    for (int32_t b : held) p.allocator().decref(b);
    p.prefix_cache()->poll_landings(p.allocator(), -1);
    p.prefix_cache()->clear(p.allocator());
  }
  auto pct = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
  };
  auto mean = [](const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return t / static_cast<double>(v.size());
  };
  const auto& st = side[1].pool->prefix_cache()->stats();
  std::printf(
      "spill-ahead: %s, %d-block pool, %.2f MiB pages, %d blocks per step, %d MiB read per step, "
      "%d threads, %d rounds each, alternating\n",
      o.model.c_str(), o.pages, side[0].pool->bytes_per_block() / 1048576.0, o.alloc, o.step_mb,
      o.threads, o.reps);
  for (int a = 0; a < 2; ++a)
    std::printf(
        "  %-11s allocation mean %8.1f us, p50 %8.1f, p99 %8.1f; step mean %8.1f us, p99 %8.1f\n",
        a ? "spill-ahead" : "on-demand", mean(side[a].alloc_us), pct(side[a].alloc_us, 0.5),
        pct(side[a].alloc_us, 0.99), mean(side[a].step_us), pct(side[a].step_us, 0.99));
  std::printf("  spill-ahead copies started %lld, landed and freed %lld, kept on device %lld\n",
              static_cast<long long>(st.ahead_started), static_cast<long long>(st.ahead_spilled),
              static_cast<long long>(st.ahead_kept));
  std::printf("  ahead/on-demand: allocation mean %.2fx, p99 %.2fx; step mean %.3fx\n",
              mean(side[1].alloc_us) / mean(side[0].alloc_us),
              pct(side[1].alloc_us, 0.99) / pct(side[0].alloc_us, 0.99),
              mean(side[1].step_us) / mean(side[0].step_us));
  return 0;
}

int run_prefix(const Options& o) {
  enum class Run { kOff, kOn, kSpill };
  std::vector<Run> runs = {Run::kOff, Run::kOn};
  if (!o.prefix_spill.empty()) runs.push_back(Run::kSpill);
  kvsplit::bench::Outputs off_tokens;  // the measured requests' tokens with the cache off
  for (Run run : runs) {
    kvsplit::EngineConfig c;
    c.model = o.model;
    c.mode = kvsplit::ServingMode::kColocated;
    c.threads_per_worker = o.threads;
    c.num_decode_workers = 1;
    c.max_batch_tokens = 2048;
    c.prefix_cache = run != Run::kOff;
    c.block_size = 16;
    const int prompt = o.prefix_tokens + o.suffix_tokens;
    const int request_pages = (prompt + 2 + 15) / 16;
    if (run == Run::kSpill) {
      // Room for one request and a few pages more: the filler's prompt needs every block.
      c.kv_blocks_per_worker = request_pages + 4;
      if (o.prefix_spill == "host") {
        c.temporal.host_capacity_mb = 256;
      } else {
        std::filesystem::remove_all(o.disk_path + "-prefix");
        std::filesystem::create_directories(o.disk_path + "-prefix");
        c.temporal.disk_path = o.disk_path + "-prefix";
        c.temporal.disk_capacity_mb = 1024;
      }
    }
    auto engine = kvsplit::Engine::create(c);
    if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
    std::mt19937 rng(2);
    const int vocab = (*engine)->model_info().vocab_size;
    std::vector<int32_t> system(o.prefix_tokens);
    for (int32_t& t : system) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    // Another tenant's prompt as long as the pool: serving it evicts every cached page.
    std::vector<int32_t> filler((request_pages + 4) * 16 - 2);
    for (int32_t& t : filler) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    kvsplit::bench::Outputs tokens;  // the measured requests'
    auto serve = [&](kvsplit::Request r, double* ttft) -> int {
      r.sampling.max_tokens = 2;
      r.sampling.ignore_eos = true;
      r.sampling.temperature = 0;
      auto h = (*engine)->submit(r);
      if (!h.ok()) return std::fprintf(stderr, "%s\n", h.status().to_string().c_str()), 1;
      kvsplit::TokenEvent ev;
      std::vector<int32_t> out;
      if (!kvsplit::bench::drain_tokens(*h, &ev, &out, std::chrono::minutes(5)))
        return std::fprintf(stderr, "no final event\n"), 1;
      if (!ev.status.ok()) return std::fprintf(stderr, "%s\n", ev.status.to_string().c_str()), 1;
      if (ttft != nullptr) {
        *ttft = ev.timings.ttft_ms;
        tokens.push_back(std::move(out));
      }
      return 0;
    };
    // One short request of another tenant first (its pages share nothing with the prefix): the
    // first measured request must not also pay the new engine's start-up, or the "x lower" ratio
    // would credit the cache with it (the cache-off run showed 1.03-1.25x from that alone).
    {
      kvsplit::Request w;
      w.tenant = "warm-up";
      for (int k = 0; k < 32; ++k)
        w.prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
      if (serve(w, nullptr) != 0) return 1;
    }
    std::vector<double> ttft;
    for (int i = 0; i < o.requests; ++i) {
      if (run == Run::kSpill && i > 0) {
        kvsplit::Request f;
        f.tenant = "filler";
        f.prompt_token_ids = filler;
        if (serve(f, nullptr) != 0) return 1;
      }
      kvsplit::Request r;
      r.tenant = "bench";
      r.prompt_token_ids = system;
      for (int k = 0; k < o.suffix_tokens; ++k)
        r.prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
      double t = 0;
      if (serve(r, &t) != 0) return 1;
      ttft.push_back(t);
    }
    std::vector<double> later(ttft.begin() + 1, ttft.end());
    std::sort(later.begin(), later.end());
    const double median = later[later.size() / 2];
    const char* name = run == Run::kOff ? "off" : run == Run::kOn ? "on" : "on, spilled";
    std::printf(
        "prefix cache %s%s%s: %s, %d-token shared prefix + %d, %d requests one after another "
        "(after a warm-up request of another tenant): first TTFT %.1f ms, later median %.1f ms "
        "(%.1fx lower); tokens same as off: %s\n",
        name, run == Run::kSpill ? " to " : "", run == Run::kSpill ? o.prefix_spill.c_str() : "",
        o.model.c_str(), o.prefix_tokens, o.suffix_tokens, o.requests, ttft[0], median,
        ttft[0] / median,
        run == Run::kOff ? "yes" : kvsplit::bench::same_tokens(off_tokens, tokens));
    if (run == Run::kSpill) {
      const kvsplit::EngineStats s = (*engine)->stats();
      for (const kvsplit::PoolStats& p : s.pools)
        std::printf(
            "  %s: %d device pages; prefix hits %lld tokens (host %lld, disk %lld), spilled %lld "
            "pages to host, %lld to disk, %lld faults\n",
            p.name.c_str(), p.kv_blocks_total, static_cast<long long>(p.kv_prefix_hits),
            static_cast<long long>(p.kv_prefix_hits_host),
            static_cast<long long>(p.kv_prefix_hits_disk),
            static_cast<long long>(p.kv_prefix_spills_host),
            static_cast<long long>(p.kv_prefix_spills_disk),
            static_cast<long long>(p.kv_prefix_spill_faults));
    }
    if (run == Run::kOff) {
      off_tokens = std::move(tokens);
    } else if (kvsplit::bench::check_same_tokens("prefix", off_tokens, "prefix cache off", tokens,
                                                 std::string("prefix cache ") + name)) {
      return 1;
    }
  }
  if (!o.prefix_spill.empty()) std::filesystem::remove_all(o.disk_path + "-prefix");
  return 0;
}

// The time of one call of `fn` in milliseconds; -1 when it failed.
template <class Fn>
double time_ms(Fn&& fn) {
  const auto t0 = Clock::now();
  return fn() ? ms_since(t0) : -1;
}

int run_swap_bandwidth(const Options& o) {
  auto loaded = kvsplit::model::load_model(o.model);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 1;
  const auto& mc = loaded->config;
  const kvsplit::kv::KvShape shape{mc.num_layers, mc.num_kv_heads, mc.head_dim};
  auto be = kvsplit::backend::create_backend(o.backend, o.threads);
  if (!be.ok()) return std::fprintf(stderr, "%s\n", be.status().to_string().c_str()), 1;
  kvsplit::backend::Backend& b = **be;
  kvsplit::kv::KvPoolConfig pc;
  pc.block_size = 16;
  pc.num_blocks = o.pages;
  const int64_t page = kvsplit::kv::KvPool::block_bytes(pc, shape);  // all layers
  pc.host_bytes = page * o.pages;
  auto pool = kvsplit::kv::KvPool::create(b, pc, shape);
  if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().to_string().c_str()), 1;
  kvsplit::kv::BlockTable table;
  if (!(*pool)->reserve(table, o.pages * pc.block_size)) return 1;
  // The references: one copy of the same bytes between a device buffer and the host tier's own
  // memory (its slots are one allocation: slot 0 on, o.pages slots, free between the swaps), and
  // the same with a second alloc_host buffer.
  const size_t bytes = static_cast<size_t>(page) * static_cast<size_t>(o.pages);
  auto dev = kvsplit::backend::DeviceBuffer::make(b, bytes);
  auto host = b.alloc_host(bytes);
  if (!dev.ok() || !host.ok()) return std::fprintf(stderr, "out of memory\n"), 1;
  std::memset(*host, 1, bytes);
  void* tier = (*pool)->host_slot(0);
  // Touched before the timing, as the second buffer is: the first copy into fresh pages would
  // time their faults (a 4x slower reference at --reps 1).
  std::memset(tier, 1, bytes);
  auto copy = [&](void* h, bool d2h) {
    const kvsplit::Status st =
        d2h ? b.copy_d2h_async(h, dev->get(), bytes) : b.copy_h2d_async(dev->get(), h, bytes);
    return st.ok() && b.synchronize().ok();
  };
  // The third reference: the same bytes in the swap's pieces (one page of one layer each), one
  // copy call after another: what the swap did before it batched its copies.
  const size_t piece = static_cast<size_t>(page / mc.num_layers);
  auto copy_pieces = [&](bool d2h) {
    auto* h = static_cast<std::byte*>(*host);
    auto* d = dev->get<std::byte>();
    for (size_t off = 0; off < bytes; off += piece) {
      const kvsplit::Status st = d2h ? b.copy_d2h_async(h + off, d + off, piece)
                                     : b.copy_h2d_async(d + off, h + off, piece);
      if (!st.ok()) return false;
    }
    return b.synchronize().ok();
  };
  using Method = kvsplit::backend::Backend::BatchCopyMethod;
  kvsplit::kv::SwapStats st;
  auto swap = [&](Method m, bool out) {
    b.set_batch_copy_method(m);
    auto done =
        out ? kvsplit::kv::swap_out(**pool, table, &st) : kvsplit::kv::swap_in(**pool, table, &st);
    b.set_batch_copy_method(Method::kAuto);
    return done.ok() && *done;
  };
  // Best of o.reps, per direction: [0] the tier copy, [1] the second buffer's copy, [2] one call
  // per piece, [3] swap by the kernel, [4] swap by the copy engines.
  double best[2][5];
  for (auto& dir : best)
    for (double& v : dir) v = 1e30;
  bool ok = true;
  auto keep = [&](double& slot, double ms) {
    ok = ok && ms >= 0;
    slot = std::min(slot, ms);
  };
  for (int r = 0; r < o.reps && ok; ++r) {  // interleaved, so drift hits all alike
    keep(best[0][0], time_ms([&] { return copy(tier, true); }));
    keep(best[0][1], time_ms([&] { return copy(*host, true); }));
    keep(best[0][2], time_ms([&] { return copy_pieces(true); }));
    keep(best[0][3], time_ms([&] { return swap(Method::kKernel, true); }));
    keep(best[1][3], time_ms([&] { return swap(Method::kKernel, false); }));
    keep(best[0][4], time_ms([&] { return swap(Method::kDma, true); }));
    keep(best[1][4], time_ms([&] { return swap(Method::kDma, false); }));
    keep(best[1][2], time_ms([&] { return copy_pieces(false); }));
    keep(best[1][1], time_ms([&] { return copy(*host, false); }));
    keep(best[1][0], time_ms([&] { return copy(tier, false); }));
  }
  b.free_host(*host);
  if (!ok || st.to_disk != 0) return std::fprintf(stderr, "swap-bandwidth: a copy failed\n"), 1;
  const double gb = static_cast<double>(bytes) / 1e6;  // bytes per ms -> GB/s
  std::printf(
      "swap-bandwidth: %s, %s, %d pages of %.1f KiB (%d layers x %.1f KiB per copy), host "
      "memory %s, best of %d\n",
      o.model.c_str(), b.name().c_str(), o.pages, static_cast<double>(page) / 1024, mc.num_layers,
      static_cast<double>(page) / mc.num_layers / 1024,
      b.host_memory_pinned() ? "pinned" : "pageable", o.reps);
  if (b.kind() != kvsplit::backend::DeviceKind::kCuda)
    std::printf(
        "  (this backend copies one way: \"copy kernel\" and \"copy engines\" are the same "
        "copies, timed twice)\n");
  for (int d = 0; d < 2; ++d) {
    const double* v = best[d];
    std::printf(
        "  %s: one copy into the tier %.2f GB/s; swap, copy kernel %.2f GB/s: %.2f of it; swap, "
        "copy engines %.2f GB/s: %.2f of it; one call per piece %.2f GB/s: %.2f of it; one copy "
        "into a second buffer %.2f GB/s (%.2f of the tier copy)\n",
        d == 0 ? "device->host (out)" : "host->device (in) ", gb / v[0], gb / v[3], v[0] / v[3],
        gb / v[4], v[0] / v[4], gb / v[2], v[0] / v[2], gb / v[1], v[0] / v[1]);
  }
  (*pool)->release(table);
  return 0;
}

int run_resume_step(const Options& o) {
  auto loaded = kvsplit::model::load_model(o.model);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 1;
  kvsplit::backend::BackendOptions bo;
  bo.threads = o.threads;
  bo.async_copies = true;
  auto be = kvsplit::backend::create_backend("cpu", bo);
  if (!be.ok()) return std::fprintf(stderr, "%s\n", be.status().to_string().c_str()), 1;
  auto model = kvsplit::model::LlamaModel::create(*loaded, **be);
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().to_string().c_str()), 1;
  // Two sequences of `tokens` positions: A is swapped out and resumed, B decodes every step
  // (its context grows by four tokens a round).
  const int tokens = std::min(o.tokens, loaded->config.max_seq_len - 4 * o.reps - 2);
  if (tokens < 1) {
    return std::fprintf(stderr,
                        "resume-step: --reps %d leaves no room in the model's %d-token context "
                        "(4 tokens a round)\n",
                        o.reps, loaded->config.max_seq_len),
           1;
  }
  const int pages = (tokens + 15) / 16;
  kvsplit::kv::KvPoolConfig pc;
  pc.block_size = 16;
  pc.num_blocks = 2 * pages + 4 * o.reps / 16 + 4;
  const kvsplit::kv::KvShape shape = (*model)->kv_shape();
  pc.host_bytes = int64_t{pages} * kvsplit::kv::KvPool::block_bytes(pc, shape);
  auto pool = kvsplit::kv::KvPool::create(**be, pc, shape);
  if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().to_string().c_str()), 1;
  std::mt19937 rng(3);
  std::vector<int32_t> ids(tokens + 4 * o.reps + 2);
  for (int32_t& t : ids) t = 3 + static_cast<int32_t>(rng() % (loaded->config.vocab_size - 3));
  kvsplit::kv::BlockTable a, b;
  std::vector<float> logits;
  for (kvsplit::kv::BlockTable* t : {&a, &b}) {
    (*pool)->reserve(*t, tokens);
    kvsplit::model::SeqStep step;
    step.tokens = std::span<const int32_t>(ids.data(), tokens);
    step.table = t;
    step.logits = kvsplit::model::SeqStep::Logits::kNone;
    const auto st = (*model)->forward(std::vector<kvsplit::model::SeqStep>{step}, **pool, &logits);
    if (!st.ok()) return std::fprintf(stderr, "resume-step: %s\n", st.to_string().c_str()), 1;
  }
  int b_pos = tokens;
  auto decode_b = [&]() {
    (*pool)->reserve(b, b_pos + 1);
    kvsplit::model::SeqStep step;
    step.tokens = std::span<const int32_t>(ids.data() + b_pos, 1);
    step.start_pos = b_pos++;
    step.table = &b;
    step.logits = kvsplit::model::SeqStep::Logits::kLast;  // a decode step computes its logits
    const auto st = (*model)->forward(std::vector<kvsplit::model::SeqStep>{step}, **pool, &logits);
    if (!st.ok()) std::fprintf(stderr, "resume-step: %s\n", st.to_string().c_str());
    return st.ok();
  };
  kvsplit::kv::SwapStats st;
  std::vector<double> resume[2], before[2];  // [without, with host prefetch]
  for (int r = 0; r < o.reps; ++r) {
    for (int with = 0; with < 2; ++with) {
      if (!*kvsplit::kv::swap_out(**pool, a, &st))
        return std::fprintf(stderr, "resume-step: the swap out was refused\n"), 1;
      // The step before: the prefetch is started before its forward pass (Worker::schedule).
      auto t0 = Clock::now();
      if (with && !*kvsplit::kv::start_host_prefetch(**pool, a, pages, &st))
        return std::fprintf(stderr, "resume-step: the host prefetch was refused\n"), 1;
      if (!decode_b()) return std::fprintf(stderr, "resume-step: decode failed\n"), 1;
      before[with].push_back(ms_since(t0));
      // The resuming step: its swap-ins, then its forward pass.
      t0 = Clock::now();
      auto in = kvsplit::kv::swap_in(**pool, a, &st);
      if (!in.ok() || !*in) return std::fprintf(stderr, "resume-step: the swap in failed\n"), 1;
      if (!decode_b()) return std::fprintf(stderr, "resume-step: decode failed\n"), 1;
      resume[with].push_back(ms_since(t0));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double mib = double(pages) * (*pool)->bytes_per_block() / 1048576.0;
  std::printf(
      "resume step: %s, a %d-token sequence (%.1f MiB of KV) resumed from the host tier beside a "
      "decode step of a %d-token one, %d threads, CPU backend with async_copies, %d rounds "
      "(median)\n"
      "  without host prefetch: resume step %8.2f ms (step before %8.2f ms)\n"
      "  with host prefetch:    resume step %8.2f ms (step before %8.2f ms)\n"
      "  resume step with / without: %.2fx; host prefetch hits %lld, misses %lld\n",
      o.model.c_str(), tokens, mib, tokens, o.threads, o.reps, median(resume[0]), median(before[0]),
      median(resume[1]), median(before[1]), median(resume[1]) / median(resume[0]),
      static_cast<long long>(st.host_prefetch_hits),
      static_cast<long long>(st.host_prefetch_misses));
  (*pool)->release(a);
  (*pool)->release(b);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  Options o;
  CLI::App app{"temporal cut benchmarks"};
  app.add_option("--model", o.model, "model path or synthetic:<preset>");
  app.add_option("--threads", o.threads, "CPU threads")->check(CLI::Range(1, 1024));
  app.add_flag("--restore", o.restore, "host / disk restore against recompute");
  app.add_flag("--prefix", o.prefix, "prefix cache TTFT");
  app.add_flag("--spill-alloc", o.spill_alloc,
               "allocation latency with prefix-cache spills to disk, sync against async");
  app.add_flag("--spill-ahead", o.spill_ahead,
               "prefix-cache host spills on the allocation path against spill-ahead");
  app.add_option("--alloc", o.alloc, "--spill-ahead: blocks allocated per step")
      ->check(CLI::Range(1, 1024));
  app.add_option("--step-mb", o.step_mb, "--spill-ahead: MiB a step reads (its own work)")
      ->check(CLI::Range(1, 4096));
  app.add_flag("--resume-step", o.resume_step,
               "the resuming step with and without the host-tier prefetch (async copies)");
  app.add_flag("--swap-bandwidth", o.swap_bandwidth,
               "host-tier swap copies against one contiguous copy of the same bytes");
  app.add_option("--backend", o.backend, "--swap-bandwidth: cpu | cuda");
  app.add_option("--pages", o.pages,
                 "--spill-alloc: device pages (all cached, all spilled); --swap-bandwidth: the "
                 "sequence's pages")
      ->check(CLI::Range(2, 100000));
  app.add_option("--tokens", o.tokens, "--restore, --resume-step: sequence length")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--prefix-tokens", o.prefix_tokens, "--prefix: shared prefix length")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--disk-direct-io", o.disk_direct_io, "--restore: the disk tier with O_DIRECT");
  app.add_flag("--cold", o.cold,
               "--restore: also a disk swap-in with the page cache dropped first (reads the "
               "device, not memory)");
  app.add_option("--requests", o.requests, "--prefix: requests")->check(CLI::Range(2, 10000));
  app.add_option("--reps", o.reps,
                 "--restore, --swap-bandwidth: repetitions (best of); --spill-alloc: rounds")
      ->check(CLI::Range(1, 100000));
  app.add_option("--disk-path", o.disk_path,
                 "--restore: disk tier directory (--prefix-spill disk: "
                 "<path>-prefix)");
  app.add_option("--prefix-spill", o.prefix_spill,
                 "--prefix: also a run whose prefix is pushed out to this tier between requests")
      ->check(CLI::IsMember({"host", "disk"}));
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (o.spill_ahead && o.alloc > o.pages) {
    // No step would run (pages / alloc == 0): nothing to time.
    std::fprintf(stderr, "--spill-ahead: --alloc %d must be at most --pages %d\n", o.alloc,
                 o.pages);
    return 2;
  }
  int rc = 0;
  if (o.restore) rc |= run_restore(o);
  if (o.prefix) rc |= run_prefix(o);
  if (o.spill_alloc) rc |= run_spill_alloc(o);
  if (o.swap_bandwidth) rc |= run_swap_bandwidth(o);
  if (o.spill_ahead) rc |= run_spill_ahead(o);
  if (o.resume_step) rc |= run_resume_step(o);
  if (!o.restore && !o.prefix && !o.spill_alloc && !o.swap_bandwidth && !o.spill_ahead &&
      !o.resume_step)
    std::fprintf(stderr,
                 "give --restore, --prefix, --spill-alloc, --spill-ahead, --resume-step and/or "
                 "--swap-bandwidth\n");
  return rc;
}
