// Sampler: penalties, greedy, temperature + run.c-exact softmax, top-k / min-p / top-p.
#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/splitmix.h"

namespace kvsplit::sampling {
namespace {

// Float softmax exactly as llama2.c run.c (max, expf(x - max), sequential float sum, divide), in
// place. Also returns the lowest index of the maximum and the sum (for degenerate-input checks).
// A NaN entry is no number: it is not the maximum (argmax_lowest, wherever it is; from x[0]
// run.c's scan kept a leading NaN as the maximum) and gets probability 0.
float softmax_runc(float* x, int n, int32_t* max_index) {
  const int32_t max_i = argmax_lowest(x, n);
  const float max_val = x[max_i];
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::isnan(x[i]) ? 0.0f : std::exp(x[i] - max_val);  // float overload: expf, as run.c
    sum += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] /= sum;
  *max_index = max_i;
  return sum;
}

// Strict total order on candidates: descending probability, ascending id on ties. Candidates are
// gathered in id order, so this is the order a stable descending sort (glibc's mergesort qsort in
// run.c) gives, and partial selections (nth_element, heaps) agree exactly with a full sort.
bool candidate_before(const Sampler::Candidate& a, const Sampler::Candidate& b) {
  return a.prob > b.prob || (a.prob == b.prob && a.index < b.index);
}

}  // namespace

bool logits_usable(const float* x, int n) {
  const int32_t best = argmax_lowest(x, n);
  return n > 0 && std::isfinite(x[best]);
}

int32_t argmax_lowest(const float* x, int n) {
  int32_t best = -1;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

uint64_t stream_seed(uint64_t base, uint64_t index) {
  return index == 0 ? base : splitmix64(base ^ splitmix64(index));
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> eos_ids)
    : params_(params), rng_state_(seed == 0 ? kZeroSeedState : seed) {
  if (params_.min_tokens > 0) {
    if (!params_.ignore_eos) min_tokens_mask_.assign(eos_ids.begin(), eos_ids.end());
    min_tokens_mask_.insert(min_tokens_mask_.end(), params_.stop_token_ids.begin(),
                            params_.stop_token_ids.end());
  }
  if (params_.guided.on()) {  // validate() refuses ignore_eos with a constraint
    end_ids_.assign(eos_ids.begin(), eos_ids.end());
    end_ids_.insert(end_ids_.end(), params_.stop_token_ids.begin(), params_.stop_token_ids.end());
  }
}

void Sampler::reserve(int vocab) {
  KVSPLIT_CHECK(vocab >= 1);
  const size_t n = static_cast<size_t>(vocab);
  if (candidates_.size() < n) candidates_.resize(n);
  if (bucket_mass_.empty()) bucket_mass_.resize(kNumBuckets);
  if (penalties_on() && counts_.size() < n) {
    // Grown only between requests' histories: reset_history left every entry zero.
    counts_.resize(n, 0);
    seen_.resize(n, 0);
  }
}

float Sampler::uniform_from_state(uint64_t* state) {
  uint64_t s = *state;
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  *state = s;
  const uint32_t u32 = static_cast<uint32_t>((s * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(u32 >> 8) / 16777216.0f;
}

void Sampler::apply_bias_and_mask(float* logits, int vocab, size_t num_output, bool bias) const {
  for (const auto& [id, b] : params_.logit_bias) {
    KVSPLIT_CHECK_MSG(id >= 0 && id < vocab, "logit_bias id out of vocab range");
    if (bias) logits[id] += b;
  }
  if (num_output >= static_cast<size_t>(params_.min_tokens)) return;
  for (int32_t id : min_tokens_mask_) {
    // An EOS id past a model's logits (a config naming more ids than the vocab) masks nothing.
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
  }
}

bool Sampler::penalties_on() const {
  return params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
         params_.presence_penalty != 0.0f;
}

void Sampler::reset_history() {
  for (int32_t t : seen_ids_) seen_[t] = 0;
  for (int32_t t : output_ids_) counts_[t] = 0;
  seen_ids_.clear();
  output_ids_.clear();
  history_ = {};
}

void Sampler::sync_history(int vocab, std::span<const int32_t> prompt,
                           std::span<const int32_t> output) {
  const History now{prompt.data(), prompt.size(), output.data(), vocab};
  // The same request as the last call: its prompt in place, its output grown by appending.
  const bool continues = history_.prompt == now.prompt && history_.prompt_size == now.prompt_size &&
                         history_.vocab == vocab && output.size() >= output_done_ &&
                         (output_done_ == 0 || history_.output == now.output);
  // Only the repetition penalty reads the prompt and marks seen ids.
  const bool repetition = params_.repetition_penalty != 1.0f;
  if (!continues) {
    reset_history();
    output_done_ = 0;
    history_ = now;
    for (int32_t t : repetition ? prompt : std::span<const int32_t>()) {
      KVSPLIT_CHECK_MSG(t >= 0 && t < vocab, "token id out of vocab range");
      if (!seen_[t]) {
        seen_[t] = 1;
        seen_ids_.push_back(t);
      }
    }
    // In id order, the per-token walk over the logits is sequential (a long prompt's distinct
    // ids in prompt order are scattered over the vocabulary).
    std::sort(seen_ids_.begin(), seen_ids_.end());
  }
  history_.output = now.output;
  for (size_t i = output_done_; i < output.size(); ++i) {
    const int32_t t = output[i];
    KVSPLIT_CHECK_MSG(t >= 0 && t < vocab, "token id out of vocab range");
    if (repetition && !seen_[t]) {
      seen_[t] = 1;
      seen_ids_.push_back(t);
    }
    if (counts_[t]++ == 0) output_ids_.push_back(t);
  }
  output_done_ = output.size();
}

void Sampler::apply_penalties(float* logits, int vocab, std::span<const int32_t> prompt,
                              std::span<const int32_t> output) {
  if (!penalties_on()) return;
  sync_history(vocab, prompt, output);
  // Each distinct token once, whatever its count: the work per token is the number of distinct
  // ids seen, not the prompt's and output's length.
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    // HF's rule, l > 0 ? l / rep : l * rep, on each id seen. Written with both results computed
    // and one kept (no branch on the sign, which would be mispredicted half the time). When many
    // ids are seen (a long prompt), one pass over the whole row under the seen_ mask vectorizes
    // and beats the scattered walk; the values are the same either way.
    auto penalised = [rep](float l) {
      const float divided = l / rep;
      const float multiplied = l * rep;
      return l > 0.0f ? divided : multiplied;
    };
    if (seen_ids_.size() * kDenseHistoryFraction > static_cast<size_t>(vocab)) {
      const uint8_t* seen = seen_.data();
      for (int i = 0; i < vocab; ++i) logits[i] = seen[i] ? penalised(logits[i]) : logits[i];
    } else {
      for (int32_t t : seen_ids_) logits[t] = penalised(logits[t]);
    }
  }
  const float freq = params_.frequency_penalty;
  const float presence = params_.presence_penalty;
  if (freq != 0.0f || presence != 0.0f) {
    for (int32_t t : output_ids_) logits[t] -= static_cast<float>(counts_[t]) * freq + presence;
  }
}

int32_t Sampler::sample(float* logits, int vocab, std::span<const int32_t> prompt,
                        std::span<const int32_t> output) {
  KVSPLIT_CHECK(logits != nullptr && vocab >= 1);
  reserve(vocab);
  if (guide_ != nullptr) return sample_guided(logits, vocab, prompt, output);
  apply_bias_and_mask(logits, vocab, output.size());
  apply_penalties(logits, vocab, prompt, output);
  return pick(logits, vocab);
}

void Sampler::set_guide(std::unique_ptr<GuideState> guide) {
  guide_ = std::move(guide);
  guide_status_ = ok_status();
}

bool Sampler::is_end_id(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

// An end id is an end id only, whatever bytes it decodes to: allowed exactly when the text is
// complete (as text, a stop token id would end the request with its bytes left out).
bool Sampler::guide_allows(int32_t id, bool end_ok) const {
  return is_end_id(id) ? end_ok : guide_mask_->test(id);
}

// Bias, then the grammar's mask (every token not allowed to -inf), then the min_tokens mask unless
// it would leave nothing (the grammar allows only an end id: the text is complete), penalties,
// and the usual pick. The pick is checked against the mask (all-NaN allowed logits would let
// the degenerate fallback pick a masked id).
int32_t Sampler::sample_guided(float* logits, int vocab, std::span<const int32_t> prompt,
                               std::span<const int32_t> output) {
  for (const auto& [id, bias] : params_.logit_bias) logits[id] += bias;
  StatusOr<std::shared_ptr<const TokenMask>> mask = guide_->mask();
  if (!mask.ok()) {
    guide_status_ = mask.status();
    return kNoAllowedToken;
  }
  guide_mask_ = std::move(*mask);
  KVSPLIT_CHECK(static_cast<int>(guide_mask_->bits.size()) * 64 >= vocab);
  const bool end_ok = guide_->accepting();
  end_logits_.clear();  // the end ids' logits before the text mask
  for (const int32_t id : end_ids_)
    end_logits_.push_back(id >= 0 && id < vocab ? logits[id] : 0.0f);
  // Word by word: a full word keeps its 64 logits, others are blended (vectorizable).
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const uint64_t* bits = guide_mask_->bits.data();
  for (int base = 0; base < vocab; base += 64) {
    const uint64_t keep = bits[base >> 6];
    const int n = std::min(64, vocab - base);
    if (keep == ~uint64_t{0} && n == 64) continue;
    float* l = logits + base;
    for (int j = 0; j < n; ++j) l[j] = (keep >> j) & 1u ? l[j] : kMasked;
  }
  // Then the end ids, by their own rule (see guide_allows); `allowed` counts distinct ids.
  int32_t allowed = guide_mask_->count;
  int32_t first = -1;
  for (size_t k = 0; k < end_ids_.size(); ++k) {
    const int32_t id = end_ids_[k];
    if (id < 0 || id >= vocab) continue;
    const bool repeated =
        std::find(end_ids_.begin(), end_ids_.begin() + k, id) != end_ids_.begin() + k;
    if (!repeated && guide_mask_->test(id)) --allowed;  // counted as text above
    logits[id] = end_ok ? end_logits_[k] : kMasked;
    if (!end_ok) continue;
    if (!repeated) ++allowed;
    if (first < 0 || id < first) first = id;
  }
  for (size_t w = 0; w < guide_mask_->bits.size() && (first < 0 || first > int32_t(w * 64)); ++w) {
    for (uint64_t word = guide_mask_->bits[w]; word != 0; word &= word - 1) {
      const auto id = static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(word)));
      if (is_end_id(id)) continue;
      if (first < 0 || id < first) first = id;
      break;
    }
  }
  int32_t allowed_stop = 0;  // allowed ids the min_tokens mask would take
  for (auto it = min_tokens_mask_.begin(); it != min_tokens_mask_.end(); ++it) {
    const bool repeated = std::find(min_tokens_mask_.begin(), it, *it) != it;
    if (!repeated && *it >= 0 && *it < vocab && guide_allows(*it, end_ok)) ++allowed_stop;
  }
  if (allowed == 0) {
    guide_status_ = end_ok ? ok_status()
                           : invalid_argument(
                                 "guided decoding: no token of the vocabulary continues the text "
                                 "within the constraint");
    return kNoAllowedToken;
  }
  if (allowed > allowed_stop) apply_bias_and_mask(logits, vocab, output.size(), /*bias=*/false);
  apply_penalties(logits, vocab, prompt, output);
  int32_t token = pick(logits, vocab);
  if (!guide_allows(token, end_ok)) token = first;
  if (is_end_id(token)) return token;  // the text ends here
  if (Status st = guide_->advance(token); !st.ok()) {
    guide_status_ = std::move(st);
    return kNoAllowedToken;
  }
  return token;
}

int32_t Sampler::pick(float* logits, int vocab) {
  if (vocab == 1) {
    if (params_.temperature >= kGreedyTemperature) next_uniform();  // keep one draw per token
    return 0;
  }

  if (params_.temperature < kGreedyTemperature) return argmax_lowest(logits, vocab);

  const float temperature = params_.temperature;
  for (int i = 0; i < vocab; ++i) logits[i] /= temperature;  // divide, as run.c
  int32_t max_index = 0;
  const float sum = softmax_runc(logits, vocab, &max_index);
  const float coin = next_uniform();                           // exactly one draw per sampled token
  if (!(sum > 0.0f) || !std::isfinite(sum)) return max_index;  // NaN / +inf logits

  const bool filtered = (params_.top_k > 0 && params_.top_k < vocab) || params_.min_p > 0.0f;
  if (filtered) return sample_filtered(logits, vocab, max_index, coin);
  if (params_.top_p > 0.0f && params_.top_p < 1.0f) {
    return sample_top_p_runc(logits, vocab, coin);
  }
  // run.c sample_mult: multinomial over the cumulative distribution in id order. Rounding can
  // leave the float sum short of the coin; run.c then returns vocab - 1 whatever its probability,
  // this returns the last id that has any (the same token unless run.c's has probability 0).
  float cdf = 0.0f;
  int32_t last = max_index;
  for (int i = 0; i < vocab; ++i) {
    cdf += logits[i];
    if (coin < cdf) return i;
    if (logits[i] > 0.0f) last = i;
  }
  return last;
}

int Sampler::presort_prefix(int n, float limit) {
  Candidate* c = candidates_.data();
  // Bucket = the float's bit pattern >> 20 (exponent + 3 mantissa bits): monotone in p for
  // p in [0, 1], so every candidate of a higher bucket comes before every one of a lower bucket.
  auto bucket = [](float p) {
    return std::min<uint32_t>(std::bit_cast<uint32_t>(p) >> 20, kNumBuckets - 1);
  };
  std::fill(bucket_mass_.begin(), bucket_mass_.end(), 0.0);
  for (int i = 0; i < n; ++i) bucket_mass_[bucket(c[i].prob)] += c[i].prob;
  // Smallest set of top buckets whose mass passes the limit, with a margin for the float sum.
  const double target = static_cast<double>(limit) * (1.0 + 1e-3) + 1e-6;
  double acc = 0.0;
  int b = static_cast<int>(kNumBuckets) - 1;
  for (; b > 0; --b) {
    acc += bucket_mass_[b];
    if (acc > target) break;
  }
  if (b == 0) return 0;  // the prefix is (nearly) everything: plain chunked scan
  Candidate* mid = std::partition(
      c, c + n, [&](const Candidate& x) { return bucket(x.prob) >= static_cast<uint32_t>(b); });
  std::sort(c, mid, candidate_before);
  return static_cast<int>(mid - c);
}

int Sampler::scan_sorted_until(int n, float limit, bool already_sorted, float* cumulative) {
  Candidate* c = candidates_.data();
  float sum = 0.0f;
  int sorted_end = already_sorted ? n : (n > kPresortMinCandidates ? presort_prefix(n, limit) : 0);
  int chunk = 64;
  for (int i = 0; i < n; ++i) {
    if (i == sorted_end) {
      const int end = std::min(n, sorted_end + chunk);
      if (end - sorted_end <= 1024) {
        // Heap selection: one comparison for each candidate that does not make the chunk.
        std::partial_sort(c + sorted_end, c + end, c + n, candidate_before);
      } else {
        if (end < n) std::nth_element(c + sorted_end, c + end, c + n, candidate_before);
        std::sort(c + sorted_end, c + end, candidate_before);
      }
      sorted_end = end;
      chunk *= 4;
    }
    sum += c[i].prob;
    if (sum > limit) {
      *cumulative = sum;
      return i;
    }
  }
  *cumulative = sum;
  return n - 1;
}

int32_t Sampler::sample_top_p_runc(const float* probs, int vocab, float coin) {
  const float topp = params_.top_p;
  // run.c: drop probabilities below (1 - topp) / (n - 1); they cannot be in the nucleus.
  const float cutoff = (1.0f - topp) / static_cast<float>(vocab - 1);
  int n0 = 0;
  for (int i = 0; i < vocab; ++i) {
    if (probs[i] >= cutoff) candidates_[n0++] = {probs[i], i};
  }
  if (n0 == 0) return argmax_lowest(probs, vocab);  // unreachable for a finite softmax
  float cumulative = 0.0f;
  const int last = scan_sorted_until(n0, topp, /*already_sorted=*/false, &cumulative);
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int i = 0; i <= last; ++i) {
    cdf += candidates_[i].prob;
    if (r < cdf) return candidates_[i].index;
  }
  return candidates_[last].index;
}

int32_t Sampler::sample_filtered(const float* probs, int vocab, int32_t max_index, float coin) {
  // min-p: keep p >= min_p * p_max (p_max = probs[max_index]). `>=` also drops NaN.
  const float threshold = params_.min_p > 0.0f ? params_.min_p * probs[max_index] : 0.0f;
  Candidate* c = candidates_.data();
  int m = 0;
  bool sorted = false;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    // top-k: the k most probable (ties: lower id first) among those passing min-p, selected with
    // a bounded heap whose front is the worst kept candidate (one compare per rejected id).
    const int k = params_.top_k;
    for (int i = 0; i < vocab; ++i) {
      if (!(probs[i] >= threshold)) continue;
      const Candidate cand{probs[i], i};
      if (m < k) {
        c[m++] = cand;
        if (m == k) std::make_heap(c, c + k, candidate_before);
      } else if (candidate_before(cand, c[0])) {
        std::pop_heap(c, c + k, candidate_before);
        c[k - 1] = cand;
        std::push_heap(c, c + k, candidate_before);
      }
    }
    if (m == k) {
      std::sort_heap(c, c + k, candidate_before);
    } else {
      std::sort(c, c + m, candidate_before);
    }
    sorted = true;
  } else {
    for (int i = 0; i < vocab; ++i) {
      if (probs[i] >= threshold) c[m++] = {probs[i], i};
    }
  }
  if (m == 0) return max_index;
  // Mass of the candidate set, so top_p is relative to the renormalised distribution.
  float mass = 0.0f;
  for (int i = 0; i < m; ++i) mass += candidates_[i].prob;

  int last = m - 1;
  float cumulative = mass;
  if (params_.top_p < 1.0f) {
    last = scan_sorted_until(m, params_.top_p * mass, sorted, &cumulative);
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int i = 0; i <= last; ++i) {
    cdf += candidates_[i].prob;
    if (r < cdf) return candidates_[i].index;
  }
  return candidates_[last].index;
}

}  // namespace kvsplit::sampling
