// Per-request sampling and stopping parameters (public API).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit {

// Structured output (vLLM's guided decoding, OpenAI's response_format): the generated text is
// held to a language. At each step only the tokens whose bytes keep the text a prefix of some
// string of the language may be sampled; the model's EOS ids and stop_token_ids only once the
// text is a whole string of it. docs/sampling.md, "Guided decoding", has the rules.
struct GuidedDecoding {
  enum class Kind : uint8_t {
    kNone,
    kRegex,       // `spec`: a regular expression (docs/sampling.md lists the syntax)
    kChoice,      // `choices`: exactly one of these strings
    kJsonSchema,  // `spec`: a JSON schema (the supported subset is listed there)
    kJsonObject,  // any JSON object (nested up to kJsonObjectDepth)
    kGrammar,     // `spec`: a context-free grammar in GBNF, start rule `root` (docs/sampling.md)
  };
  Kind kind = Kind::kNone;
  std::string spec;
  std::vector<std::string> choices;

  bool on() const { return kind != Kind::kNone; }
};

// Limits (validate): a regex, schema or grammar of at most kMaxGuidedSpecBytes, at most
// kMaxGuidedChoices choices of at most kMaxGuidedChoiceBytes each and kMaxGuidedSpecBytes in all.
inline constexpr size_t kMaxGuidedSpecBytes = 32 * 1024;
inline constexpr size_t kMaxGuidedChoices = 256;
inline constexpr size_t kMaxGuidedChoiceBytes = 1024;
inline constexpr int kJsonObjectDepth = 4;  // objects and arrays nested in a json_object answer

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
  // Structured output. Not with ignore_eos: the language decides where the text ends.
  GuidedDecoding guided;

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
