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
  // eos_ids: the model's EOS ids (ignored with params.ignore_eos). max_new_tokens: min of
  // params.max_tokens and what the context leaves after the prompt.
  StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids, int max_new_tokens);

  struct Step {
    FinishReason reason = FinishReason::kNone;  // kStop or kLength when generation ends here
    std::string text;                           // text that may be emitted now
  };
  // Feeds one generated token (already appended to the output) and its decoded text delta.
  Step on_token(int32_t token, std::string_view text_delta);
  // Text still held back (call once when generation ends without a stop string).
  std::string flush();
  int num_generated() const { return num_generated_; }

 private:
  SamplingParams params_;
  std::vector<int32_t> eos_ids_;
  int max_new_tokens_;
  int num_generated_ = 0;
  std::string held_;  // text not yet emitted (may begin a stop string)
};

}  // namespace kvsplit::sampling
