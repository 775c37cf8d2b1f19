#include "model/model_config.h"

#include <cmath>

namespace kvsplit::model {

namespace {

// Upper bounds that no real checkpoint reaches; they keep size arithmetic far from overflow and
// turn garbage headers into clear errors.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxHiddenDim = 1 << 18;
constexpr int64_t kMaxLayers = 1 << 10;
constexpr int64_t kMaxHeads = 1 << 10;
constexpr int64_t kMaxHeadDim = 1 << 10;
constexpr int64_t kMaxVocab = 1 << 22;

Status check_range(const std::string& source, const char* field, int64_t v, int64_t hi) {
  if (v <= 0 || v > hi) {
    return invalid_argument(source + ": " + field + " = " + std::to_string(v) +
                            " out of range [1, " + std::to_string(hi) + "]");
  }
  return ok_status();
}

}  // namespace

Status validate_model_sizes(const ModelConfig& c, const std::string& source) {
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "dim", c.dim, kMaxDim));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "hidden_dim", c.hidden_dim, kMaxHiddenDim));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "num_layers", c.num_layers, kMaxLayers));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "num_heads", c.num_heads, kMaxHeads));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "num_kv_heads", c.num_kv_heads, kMaxHeads));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "head_dim", c.head_dim, kMaxHeadDim));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "vocab_size", c.vocab_size, kMaxVocab));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "max_seq_len", c.max_seq_len, kMaxContextLength));
  return ok_status();
}

Status validate_model_config(const ModelConfig& c, const std::string& source) {
  KVSPLIT_RETURN_IF_ERROR(validate_model_sizes(c, source));
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument(source + ": num_heads (" + std::to_string(c.num_heads) +
                            ") is not a multiple of num_kv_heads (" +
                            std::to_string(c.num_kv_heads) + ")");
  }
  if (c.head_dim % 2 != 0) {
    return invalid_argument(source + ": head_dim = " + std::to_string(c.head_dim) +
                            " must be even (RoPE rotates pairs)");
  }
  if (!(std::isfinite(c.norm_eps) && c.norm_eps > 0.0f)) {
    return invalid_argument(source + ": norm_eps = " + std::to_string(c.norm_eps) +
                            " must be finite and > 0");
  }
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f)) {
    return invalid_argument(source + ": rope_theta = " + std::to_string(c.rope_theta) +
                            " must be finite and > 1");
  }
  KVSPLIT_RETURN_IF_ERROR(validate_rope_scaling(c, source));
  if (!c.layer_window.empty() && std::ssize(c.layer_window) != c.num_layers) {
    return invalid_argument(source + ": layer_window has " + std::to_string(c.layer_window.size()) +
                            " entries for " + std::to_string(c.num_layers) + " layers");
  }
  for (size_t l = 0; l < c.layer_window.size(); ++l) {
    if (c.layer_window[l] < 0) {
      return invalid_argument(source + ": sliding window of layer " + std::to_string(l) + " = " +
                              std::to_string(c.layer_window[l]) + " must be >= 0 (0: none)");
    }
  }
  for (int32_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return invalid_argument(source + ": eos token id " + std::to_string(id) +
                              " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
  }
  if (c.bos_token_id >= c.vocab_size) {
    return invalid_argument(source + ": bos token id " + std::to_string(c.bos_token_id) +
                            " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  return ok_status();
}

}  // namespace kvsplit::model
