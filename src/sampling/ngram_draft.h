// Speculative decoding's draft: n-gram prompt lookup (vLLM's "ngram" method, "prompt lookup
// decoding"). The last n tokens of a sequence are looked up earlier in it; the tokens that followed
// the latest earlier occurrence are proposed as the next ones. No draft model: it pays off where
// the output repeats its context (summaries, code edits, retrieval, extraction, loops).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvsplit::sampling {

struct NgramDraftConfig {
  int max_tokens = 4;  // tokens proposed at most (num_speculative_tokens), >= 1
  int min_n = 1;       // shortest suffix looked up (prompt_lookup_min), >= 1
  int max_n = 4;       // longest suffix looked up first (prompt_lookup_max), >= min_n
};

// Proposes into *out (cleared first) the continuation of `tokens` (prompt followed by the output,
// its last token the one just sampled): for n from max_n down to min_n, the suffix of n tokens is
// searched for at its latest earlier start; at the first n that occurs, the max_tokens tokens
// after that occurrence are proposed, the copy running on into the draft itself where it reaches
// the end of `tokens` (a loop repeats: "a b a b" proposes "a b a b ..."). The longest
// suffix wins because a longer match predicts better; the latest occurrence because recent text
// is the likeliest to repeat. Empty when no suffix of min_n tokens occurs earlier. One backward
// pass over `tokens` that stops at the latest match of max_n tokens: O(len) comparisons of the
// last token, each occurrence extended by at most max_n - 1 more.
void propose_ngram_draft(std::span<const int32_t> tokens, const NgramDraftConfig& config,
                         std::vector<int32_t>* out);

// How far one sequence's drafts tend to be accepted, so that its draft length follows: a draft
// token at position j is accepted only if every one before it was, with probability about a^j
// for a per-token acceptance rate a. The rate is estimated from the sequence's recent rows (decayed
// counts of draft tokens accepted, and of rejections, over a weak prior of rate 2/3 worth under
// one row),
// and a row drafts 1 + the run of accepted tokens it expects, a / (1 - a), up to the cap: text
// that keeps matching drafts far ahead, text that does not a single token (each a draft token fed
// and verified for nothing when rejected).
class DraftAcceptance {
 public:
  static constexpr double kDecay = 0.9;  // weight of older rows per row observed
  // The draft length for the next row, in [1, max_tokens] (max_tokens >= 1).
  int length(int max_tokens) const;
  // A row fed `drafted` draft tokens; `accepted` of them were, and `rejected`: the token after
  // them was not the draft's (false when generation ended there, or every draft was accepted).
  void observe(int drafted, int accepted, bool rejected);
  double rate() const { return (accepted_ + 0.6) / (tries_ + 0.9); }

 private:
  double accepted_ = 0, tries_ = 0;
};

}  // namespace kvsplit::sampling
