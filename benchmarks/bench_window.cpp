// Sliding-window KV freeing (docs/models.md, "KV behind the window is freed"): how many long
// generations one fixed KV pool decodes at once when the pages every layer's window has passed go
// back to the pool, against the same synthetic shape with full attention, which must keep them.
// Both engines run in the same process, taking turns (--reps rounds), on one colocated worker;
// which runs first alternates from one pair of runs to the next (full first in the first), so
// neither always pays for going first.
//
//   bench_window --model synthetic:llama-110m --window 256 --kv-blocks 256 --block-size 16
//       --prompt 128 --output 896 --seqs 4,8,16 --threads 2   (one command line)
//
// Per sequence count and model: preemptions, sequences decoding at once (mean until the first
// finish), wall time, output tokens/s and pages freed behind the window. The capacity figures are
// the freeing's; the tokens/s ratio also carries the window's shorter attention.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "burst.h"
#include "common/cli_options.h"
#include "kvsplit/engine.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvsplit::EngineConfig;

struct Options {
  std::string model = "synthetic:stories260k";
  int window = 32;
  int kv_blocks = 64;
  int block_size = 8;
  int prompt = 40;
  int output = 200;
  std::vector<int> seqs = {2, 4, 8};
  int threads = 1;
  int reps = 1;
  uint64_t seed = 1;
};

struct Result {
  int64_t preemptions = 0, dropped = 0, errors = 0;
  double running = 0, wall_s = 0, tokens = 0;
};

// The spec with every layer sliding over `window` keys (synthetic:<preset>[@opts] only).
std::string windowed(const std::string& spec, int window) {
  return spec + (spec.find('@') == std::string::npos ? "@" : ",") +
         "window=" + std::to_string(window);
}

int run_once(const Options& o, const std::string& model, int seqs, Result* r) {
  EngineConfig c;
  c.model = model;
  c.mode = kvsplit::ServingMode::kColocated;
  c.num_prefill_workers = 1;
  c.threads_per_worker = o.threads;
  c.block_size = o.block_size;
  c.kv_blocks_per_worker = o.kv_blocks;
  c.max_num_seqs = seqs;
  auto engine = kvsplit::Engine::create(c);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s: %s\n", model.c_str(), engine.status().to_string().c_str());
    return 1;
  }
  std::vector<kvsplit::RequestHandle> hs;
  const auto t0 = Clock::now();
  const kvsplit::Status submitted =
      kvsplit::bench::submit_burst(**engine, seqs, o.prompt, o.output, o.seed, &hs);
  if (!submitted.ok()) {
    std::fprintf(stderr, "%s\n", submitted.to_string().c_str());
    return 1;
  }
  r->running = kvsplit::bench::mean_running_until_done(**engine, seqs);
  for (auto& h : hs) {
    kvsplit::TokenEvent ev;
    while (h.next(&ev, std::chrono::minutes(10))) {
      r->tokens += static_cast<double>(ev.token_ids.size());
      if (ev.final) {
        r->errors += !ev.status.ok();
        break;
      }
    }
  }
  r->wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const kvsplit::EngineStats st = (*engine)->stats();
  r->preemptions = st.preemptions;
  for (const kvsplit::PoolStats& p : st.pools) r->dropped += p.kv_window_dropped_pages;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvsplit sliding-window KV freeing benchmark"};
  app.add_option("--model", o.model, "synthetic:<preset>[@seed=N,ctx=N] (no window)");
  app.add_option("--window", o.window, "the windowed model's sliding window (keys)")
      ->check(kvsplit::kPositive);
  app.add_option("--kv-blocks", o.kv_blocks, "KV pages of the worker")->check(kvsplit::kPositive);
  app.add_option("--block-size", o.block_size, "tokens per page")->check(kvsplit::kPositive);
  app.add_option("--prompt", o.prompt, "prompt tokens")->check(kvsplit::kPositive);
  app.add_option("--output", o.output, "tokens generated")->check(kvsplit::kPositive);
  app.add_option("--seqs", o.seqs, "sequence counts, submitted at once")->delimiter(',');
  app.add_option("--threads", o.threads, "CPU threads of the worker")->check(kvsplit::kPositive);
  app.add_option("--reps", o.reps, "rounds (the two models take turns)")->check(kvsplit::kPositive);
  app.add_option("--seed", o.seed, "prompt seed");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  spdlog::set_level(spdlog::level::err);  // preemption warnings are counted, not printed
  if (o.model.rfind("synthetic:", 0) != 0 || o.model.find("window=") != std::string::npos) {
    std::fprintf(stderr, "--model must be a synthetic spec without a window\n");
    return 2;
  }
  const std::string win = windowed(o.model, o.window);
  std::printf(
      "window: %s against %s, %d pages of %d tokens, sequences of %d + %d tokens submitted at "
      "once, 1 colocated worker, %d rounds\n",
      win.c_str(), o.model.c_str(), o.kv_blocks, o.block_size, o.prompt, o.output, o.reps);
  int most_full = 0, most_window = 0;
  int turn = 0;  // pairs of runs so far: odd ones run the window first
  for (int seqs : o.seqs) {
    for (int rep = 0; rep < o.reps; ++rep) {
      Result full, w;
      const bool window_first = turn++ % 2 == 1;
      if (window_first ? run_once(o, win, seqs, &w) != 0 || run_once(o, o.model, seqs, &full) != 0
                       : run_once(o, o.model, seqs, &full) != 0 || run_once(o, win, seqs, &w) != 0)
        return 1;
      if (full.errors + w.errors > 0) {
        std::fprintf(stderr, "%lld requests failed\n",
                     static_cast<long long>(full.errors + w.errors));
        return 1;
      }
      for (const auto& [name, r] :
           {std::pair<const char*, const Result&>{"full", full}, {"window", w}}) {
        std::printf(
            "  %3d seqs, %-6s: preemptions %4lld, decoding at once %5.1f, %6.2f s, %7.0f output "
            "tok/s, pages freed behind the window %lld\n",
            seqs, name, static_cast<long long>(r.preemptions), r.running, r.wall_s,
            r.tokens / r.wall_s, static_cast<long long>(r.dropped));
      }
      std::printf(
          "  %3d seqs, window / full: decoding at once %.2fx, output tok/s %.2fx (%s ran first)\n",
          seqs, w.running / std::max(full.running, 1e-9),
          (w.tokens / w.wall_s) / std::max(full.tokens / full.wall_s, 1e-9),
          window_first ? "window" : "full");
      if (full.preemptions == 0) most_full = std::max(most_full, seqs);
      if (w.preemptions == 0) most_window = std::max(most_window, seqs);
    }
  }
  std::printf("  most sequences run without a preemption: full %d, window %d\n", most_full,
              most_window);
  return 0;
}
