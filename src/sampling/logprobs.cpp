// compute_logprobs: log-softmax in double, top-n by partial sort.
#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"

namespace kvsplit::sampling {

void compute_logprobs(const float* logits, int vocab, int32_t token, int top_n,
                      float* token_logprob, std::vector<std::pair<int32_t, float>>* top) {
  KVSPLIT_CHECK(logits != nullptr && vocab >= 1);
  KVSPLIT_CHECK(token >= 0 && token < vocab);
  KVSPLIT_CHECK(top_n >= 0);
  // NaN entries are left out of the normalizer, as the sampler gives them probability 0; a row
  // of NaN only has no distribution (NaN throughout).
  double max_val = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) max_val = std::max(max_val, static_cast<double>(logits[i]));
  }
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - max_val);
  }
  const double log_z = sum > 0 ? max_val + std::log(sum) : std::numeric_limits<double>::quiet_NaN();
  if (token_logprob != nullptr) {
    *token_logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);
  }
  if (top == nullptr) return;
  top->clear();
  const int n = std::min(top_n, vocab);
  if (n == 0) return;
  // Select the n largest logits (ties: lower id first); NaN sorts last so the order stays strict.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) ids[i] = i;
  auto before = [logits](int32_t a, int32_t b) {
    const float la = logits[a], lb = logits[b];
    const bool na = std::isnan(la), nb = std::isnan(lb);
    if (na != nb) return nb;  // non-NaN before NaN
    if (!na && la != lb) return la > lb;
    return a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), before);
  top->reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    top->emplace_back(ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - log_z));
  }
}

}  // namespace kvsplit::sampling
