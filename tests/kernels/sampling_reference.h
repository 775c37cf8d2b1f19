// Host reference of the GPU sampler (kernels/sampling/sampling.h): the same steps written the
// obvious way — sort the candidates, cut top-k and top-p, walk the kept ids in order. Shares only
// the per-element math (sampling_math.h) and Philox with the kernel, not its selection logic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_math.h"

namespace kvsplit::testing {

struct ReferenceCandidate {
  uint64_t key;
  uint64_t mass;
  int32_t id;
};

// Argmax with the lowest id on exact ties; NaN never wins (all NaN: 0).
inline int32_t reference_argmax(const float* logits, int vocab) {
  int32_t best = -1;
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

// The kept tokens of one row (empty for greedy / degenerate rows), ascending id.
inline std::vector<ReferenceCandidate> reference_kept(const float* logits, int vocab,
                                                      const kernels::SampleRowParams& p) {
  if (!(p.temperature >= kernels::kSampleGreedyTemperature)) return {};
  float max_s = -INFINITY;
  for (int i = 0; i < vocab; ++i) max_s = std::fmax(max_s, logits[i] / p.temperature);
  if (!std::isfinite(max_s)) return {};
  const bool min_p_on = p.min_p > 0.f;
  const float min_p = std::min(p.min_p, 1.f);
  std::vector<ReferenceCandidate> c;
  for (int i = 0; i < vocab; ++i) {
    const float s = logits[i] / p.temperature;
    if (std::isnan(s)) continue;
    const float w = kernels::sample_weight(s, max_s);
    if (min_p_on && !(w >= min_p)) continue;
    c.push_back({kernels::sample_sort_key(s, i), kernels::sample_mass(w), i});
  }
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.key > b.key; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
  if (p.top_p < 1.f) {
    uint64_t total = 0;
    for (const auto& e : c) total += e.mass;
    const uint64_t limit = kernels::top_p_limit(p.top_p, total);
    uint64_t run = 0;
    for (size_t j = 0; j < c.size(); ++j) {
      run += c[j].mass;
      if (run > limit) {
        c.resize(j + 1);
        break;
      }
    }
  }
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return c;
}

// The token the GPU sampler must pick for this row.
inline int32_t reference_sample(const float* logits, int vocab, const kernels::SampleRowParams& p) {
  const std::vector<ReferenceCandidate> kept = reference_kept(logits, vocab, p);
  if (kept.empty()) {  // greedy or degenerate: the argmax, or -1 when it is not finite
    const int32_t best = reference_argmax(logits, vocab);
    return std::isfinite(logits[best]) ? best : -1;
  }
  uint64_t total = 0;
  for (const auto& e : kept) total += e.mass;
  const uint64_t pick = kernels::mul_hi_u64(kernels::sampling_random_bits(p.seed, p.step), total);
  uint64_t run = 0;
  for (const auto& e : kept) {
    run += e.mass;
    if (run > pick) return e.id;
  }
  return -1;  // unreachable: pick < total
}

}  // namespace kvsplit::testing
