// Token sampling for one request. Deterministic per seed: the same seed and the same logits give
// the same token whatever else is in the batch (each request owns its RNG stream).
//
// Semantics (docs/sampling.md has the full statement):
//   0. logit_bias added; while fewer than min_tokens tokens are generated, the stop ids (EOS
//      unless ignore_eos, stop_token_ids) are masked to -inf;
//   1. repetition penalty (HF: l > 0 ? l / p : l * p, once per distinct token of prompt + output);
//   2. frequency / presence penalties (OpenAI: l -= count * freq + (count > 0) * presence, over
//      the output tokens);
//   3. temperature < kGreedyTemperature (1e-5): argmax, lowest id on exact ties, no RNG draw;
//   4. otherwise l /= temperature, float softmax as llama2.c run.c, one uniform draw, then
//      top-k, min-p and top-p restrict the candidates and the draw picks one of them.
// With only temperature / top_p / seed set this is bit-exact llama2.c run.c `sample()`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvsplit/sampling_params.h"
#include "sampling/guide.h"

namespace kvsplit::sampling {

// Temperatures below this are treated as greedy (as vLLM does): dividing by them would overflow.
inline constexpr float kGreedyTemperature = 1e-5f;
// xorshift64* has the fixed point 0; seed 0 starts from this state instead.
inline constexpr uint64_t kZeroSeedState = 0x9E3779B97F4A7C15ull;

// Greedy pick: the index of the largest value, the lowest on exact ties; NaN never wins (all NaN:
// 0). The same rule as the CUDA argmax / greedy sampling kernels.
int32_t argmax_lowest(const float* x, int n);

// True when the largest non-NaN value of x[0, n) exists and is finite: logits a token can be
// picked from. A model whose activations overflow gives rows of NaN or infinities; every picker
// would return some id anyway (argmax_lowest: 0), a silent wrong answer, so the engine fails the
// sequence instead. The same rule as the CUDA greedy sampling kernel's id -1.
bool logits_usable(const float* x, int n);

// True when Sampler::sample is exactly argmax_lowest of the raw logits for these parameters
// (greedy, no penalties, no logit bias, no min_tokens mask): a model may then return the argmax
// instead of the logits.
inline bool is_plain_greedy(const SamplingParams& p) {
  return p.temperature < kGreedyTemperature && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && p.logit_bias.empty() &&
         p.min_tokens == 0 && !p.guided.on();
}

// The seed of stream `index` of a run seeded `base` (the CLI's prompt `index`). Stream 0 takes
// `base` itself, so one stream matches run.c's `-s base`; the others take splitmix64-derived
// seeds. The state is the seed, and xorshift's first draws from nearby states are close (seeds
// 1, 2, 3 draw 0.28, 0.56, 0.84 first), so consecutive seeds would give correlated first tokens.
uint64_t stream_seed(uint64_t base, uint64_t index);

class Sampler {
 public:
  // `params` must have passed validate(). `seed` is the request's RNG seed (the initial xorshift
  // state, as run.c's `-s`; 0 is replaced by kZeroSeedState). `eos_ids`: the model's EOS ids,
  // masked with the stop_token_ids while fewer than params.min_tokens tokens are generated
  // (unless params.ignore_eos).
  Sampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> eos_ids = {});

  // Sizes the scratch buffers for `vocab` so that sample() never allocates afterwards. Optional:
  // sample() grows them on first use.
  void reserve(int vocab);

  // Picks the next token from logits [vocab] (modified in place: penalties, temperature, then
  // probabilities). `prompt` and `output` are the request's tokens so far (for penalties); every
  // id must be in [0, vocab) (the engine validates prompt ids on admission). vocab >= 1.
  // Greedy when temperature < kGreedyTemperature (argmax, lowest id on exact ties). If the
  // softmax degenerates (NaN or +inf logits), returns the argmax of the scaled logits.
  // With a guide (set_guide), only the tokens the constraint allows are candidates, the chosen
  // one advances the guide, and kNoAllowedToken comes back when nothing may be sampled:
  // guide_status() is then OK when the text is complete (the sequence stops) or says why not.
  int32_t sample(float* logits, int vocab, std::span<const int32_t> prompt,
                 std::span<const int32_t> output);

  static constexpr int32_t kNoAllowedToken = -1;
  // Guided decoding (params.guided on): the sequence's position in its grammar, before its first
  // sample.
  void set_guide(std::unique_ptr<GuideState> guide);
  bool guided() const { return guide_ != nullptr; }
  const Status& guide_status() const { return guide_status_; }

  // The RNG: xorshift64* as run.c's random_f32, 24-bit uniform in [0, 1).
  static float uniform_from_state(uint64_t* state);

  struct Candidate {  // scratch entry: a probability and its token id
    float prob;
    int32_t index;
  };

 private:
  float next_uniform() { return uniform_from_state(&rng_state_); }
  // logit_bias (unless !bias), then the min_tokens mask (while output is shorter than min_tokens).
  void apply_bias_and_mask(float* logits, int vocab, size_t num_output, bool bias = true) const;
  // Greedy or the draw over logits already biased, masked and penalized.
  int32_t pick(float* logits, int vocab);
  int32_t sample_guided(float* logits, int vocab, std::span<const int32_t> prompt,
                        std::span<const int32_t> output);
  bool guide_allows(int32_t id, bool end_ok) const;
  bool is_end_id(int32_t id) const;
  bool penalties_on() const;
  // Penalties: logits of the distinct ids of prompt + output (repetition) and of the output with
  // their counts (frequency / presence), from the history kept since the last call.
  void apply_penalties(float* logits, int vocab, std::span<const int32_t> prompt,
                       std::span<const int32_t> output);
  // Brings the history up to `prompt` and `output`: only the output tokens appended since the
  // last call are read when the spans continue the last call's (the same prompt in place, the
  // output grown by appending, as the engine's one token vector per request gives); anything
  // else rebuilds it from the spans.
  void sync_history(int vocab, std::span<const int32_t> prompt, std::span<const int32_t> output);
  void reset_history();
  // run.c's sample_topp on the full distribution (top_k and min_p off).
  int32_t sample_top_p_runc(const float* probs, int vocab, float coin);
  // top-k / min-p candidate set, then the same top-p / multinomial step over it.
  int32_t sample_filtered(const float* probs, int vocab, int32_t max_index, float coin);
  // Walks candidates_[0, n) in descending (prob, then ascending id) order, sorting lazily chunk
  // by chunk, accumulating in float until the running sum exceeds `limit`. Returns the last index
  // visited (n - 1 when never exceeded) and the running sum at that point.
  int scan_sorted_until(int n, float limit, bool already_sorted, float* cumulative);
  // For large candidate sets: one histogram pass over the float bit patterns finds a bucket
  // boundary whose prefix mass passes `limit`; moves that prefix to the front and sorts it.
  // Returns its length (0 when it would be nearly everything). Only affects speed.
  int presort_prefix(int n, float limit);

  static constexpr uint32_t kNumBuckets = 1024;  // covers bit patterns of [0, 1]
  static constexpr int kPresortMinCandidates = 4096;
  // The repetition penalty walks the whole row (vectorized, under the seen_ mask) instead of the
  // seen ids once more than vocab / this many ids are seen.
  static constexpr size_t kDenseHistoryFraction = 8;

  SamplingParams params_;
  uint64_t rng_state_;
  std::vector<int32_t> min_tokens_mask_;  // ids masked before min_tokens (empty: min_tokens 0)
  std::unique_ptr<GuideState> guide_;
  std::shared_ptr<const TokenMask> guide_mask_;  // the mask of the current step
  std::vector<int32_t> end_ids_;                 // EOS and stop_token_ids (guided only)
  std::vector<float> end_logits_;                // scratch: their logits before the mask
  Status guide_status_;
  std::vector<Candidate> candidates_;  // scratch [vocab]
  // Penalty history (sync_history): seen_[t] marks an id of prompt + output (listed once in
  // seen_ids_), counts_[t] its count in the output (ids listed once in output_ids_); sized
  // [vocab] only with penalties on.
  struct History {
    const int32_t* prompt = nullptr;
    size_t prompt_size = 0;
    const int32_t* output = nullptr;
    int vocab = 0;
  };
  History history_;
  size_t output_done_ = 0;  // output tokens in the history
  std::vector<uint8_t> seen_;
  std::vector<int32_t> seen_ids_;
  std::vector<int32_t> counts_;
  std::vector<int32_t> output_ids_;
  std::vector<double> bucket_mass_;  // scratch [kNumBuckets]
};

}  // namespace kvsplit::sampling
