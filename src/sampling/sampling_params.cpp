// SamplingParams::validate and finish_reason_name.
#include "kvsplit/sampling_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/utf8.h"

namespace kvsplit {
namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr size_t kMaxStopTokenIds = 64;
constexpr int32_t kMaxMaxTokens = 1 << 30;
// 200 entries of 13 bytes at most on the wire: the largest valid request still fits the 8 KiB
// that config::kRequestFieldsBytes keeps beside the prompt (OpenAI takes at most 300).
constexpr size_t kMaxLogitBias = 200;
constexpr float kMaxAbsLogitBias = 100.0f;
constexpr float kMaxTemperature = 100.0f;
constexpr float kMaxRepetitionPenalty = 10.0f;
// Below it, a seen token's positive logit divided by the penalty overflows float for logits
// models produce (1e-40 made it +inf and the softmax NaN): refused rather than sampled wrongly.
constexpr float kMinRepetitionPenalty = 0.01f;

Status field_error(const char* field, const std::string& what) {
  return invalid_argument(fmt::format("{}: {}", field, what));
}

// Written as !(ok) so that NaN fails every range check.
Status in_range(const char* field, float v, float lo, float hi, bool lo_open) {
  if (!(std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi)) {
    return field_error(field,
                       fmt::format("must be in {}{}, {}], got {}", lo_open ? "(" : "[", lo, hi, v));
  }
  return ok_status();
}

Status validate_logit_bias(const std::vector<std::pair<int32_t, float>>& logit_bias,
                           int32_t vocab_size) {
  if (logit_bias.size() > kMaxLogitBias) {
    return field_error("logit_bias",
                       fmt::format("at most {} entries, got {}", kMaxLogitBias, logit_bias.size()));
  }
  std::vector<int32_t> ids;
  ids.reserve(logit_bias.size());
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return field_error("logit_bias",
                         vocab_size > 0
                             ? fmt::format("token id {} is not in [0, {})", id, vocab_size)
                             : fmt::format("token id {} must be >= 0", id));
    }
    if (!(std::isfinite(bias) && std::fabs(bias) <= kMaxAbsLogitBias)) {
      return field_error("logit_bias",
                         fmt::format("the bias of token {} must be in [-{}, {}], got {}", id,
                                     kMaxAbsLogitBias, kMaxAbsLogitBias, bias));
    }
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end())
    return field_error("logit_bias", fmt::format("token id {} is given twice", *dup));
  return ok_status();
}

Status validate_guided(const GuidedDecoding& g, bool ignore_eos) {
  using Kind = GuidedDecoding::Kind;
  if (!g.on()) {
    if (!g.spec.empty() || !g.choices.empty())
      return field_error("guided", "a spec or choices without a kind");
    return ok_status();
  }
  if (ignore_eos) {
    return field_error("ignore_eos",
                       "cannot be combined with guided decoding (the constraint decides where "
                       "the text ends)");
  }
  const bool wants_spec =
      g.kind == Kind::kRegex || g.kind == Kind::kJsonSchema || g.kind == Kind::kGrammar;
  const char* field = g.kind == Kind::kRegex        ? "guided.regex"
                      : g.kind == Kind::kJsonSchema ? "guided.json_schema"
                      : g.kind == Kind::kGrammar    ? "guided.grammar"
                      : g.kind == Kind::kChoice     ? "guided.choice"
                                                    : "guided.json_object";
  if (wants_spec && g.spec.empty()) return field_error(field, "must not be empty");
  if (!wants_spec && !g.spec.empty()) return field_error(field, "takes no spec");
  if (g.spec.size() > kMaxGuidedSpecBytes) {
    return field_error(field,
                       fmt::format("at most {} bytes, got {}", kMaxGuidedSpecBytes, g.spec.size()));
  }
  if (!utf8::is_valid(g.spec)) return field_error(field, "is not valid UTF-8");
  if (g.kind != Kind::kChoice) {
    if (!g.choices.empty()) return field_error(field, "takes no choices");
    return ok_status();
  }
  if (g.choices.empty() || g.choices.size() > kMaxGuidedChoices) {
    return field_error(
        field, fmt::format("needs 1..{} choices, got {}", kMaxGuidedChoices, g.choices.size()));
  }
  size_t total = 0;
  for (size_t i = 0; i < g.choices.size(); ++i) {
    total += g.choices[i].size();
    if (total > kMaxGuidedSpecBytes) {
      return field_error(
          field, fmt::format("the choices take more than {} bytes in all", kMaxGuidedSpecBytes));
    }
    if (g.choices[i].size() > kMaxGuidedChoiceBytes) {
      return field_error(field, fmt::format("choice {} has {} bytes, at most {}", i,
                                            g.choices[i].size(), kMaxGuidedChoiceBytes));
    }
    if (!utf8::is_valid(g.choices[i]))
      return field_error(field, fmt::format("choice {} is not valid UTF-8", i));
  }
  return ok_status();
}

}  // namespace

Status SamplingParams::validate(int32_t vocab_size) const {
  KVSPLIT_RETURN_IF_ERROR(in_range("temperature", temperature, 0.0f, kMaxTemperature, false));
  KVSPLIT_RETURN_IF_ERROR(in_range("top_p", top_p, 0.0f, 1.0f, true));
  if (top_k < -1 || (vocab_size > 0 && top_k > vocab_size)) {
    return field_error(
        "top_k", vocab_size > 0
                     ? fmt::format("must be in [-1, {}] (0 or -1 = off), got {}", vocab_size, top_k)
                     : fmt::format("must be >= -1 (0 or -1 = off), got {}", top_k));
  }
  KVSPLIT_RETURN_IF_ERROR(in_range("min_p", min_p, 0.0f, 1.0f, false));
  KVSPLIT_RETURN_IF_ERROR(in_range("repetition_penalty", repetition_penalty, kMinRepetitionPenalty,
                                   kMaxRepetitionPenalty, false));
  KVSPLIT_RETURN_IF_ERROR(in_range("presence_penalty", presence_penalty, -2.0f, 2.0f, false));
  KVSPLIT_RETURN_IF_ERROR(in_range("frequency_penalty", frequency_penalty, -2.0f, 2.0f, false));
  // max_tokens counts generated tokens (see the header); the cap keeps prompt + max_tokens
  // position arithmetic far from int32 overflow.
  if (max_tokens < 1 || max_tokens > kMaxMaxTokens) {
    return field_error("max_tokens",
                       fmt::format("must be in [1, {}], got {}", kMaxMaxTokens, max_tokens));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return field_error("min_tokens", fmt::format("must be in [0, max_tokens = {}], got {}",
                                                 max_tokens, min_tokens));
  }
  if (stop.size() > kMaxStopStrings) {
    return field_error(
        "stop", fmt::format("at most {} stop strings, got {}", kMaxStopStrings, stop.size()));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty() || stop[i].size() > kMaxStopStringBytes) {
      return field_error("stop", fmt::format("stop[{}] must be 1..{} bytes, got {}", i,
                                             kMaxStopStringBytes, stop[i].size()));
    }
    if (!utf8::is_valid(stop[i])) {
      return field_error("stop", fmt::format("stop[{}] is not valid UTF-8", i));
    }
  }
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return field_error("stop_token_ids", fmt::format("at most {} ids, got {}", kMaxStopTokenIds,
                                                     stop_token_ids.size()));
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const int32_t id = stop_token_ids[i];
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return field_error(
          "stop_token_ids",
          vocab_size > 0
              ? fmt::format("stop_token_ids[{}] = {} is not in [0, {})", i, id, vocab_size)
              : fmt::format("stop_token_ids[{}] = {} must be >= 0", i, id));
    }
  }
  KVSPLIT_RETURN_IF_ERROR(validate_guided(guided, ignore_eos));
  return validate_logit_bias(logit_bias, vocab_size);
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace kvsplit
