// Token sampling for one request. Deterministic per seed: the same seed and the same logits give
// the same token whatever else is in the batch (each request owns its RNG stream).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvsplit/sampling_params.h"

namespace kvsplit::sampling {

class Sampler {
 public:
  // `params` must have passed validate(). `seed` is the request's RNG seed.
  Sampler(const SamplingParams& params, uint64_t seed);

  // Picks the next token from logits [vocab] (modified in place: penalties, temperature,
  // filters). `prompt` and `output` are the request's tokens so far (for penalties).
  // Greedy when temperature == 0 (argmax, lowest id on exact ties).
  int32_t sample(float* logits, int vocab, std::span<const int32_t> prompt,
                 std::span<const int32_t> output);

 private:
  float next_uniform();  // [0, 1)

  SamplingParams params_;
  uint64_t rng_state_;
  std::vector<float> probs_;      // scratch [vocab]
  std::vector<int32_t> indices_;  // scratch [vocab]
};

}  // namespace kvsplit::sampling
