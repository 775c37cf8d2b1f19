// bench_serving_offline --fairness (fair time slicing, docs/kv-cuts.md "Measured").
#include <algorithm>
#include <cstdio>
#include <random>

#include "serving_offline.h"

namespace kvsplit::bench_serving {
namespace {

// Fairness (fair time slicing): a stream of short requests, run once alone and once with one long
// prompt arriving among them, each run on a fresh engine with one worker per role. Reports the
// short requests' TTFT with and without it (all of them, and those that arrived while the long
// prompt was being prefilled), the long request's TTFT and output tokens/s.
std::vector<Item> fairness_workload(const Options& o, int vocab, bool with_long) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.fair_rate);
  std::uniform_int_distribution<int> plen(o.fair_prompt_min, o.fair_prompt_max);
  std::uniform_int_distribution<int> olen(o.fair_output_min, o.fair_output_max);
  std::vector<Item> out;
  double t = 0;
  for (int i = 0; i < o.fair_requests; ++i) {
    t += gap(rng);
    const int p = plen(rng), n = olen(rng);
    out.push_back(synthetic_item("s" + std::to_string(i), t, p, n, "interactive", vocab, rng));
  }
  if (with_long) {
    std::mt19937_64 long_rng(o.seed + 1);  // the short requests stay the same
    Item it = synthetic_item("long", o.long_at_s, o.long_prompt, o.long_output, "interactive",
                             vocab, long_rng);
    auto pos = std::upper_bound(out.begin(), out.end(), it.arrival_s,
                                [](double a, const Item& b) { return a < b.arrival_s; });
    out.insert(pos, std::move(it));
  }
  return out;
}

}  // namespace

int run_fairness(const Options& o) {
  std::vector<ServingMode> modes;
  if (o.mode != "disaggregated") modes.push_back(ServingMode::kColocated);
  if (o.mode != "colocated") modes.push_back(ServingMode::kDisaggregated);
  for (ServingMode mode : modes) {
    const char* name = mode == ServingMode::kColocated ? "colocated" : "disaggregated";
    EngineConfig c = base_config(o, mode);
    c.num_prefill_workers = 1;
    c.num_decode_workers = 1;
    if (o.kv_blocks == 0) {
      // The long prompt and up to 128 short requests at once: KV never limits admission, so the
      // comparison is about the step's compute alone.
      c.kv_blocks_per_worker = (o.long_prompt + o.long_output + c.block_size - 1) / c.block_size +
                               std::min(o.fair_requests, 128) *
                                   ((o.fair_prompt_max + o.fair_output_max) / c.block_size + 1);
    }
    std::printf(
        "fairness: %s, %s (1 worker per role, %d threads), max_batch_tokens %d, "
        "max_chunk_tokens %d, max_chunk_ms %g%s; %d short "
        "requests (prompt %d-%d, output %d-%d tokens, Poisson %.1f/s), one %d-token prompt "
        "(+%d output) at %.2f s; each run on a fresh engine, same process\n",
        o.model.c_str(), name, c.threads_per_worker, c.max_batch_tokens, c.max_chunk_tokens,
        c.max_chunk_ms, c.max_chunk_ms_auto ? " (auto: the classes' max_itl_ms)" : "",
        o.fair_requests, o.fair_prompt_min, o.fair_prompt_max, o.fair_output_min, o.fair_output_max,
        o.fair_rate, o.long_prompt, o.long_output, o.long_at_s);
    struct Run {
      std::vector<double> ttft, arrival;  // short requests, in workload order
      double long_ttft = 0, long_start = 0, tok_s = 0, itl_p99 = 0;
      int errors = 0;
    };
    Run runs[2];
    for (int with_long = 0; with_long < 2; ++with_long) {
      auto engine = EngineImpl::create(c);
      if (!engine.ok()) {
        std::fprintf(stderr, "%s: %s\n", name, engine.status().to_string().c_str());
        return 1;
      }
      const std::vector<Item> work =
          fairness_workload(o, (*engine)->model_info().vocab_size, with_long != 0);
      if (with_long && !o.write_trace.empty()) {
        if (auto st = kvsplit::kvm::write_trace_file(o.write_trace, trace_of(work)); !st.ok()) {
          std::fprintf(stderr, "--write-trace: %s\n", st.to_string().c_str());
          return 2;
        }
      }
      const StreamResult res = run_stream(**engine, work, name, true);
      Run& r = runs[with_long];
      int64_t tokens = 0;
      for (size_t i = 0; i < work.size(); ++i) {
        const Outcome& out = res.outcomes[i];
        tokens += out.tokens;
        r.errors += !out.ok;
        if (work[i].request.request_id == "long") {
          r.long_ttft = out.ttft_ms;
          r.long_start = work[i].arrival_s;
        } else {
          r.ttft.push_back(out.ttft_ms);
          r.arrival.push_back(work[i].arrival_s);
        }
      }
      r.tok_s = static_cast<double>(tokens) / res.wall_s;
      r.itl_p99 = pct(res.itl, 99);
    }
    if (runs[0].errors + runs[1].errors > 0) {
      std::fprintf(stderr, "fairness: %d requests failed\n", runs[0].errors + runs[1].errors);
      return 1;
    }
    // The short requests that arrived while the long prompt waited for its first token.
    std::vector<double> during[2];
    for (size_t i = 0; i < runs[1].arrival.size(); ++i) {
      const double a = runs[1].arrival[i];
      if (a >= runs[1].long_start && a <= runs[1].long_start + runs[1].long_ttft / 1000.0) {
        for (int k = 0; k < 2; ++k) during[k].push_back(runs[k].ttft[i]);
      }
    }
    for (int k = 0; k < 2; ++k) {
      std::printf(
          "  %-12s short TTFT ms p50 %8.2f p99 %8.2f | %3zu arriving during the long prefill: "
          "p50 %8.2f p99 %8.2f | ITL p99 %7.2f ms | %6.1f output tok/s",
          k == 0 ? "without long" : "with long", pct(runs[k].ttft, 50), pct(runs[k].ttft, 99),
          during[k].size(), pct(during[k], 50), pct(during[k], 99), runs[k].itl_p99, runs[k].tok_s);
      if (k == 1) std::printf(" | long TTFT %.0f ms", runs[1].long_ttft);
      std::printf("\n");
    }
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf(
        "  ratio with/without: short TTFT p99 %.2fx (goal <= 1.5x), p50 %.2fx; during the long "
        "prefill p99 %.2fx, p50 %.2fx; output tok/s %.2fx\n",
        ratio(pct(runs[1].ttft, 99), pct(runs[0].ttft, 99)),
        ratio(pct(runs[1].ttft, 50), pct(runs[0].ttft, 50)),
        ratio(pct(during[1], 99), pct(during[0], 99)),
        ratio(pct(during[1], 50), pct(during[0], 50)), ratio(runs[1].tok_s, runs[0].tok_s));
  }
  return 0;
}

}  // namespace kvsplit::bench_serving
