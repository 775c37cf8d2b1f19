// SamplingParams::validate and finish_reason_name.
#include "kvsplit/sampling_params.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace kvsplit {
namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr int32_t kMaxMaxTokens = 1 << 30;

Status field_error(const char* field, const std::string& what) {
  return invalid_argument(fmt::format("{}: {}", field, what));
}

}  // namespace

Status SamplingParams::validate() const {
  // Written as !(ok) so that NaN fails every range check.
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return field_error("temperature", fmt::format("must be finite and >= 0, got {}", temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return field_error("top_p", fmt::format("must be in (0, 1], got {}", top_p));
  }
  if (top_k < 0) {
    return field_error("top_k", fmt::format("must be >= 0 (0 = off), got {}", top_k));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return field_error("min_p", fmt::format("must be in [0, 1], got {}", min_p));
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return field_error("repetition_penalty",
                       fmt::format("must be finite and > 0, got {}", repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return field_error("presence_penalty",
                       fmt::format("must be in [-2, 2], got {}", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return field_error("frequency_penalty",
                       fmt::format("must be in [-2, 2], got {}", frequency_penalty));
  }
  // max_tokens counts generated tokens (see the header); the cap keeps prompt + max_tokens
  // position arithmetic far from int32 overflow.
  if (max_tokens < 1 || max_tokens > kMaxMaxTokens) {
    return field_error("max_tokens",
                       fmt::format("must be in [1, {}], got {}", kMaxMaxTokens, max_tokens));
  }
  if (stop.size() > kMaxStopStrings) {
    return field_error(
        "stop", fmt::format("at most {} stop strings, got {}", kMaxStopStrings, stop.size()));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return field_error("stop", fmt::format("stop string {} is empty", i));
    }
    if (stop[i].size() > kMaxStopStringBytes) {
      return field_error("stop", fmt::format("stop string {} is {} bytes, the limit is {}", i,
                                             stop[i].size(), kMaxStopStringBytes));
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0) {
      return field_error("stop_token_ids",
                         fmt::format("id {} must be >= 0, got {}", i, stop_token_ids[i]));
    }
  }
  return ok_status();
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
