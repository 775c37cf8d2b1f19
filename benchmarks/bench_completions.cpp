// bench_completions: parallel sampling (Request::n) against the same completions sent as separate
// requests, on one colocated engine with the prefix cache on, in the same run:
//   - `n = N`: one request of N completions, seed s (completion i samples with s + i); the
//     completions after the first wait for its prompt and take its cached pages;
//   - `N requests`: N requests of n = 1 with seeds s .. s + N - 1 submitted at once (what a client
//     without `n` sends): each computes the whole prompt, since none is cached when they start.
// Each round uses a fresh prompt (no cache hit from an earlier round). Per mode it prints the
// prompt tokens computed (prompt - cached, summed over the completions) and the wall time from
// the submit to the last completion's final event (median of the rounds), and checks that both
// modes generate the same tokens (the seeds make them equal).
//
//   build/benchmarks/bench_completions [--model synthetic:stories260k] [--n 8] [--prompt-len 400]
//                                      [--max-tokens 16] [--rounds 5] [--threads 2] [--kv-blocks N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/cli_options.h"
#include "engine/engine_impl.h"

namespace {

using namespace kvsplit;
using Clock = std::chrono::steady_clock;

struct Result {
  double seconds = 0;
  int64_t prompt_computed = 0;
  std::vector<std::vector<int32_t>> tokens;  // per completion
  bool ok = true;
};

// Reads every handle's events until each stream's last event.
Result drain(std::vector<RequestHandle>& handles, int completions_each, Clock::time_point t0) {
  Result r;
  r.tokens.resize(handles.size() * static_cast<size_t>(completions_each));
  for (size_t h = 0; h < handles.size(); ++h) {
    while (true) {
      TokenEvent ev;
      if (!handles[h].next(&ev, std::chrono::seconds(600))) {
        std::fprintf(stderr, "bench_completions: no event within 600 s\n");
        r.ok = false;
        return r;
      }
      std::vector<int32_t>& out =
          r.tokens[h * static_cast<size_t>(completions_each) + static_cast<size_t>(ev.index)];
      out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.final) {
        r.prompt_computed += ev.usage.prompt_tokens - ev.usage.cached_tokens;
        if (!ev.status.ok()) {
          std::fprintf(stderr, "bench_completions: %s\n", ev.status.to_string().c_str());
          r.ok = false;
        }
      }
      if (ev.last) break;
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "synthetic:stories260k";
  int n = 8, prompt_len = 400, max_tokens = 16, rounds = 5, threads = 2, kv_blocks = 0;
  CLI::App app{"bench_completions: Request::n against n separate requests"};
  app.add_option("--model", model, "model path or synthetic:<preset>");
  app.add_option("--n", n, "completions per request")->check(CLI::Range(2, kMaxCompletions));
  app.add_option("--prompt-len", prompt_len, "prompt tokens")->check(CLI::Range(2, 1 << 20));
  app.add_option("--max-tokens", max_tokens, "tokens per completion")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--rounds", rounds, "rounds (each a fresh prompt)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "CPU threads of the worker")->check(CLI::Range(1, 256));
  app.add_option("--kv-blocks", kv_blocks, "KV blocks of the worker (0: the engine's default)")
      ->check(CLI::Range(0, 1 << 24));
  strict_options(app);
  if (const auto rc = parse_args(app, argc, argv)) return *rc;

  EngineConfig cfg;
  cfg.model = model;
  cfg.mode = ServingMode::kColocated;
  cfg.num_prefill_workers = 1;
  cfg.threads_per_worker = threads;
  cfg.prefix_cache = true;
  cfg.max_batch_tokens = 512;
  cfg.kv_blocks_per_worker = kv_blocks;
  cfg.sla_classes[0].max_queue = 4 * kMaxCompletions;
  cfg.sla_classes[0].queue_timeout_ms = 3600 * 1000;
  auto engine = EngineImpl::create(cfg);
  if (!engine.ok()) {
    std::fprintf(stderr, "bench_completions: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  const ModelInfo info = (*engine)->model_info();
  if (prompt_len + max_tokens - 1 > info.max_context) {
    std::fprintf(stderr,
                 "bench_completions: --prompt-len + --max-tokens - 1 exceeds the context %d\n",
                 info.max_context);
    return 2;
  }
  std::printf("model %s, %d completions of a %d-token prompt, %d tokens each, %d rounds\n",
              info.source.c_str(), n, prompt_len, max_tokens, rounds);
  std::mt19937 rng(2026);
  std::vector<double> t_group, t_separate;
  int64_t computed_group = 0, computed_separate = 0;
  bool same = true, ok = true;
  for (int round = 0; round < rounds && ok; ++round) {
    Request base;
    for (int i = 0; i < prompt_len; ++i)
      base.prompt_token_ids.push_back(3 + static_cast<int32_t>(rng() % (info.vocab_size - 3)));
    base.sampling.temperature = 0.8f;
    base.sampling.max_tokens = max_tokens;
    base.sampling.ignore_eos = true;
    // Alternate which mode goes first, so neither always meets a warmer machine.
    Result group, separate;
    for (int pass = 0; pass < 2; ++pass) {
      const bool run_group = (pass == 0) == (round % 2 == 0);
      Request r = base;
      r.cache_salt = std::to_string(round) + (run_group ? "g" : "s");  // no hit across modes
      std::vector<RequestHandle> handles;
      const Clock::time_point t0 = Clock::now();
      if (run_group) {
        r.n = n;
        r.sampling.seed = 1000;
        auto h = (*engine)->submit(r);
        if (!h.ok()) {
          std::fprintf(stderr, "bench_completions: %s\n", h.status().to_string().c_str());
          return 1;
        }
        handles.push_back(*h);
        group = drain(handles, n, t0);
      } else {
        for (int i = 0; i < n; ++i) {
          r.sampling.seed = 1000 + i;
          auto h = (*engine)->submit(r);
          if (!h.ok()) {
            std::fprintf(stderr, "bench_completions: %s\n", h.status().to_string().c_str());
            return 1;
          }
          handles.push_back(*h);
        }
        separate = drain(handles, 1, t0);
      }
    }
    ok = group.ok && separate.ok;
    same = same && group.tokens == separate.tokens;
    t_group.push_back(group.seconds);
    t_separate.push_back(separate.seconds);
    computed_group += group.prompt_computed;
    computed_separate += separate.prompt_computed;
  }
  if (!ok) return 1;
  const double tg = median(t_group), ts = median(t_separate);
  std::printf("%-14s prompt tokens computed %9.1f per request, wall %8.2f ms (median)\n",
              ("n = " + std::to_string(n)).c_str(), static_cast<double>(computed_group) / rounds,
              tg * 1e3);
  std::printf("%-14s prompt tokens computed %9.1f per request, wall %8.2f ms (median)\n",
              (std::to_string(n) + " requests").c_str(),
              static_cast<double>(computed_separate) / rounds, ts * 1e3);
  std::printf("separate / n: prompt tokens computed %.2fx, wall %.2fx; tokens the same: %s\n",
              computed_group > 0 ? static_cast<double>(computed_separate) / computed_group : 0.0,
              tg > 0 ? ts / tg : 0.0, same ? "yes" : "NO");
  return same ? 0 : 1;
}
