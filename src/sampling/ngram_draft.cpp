#include "sampling/ngram_draft.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvsplit::sampling {

void propose_ngram_draft(std::span<const int32_t> tokens, const NgramDraftConfig& config,
                         std::vector<int32_t>* out) {
  out->clear();
  const ptrdiff_t len = static_cast<ptrdiff_t>(tokens.size());
  if (config.max_tokens <= 0 || config.min_n <= 0) return;
  for (ptrdiff_t n = std::min<ptrdiff_t>(config.max_n, len - 1); n >= config.min_n; --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    const int32_t last = suffix[n - 1];
    // Occurrences ending at e (the match is tokens[e - n + 1, e]), latest first; e < len - 1
    // leaves at least one token after it to propose.
    for (ptrdiff_t e = len - 2; e >= n - 1; --e) {
      if (tokens[static_cast<size_t>(e)] != last) continue;
      if (!std::equal(suffix, suffix + n - 1, tokens.data() + (e - n + 1))) continue;
      // The copy overlaps its own output where the occurrence is close (a loop of period
      // len - 1 - e): position len + i repeats position from + i, which the draft holds already
      // once from + i >= len (an LZ77-style overlapping copy).
      const ptrdiff_t from = e + 1;
      out->reserve(static_cast<size_t>(config.max_tokens));
      for (ptrdiff_t i = 0; i < config.max_tokens; ++i) {
        const ptrdiff_t src = from + i;
        out->push_back(src < len ? tokens[static_cast<size_t>(src)]
                                 : (*out)[static_cast<size_t>(src - len)]);
      }
      return;
    }
  }
}

int DraftAcceptance::length(int max_tokens) const {
  const double a = rate();
  const double run = a / (1 - a);  // a < 1: the prior keeps it so
  return static_cast<int>(
      std::clamp(1 + std::floor(run + 1e-9), 1.0, static_cast<double>(max_tokens)));
}

void DraftAcceptance::observe(int drafted, int accepted, bool rejected) {
  if (drafted <= 0) return;
  accepted_ = kDecay * accepted_ + accepted;
  tries_ = kDecay * tries_ + accepted + (rejected ? 1 : 0);
}

}  // namespace kvsplit::sampling
