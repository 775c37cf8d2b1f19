// Offline serving benchmark: replays a seeded synthetic workload through the Engine in process
// (Poisson arrivals, lognormal prompt / output lengths, a mix of SLA classes) and prints TTFT / ITL
// / E2E percentiles, throughput, preemptions and goodput, for the disaggregated and the colocated
// mode in one run. --bookkeeping instead measures the scheduler's bookkeeping share of step time
// with 256 running sequences. --capacity measures how many sequences one fixed KV budget runs at
// once with the semantic cut off and on. --swap-compare runs one over-committed KV budget with the
// temporal cut's swap: never (recompute), always and auto, and reports time, throughput and
// goodput (requests within the SLA targets) and checks that every mode gave every request the
// same tokens; --swap-reps N runs N rounds of the three modes (the first of a round rotating) and
// prints medians and the rounds' ratios. --fairness runs a stream of short requests without
// and with one long prompt among them and reports the short requests' TTFT (fair time slicing).
//
//   bench_serving_offline --model synthetic:stories260k --requests 200 --rate 50
//   bench_serving_offline --model synthetic:llama-110m --bookkeeping
//   bench_serving_offline --model ../shared/models/stories260K.bin --capacity --kv-capacity-mb 5
//   bench_serving_offline --model synthetic:llama-110m --swap-compare --kv-capacity-mb 120
//       --swap-seqs 6 --swap-prompt 768 --swap-output 128 --threads 2 --swap-reps 3 (one line)
//   bench_serving_offline --model synthetic:llama-110m@ctx=4608 --threads 2 --fairness
//       --mode colocated --write-trace fair.jsonl (one line; then --trace fair.jsonl replays it)
//   bench_serving_offline --config server.yaml --trace phased.jsonl   # replay a request trace
//                                                   # (docs/kvm.md) on the config's engine
//   bench_serving_offline --requests 100 --write-trace work.jsonl     # save the workload
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>

#include "common/cli_options.h"
#include "config/config.h"
#include "serving_offline.h"

namespace kvsplit::bench_serving {

Item synthetic_item(std::string id, double arrival_s, int p, int n, const std::string& cls,
                    int vocab, std::mt19937_64& rng) {
  Item it;
  it.arrival_s = arrival_s;
  it.request.request_id = std::move(id);
  it.request.prompt_token_ids.resize(static_cast<size_t>(p));
  for (int32_t& tok : it.request.prompt_token_ids)
    tok = 3 + static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab - 3));
  it.request.sampling.max_tokens = n;
  it.request.sampling.ignore_eos = true;
  it.request.sampling.temperature = 0;
  it.request.sla_class = cls;
  return it;
}

std::vector<Item> make_workload(const Options& o, int vocab, int context) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate);
  std::lognormal_distribution<double> plen(std::log(o.prompt_median), o.prompt_sigma);
  std::lognormal_distribution<double> olen(std::log(o.output_median), o.output_sigma);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<Item> out;
  double t = 0;
  for (int i = 0; i < o.requests; ++i) {
    t += gap(rng);
    // Clamped as doubles: a draw beyond int (a huge median or sigma) must not be cast first.
    const int p = static_cast<int>(std::clamp(plen(rng), 1.0, context / 2.0));
    const int n = static_cast<int>(std::clamp(olen(rng), 1.0, context / 2.0 - 1.0));
    const char* cls = u(rng) < o.interactive_share ? "interactive" : "batch";
    out.push_back(synthetic_item("b" + std::to_string(i), t, p, n, cls, vocab, rng));
  }
  return out;
}

// The trace's requests: synthetic prompts of prompt_tokens ids, max_tokens = output_tokens with
// EOS ignored (every request generates exactly that many), the trace's class.
std::vector<Item> workload_from_trace(const std::vector<kvsplit::kvm::TraceRequest>& trace,
                                      uint64_t seed, int vocab, int context) {
  std::mt19937_64 rng(seed);
  std::vector<Item> out;
  for (size_t i = 0; i < trace.size(); ++i) {
    const kvsplit::kvm::TraceRequest& t = trace[i];
    const int p = std::clamp(t.prompt_tokens, 1, context - 1);
    const int n = std::clamp(t.output_tokens, 1, std::max(1, context - p));
    out.push_back(synthetic_item("t" + std::to_string(i), t.arrival_ms / 1000.0, p, n, t.sla_class,
                                 vocab, rng));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Item& a, const Item& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

std::vector<kvsplit::kvm::TraceRequest> trace_of(const std::vector<Item>& work) {
  std::vector<kvsplit::kvm::TraceRequest> t;
  for (const Item& it : work) {
    t.push_back({std::round(it.arrival_s * 1e6) / 1e3,
                 static_cast<int>(it.request.prompt_token_ids.size()),
                 it.request.sampling.max_tokens, it.request.sla_class});
  }
  return t;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()))];
}

// --config: the file's engine settings, SLA classes and kvm (its model unless it names none).
EngineConfig g_file_config;
bool g_have_file_config = false;

EngineConfig base_config(const Options& o, ServingMode mode) {
  if (g_have_file_config) {
    EngineConfig c = g_file_config;
    c.mode = mode;
    return c;
  }
  EngineConfig c;
  c.model = o.model;
  // The engine's speed is measured, not its consumers': some modes read their handles only at
  // the end (--bookkeeping), which the slow-reader back-pressure would hold back.
  c.max_unread_events = 0;
  c.mode = mode;
  c.threads_per_worker = o.threads;
  c.num_prefill_workers = o.prefill_workers;
  c.num_decode_workers = mode == ServingMode::kColocated ? o.colocated_workers : o.decode_workers;
  c.max_batch_tokens = o.max_batch_tokens;
  if (o.max_chunk_tokens >= 0) c.max_chunk_tokens = o.max_chunk_tokens;
  c.max_chunk_ms = o.max_chunk_ms;
  c.max_chunk_ms_auto = o.max_chunk_ms_auto;
  c.kv_blocks_per_worker = o.kv_blocks;
  if (o.max_num_seqs > 0) c.max_num_seqs = o.max_num_seqs;
  c.forward_waiting_handoffs = o.forward_handoffs;
  // Two classes: interactive (TTFT 500 ms, ITL 100 ms, priority 1) and batch (5 s, 500 ms, 0).
  const auto sla_class = [](const char* name, double ttft_ms, double itl_ms, int32_t priority) {
    kvsplit::SlaClass k;
    k.name = name;
    k.max_ttft_ms = ttft_ms;
    k.max_itl_ms = itl_ms;
    k.priority = priority;
    k.max_queue = 100000;
    k.queue_timeout_ms = 600000.0;
    return k;
  };
  c.sla_classes = {sla_class("batch", 5000.0, 500.0, 0), sla_class("interactive", 500.0, 100.0, 1)};
  return c;
}

StreamResult run_stream(EngineImpl& engine, const std::vector<Item>& work, const char* name,
                        bool report_refused) {
  const int n = static_cast<int>(work.size());
  StreamResult res;
  res.outcomes.resize(n);
  std::vector<kvsplit::RequestHandle> handles(n);
  std::vector<char> refused(n, 0);  // submit failed (e.g. the class queue full)
  std::atomic<int> submitted{0};
  const auto t0 = Clock::now();
  std::thread driver([&] {
    for (int i = 0; i < n; ++i) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(work[i].arrival_s)));
      auto h = engine.submit(work[i].request);
      if (h.ok()) {
        handles[i] = *h;
      } else {
        refused[i] = 1;
        if (report_refused)
          std::fprintf(stderr, "submit %d: %s\n", i, h.status().to_string().c_str());
      }
      submitted.store(i + 1, std::memory_order_release);
    }
  });
  const bool tty = isatty(STDOUT_FILENO);
  std::vector<Clock::time_point> last(n);
  std::vector<bool> done(n, false);
  int num_done = 0;
  while (num_done < n) {
    const int s = submitted.load(std::memory_order_acquire);
    bool progress = false;
    for (int i = 0; i < s; ++i) {
      TokenEvent ev;
      Outcome& r = res.outcomes[i];
      while (!done[i] && !refused[i] && handles[i].try_next(&ev)) {
        progress = true;
        if (!ev.token_ids.empty()) {
          if (last[i] != Clock::time_point{}) {
            res.itl.push_back(std::chrono::duration<double, std::milli>(ev.time - last[i]).count());
          }
          last[i] = ev.time;
          r.tokens += static_cast<int64_t>(ev.token_ids.size());
        }
        if (!ev.final) continue;
        done[i] = true;
        ++num_done;
        r.ok = ev.status.ok();
        r.ttft_ms = ev.timings.ttft_ms;
        r.e2e_ms = ev.timings.e2e_ms;
        r.mean_itl_ms = ev.timings.mean_itl_ms;
        r.preemptions = ev.timings.preemptions;
      }
      if (!done[i] && refused[i]) {  // submit failed: counts as an error
        done[i] = true;
        ++num_done;
      }
    }
    if (tty) {
      const int w = 40, fill = w * num_done / std::max(1, n);
      std::printf("\r%-14s [%s%s] %d/%d", name, std::string(fill, '#').c_str(),
                  std::string(w - fill, ' ').c_str(), num_done, n);
      std::fflush(stdout);
    }
    if (!progress) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  driver.join();
  res.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (tty) std::printf("\n");
  return res;
}

int run_mode(const Options& o, ServingMode mode) {
  const char* name = mode == ServingMode::kColocated ? "colocated" : "disaggregated";
  const EngineConfig config = base_config(o, mode);
  auto engine = EngineImpl::create(config);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, engine.status().to_string().c_str());
    return 1;
  }
  const kvsplit::ModelInfo info = (*engine)->model_info();
  std::vector<Item> work;
  if (!o.trace.empty()) {
    auto trace = kvsplit::kvm::read_trace_file(o.trace);
    if (!trace.ok()) {
      std::fprintf(stderr, "--trace: %s\n", trace.status().to_string().c_str());
      return 2;
    }
    work = workload_from_trace(*trace, o.seed, info.vocab_size, info.max_context);
  } else {
    work = make_workload(o, info.vocab_size, info.max_context);
  }
  if (!o.write_trace.empty()) {
    if (auto st = kvsplit::kvm::write_trace_file(o.write_trace, trace_of(work)); !st.ok()) {
      std::fprintf(stderr, "--write-trace: %s\n", st.to_string().c_str());
      return 2;
    }
  }
  // Each request's class (index into config.sla_classes; empty: the first, the default).
  const size_t nc = config.sla_classes.size();
  std::vector<int> cls(work.size(), 0);
  for (size_t i = 0; i < work.size(); ++i) {
    for (size_t k = 0; k < nc; ++k) {
      if (config.sla_classes[k].name == work[i].request.sla_class) cls[i] = static_cast<int>(k);
    }
  }
  const int n = static_cast<int>(work.size());
  const StreamResult res = run_stream(**engine, work, name, /*report_refused=*/o.trace.empty());
  const double wall = res.wall_s;
  std::vector<double> ttft, e2e;
  const std::vector<double>& itl = res.itl;
  std::vector<std::vector<double>> cls_ttft(nc), cls_itl(nc);  // per class; ITL: request means
  std::vector<int> cls_requests(nc, 0), cls_good(nc, 0), cls_errors(nc, 0);
  int good = 0, errors = 0;
  int64_t tokens = 0;
  for (int i = 0; i < n; ++i) {
    cls_requests[cls[i]]++;
    const Outcome& r = res.outcomes[i];
    tokens += r.tokens;
    if (!r.ok) {
      ++errors;
      cls_errors[cls[i]]++;
      continue;
    }
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    const kvsplit::SlaClass& c = config.sla_classes[cls[i]];
    cls_ttft[cls[i]].push_back(r.ttft_ms);
    cls_itl[cls[i]].push_back(r.mean_itl_ms);
    const bool met = r.ttft_ms <= c.max_ttft_ms && r.mean_itl_ms <= c.max_itl_ms;
    good += met;
    cls_good[cls[i]] += met;
  }
  if (!o.write_requests.empty()) {
    std::vector<kvsplit::kvm::RequestOutcome> out(n);
    for (int i = 0; i < n; ++i) {
      const Outcome& r = res.outcomes[i];
      kvsplit::kvm::RequestOutcome& w = out[i];
      w.index = i;
      w.arrival_ms = 1e3 * work[i].arrival_s;
      w.sla_class = config.sla_classes[cls[i]].name;
      w.prompt_tokens = static_cast<int>(work[i].request.prompt_token_ids.size());
      w.output_tokens = work[i].request.sampling.max_tokens;
      w.ok = r.ok;
      w.ttft_ms = r.ttft_ms;
      w.mean_itl_ms = r.mean_itl_ms;
      w.e2e_ms = r.e2e_ms;
      w.preemptions = r.preemptions;
    }
    if (auto st = kvsplit::kvm::write_outcomes_file(o.write_requests, out); !st.ok()) {
      std::fprintf(stderr, "--write-requests: %s\n", st.to_string().c_str());
      return 2;
    }
  }
  const kvsplit::EngineStats st = (*engine)->stats();
  double fwd = 0, book = 0, samp = 0;
  int64_t steps = 0;
  for (const auto& w : (*engine)->worker_snapshots()) {
    fwd += w.forward_ms;
    book += w.bookkeeping_ms;
    samp += w.sampling_ms;
    steps += w.steps;
  }
  std::printf("%-14s requests %d (errors %d) in %.2f s: %.1f req/s, %.0f output tok/s\n", name, n,
              errors, wall, n / wall, tokens / wall);
  std::printf("  TTFT ms  p50 %8.2f  p90 %8.2f  p99 %8.2f\n", pct(ttft, 50), pct(ttft, 90),
              pct(ttft, 99));
  std::printf("  ITL  ms  p50 %8.2f  p90 %8.2f  p99 %8.2f\n", pct(itl, 50), pct(itl, 90),
              pct(itl, 99));
  std::printf("  E2E  ms  p50 %8.2f  p90 %8.2f  p99 %8.2f\n", pct(e2e, 50), pct(e2e, 90),
              pct(e2e, 99));
  std::printf("  preemptions %lld, goodput %.1f%% (TTFT and mean ITL within the class targets)\n",
              static_cast<long long>(st.preemptions), 100.0 * good / std::max(1, n));
  int64_t forwarded = 0;
  for (const kvsplit::PoolStats& p : st.pools) forwarded += p.handoffs_forwarded;
  if (mode == ServingMode::kDisaggregated)
    std::printf("  handoffs passed on by decode workers (waiting for room): %lld\n",
                static_cast<long long>(forwarded));
  std::printf("  %-14s %8s %6s %10s %10s %10s %12s %9s\n", "class", "requests", "errors",
              "ttft p50", "ttft p99", "itl p99", "goodput r/s", "goodput");
  for (size_t k = 0; k < nc; ++k) {
    if (cls_requests[k] == 0) continue;
    std::printf("  %-14s %8d %6d %10.2f %10.2f %10.2f %12.2f %8.1f%%\n",
                config.sla_classes[k].name.c_str(), cls_requests[k], cls_errors[k],
                pct(cls_ttft[k], 50), pct(cls_ttft[k], 99), pct(cls_itl[k], 99), cls_good[k] / wall,
                100.0 * cls_good[k] / cls_requests[k]);
  }
  std::printf(
      "  (per class: ITL p99 over requests' mean inter-token latency; goodput: requests "
      "within the class's TTFT and ITL targets)\n");
  // Effective KV (docs/kvm.md, "Effective-KV accounting"): the device bytes a class's KV held per
  // token held, over the run (full precision: the pool's bytes per token; demoted pages lower it).
  std::printf("  kv bytes per token held:");
  for (size_t k = 0; k < nc; ++k) {
    double bytes = 0, tokens = 0;
    for (const kvsplit::KvAccounting& a : st.kv_accounting) {
      if (a.sla_class != config.sla_classes[k].name) continue;
      bytes += a.effective_kv_byte_seconds;
      tokens += a.kv_token_seconds;
    }
    if (tokens > 0) std::printf(" %s %.1f", config.sla_classes[k].name.c_str(), bytes / tokens);
  }
  std::printf(" (effective KV byte-seconds / KV token-seconds)\n");
  const double step = std::max(fwd + samp + book, 1e-9);
  if (st.kvm_enabled) {
    std::printf("  kvm: %lld decisions\n", static_cast<long long>(st.kvm_decisions_total));
    // KVM overhead. The tick's computing (monitors, rules, decision log) runs on the KVM thread
    // once per interval; the engine snapshot it reads first (Engine::stats without the KVM part)
    // is timed here, idle. Waiting for the workers to apply a decision's commands is reported
    // apart: the KVM thread sleeps then, and the workers apply them at their step boundary.
    const auto s0 = Clock::now();
    constexpr int kStatsCalls = 200;
    for (int k = 0; k < kStatsCalls; ++k) (void)(*engine)->stats();
    const double stats_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - s0).count() / kStatsCalls;
    const double interval = config.kvm.interval_ms;
    const double step_ms = steps > 0 ? step / static_cast<double>(steps) : 0;
    // Step time the workers spent per interval (summed over workers).
    const double step_per_interval = step / std::max(wall * 1000.0, 1e-9) * interval;
    std::printf(
        "  kvm overhead: tick %.4f ms mean + engine snapshot %.4f ms (idle) per %.0f ms interval "
        "= %.3f%% of the interval; decode step %.4f ms mean (%lld steps, %.1f ms of steps per "
        "interval): tick per interval = %.3f%% of the step time, one tick = %.2f steps\n",
        st.kvm_tick_ms_mean, stats_ms, interval,
        100.0 * (st.kvm_tick_ms_mean + stats_ms) / interval, step_ms, static_cast<long long>(steps),
        step_per_interval, 100.0 * st.kvm_tick_ms_mean / std::max(step_per_interval, 1e-9),
        st.kvm_tick_ms_mean / std::max(step_ms, 1e-9));
    std::printf("  kvm actuator wait: %.4f ms mean per tick (asleep, for the workers' replies)\n",
                st.kvm_actuate_ms_mean);
  }
  std::printf("  step time: forward %.1f%%, sampling+events %.1f%%, scheduler bookkeeping %.2f%%\n",
              100.0 * fwd / step, 100.0 * samp / step, 100.0 * book / step);
  return 0;
}

// 256 sequences (8 prompt tokens each) decoding together in one colocated worker: where the step
// time goes. The KV pool is sized for all of them (--kv-blocks overrides).
int run_bookkeeping(const Options& o, int sampling_threads) {
  EngineConfig c = base_config(o, ServingMode::kColocated);
  c.num_decode_workers = 1;
  c.max_num_seqs = o.bookkeeping_seqs;
  c.max_batch_tokens = o.bookkeeping_seqs * 8;
  if (o.kv_blocks == 0) {
    // + 2% for the colocated worker's admission watermark (1% of the pool kept free).
    c.kv_blocks_per_worker = o.bookkeeping_seqs *
                                 ((8 + o.bookkeeping_tokens + c.block_size - 1) / c.block_size) *
                                 102 / 100 +
                             2;
  }
  EngineImpl::InternalOptions internal;
  internal.sampling_threads = sampling_threads;
  auto engine = EngineImpl::create(c, internal);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::vector<kvsplit::RequestHandle> hs;
  for (int i = 0; i < o.bookkeeping_seqs; ++i) {
    Request r;
    r.prompt_token_ids = std::vector<int32_t>(8, 3 + i % 200);
    r.sampling.max_tokens = o.bookkeeping_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = i;
    auto h = (*engine)->submit(r);
    if (!h.ok()) {
      std::fprintf(stderr, "bookkeeping: request %d: %s\n", i, h.status().to_string().c_str());
      return 1;
    }
    hs.push_back(std::move(h).value());
  }
  // Steady state: from the step where every sequence is running to the first finish.
  auto wait_for = [&](auto pred) {
    const auto deadline = Clock::now() + std::chrono::minutes(20);
    while (!pred((*engine)->stats()) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  int max_running = 0;
  wait_for([&](const kvsplit::EngineStats& s) {
    max_running = std::max(max_running, s.num_running);
    return s.num_running >= o.bookkeeping_seqs || s.requests_finished > 0;
  });
  const auto a = (*engine)->worker_snapshots().at(0);
  wait_for([&](const kvsplit::EngineStats& s) { return s.requests_finished > 0; });
  const auto b = (*engine)->worker_snapshots().at(0);
  for (auto& h : hs) {
    TokenEvent ev;
    while (h.next(&ev, std::chrono::minutes(10)) && !ev.final) {
    }
  }
  const auto w = (*engine)->worker_snapshots().at(0);
  std::printf(
      "bookkeeping: %s, %d sequences (%d running at once), %lld steps in all, %d forward "
      "threads, %d sampling threads\n",
      (*engine)->model_info().source.c_str(), o.bookkeeping_seqs, max_running,
      static_cast<long long>(w.steps), o.threads, sampling_threads);
  auto report = [](const char* what, double steps, double fwd, double samp, double book) {
    if (steps <= 0) return;
    const double step = fwd + samp + book;
    std::printf(
        "  %s (%.0f steps): forward %.2f ms/step, sampling+events %.3f ms/step, scheduler "
        "bookkeeping %.3f ms/step = %.3f%% of step time (sampling+events %.2f%%)\n",
        what, steps, fwd / steps, samp / steps, book / steps, 100.0 * book / step,
        100.0 * samp / step);
  };
  report("all running", static_cast<double>(b.steps - a.steps), b.forward_ms - a.forward_ms,
         b.sampling_ms - a.sampling_ms, b.bookkeeping_ms - a.bookkeeping_ms);
  report("whole run", static_cast<double>(w.steps), w.forward_ms, w.sampling_ms, w.bookkeeping_ms);
  return 0;
}

}  // namespace kvsplit::bench_serving

int main(int argc, char** argv) {
  using namespace kvsplit::bench_serving;
  Options o;
  CLI::App app{"kvsplit offline serving benchmark"};
  const CLI::Range tokens(1, 1 << 20), seqs(1, 100000), mib(1.0, 16777216.0), host(0, 1 << 24);
  app.add_option("--model", o.model, "model path or synthetic:<preset>");
  app.add_option("--mode", o.mode, "both | colocated | disaggregated")
      ->check(CLI::IsMember({"both", "colocated", "disaggregated"}));
  app.add_option("--requests", o.requests, "number of requests")->check(kvsplit::kPositive);
  app.add_option("--rate", o.rate, "Poisson arrival rate (requests/s)")->check(kvsplit::kPositive);
  app.add_option("--seed", o.seed, "workload seed");
  app.add_option("--prompt-median", o.prompt_median, "lognormal prompt length median (tokens)")
      ->check(CLI::Range(1.0, 1e9));
  app.add_option("--prompt-sigma", o.prompt_sigma, "lognormal prompt length sigma")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--output-median", o.output_median, "lognormal output length median (tokens)")
      ->check(CLI::Range(1.0, 1e9));
  app.add_option("--output-sigma", o.output_sigma, "lognormal output length sigma")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--interactive-share", o.interactive_share, "share of the interactive class")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--prefill-workers", o.prefill_workers, "disaggregated prefill workers");
  app.add_option("--decode-workers", o.decode_workers, "disaggregated decode workers");
  app.add_option("--colocated-workers", o.colocated_workers, "colocated workers");
  app.add_option("--threads", o.threads, "CPU threads per worker");
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "prefill token budget per step");
  app.add_option("--max-chunk-tokens", o.max_chunk_tokens,
                 "most prefill tokens one prompt gets in a step (0: no cap; default: the "
                 "engine's)");
  app.add_option("--max-chunk-ms", o.max_chunk_ms,
                 "time-based prefill cap: a prompt's chunk keeps the step within this many ms by "
                 "the worker's measured step cost (0: off)");
  app.add_flag("--max-chunk-ms-auto", o.max_chunk_ms_auto,
               "pools.max_chunk_ms: auto: a step's budget is its decoding classes' max_itl_ms");
  app.add_option("--kv-blocks", o.kv_blocks, "KV blocks per worker (0: from capacity)");
  app.add_option("--max-num-seqs", o.max_num_seqs, "sequences per worker (0: the engine's)");
  app.add_option("--forward-handoffs", o.forward_handoffs,
                 "pass handoffs waiting for room to a decode worker with room (true|false)");
  app.add_flag("--bookkeeping", o.bookkeeping, "measure bookkeeping at 256 running sequences");
  app.add_option("--bookkeeping-seqs", o.bookkeeping_seqs, "sequences for --bookkeeping")
      ->check(seqs);
  app.add_option("--bookkeeping-tokens", o.bookkeeping_tokens, "max_tokens for --bookkeeping")
      ->check(tokens);
  app.add_option("--sampling-threads", o.sampling_threads,
                 "--bookkeeping: sampling threads (0: run with 1, then with --threads)");
  app.add_flag("--capacity", o.capacity,
               "sequences one fixed KV budget runs at once, semantic cut off vs on");
  app.add_option("--kv-capacity-mb", o.kv_capacity_mb, "--capacity: KV budget (MiB)")->check(mib);
  app.add_option("--quant-fraction", o.quant_fraction,
                 "--capacity: share of the budget for the quantized arenas")
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--capacity-seqs", o.capacity_seqs, "--capacity: sequence counts to try")
      ->delimiter(',')
      ->check(seqs);
  app.add_option("--capacity-prompt", o.capacity_prompt, "--capacity: prompt tokens")
      ->check(tokens);
  app.add_option("--capacity-output", o.capacity_output, "--capacity: tokens generated")
      ->check(tokens);
  app.add_option("--semantic-threshold", o.semantic_threshold, "--capacity: ladder threshold");
  app.add_option("--recent-tokens", o.recent_tokens, "--capacity: recent tokens kept full");
  app.add_option("--score-interval", o.score_interval, "--capacity: decode steps between scorings")
      ->check(kvsplit::kPositive);
  app.add_flag("--swap-compare", o.swap_compare,
               "temporal cut: swap never / always / auto on one over-committed KV budget");
  app.add_option("--swap-seqs", o.swap_seqs, "--swap-compare: sequences submitted at once")
      ->check(seqs);
  app.add_option("--swap-prompt", o.swap_prompt, "--swap-compare: prompt tokens")->check(tokens);
  app.add_option("--swap-output", o.swap_output, "--swap-compare: tokens generated")->check(tokens);
  app.add_option("--host-mb", o.host_mb, "--swap-compare: host tier per worker (MiB)")->check(host);
  app.add_option("--swap-reps", o.swap_reps,
                 "--swap-compare: rounds of never, always, auto taking turns (median and range)")
      ->check(kvsplit::kPositive);
  app.add_option("--sla-ttft-ms", o.sla_ttft_ms,
                 "--swap-compare: goodput's TTFT target (default: the default class's, 5000)")
      ->check(kvsplit::kNonNegative);
  app.add_option("--sla-itl-ms", o.sla_itl_ms,
                 "--swap-compare: goodput's mean ITL target (default: the default class's, 500)")
      ->check(kvsplit::kNonNegative);
  app.add_option("--trace", o.trace,
                 "replay this request trace (JSON lines, docs/kvm.md) instead of the synthetic "
                 "workload: synthetic prompts of its lengths, EOS ignored, its classes");
  app.add_option("--write-trace", o.write_trace, "write the workload as a request trace");
  app.add_option("--write-requests", o.write_requests,
                 "write each request's TTFT, mean ITL and preemptions (JSON lines, as "
                 "kvsplit policy simulate --write-requests predicts them)");
  app.add_option("--config", o.config,
                 "server YAML config: its engine settings, SLA classes and kvm section (with "
                 "--mode both, its workers in each mode; otherwise the mode given)");
  app.add_flag("--fairness", o.fairness,
               "fair time slicing: short requests' TTFT without and with one long prompt among "
               "them (--write-trace writes the run with it)");
  app.add_option("--fair-requests", o.fair_requests, "--fairness: short requests")
      ->check(kvsplit::kPositive);
  app.add_option("--fair-rate", o.fair_rate, "--fairness: short requests' Poisson rate (1/s)")
      ->check(kvsplit::kPositive);
  app.add_option("--fair-prompt-min", o.fair_prompt_min, "--fairness: shortest short prompt")
      ->check(kvsplit::kPositive);
  app.add_option("--fair-prompt-max", o.fair_prompt_max, "--fairness: longest short prompt")
      ->check(kvsplit::kPositive);
  app.add_option("--fair-output-min", o.fair_output_min, "--fairness: shortest short output")
      ->check(kvsplit::kPositive);
  app.add_option("--fair-output-max", o.fair_output_max, "--fairness: longest short output")
      ->check(kvsplit::kPositive);
  app.add_option("--long-prompt", o.long_prompt, "--fairness: the long prompt's tokens")
      ->check(kvsplit::kPositive);
  app.add_option("--long-output", o.long_output, "--fairness: the long request's output tokens")
      ->check(kvsplit::kPositive);
  app.add_option("--long-at", o.long_at_s, "--fairness: the long prompt's arrival (s)")
      ->check(kvsplit::kNonNegative);
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (o.fair_prompt_min > o.fair_prompt_max || o.fair_output_min > o.fair_output_max) {
    std::fprintf(stderr, "--fair-*-min must not exceed --fair-*-max\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::err);
  if (!o.config.empty()) {
    auto cfg = kvsplit::config::load_config_file(o.config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "--config: %s\n", cfg.status().to_string().c_str());
      return 2;
    }
    g_file_config = cfg->engine;
    if (!cfg->model_given || app.count("--model") > 0) g_file_config.model = o.model;
    g_have_file_config = true;
  }
  if (o.fairness) return run_fairness(o);
  if (o.capacity) return run_capacity(o);
  if (o.swap_compare) return run_swap_compare(o);
  if (o.bookkeeping) {
    if (o.sampling_threads > 0) return run_bookkeeping(o, o.sampling_threads);
    int rc = run_bookkeeping(o, 1);
    if (o.threads > 1) rc |= run_bookkeeping(o, o.threads);
    return rc;
  }
  int rc = 0;
  if (o.mode != "colocated") rc |= run_mode(o, ServingMode::kDisaggregated);
  if (o.mode != "disaggregated") rc |= run_mode(o, ServingMode::kColocated);
  return rc;
}
