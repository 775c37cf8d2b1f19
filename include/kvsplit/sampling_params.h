// Per-request sampling and stopping parameters (public API).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit {

struct SamplingParams {
  float temperature = 1.0f;         // [0, 100]; 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;               // (0, 1]; 1 = off
  int32_t top_k = 0;                // [-1, vocab]; 0 or -1 (vLLM's "off") = off
  float min_p = 0.0f;               // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;  // (0, 10]; 1 = off (HF/vLLM semantics, over prompt + output)
  float presence_penalty = 0.0f;    // [-2, 2] (OpenAI semantics, over output tokens)
  float frequency_penalty = 0.0f;   // [-2, 2]
  std::optional<uint64_t> seed;     // unset: drawn per request from the engine's seed
  // Tokens to generate, as in the OpenAI and vLLM APIs: the prompt's prefill yields the first and
  // each decode step one more, so a request generates at most max_tokens tokens (fewer when it
  // stops or reaches the context) and its KV cache holds at most prompt + max_tokens - 1
  // positions (the last token is never fed). [1, 2^30].
  int32_t max_tokens = 16;
  std::vector<std::string> stop;        // <= 16 stop strings, 1..256 bytes of UTF-8 each
  std::vector<int32_t> stop_token_ids;  // <= 64 extra stop ids (included in output ids)
  bool ignore_eos = false;              // do not stop on the model's EOS ids
  // Tokens generated before the model's EOS ids (unless ignore_eos) and stop_token_ids may be
  // sampled, and before a stop string may end generation (vLLM's min_tokens). [0, max_tokens].
  int32_t min_tokens = 0;
  // Added to the logits of these token ids before penalties and temperature (OpenAI's and vLLM's
  // logit_bias): -100 in effect bans a token, +100 forces it. <= 200 entries, distinct ids,
  // biases in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;

  // The one set of rules for these fields (the engine, the CLI and the gRPC edge all use it):
  // kInvalidArgument naming the field when a value is out of range. With vocab_size > 0, top_k
  // must be <= vocab_size and stop_token_ids and logit_bias ids in [0, vocab_size).
  Status validate(int32_t vocab_size = 0) const;
};

// Most tokens a request with these parameters can generate (max_tokens, see above).
inline int32_t max_generated_tokens(const SamplingParams& p) { return p.max_tokens; }

enum class FinishReason : uint8_t { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", ...

}  // namespace kvsplit
