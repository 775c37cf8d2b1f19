#include "model/model_config.h"

#include <cmath>
#include <numbers>

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
constexpr int64_t kMaxSeqLen = 1 << 24;

Status check_range(const std::string& source, const char* field, int64_t v, int64_t hi) {
  if (v <= 0 || v > hi) {
    return invalid_argument(source + ": " + field + " = " + std::to_string(v) +
                            " out of range [1, " + std::to_string(hi) + "]");
  }
  return ok_status();
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  if (!config.rope_scaling) {
    // Exactly llama2.c run.c: 1.0f / powf(theta, head_dim_index / (float)head_size), in float.
    for (int i = 0; i < half; ++i) {
      inv_freq[i] = 1.0f / std::pow(config.rope_theta, static_cast<float>(2 * i) /
                                                           static_cast<float>(config.head_dim));
    }
    return inv_freq;
  }
  // Llama-3 wavelength-based scaling (HF `_compute_llama3_parameters`), in double:
  // long wavelengths (low frequencies) are divided by `factor`, short ones kept, and the band in
  // between interpolated smoothly in 1 / wavelength.
  const RopeScaling& s = *config.rope_scaling;
  const double old_ctx = s.original_max_position_embeddings;
  const double low_freq_wavelen = old_ctx / s.low_freq_factor;
  const double high_freq_wavelen = old_ctx / s.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    const double f = 1.0 / std::pow(static_cast<double>(config.rope_theta),
                                    static_cast<double>(2 * i) / config.head_dim);
    const double wavelen = 2.0 * std::numbers::pi / f;
    double out;
    if (wavelen < high_freq_wavelen) {
      out = f;
    } else if (wavelen > low_freq_wavelen) {
      out = f / s.factor;
    } else {
      const double smooth =
          (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      out = (1.0 - smooth) * f / s.factor + smooth * f;
    }
    inv_freq[i] = static_cast<float>(out);
  }
  return inv_freq;
}

Status validate_model_config(const ModelConfig& c, const std::string& source) {
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "dim", c.dim, kMaxDim));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "hidden_dim", c.hidden_dim, kMaxHiddenDim));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "num_layers", c.num_layers, kMaxLayers));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "num_heads", c.num_heads, kMaxHeads));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "num_kv_heads", c.num_kv_heads, kMaxHeads));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "head_dim", c.head_dim, kMaxHeadDim));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "vocab_size", c.vocab_size, kMaxVocab));
  KVSPLIT_RETURN_IF_ERROR(check_range(source, "max_seq_len", c.max_seq_len, kMaxSeqLen));
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
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    if (!(s.factor >= 1.0f && std::isfinite(s.factor)) || !(s.low_freq_factor > 0.0f) ||
        !(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor) ||
        s.original_max_position_embeddings <= 0) {
      return invalid_argument(
          source +
          ": rope_scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor, "
          "original_max_position_embeddings > 0 (got factor " +
          std::to_string(s.factor) + ", low " + std::to_string(s.low_freq_factor) + ", high " +
          std::to_string(s.high_freq_factor) + ", original " +
          std::to_string(s.original_max_position_embeddings) + ")");
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
