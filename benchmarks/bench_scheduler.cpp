// bench_scheduler: host time of one Scheduler step against the number of sequences a worker owns
// (docs/serving.md, "Scheduler"). The scheduler runs on the worker's thread before every forward
// pass, so its cost must grow about linearly with the sequences, not with their square.
//
// For each size N (sequences), three steps on plain structs, each timed over repeated calls:
// - restarts: N/2 running sequences decoding (each with room for its next token, more positions
//             to reach) and N/2 restarts waiting for blocks in a nearly full pool: the room each
//             restart must leave for the growth of the running sequences served before it;
// - growth:   N running sequences that each need a block in a full pool: every one the pool
//             cannot grow preempts the one the swap predictor needs last;
// - handoffs: N/2 running sequences and N/2 received KV handoffs admitted in one pass
//             (Scheduler::admit_handoffs): the blocks the next tokens ahead of each one need.
// Prints microseconds per step and, per step kind, the ratio of the largest size's time per
// sequence to the smallest's (same run): about 1 when the cost grows linearly.
//
//   build/benchmarks/bench_scheduler [--sizes 256,1024,4096,16384] [--min-ms 50]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/cli_options.h"
#include "sched/scheduler.h"

namespace {

using kvsplit::sched::SchedHandoff;
using kvsplit::sched::SchedSeq;
using kvsplit::sched::Scheduler;
using kvsplit::sched::SchedulerConfig;
using kvsplit::sched::SchedulerInput;
using kvsplit::sched::SchedulerOutput;
using Clock = std::chrono::steady_clock;

struct Figures {
  double restarts_us = 0, growth_us = 0, handoffs_us = 0;
};

SchedulerConfig config() {
  SchedulerConfig c;
  c.max_num_seqs = 1 << 30;
  c.block_size = 16;
  c.max_batch_tokens = 512;
  return c;
}

// Microseconds per call of `step`, repeated for at least `min_ms` (3 calls at least) after one
// untimed call. `check` sees the last output: the step must do what it is meant to.
template <typename Step, typename Check>
double time_us(double min_ms, Step step, Check check) {
  int calls = 0;
  SchedulerOutput out = step();
  const auto t0 = Clock::now();
  double ms = 0;
  while (calls < 3 || ms < min_ms) {
    out = step();
    ++calls;
    ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  if (!check(out)) {
    std::fprintf(stderr, "bench_scheduler: the step did not plan what it measures\n");
    std::exit(1);
  }
  return ms * 1000 / calls;
}

Figures measure(int n, double min_ms) {
  Figures f;
  const Scheduler s(config());
  {
    const int r = n / 2, w = n - r;
    std::vector<SchedSeq> run(r), wait(w);
    for (int i = 0; i < r; ++i) {
      run[i].id = i;
      run[i].arrival = i;
      run[i].num_computed = 100;  // 7 blocks: room for the next token
      run[i].num_blocks = 7;
      run[i].final_positions = 200;
    }
    for (int i = 0; i < w; ++i) {
      wait[i].id = r + i;
      wait[i].arrival = r + i;
      wait[i].target = 120;
      wait[i].restart = true;
    }
    SchedulerInput in;
    in.running = run;
    in.waiting = wait;
    in.free_blocks = 10;
    in.total_blocks = r * 7 + 10 + 1000;
    f.restarts_us = time_us(
        min_ms, [&] { return s.schedule(in); },
        [&](const SchedulerOutput& o) { return static_cast<int>(o.decode.size()) == r; });
  }
  {
    std::vector<SchedSeq> run(n);
    for (int i = 0; i < n; ++i) {
      run[i].id = i;
      run[i].arrival = i;
      run[i].num_computed = 64;  // 4 full blocks: the next token needs a fifth
      run[i].num_blocks = 4;
    }
    SchedulerInput in;
    in.running = run;
    in.total_blocks = n * 4;
    f.growth_us = time_us(
        min_ms, [&] { return s.schedule(in); },
        [&](const SchedulerOutput& o) { return o.preempted.size() * 5 >= static_cast<size_t>(n); });
  }
  {
    const int r = n / 2, h = n - r;
    std::vector<SchedSeq> run(r);
    std::vector<SchedHandoff> offers(h);
    for (int i = 0; i < r; ++i) {
      run[i].id = i;
      run[i].arrival = i;
      run[i].num_computed = 100;
      run[i].num_blocks = 7;
    }
    for (int i = 0; i < h; ++i) {
      offers[i].id = r + i;
      offers[i].arrival = r + i;
      offers[i].num_tokens = 40;
    }
    SchedulerInput in;
    in.running = run;
    in.handoffs = offers;
    in.free_blocks = h * 4 + r;
    in.total_blocks = r * 7 + in.free_blocks;
    f.handoffs_us = time_us(
        min_ms, [&] { return s.admit_handoffs(in); },
        [&](const SchedulerOutput& o) { return static_cast<int>(o.admitted.size()) == h; });
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scheduler step time against the number of sequences"};
  std::vector<int> sizes{256, 1024, 4096, 16384};
  double min_ms = 50;
  app.add_option("--sizes", sizes, "sequences per step")
      ->delimiter(',')
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--min-ms", min_ms, "least time each step kind is repeated for, ms")
      ->check(CLI::Range(0.0, 60000.0));
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  std::sort(sizes.begin(), sizes.end());
  std::printf("sequences | restarts us/step | growth us/step | handoffs us/step\n");
  std::vector<Figures> all;
  for (int n : sizes) {
    all.push_back(measure(n, min_ms));
    std::printf("%9d | %16.1f | %14.1f | %16.1f\n", n, all.back().restarts_us, all.back().growth_us,
                all.back().handoffs_us);
  }
  const Figures &lo = all.front(), &hi = all.back();
  const double scale = static_cast<double>(sizes.front()) / sizes.back();
  std::printf(
      "per sequence, largest / smallest (%d / %d sequences): restarts %.2fx, growth %.2fx, "
      "handoffs %.2fx\n",
      sizes.back(), sizes.front(), hi.restarts_us / lo.restarts_us * scale,
      hi.growth_us / lo.growth_us * scale, hi.handoffs_us / lo.handoffs_us * scale);
  return 0;
}
