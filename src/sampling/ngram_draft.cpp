#include "sampling/ngram_draft.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvsplit::sampling {

void propose_ngram_draft(std::span<const int32_t> tokens, const NgramDraftConfig& config,
                         std::vector<int32_t>* out) {
  out->clear();
  const ptrdiff_t len = static_cast<ptrdiff_t>(tokens.size());
  const ptrdiff_t max_n = std::min<ptrdiff_t>(config.max_n, len - 1);
  if (config.max_tokens <= 0 || config.min_n <= 0 || max_n < config.min_n) return;
  const int32_t* t = tokens.data();
  const int32_t last = t[len - 1];
  // One pass, latest first: each earlier occurrence of the last token (ending at e < len - 1, so
  // a token follows it) is extended backwards to its common suffix with the sequence, at most
  // max_n. The first of the longest wins: a strictly longer match replaces the best, an equal
  // one does not, and a match of max_n ends the scan (the latest of the longest).
  ptrdiff_t best_e = -1, best_n = 0;
  for (ptrdiff_t e = len - 2; e >= 0; --e) {
    if (t[e] != last) continue;
    ptrdiff_t n = 1;
    while (n < max_n && e - n >= 0 && t[e - n] == t[len - 1 - n]) ++n;
    if (n > best_n) {
      best_n = n;
      best_e = e;
      if (n == max_n) break;
    }
  }
  if (best_n < config.min_n) return;
  // The copy overlaps its own output where the occurrence is close (a loop of period
  // len - 1 - best_e): position len + i repeats position from + i, which the draft holds already
  // once from + i >= len (an LZ77-style overlapping copy).
  const ptrdiff_t from = best_e + 1;
  out->reserve(static_cast<size_t>(config.max_tokens));
  for (ptrdiff_t i = 0; i < config.max_tokens; ++i) {
    const ptrdiff_t src = from + i;
    out->push_back(src < len ? t[src] : (*out)[static_cast<size_t>(src - len)]);
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
