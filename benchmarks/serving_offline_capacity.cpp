// bench_serving_offline --capacity and --swap-compare: one colocated worker with a fixed KV
// budget and a burst of long greedy generations (docs/kv-cuts.md "Measured").
#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>
#include <vector>

#include "burst.h"
#include "serving_offline.h"
#include "token_check.h"

namespace kvsplit::bench_serving {
namespace {

// One colocated worker with a fixed KV budget; `seqs` long generations submitted at once.
// Reports the mean number of sequences decoding at once, preemptions (recomputes: the budget was
// too small for them all), wall time and output tokens/s.
struct CapacityResult {
  double mean_running = 0;
  int64_t preemptions = 0, demotions = 0, evictions = 0, recalls = 0, refused = 0;
  int64_t swaps_out = 0, swaps_in = 0, swap_bytes = 0, recompute_choices = 0, fallbacks = 0;
  double wall_s = 0, tokens = 0;
  int errors = 0;
  // Goodput: requests (and their output tokens) within the SLA targets: TTFT <= sla_ttft_ms and
  // mean inter-token latency <= sla_itl_ms.
  double sla_ttft_ms = 0, sla_itl_ms = 0;
  int good = 0;
  double good_tokens = 0;
  kvsplit::bench::Outputs outputs;  // per request, in submission order: its tokens
};

int run_capacity_once(const Options& o, int seqs, kvsplit::KvPolicy policy, CapacityResult* res,
                      const kvsplit::TemporalCutConfig& temporal = {}, int prompt = 0,
                      int output = 0) {
  if (prompt == 0) prompt = o.capacity_prompt;
  if (output == 0) output = o.capacity_output;
  EngineConfig c = base_config(o, ServingMode::kColocated);
  c.temporal = temporal;
  c.num_decode_workers = 1;
  c.kv_blocks_per_worker = 0;
  c.kv_capacity_bytes = static_cast<int64_t>(o.kv_capacity_mb * (1 << 20));
  c.max_num_seqs = seqs;
  c.kv_policy = policy;
  if (policy == kvsplit::KvPolicy::kSemantic) {
    c.kv_quant_fraction = o.quant_fraction;
    c.semantic.semantic_threshold = o.semantic_threshold;
    c.semantic.evict_threshold = 0.f;
    c.semantic.demote_after_steps = 1;
    c.semantic.score_interval = o.score_interval;
    c.semantic.recall_threshold = 1.f;
    c.semantic.recent_tokens = o.recent_tokens;
  }
  auto engine = EngineImpl::create(c);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::vector<kvsplit::RequestHandle> hs;
  const auto t0 = Clock::now();
  const Status submitted =
      kvsplit::bench::submit_burst(**engine, seqs, prompt, output, o.seed, &hs);
  if (!submitted.ok()) {
    std::fprintf(stderr, "%s\n", submitted.to_string().c_str());
    return 1;
  }
  res->mean_running = kvsplit::bench::mean_running_until_done(**engine, seqs);
  // The SLA targets: --sla-ttft-ms / --sla-itl-ms, else the default class's (the first).
  res->sla_ttft_ms = o.sla_ttft_ms > 0 ? o.sla_ttft_ms : c.sla_classes.at(0).max_ttft_ms;
  res->sla_itl_ms = o.sla_itl_ms > 0 ? o.sla_itl_ms : c.sla_classes.at(0).max_itl_ms;
  for (auto& h : hs) {
    TokenEvent ev;
    double tokens = 0;
    std::vector<int32_t>& out = res->outputs.emplace_back();
    bool ended = false;  // a request without its final event (timed out) is an error
    while (h.next(&ev, std::chrono::minutes(10))) {
      tokens += static_cast<double>(ev.token_ids.size());
      out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.final) {
        ended = true;
        res->errors += !ev.status.ok();
        if (ev.status.ok() && ev.timings.ttft_ms <= res->sla_ttft_ms &&
            ev.timings.mean_itl_ms <= res->sla_itl_ms) {
          ++res->good;
          res->good_tokens += tokens;
        }
        break;
      }
    }
    res->errors += !ended;
    res->tokens += tokens;
  }
  res->wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const kvsplit::EngineStats st = (*engine)->stats();
  res->preemptions = st.preemptions;
  for (const kvsplit::PoolStats& p : st.pools) {
    res->demotions += p.kv_demotions;
    res->evictions += p.kv_evictions;
    res->recalls += p.kv_recalls;
    res->refused += p.kv_refused_transitions;
    res->swaps_out += p.kv_swaps_out;
    res->swaps_in += p.kv_swaps_in;
    res->swap_bytes += p.kv_swap_bytes;
    res->recompute_choices += p.kv_recompute_choices;
    res->fallbacks += p.kv_swap_fallbacks;
  }
  return 0;
}

}  // namespace

// The temporal cut against recompute: one over-committed budget, swap never / always / auto.
// `--swap-reps` rounds, each running every mode once, the first rotating (round 1: never, always,
// auto; round 2: always, auto, never; ...), so that neither a slow spell of a shared machine nor
// going first falls on one mode; each round's ratios are against that round's `never`; the
// summary's headline is the median of those same-round ratios, with their range. The requests are
// greedy with EOS ignored, and swapping restores the KV exactly: every run must give every request
// round 1's `never` tokens (checked; a difference fails the run, naming the request).
int run_swap_compare(const Options& o) {
  std::printf(
      "swap: %s, KV budget %.1f MiB, host tier %lld MiB, %d sequences of %d + %d tokens "
      "submitted at once, 1 colocated worker, %d threads, %d round(s)\n",
      o.model.c_str(), o.kv_capacity_mb, static_cast<long long>(o.host_mb), o.swap_seqs,
      o.swap_prompt, o.swap_output, o.threads, o.swap_reps);
  constexpr std::array<kvsplit::SwapMode, 3> kModes = {
      kvsplit::SwapMode::kNever, kvsplit::SwapMode::kAlways, kvsplit::SwapMode::kAuto};
  constexpr std::array<const char*, 3> kNames = {"never", "always", "auto"};
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  // Per mode, per round: wall time, and throughput and goodput (tok/s) relative to the round's
  // never.
  std::array<std::vector<double>, 3> walls, thr, good_tok;
  kvsplit::bench::Outputs want;  // round 1's never
  for (int round = 0; round < o.swap_reps; ++round) {
    std::array<CapacityResult, 3> res;
    std::string order;
    for (size_t k = 0; k < kModes.size(); ++k) {
      const size_t m = (static_cast<size_t>(round) + k) % kModes.size();
      kvsplit::TemporalCutConfig t;
      t.host_capacity_mb = o.host_mb;
      t.swap = kModes[m];
      if (run_capacity_once(o, o.swap_seqs, kvsplit::KvPolicy::kFull, &res[m], t, o.swap_prompt,
                            o.swap_output) != 0 ||
          res[m].errors > 0)
        return 1;
      order += std::string(k > 0 ? ", " : "") + kNames[m];
    }
    if (round == 0) want = res[0].outputs;
    std::printf("  [%d] run order: %s\n", round + 1, order.c_str());
    const CapacityResult& never = res[0];
    const double never_tok_s = never.tokens / never.wall_s;
    const double never_good = never.good / never.wall_s;
    const double never_good_tok = never.good_tokens / never.wall_s;
    for (size_t m = 0; m < kModes.size(); ++m) {
      const CapacityResult& r = res[m];
      const double tok_s = r.tokens / r.wall_s;
      const double good_rps = r.good / r.wall_s, good_tok_s = r.good_tokens / r.wall_s;
      walls[m].push_back(r.wall_s);
      thr[m].push_back(ratio(tok_s, never_tok_s));
      good_tok[m].push_back(ratio(good_tok_s, never_good_tok));
      std::printf(
          "  [%d] swap %-6s: %6.2f s (%.2fx the time of never), %6.0f output tok/s, preemptions "
          "%4lld: swapped out %lld, in %lld (%.1f MiB copied), recompute choices %lld, fallbacks "
          "%lld; tokens same as round 1's never: %s\n",
          round + 1, kNames[m], r.wall_s, r.wall_s / never.wall_s, tok_s,
          static_cast<long long>(r.preemptions), static_cast<long long>(r.swaps_out),
          static_cast<long long>(r.swaps_in), static_cast<double>(r.swap_bytes) / (1 << 20),
          static_cast<long long>(r.recompute_choices), static_cast<long long>(r.fallbacks),
          kvsplit::bench::same_tokens(want, r.outputs));
      std::printf(
          "              goodput (TTFT <= %.0f ms, mean ITL <= %.0f ms): %d of %d requests, %.3f "
          "req/s, %.1f output tok/s; %s/never: throughput %.2fx, goodput %.2fx req/s, %.2fx "
          "tok/s\n",
          r.sla_ttft_ms, r.sla_itl_ms, r.good, o.swap_seqs, good_rps, good_tok_s, kNames[m],
          thr[m].back(), ratio(good_rps, never_good), good_tok[m].back());
    }
    for (size_t m = 0; m < kModes.size(); ++m)
      if (kvsplit::bench::check_same_tokens(
              "swap-compare", want, "round 1's swap never", res[m].outputs,
              "round " + std::to_string(round + 1) + "'s swap " + kNames[m]))
        return 1;
  }
  if (o.swap_reps > 1) {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const size_t n = v.size();
      return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    auto range = [](const std::vector<double>& v) {
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      return std::pair<double, double>{*lo, *hi};
    };
    const double never_median = median(walls[0]);
    for (size_t m = 1; m < kModes.size(); ++m) {
      const auto [t_lo, t_hi] = range(thr[m]);
      const auto [g_lo, g_hi] = range(good_tok[m]);
      std::printf(
          "  summary %-6s: throughput %.2fx never's (median of the rounds' ratios; rounds "
          "%.2f-%.2fx); goodput (tok/s) median %.2fx (rounds %.2f-%.2fx); median run %.2f s, "
          "never's %.2f s\n",
          kNames[m], median(thr[m]), t_lo, t_hi, median(good_tok[m]), g_lo, g_hi, median(walls[m]),
          never_median);
    }
  }
  return 0;
}

int run_capacity(const Options& o) {
  std::printf(
      "capacity: %s, KV budget %.1f MiB, sequences of %d + %d tokens submitted at once, 1 "
      "colocated worker; semantic: quant fraction %.2f, threshold %.2f, recent %d, score "
      "interval %d\n",
      o.model.c_str(), o.kv_capacity_mb, o.capacity_prompt, o.capacity_output, o.quant_fraction,
      o.semantic_threshold, o.recent_tokens, o.score_interval);
  int most_full = 0, most_semantic = 0;
  for (int seqs : o.capacity_seqs) {
    for (kvsplit::KvPolicy policy : {kvsplit::KvPolicy::kFull, kvsplit::KvPolicy::kSemantic}) {
      CapacityResult r;
      if (run_capacity_once(o, seqs, policy, &r) != 0 || r.errors > 0) return 1;
      const bool semantic = policy == kvsplit::KvPolicy::kSemantic;
      std::printf(
          "  %3d seqs, %-8s: preemptions %4lld, decoding at once %5.1f (mean until the first "
          "finish), %5.1f s, %5.0f output tok/s; demotions %lld, recalls %lld, refused %lld\n",
          seqs, semantic ? "semantic" : "full", static_cast<long long>(r.preemptions),
          r.mean_running, r.wall_s, r.tokens / r.wall_s, static_cast<long long>(r.demotions),
          static_cast<long long>(r.recalls), static_cast<long long>(r.refused));
      int& most = semantic ? most_semantic : most_full;
      if (r.preemptions == 0) most = std::max(most, seqs);
    }
  }
  std::printf("  most sequences run without a preemption: full %d, semantic %d (%.2fx)\n",
              most_full, most_semantic,
              static_cast<double>(most_semantic) / std::max(1, most_full));
  return 0;
}

}  // namespace kvsplit::bench_serving
