// KV handoff with the decode pool's prefix cache (disaggregated mode, docs/serving.md "Handoffs
// and the decode pool's prefix cache"). Requests share a system prompt of --prefix-tokens tokens
// and add --suffix-tokens of their own (--prompts such prompts, one tenant each; each request's
// drawn at random). Three
// engines run the same requests: the prefix cache off; on with handoffs routed by load alone
// (pools.cache_aware_handoffs false); on with cache-aware routing (the default). Each has one
// prefill and --decode-workers decode workers:
//   sequential  --requests requests one after another: the decode pools' handoff pages copied
//               and taken from their caches, and the median handoff time (Timings::handoff_ms:
//               offer posted -> pages in the decode pool) of the later requests.
//   concurrent  --concurrent requests submitted at once, each generating --max-tokens, into
//               pools of --kv-blocks blocks per worker: the most sequences the decode pools ran
//               at once, their blocks in use per running sequence then (stats sampled every ms),
//               and the handoff pages copied and taken from the caches.
// Ratios are against the cache off, in the same run. The requests are greedy with EOS ignored:
// every request's tokens must be the same in the three engines (checked; a difference fails the
// run, naming the first differing request).
//
// The defaults (llama-110m, 512 + 16 prompt tokens, 8 at once generating 128 tokens, 128 blocks
// per worker) make the decode pool the limit without the cache: about three sequences of 41
// pages fit; sharing their 32 prefix pages, all eight do.
//
//   bench_handoff --model synthetic:llama-110m --threads 1
//   bench_handoff --model synthetic:llama-110m --threads 1 --decode-workers 2 --prompts 4
//       --prefix-tokens 256 --requests 8 --concurrent 16 --max-tokens 32 --kv-blocks 256
//
// --forwarding instead compares three ways of placing handoffs, alternating, --reps times each:
// routed by KV load alone, waiting for room where they were sent (the engine before 2026-12-05:
// EngineImpl::InternalOptions::slot_aware_handoffs false, pools.forward_waiting_handoffs false);
// routed to a decode worker with a free sequence slot first; and that with handoffs waiting for
// room passed on to a decode worker with room (the default). --fwd-requests requests arriving at
// --fwd-rate per second (Poisson), alternately a long prompt with a short answer
// (--fwd-long-prompt tokens, 8 generated) and a short prompt with a long answer (16 tokens,
// --fwd-long-output generated), on --decode-workers decode workers of --fwd-slots sequences
// each. A decode worker's KV in use is then no guide to when its slots free up, so a handoff
// routed by load can wait for a slot while another worker has one. Reported: the handoff time
// (Timings::handoff_ms: offer posted -> decoding, the wait for room included) mean / p90 / max,
// end-to-end p50 / p90, the wall time, and the handoffs passed on. Requests are greedy with EOS
// ignored: every run must give each request the first run's tokens (checked, as with
// --hung-worker).
//
//   bench_handoff --forwarding --model synthetic:llama-110m --threads 1 --decode-workers 2
//       --kv-blocks 512
//
// --hung-worker instead holds decode-0 hung (it takes no offer) while --fwd-requests short
// requests (16 prompt tokens, 16 generated) arrive at --fwd-rate per second, with
// handoff_timeout_ms --hung-timeout-ms and --fwd-slots sequences per decode worker. The offers
// routed to decode-0 before it is marked down are taken back either at their own deadlines (the
// engine before 2026-12-05: EngineImpl::InternalOptions::take_back_from_down false, and
// handoff_stall_ms 0), at once when the first deadline marks it down (handoff_stall_ms 0), or at
// once when the stall bound does (handoff_stall_ms --hung-stall-ms, the default since
// 2026-12-06). Reported: the offers re-routed and the handoff time (mean / p90 / max, and the sum
// over the re-routed).
//
//   bench_handoff --hung-worker --model synthetic:llama-110m --threads 1 --decode-workers 2
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/cli_options.h"
#include "engine/engine_impl.h"
#include "kvsplit/engine.h"
#include "token_check.h"

namespace {

struct Options {
  std::string model = "synthetic:llama-110m";
  int threads = 1;
  int prefix_tokens = 512;
  int suffix_tokens = 16;
  int requests = 6;
  int concurrent = 8;
  int max_tokens = 128;
  int kv_blocks = 128;
  int decode_workers = 1;
  int prompts = 1;  // distinct system prompts (tenants), each request's drawn at random
  bool forwarding = false;
  bool hung_worker = false;
  int hung_timeout_ms = 1000;
  int hung_stall_ms = 1000;
  int fwd_requests = 48, fwd_slots = 4, fwd_long_prompt = 768, fwd_long_output = 160, reps = 2;
  double fwd_rate = 2;
};

struct Result {
  double first_handoff_ms = 0, later_handoff_ms = 0;  // median of the later requests
  int64_t copied = 0, cached = 0;                     // handoff pages, sequential part
  int64_t to_cached = 0;  // handoffs routed to a decode worker sent the prompt before
  int64_t copied_at_once = 0, cached_at_once = 0;  // handoff pages, concurrent part
  int peak_running = 0;
  double blocks_per_seq = 0;       // decode blocks in use per running sequence at the peak
  kvsplit::bench::Outputs tokens;  // per request: the sequential ones, then the concurrent ones
};

// The decode pools together: running sequences, blocks in use, handoff pages.
struct DecodeTotals {
  int pools = 0, running = 0, used = 0;
  int64_t copied = 0, cached = 0;
};
DecodeTotals decode_totals(const kvsplit::EngineStats& s) {
  DecodeTotals t;
  for (const kvsplit::PoolStats& p : s.pools) {
    if (p.name.rfind("decode-", 0) != 0) continue;
    ++t.pools;
    t.running += p.running;
    t.used += p.kv_blocks_total - p.kv_blocks_free;
    t.copied += p.handoff_pages_copied;
    t.cached += p.handoff_pages_cached;
  }
  return t;
}

// One prefill worker and --decode-workers decode workers, blocks of 16 tokens.
kvsplit::EngineConfig disaggregated_config(const Options& o) {
  kvsplit::EngineConfig c;
  c.model = o.model;
  c.mode = kvsplit::ServingMode::kDisaggregated;
  c.num_prefill_workers = 1;
  c.num_decode_workers = o.decode_workers;
  c.threads_per_worker = o.threads;
  c.block_size = 16;
  c.max_batch_tokens = 2048;
  c.kv_blocks_per_worker = o.kv_blocks;
  return c;
}

// Run 0: no prefix cache; 1: the cache, handoffs routed by load alone; 2: the cache with
// cache-aware routing (the default).
int run(const Options& o, int variant, Result* out) {
  const bool cache = variant > 0;
  kvsplit::EngineConfig c = disaggregated_config(o);
  c.prefix_cache = cache;
  c.cache_aware_handoffs = variant == 2;
  auto engine = kvsplit::Engine::create(c);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  kvsplit::Engine& e = **engine;
  const int vocab = e.model_info().vocab_size;
  std::mt19937 rng(7);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& t : ids) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    return ids;
  };
  std::vector<std::vector<int32_t>> systems;
  for (int k = 0; k < o.prompts; ++k) systems.push_back(random_ids(o.prefix_tokens));
  // Each request's prompt drawn at random (the same draws in every run), so that no fixed
  // pattern of prompts lines up with the workers' turns.
  std::mt19937 pick(13);
  auto request = [&](int max_tokens) {
    const int k = static_cast<int>(pick() % static_cast<unsigned>(o.prompts));
    kvsplit::Request r;
    r.tenant = "bench-" + std::to_string(k);
    r.prompt_token_ids = systems[static_cast<size_t>(k)];
    for (int32_t t : random_ids(o.suffix_tokens)) r.prompt_token_ids.push_back(t);
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = 0;
    return r;
  };
  auto drain = [&](kvsplit::RequestHandle& h, kvsplit::TokenEvent* last) {
    out->tokens.emplace_back();
    if (!kvsplit::bench::drain_tokens(h, last, &out->tokens.back()) || !last->status.ok())
      return std::fprintf(stderr, "request failed: %s\n", last->status.to_string().c_str()), 1;
    return 0;
  };
  // 1. Sequential.
  std::vector<double> handoff;
  for (int i = 0; i < o.requests; ++i) {
    auto h = e.submit(request(2));
    if (!h.ok()) return std::fprintf(stderr, "%s\n", h.status().to_string().c_str()), 1;
    kvsplit::TokenEvent ev;
    if (drain(*h, &ev) != 0) return 1;
    handoff.push_back(ev.timings.handoff_ms);
  }
  std::vector<double> later(handoff.begin() + 1, handoff.end());
  std::sort(later.begin(), later.end());
  out->first_handoff_ms = handoff[0];
  out->later_handoff_ms = later[later.size() / 2];
  const kvsplit::EngineStats s = e.stats();
  const DecodeTotals d = decode_totals(s);
  if (d.pools == 0) return std::fprintf(stderr, "no decode pool\n"), 1;
  out->copied = d.copied;
  out->cached = d.cached;
  const int64_t to_cached_before = s.pools[0].handoffs_to_cached;
  // 2. Concurrent: a poller samples the decode pool while the requests run.
  std::vector<kvsplit::RequestHandle> handles;
  for (int i = 0; i < o.concurrent; ++i) {
    auto h = e.submit(request(o.max_tokens));
    if (!h.ok()) return std::fprintf(stderr, "%s\n", h.status().to_string().c_str()), 1;
    handles.push_back(std::move(*h));
  }
  std::atomic<bool> done{false};
  int peak = 0;
  double used_at_peak = 0;
  int samples_at_peak = 0;
  std::thread poller([&] {
    while (!done.load()) {
      const DecodeTotals t = decode_totals(e.stats());
      if (t.running > 0) {
        const double per = double(t.used) / t.running;
        if (t.running > peak) {
          peak = t.running;
          used_at_peak = 0;
          samples_at_peak = 0;
        }
        if (t.running == peak) {
          used_at_peak += per;
          ++samples_at_peak;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  int rc = 0;
  for (kvsplit::RequestHandle& h : handles) {
    kvsplit::TokenEvent ev;
    rc |= drain(h, &ev);
  }
  done = true;
  poller.join();
  out->peak_running = peak;
  const DecodeTotals end = decode_totals(e.stats());
  out->copied_at_once = end.copied - out->copied;
  out->cached_at_once = end.cached - out->cached;
  // prefill-0's count, of the concurrent requests' handoffs
  out->to_cached = e.stats().pools[0].handoffs_to_cached - to_cached_before;
  out->blocks_per_seq = samples_at_peak > 0 ? used_at_peak / samples_at_peak : 0;
  return rc;
}

struct ForwardResult {
  std::vector<double> handoff_ms, e2e_ms;
  kvsplit::bench::Outputs tokens;  // per request, in arrival order
  double wall_s = 0;
  int64_t forwarded = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(v.size() - 1, p / 100.0 * v.size()))];
}

// --forwarding and --hung-worker: --fwd-slots sequences per worker, and classes that never
// refuse or expire a request (the handles are read at the end).
kvsplit::EngineConfig arrivals_config(const Options& o) {
  kvsplit::EngineConfig c = disaggregated_config(o);
  c.max_num_seqs = o.fwd_slots;
  c.max_unread_events = 0;
  for (kvsplit::SlaClass& k : c.sla_classes) {
    k.queue_timeout_ms = 600000;
    k.max_queue = 100000;
  }
  return c;
}

// Submits --fwd-requests requests at Poisson arrivals of --fwd-rate per second (seeded: the same
// workload in every run); request i has shape(i) = {prompt tokens, tokens to generate}, random
// ids, greedy, EOS ignored. Then reads every handle to its end: the tokens, the handoff and
// end-to-end times into `out`, and the wall time from the first arrival. 1 (with a message) when
// a request fails.
template <typename Shape>
int run_arrivals(kvsplit::Engine& e, const Options& o, uint32_t seed, Shape shape,
                 ForwardResult* out) {
  const int vocab = e.model_info().vocab_size;
  std::mt19937 rng(seed);
  std::exponential_distribution<double> gap(o.fwd_rate);
  std::vector<kvsplit::RequestHandle> handles;
  const auto t0 = std::chrono::steady_clock::now();
  double at = 0;
  for (int i = 0; i < o.fwd_requests; ++i) {
    const auto [prompt, generated] = shape(i);
    kvsplit::Request r;
    r.prompt_token_ids.resize(static_cast<size_t>(prompt));
    for (int32_t& t : r.prompt_token_ids) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    r.sampling.max_tokens = generated;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = 0;
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::duration<double>(at)));
    at += gap(rng);
    auto h = e.submit(r);
    if (!h.ok()) return std::fprintf(stderr, "%s\n", h.status().to_string().c_str()), 1;
    handles.push_back(std::move(*h));
  }
  for (kvsplit::RequestHandle& h : handles) {
    kvsplit::TokenEvent ev;
    out->tokens.emplace_back();
    if (!kvsplit::bench::drain_tokens(h, &ev, &out->tokens.back()) || !ev.status.ok())
      return std::fprintf(stderr, "request failed: %s\n", ev.status.to_string().c_str()), 1;
    out->handoff_ms.push_back(ev.timings.handoff_ms);
    out->e2e_ms.push_back(ev.timings.e2e_ms);
  }
  out->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 0;
}

// variant 0: by KV load, in place; 1: free slots first, in place; 2: free slots first, passed on.
int run_forwarding(const Options& o, int variant, ForwardResult* out) {
  kvsplit::EngineConfig c = arrivals_config(o);
  c.forward_waiting_handoffs = variant == 2;
  kvsplit::EngineImpl::InternalOptions internal;
  internal.slot_aware_handoffs = variant > 0;
  auto engine = kvsplit::EngineImpl::create(c, internal);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  kvsplit::Engine& e = **engine;
  // Alternately a long prompt with a short answer and a short prompt with a long answer.
  const auto shape = [&](int i) {
    return i % 2 == 0 ? std::pair{o.fwd_long_prompt, 8} : std::pair{16, o.fwd_long_output};
  };
  if (run_arrivals(e, o, 21, shape, out) != 0) return 1;
  for (const kvsplit::PoolStats& p : e.stats().pools) out->forwarded += p.handoffs_forwarded;
  return 0;
}

int forwarding_main(const Options& o) {
  if (o.decode_workers < 2) {
    std::fprintf(stderr, "--forwarding needs --decode-workers 2 or more\n");
    return 2;
  }
  std::printf(
      "handoff forwarding: %s, %d requests at %.2f/s (long prompt %d + 8 out, 16 + %d out, "
      "alternating), one prefill and %d decode workers of %d slots, %d threads each, %d blocks "
      "per worker\n",
      o.model.c_str(), o.fwd_requests, o.fwd_rate, o.fwd_long_prompt, o.fwd_long_output,
      o.decode_workers, o.fwd_slots, o.threads, o.kv_blocks);
  const char* names[3] = {"by KV load", "slots first", "slots, passed on"};
  double sum_mean[3] = {0, 0, 0}, sum_p90[3] = {0, 0, 0}, sum_e2e[3] = {0, 0, 0};
  kvsplit::bench::Outputs first;  // rep 0's first variant: every run must give these tokens
  for (int rep = 0; rep < o.reps; ++rep) {
    for (int v = 0; v < 3; ++v) {
      ForwardResult r;
      if (run_forwarding(o, v, &r) != 0) return 1;
      if (rep == 0 && v == 0) first = r.tokens;
      double mean = 0;
      for (double x : r.handoff_ms) mean += x / static_cast<double>(r.handoff_ms.size());
      sum_mean[v] += mean;
      sum_p90[v] += percentile(r.handoff_ms, 90);
      sum_e2e[v] += percentile(r.e2e_ms, 90);
      std::printf(
          "  rep %d %-16s: handoff ms mean %8.1f p90 %8.1f max %8.1f; e2e ms p50 %8.1f p90 "
          "%8.1f; wall %.2f s; passed on %lld; tokens same as rep 0 %s: %s\n",
          rep, names[v], mean, percentile(r.handoff_ms, 90), percentile(r.handoff_ms, 100),
          percentile(r.e2e_ms, 50), percentile(r.e2e_ms, 90), r.wall_s,
          static_cast<long long>(r.forwarded), names[0],
          kvsplit::bench::same_tokens(first, r.tokens));
      if (kvsplit::bench::check_same_tokens("forwarding", first, std::string("rep 0 ") + names[0],
                                            r.tokens,
                                            "rep " + std::to_string(rep) + " " + names[v]))
        return 1;
    }
  }
  for (int v = 1; v < 3; ++v) {
    std::printf(
        "  %s / by KV load (sums over reps): handoff time mean %.2fx, p90 %.2fx; e2e p90 %.2fx\n",
        names[v], sum_mean[v] / std::max(1e-9, sum_mean[0]),
        sum_p90[v] / std::max(1e-9, sum_p90[0]), sum_e2e[v] / std::max(1e-9, sum_e2e[0]));
  }
  return 0;
}

// decode-0 hung from the start. Variant 0: offers in flight to it are taken back at their own
// deadlines; 1: once a deadline marks it down; 2: once the stall bound or a deadline does.
int run_hung(const Options& o, int variant, ForwardResult* out, int64_t* rerouted) {
  kvsplit::EngineConfig c = arrivals_config(o);
  c.handoff_timeout_ms = o.hung_timeout_ms;
  c.handoff_stall_ms = variant == 2 ? o.hung_stall_ms : 0;
  kvsplit::EngineImpl::InternalOptions internal;
  internal.take_back_from_down = variant > 0;
  auto engine = kvsplit::EngineImpl::create(c, internal);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;
  kvsplit::EngineImpl& e = **engine;
  e.set_test_hold_worker(1, kvsplit::sched::TestHold::kAll);  // workers: prefill-0, decode-0, ...
  const int rc = run_arrivals(
      e, o, 33,
      [](int) {
        return std::pair{16, 16};
      },
      out);
  *rerouted = e.stats().pools[0].handoffs_rerouted;
  e.set_test_hold_worker(1, kvsplit::sched::TestHold::kNone);
  return rc;
}

int hung_main(const Options& o) {
  if (o.decode_workers < 2) {
    std::fprintf(stderr, "--hung-worker needs --decode-workers 2 or more\n");
    return 2;
  }
  std::printf(
      "hung decode worker: %s, %d requests (16 + 16 out) at %.2f/s, one prefill and %d decode "
      "workers of %d slots (decode-0 hung), handoff_timeout_ms %d, handoff_stall_ms %d, %d "
      "threads each\n",
      o.model.c_str(), o.fwd_requests, o.fwd_rate, o.decode_workers, o.fwd_slots, o.hung_timeout_ms,
      o.hung_stall_ms, o.threads);
  constexpr int kVariants = 3;
  const char* names[kVariants] = {"at own deadlines", "at first deadline", "at stall bound"};
  double sum_rerouted_ms[kVariants] = {}, sum_mean[kVariants] = {};
  int64_t sum_rerouted[kVariants] = {};
  kvsplit::bench::Outputs first;  // rep 0's first variant: every run must give these tokens
  for (int rep = 0; rep < o.reps; ++rep) {
    for (int v = 0; v < kVariants; ++v) {
      ForwardResult r;
      int64_t rerouted = 0;
      if (run_hung(o, v, &r, &rerouted) != 0) return 1;
      if (rep == 0 && v == 0) first = r.tokens;
      double mean = 0;
      for (double x : r.handoff_ms) mean += x / static_cast<double>(r.handoff_ms.size());
      // The re-routed offers are the ones that waited for a deadline: the slowest handoffs.
      std::vector<double> sorted = r.handoff_ms;
      std::sort(sorted.rbegin(), sorted.rend());
      double slowest = 0;
      for (int64_t k = 0; k < rerouted && k < static_cast<int64_t>(sorted.size()); ++k)
        slowest += sorted[static_cast<size_t>(k)];
      sum_rerouted_ms[v] += slowest;
      sum_rerouted[v] += rerouted;
      sum_mean[v] += mean;
      std::printf(
          "  rep %d %-17s: re-routed %lld, their handoff ms sum %8.1f (%6.1f each); all: mean "
          "%7.1f p90 %7.1f max %7.1f; wall %.2f s; tokens same as rep 0 %s: %s\n",
          rep, names[v], static_cast<long long>(rerouted), slowest,
          rerouted > 0 ? slowest / static_cast<double>(rerouted) : 0.0, mean,
          percentile(r.handoff_ms, 90), percentile(r.handoff_ms, 100), r.wall_s, names[0],
          kvsplit::bench::same_tokens(first, r.tokens));
      if (kvsplit::bench::check_same_tokens("hung worker", first, std::string("rep 0 ") + names[0],
                                            r.tokens,
                                            "rep " + std::to_string(rep) + " " + names[v]))
        return 1;
    }
  }
  double each[kVariants];
  for (int v = 0; v < kVariants; ++v)
    each[v] = sum_rerouted_ms[v] / static_cast<double>(std::max<int64_t>(1, sum_rerouted[v]));
  for (int v = 1; v < kVariants; ++v) {
    std::printf(
        "  %s / %s (over reps): a re-routed offer's handoff time %.2fx (%.1f / %.1f ms), mean "
        "handoff time %.2fx\n",
        names[v], names[0], each[v] / std::max(1e-9, each[0]), each[v], each[0],
        sum_mean[v] / std::max(1e-9, sum_mean[0]));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  Options o;
  CLI::App app{"KV handoff with the decode pool's prefix cache: off, on by load, on cache-aware"};
  app.add_option("--model", o.model, "model path or synthetic:<preset>");
  app.add_option("--threads", o.threads, "CPU threads per worker")->check(CLI::Range(1, 256));
  app.add_option("--prefix-tokens", o.prefix_tokens, "shared system prompt length")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--suffix-tokens", o.suffix_tokens, "each request's own tokens after it")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--requests", o.requests, "sequential requests")->check(CLI::Range(2, 10000));
  app.add_option("--concurrent", o.concurrent, "requests submitted at once")
      ->check(CLI::Range(1, 10000));
  app.add_option("--max-tokens", o.max_tokens, "tokens each concurrent request generates")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--kv-blocks", o.kv_blocks, "KV blocks per worker (16 tokens each)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--decode-workers", o.decode_workers, "decode workers")->check(CLI::Range(1, 64));
  app.add_option("--prompts", o.prompts,
                 "distinct system prompts, one tenant each; each request's drawn at random")
      ->check(CLI::Range(1, 10000));
  app.add_flag("--forwarding", o.forwarding,
               "compare handoffs waiting in place with handoffs passed on to a decode worker "
               "with room");
  app.add_option("--fwd-requests", o.fwd_requests, "--forwarding, --hung-worker: requests")
      ->check(CLI::Range(2, 100000));
  app.add_option("--fwd-rate", o.fwd_rate, "--forwarding, --hung-worker: arrivals per second")
      ->check(kvsplit::kPositive);
  app.add_option("--fwd-slots", o.fwd_slots,
                 "--forwarding, --hung-worker: sequences per decode worker")
      ->check(CLI::Range(1, 4096));
  app.add_option("--fwd-long-prompt", o.fwd_long_prompt, "--forwarding: the long prompt")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--fwd-long-output", o.fwd_long_output, "--forwarding: the long answer")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--reps", o.reps, "--forwarding, --hung-worker: runs of each variant")
      ->check(CLI::Range(1, 100));
  app.add_flag("--hung-worker", o.hung_worker,
               "offers in flight to a hung decode worker: taken back at their deadlines, at "
               "once when a deadline marks it down, or at once when the stall bound does");
  app.add_option("--hung-timeout-ms", o.hung_timeout_ms, "--hung-worker: handoff_timeout_ms")
      ->check(CLI::Range(1, 3600000));
  app.add_option("--hung-stall-ms", o.hung_stall_ms,
                 "--hung-worker: handoff_stall_ms of the third variant")
      ->check(CLI::Range(1, 3600000));
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (o.forwarding) return forwarding_main(o);
  if (o.hung_worker) return hung_main(o);
  Result r[3];
  for (int v = 0; v < 3; ++v)
    if (run(o, v, &r[v]) != 0) return 1;
  const int pages = (o.prefix_tokens + o.suffix_tokens + 15) / 16;
  std::printf(
      "handoff: %s, %d shared prefix(es) of %d tokens + %d, one prefill and %d decode "
      "worker(s), %d threads each, %d blocks per worker\n",
      o.model.c_str(), o.prompts, o.prefix_tokens, o.suffix_tokens, o.decode_workers, o.threads,
      o.kv_blocks);
  const char* names[3] = {"off", "on, by load", "on"};
  for (int v = 0; v < 3; ++v) {
    std::printf(
        "  prefix cache %-11s: %d requests in turn: pages copied %lld, from the decode cache "
        "%lld (of %d per request); handoff first %.2f ms, later median %.2f ms; %d at once: "
        "decode ran at most %d, %.1f blocks per running sequence, pages copied %lld, from the "
        "decode cache %lld, %lld of its handoffs routed to a decode worker sent the prompt "
        "before; tokens same as off: %s\n",
        names[v], o.requests, static_cast<long long>(r[v].copied),
        static_cast<long long>(r[v].cached), pages, r[v].first_handoff_ms, r[v].later_handoff_ms,
        o.concurrent, r[v].peak_running, r[v].blocks_per_seq,
        static_cast<long long>(r[v].copied_at_once), static_cast<long long>(r[v].cached_at_once),
        static_cast<long long>(r[v].to_cached),
        kvsplit::bench::same_tokens(r[0].tokens, r[v].tokens));
  }
  auto ratio = [](double a, double b) { return a / std::max(1e-9, b); };
  for (int v = 1; v < 3; ++v) {
    std::printf(
        "  %s / off: later handoff time %.2fx, pages copied in turn %.2fx, at once %.2fx, decode "
        "blocks per sequence %.2fx, most running %.2fx\n",
        names[v], ratio(r[v].later_handoff_ms, r[0].later_handoff_ms),
        ratio(double(r[v].copied), double(r[0].copied)),
        ratio(double(r[v].copied_at_once), double(r[0].copied_at_once)),
        ratio(r[v].blocks_per_seq, r[0].blocks_per_seq),
        ratio(double(r[v].peak_running), double(r[0].peak_running)));
  }
  for (int v = 1; v < 3; ++v)
    if (kvsplit::bench::check_same_tokens("handoff", r[0].tokens, "prefix cache off", r[v].tokens,
                                          std::string("prefix cache ") + names[v]))
      return 1;
  return 0;
}
