// Stop conditions of one request: EOS ids, stop token ids, stop strings, max_tokens and the
// context length. Holds back text that might be the start of a stop string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/sampling_params.h"

namespace kvsplit::sampling {

class StopChecker {
 public:
  // eos_ids: the model's EOS ids (ignored with params.ignore_eos). max_new_tokens (>= 1): most
  // tokens to generate, min of max_generated_tokens(params) and what the context leaves.
  StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids, int max_new_tokens);

  struct Step {
    FinishReason reason = FinishReason::kNone;  // kStop or kLength when generation ends here
    std::string text;                           // text that may be emitted now
    // kStop on a stop string: nothing generated from it on is emitted, not even bytes a
    // detokenizer still holds (an incomplete UTF-8 character after the match).
    bool stop_string = false;
  };
  // Feeds one generated token (already appended to the output) and its decoded text delta.
  // - EOS (unless ignore_eos) or a stop_token_id: kStop; the token's own text is not emitted,
  //   held-back text is.
  // - a stop string found in held-back text + delta, ending in the delta, once min_tokens tokens
  //   are generated (this one included): kStop; text up to (excluding) the earliest match is
  //   emitted, nothing from the stop string on. Before that, stop strings are text.
  // - num_generated() reaching max_new_tokens: kLength; all held-back text is emitted.
  // Otherwise emits the text except its longest suffix that is a proper prefix of a stop string.
  // When a Step ends generation nothing stays held back. Must not be called after that.
  Step on_token(int32_t token, std::string_view text_delta);
  // Text still held back (for a caller that ends generation itself, e.g. on cancellation).
  std::string flush();
  int num_generated() const { return num_generated_; }
  int max_new_tokens() const { return max_new_tokens_; }
  bool finished() const { return finished_; }
  // EOS (unless ignore_eos) or a stop_token_id. Its text is not emitted, so a caller does not feed
  // it to the detokenizer either: a byte-fallback stop token would leave a stray byte there (a
  // U+FFFD at the end), or complete a character and take the earlier tokens' bytes with it.
  bool is_stop_token(int32_t token) const;

 private:
  size_t hold_back_length() const;  // bytes at the end of held_ that may start a stop string

  SamplingParams params_;
  std::vector<int32_t> eos_ids_;
  int max_new_tokens_;
  int num_generated_ = 0;
  bool finished_ = false;
  size_t max_stop_len_ = 0;
  std::string held_;  // text not yet emitted (may begin a stop string)
};

}  // namespace kvsplit::sampling
