// StopChecker: EOS / stop ids, stop strings with held-back text, max_new_tokens.
#include "sampling/stop.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace kvsplit::sampling {

StopChecker::StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids,
                         int max_new_tokens)
    : params_(params), eos_ids_(std::move(eos_ids)), max_new_tokens_(max_new_tokens) {
  // The engine rejects prompts that leave no room in the context before building this.
  KVSPLIT_CHECK_MSG(max_new_tokens_ >= 1, "max_new_tokens must be >= 1");
  if (params_.ignore_eos) eos_ids_.clear();
  for (const std::string& s : params_.stop) max_stop_len_ = std::max(max_stop_len_, s.size());
}

bool StopChecker::is_stop_token(int32_t token) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end() ||
         std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
             params_.stop_token_ids.end();
}

size_t StopChecker::hold_back_length() const {
  if (max_stop_len_ == 0) return 0;
  const size_t n = held_.size();
  // Earliest start i whose suffix held_[i, n) is a proper prefix of some stop string; only the
  // last max_stop_len_ - 1 bytes can be one (a full match was already handled).
  const size_t first = n >= max_stop_len_ ? n - max_stop_len_ + 1 : 0;
  for (size_t i = first; i < n; ++i) {
    const size_t len = n - i;
    for (const std::string& s : params_.stop) {
      if (s.size() > len && s.compare(0, len, held_, i, len) == 0) return len;
    }
  }
  return 0;
}

StopChecker::Step StopChecker::on_token(int32_t token, std::string_view text_delta) {
  KVSPLIT_CHECK_MSG(!finished_, "on_token after generation ended");
  ++num_generated_;
  Step step;
  if (is_stop_token(token)) {
    step.reason = FinishReason::kStop;
    step.text = std::exchange(held_, std::string());
    finished_ = true;
    return step;
  }
  const size_t before = held_.size();
  held_.append(text_delta);
  if (!params_.stop.empty() && num_generated_ >= params_.min_tokens) {
    // Only matches that end in this token's text: one that ended earlier was complete before
    // min_tokens tokens (held back as the prefix of a longer stop string), and is no stop.
    size_t match = std::string::npos;
    for (const std::string& s : params_.stop) {
      const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
      match = std::min(match, held_.find(s, from));
    }
    if (match != std::string::npos) {
      step.reason = FinishReason::kStop;
      step.stop_string = true;
      step.text = held_.substr(0, match);
      held_.clear();
      finished_ = true;
      return step;
    }
  }
  if (num_generated_ >= max_new_tokens_) {
    step.reason = FinishReason::kLength;
    step.text = std::exchange(held_, std::string());
    finished_ = true;
    return step;
  }
  const size_t keep = hold_back_length();
  step.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

std::string StopChecker::flush() { return std::exchange(held_, std::string()); }

}  // namespace kvsplit::sampling
