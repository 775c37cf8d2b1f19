// Log-probabilities of the raw model distribution (OpenAI `logprobs`): log-softmax of the logits
// before penalties and temperature.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kvsplit::sampling {

// logits [vocab] (vocab >= 1; callers pass a copy taken before Sampler::sample modifies them).
// token in [0, vocab): its log-probability goes to *token_logprob (may be null).
// top: when non-null, cleared and filled with the min(top_n, vocab) highest (id, logprob), in
// descending order, lower id first on ties; top_n >= 0.
// log p_i = l_i - (max + log(sum_j exp(l_j - max))), the sum and the log in double. The engine's
// token events take theirs from here. NaN logits are left out of max and sum (the sampler gives
// them probability 0); their own log-probability is NaN, and a row that is all NaN (or all -inf)
// gives NaN throughout (no crash).
void compute_logprobs(const float* logits, int vocab, int32_t token, int top_n,
                      float* token_logprob, std::vector<std::pair<int32_t, float>>* top);

}  // namespace kvsplit::sampling
