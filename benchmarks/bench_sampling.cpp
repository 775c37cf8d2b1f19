// bench_sampling: the cost of sampling penalties per generated token against the prompt length.
// One request's decode is replayed: a prompt of P random ids, then `--steps` tokens sampled one
// after another into the same token vector (as the engine does), greedy, so the time is the
// penalties' plus one argmax over the vocabulary. For each P it prints, per token:
//   - `off`: no penalty (the baseline: the argmax alone);
//   - `repetition`: repetition_penalty 1.1; `freq+presence`: 0.5 / 0.2 (over the output only);
//   - `rescan`: the repetition penalty recomputed from the whole prompt + output every token
//     (what the sampler did before it kept the history), written out here as the reference;
// and the ratios repetition / off and rescan / repetition. Thread CPU time, one thread.
//
//   build/benchmarks/bench_sampling [--vocab N] [--prompts 1024,8192,...] [--steps N]
//                                   [--distinct N] [--min-seconds S]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/cli_options.h"
#include "sampling/sampler.h"

namespace {

using kvsplit::SamplingParams;
using kvsplit::sampling::argmax_lowest;
using kvsplit::sampling::Sampler;

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Setup {
  int vocab = 32000;
  int steps = 256;
  int distinct = 0;  // ids the prompt draws from (0: the whole vocabulary)
  double min_seconds = 0.3;
};

// The repetition penalty as the sampler computed it before keeping its history: every call
// marks each distinct id of prompt + output, then clears the marks.
struct Rescan {
  float penalty;
  std::vector<uint8_t> seen;
  int32_t sample(float* logits, int vocab, std::span<const int32_t> prompt,
                 std::span<const int32_t> output) {
    if (seen.size() < static_cast<size_t>(vocab)) seen.assign(vocab, 0);
    auto mark = [&](std::span<const int32_t> ids) {
      for (int32_t t : ids) {
        if (!seen[t]) {
          seen[t] = 1;
          logits[t] = logits[t] > 0.0f ? logits[t] / penalty : logits[t] * penalty;
        }
      }
    };
    mark(prompt);
    mark(output);
    for (int32_t t : prompt) seen[t] = 0;
    for (int32_t t : output) seen[t] = 0;
    return argmax_lowest(logits, vocab);
  }
};

// Seconds per token of one replayed request (best of repeats until min_seconds).
template <typename MakeSampler>
double per_token(const Setup& s, int prompt_len, MakeSampler make) {
  std::mt19937 rng(static_cast<uint32_t>(prompt_len));
  const int range = s.distinct > 0 ? std::min(s.distinct, s.vocab) : s.vocab;
  std::vector<int32_t> prompt(prompt_len);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(range));
  std::vector<float> row(s.vocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : row) x = normal(rng);
  std::vector<float> logits(s.vocab);
  double best = 1e30, spent = 0;
  int repeats = 0;
  while (repeats < 2 || spent < s.min_seconds) {
    std::vector<int32_t> tokens = prompt;
    tokens.reserve(prompt.size() + s.steps);
    auto sampler = make();
    const double t0 = thread_seconds();
    for (int i = 0; i < s.steps; ++i) {
      std::copy(row.begin(), row.end(), logits.begin());
      // Vary the winner so the output holds many ids (the row alone would repeat one).
      logits[(i * 7919) % s.vocab] += 8.0f;
      const std::span<const int32_t> p(tokens.data(), prompt.size());
      const std::span<const int32_t> o(tokens.data() + prompt.size(),
                                       tokens.size() - prompt.size());
      tokens.push_back(sampler.sample(logits.data(), s.vocab, p, o));
    }
    const double t = thread_seconds() - t0;
    best = std::min(best, t / s.steps);
    spent += t;
    ++repeats;
  }
  return best;
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(std::stoi(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  std::string prompts = "1024,8192,32768,131072";
  CLI::App app{"bench_sampling: penalty cost per token against the prompt length"};
  app.add_option("--vocab", s.vocab, "vocabulary size")->check(CLI::Range(2, 1 << 20));
  app.add_option("--prompts", prompts, "comma-separated prompt lengths");
  app.add_option("--steps", s.steps, "tokens sampled per replay")->check(CLI::Range(1, 1 << 20));
  app.add_option("--distinct", s.distinct, "ids the prompt draws from (0: the vocabulary)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--min-seconds", s.min_seconds, "least time per measurement")
      ->check(kvsplit::kPositive);
  kvsplit::strict_options(app);
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  std::vector<int> lengths;
  try {
    lengths = parse_list(prompts);
  } catch (const std::exception&) {
    std::fprintf(stderr, "bench_sampling: --prompts: comma-separated integers, got '%s'\n",
                 prompts.c_str());
    return 2;
  }
  for (int p : lengths) {
    if (p < 1 || p > (1 << 24)) {
      std::fprintf(stderr, "bench_sampling: --prompts: each in [1, 16777216], got %d\n", p);
      return 2;
    }
  }

  SamplingParams off;
  off.temperature = 0.0f;
  SamplingParams rep = off;
  rep.repetition_penalty = 1.1f;
  SamplingParams freq = off;
  freq.frequency_penalty = 0.5f;
  freq.presence_penalty = 0.2f;
  std::printf("vocab %d, %d tokens per replay, greedy; microseconds per token (thread CPU)\n",
              s.vocab, s.steps);
  std::printf("%9s | %8s %11s %14s %9s | %15s %17s\n", "prompt", "off", "repetition",
              "freq+presence", "rescan", "repetition/off", "rescan/repetition");
  for (int p : lengths) {
    const double t_off = per_token(s, p, [&] { return Sampler(off, 1); });
    const double t_rep = per_token(s, p, [&] { return Sampler(rep, 1); });
    const double t_freq = per_token(s, p, [&] { return Sampler(freq, 1); });
    const double t_rescan = per_token(s, p, [&] { return Rescan{1.1f, {}}; });
    std::printf("%9d | %8.1f %11.1f %14.1f %9.1f | %14.2fx %16.2fx\n", p, t_off * 1e6, t_rep * 1e6,
                t_freq * 1e6, t_rescan * 1e6, t_rep / t_off, t_rescan / t_rep);
  }
  return 0;
}
