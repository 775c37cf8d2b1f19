// Rotary inverse frequencies and attention factor per RoPE type, following HF transformers'
// modeling_rope_utils (`_compute_*_parameters`). Every type starts from the plain frequencies
// 1 / theta^(2i/d) in float, exactly as llama2.c's run.c and HF's fp32 torch code compute them;
// the scaling on top is evaluated in double and rounded to float once, which keeps the result
// within a few ulp of HF's fp32 arithmetic (tests/model/rope_test.cpp checks HF's own numbers).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <string>

#include "model/model_config.h"

namespace kvsplit::model {

namespace {

// HF default RoPE (and run.c): 1.0f / powf(theta, (float)(2i) / (float)d), in float.
float plain_inv_freq(float theta, int i, int head_dim) {
  return 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
}

// HF `get_mscale`: the YaRN attention temperature for a context extension `scale`.
double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// HF `find_correction_dim`: the (fractional) dimension index whose wavelength makes
// `num_rotations` turns over `original` positions.
double yarn_correction_dim(double num_rotations, int dim, double base, double original) {
  return dim * std::log(original / (num_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

void llama3_scale(const RopeScaling& s, std::vector<float>* inv_freq) {
  const double old_ctx = s.original_max_position_embeddings;
  const double low_freq_wavelen = old_ctx / s.low_freq_factor;
  const double high_freq_wavelen = old_ctx / s.high_freq_factor;
  for (float& v : *inv_freq) {
    const double f = v;
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
    v = static_cast<float>(out);
  }
}

void yarn_scale(const RopeScaling& s, float theta, int head_dim, std::vector<float>* inv_freq) {
  const double beta_fast = s.beta_fast != 0.0 ? s.beta_fast : 32.0;  // HF: `or 32`
  const double beta_slow = s.beta_slow != 0.0 ? s.beta_slow : 1.0;   // HF: `or 1`
  const double original = s.original_max_position_embeddings;
  double low = yarn_correction_dim(beta_fast, head_dim, theta, original);
  double high = yarn_correction_dim(beta_slow, head_dim, theta, original);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;  // HF: prevent a zero-width ramp
  for (size_t i = 0; i < inv_freq->size(); ++i) {
    const double extrapolation = (*inv_freq)[i];
    const double interpolation = extrapolation / s.factor;
    // 0 below `low` (pure extrapolation), 1 above `high` (pure interpolation).
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    (*inv_freq)[i] = static_cast<float>(interpolation * ramp + extrapolation * (1.0 - ramp));
  }
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

}  // namespace

const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

RopeScaling RopeScaling::llama3(double factor, double low_freq_factor, double high_freq_factor,
                                int original_max_position_embeddings) {
  RopeScaling s;
  s.type = RopeType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = low_freq_factor;
  s.high_freq_factor = high_freq_factor;
  s.original_max_position_embeddings = original_max_position_embeddings;
  return s;
}

namespace {

// HF `_compute_dynamic_ntk_parameters` at seq_len L = max(max_seq_len, original):
// base = theta * (factor * L / original - (factor - 1))^(d / (d - 2)). At L = original (the
// context the HF loader sets) the base is theta itself. Written as 1 + factor * (L / original - 1)
// so that a huge factor still gives exactly 1 there (factor - (factor - 1) rounds to 0).
double dynamic_rope_base(const ModelConfig& config) {
  const RopeScaling& s = *config.rope_scaling;
  const double original = s.original_max_position_embeddings;
  const double len = std::max(static_cast<double>(config.max_seq_len), original);
  const int d = config.head_dim;
  return config.rope_theta *
         std::pow(1.0 + s.factor * (len / original - 1.0), static_cast<double>(d) / (d - 2));
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  const int d = config.head_dim;
  float theta = config.rope_theta;
  if (config.rope_scaling && config.rope_scaling->type == RopeType::kDynamic) {
    // HF `_compute_dynamic_ntk_parameters` at seq_len L = max(max_seq_len, original):
    // base = theta * (factor * L / original - (factor - 1))^(d / (d - 2)). At L = original (the
    // context the HF loader sets) the base is theta itself.
    theta = static_cast<float>(dynamic_rope_base(config));
  }
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = plain_inv_freq(theta, i, d);
  if (!config.rope_scaling) return inv_freq;
  const RopeScaling& s = *config.rope_scaling;
  switch (s.type) {
    case RopeType::kLinear:
      // HF divides the fp32 frequencies by the factor in fp32.
      for (float& v : inv_freq) v /= static_cast<float>(s.factor);
      break;
    case RopeType::kDynamic:
      break;
    case RopeType::kLlama3:
      llama3_scale(s, &inv_freq);
      break;
    case RopeType::kYarn:
      yarn_scale(s, config.rope_theta, d, &inv_freq);
      break;
  }
  return inv_freq;
}

namespace {

// YaRN's attention factor in double: explicit, else HF's ratio of two mscales when both mscale
// and mscale_all_dim are set (DeepSeek), else 0.1 ln(factor) + 1.
double yarn_attention_factor(const RopeScaling& s) {
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    return yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim);
  }
  return yarn_get_mscale(s.factor, 1.0);
}

}  // namespace

float rope_attention_factor(const ModelConfig& config) {
  if (!config.rope_scaling || config.rope_scaling->type != RopeType::kYarn) return 1.0f;
  return static_cast<float>(yarn_attention_factor(*config.rope_scaling));
}

Status validate_rope_scaling(const ModelConfig& c, const std::string& source) {
  if (!c.rope_scaling) return ok_status();
  const RopeScaling& s = *c.rope_scaling;
  const std::string what = source + ": rope " + rope_type_name(s.type) + ": ";
  auto bad = [&](const std::string& field, double v, const std::string& want) {
    return invalid_argument(what + field + " = " + num(v) + " " + want);
  };
  if (!(std::isfinite(s.factor) && s.factor >= 1.0)) {
    return bad("factor", s.factor, "must be finite and >= 1");
  }
  if (s.type == RopeType::kLinear) return ok_status();
  if (s.original_max_position_embeddings <= 0) {
    return bad("original_max_position_embeddings", s.original_max_position_embeddings,
               "must be > 0");
  }
  switch (s.type) {
    case RopeType::kLinear:
      break;
    case RopeType::kDynamic:
      if (c.head_dim <= 2) {
        return bad("head_dim", c.head_dim, "must be > 2 (the base exponent is d / (d - 2))");
      }
      if (const double base = dynamic_rope_base(c);
          !(std::isfinite(base) && base <= std::numeric_limits<float>::max())) {
        return bad("factor", s.factor,
                   "gives a rope base of " + num(base) + " at a context of " +
                       std::to_string(c.max_seq_len) + ", outside the range of a float");
      }
      break;
    case RopeType::kLlama3:
      if (!(s.low_freq_factor > 0.0 && std::isfinite(s.low_freq_factor))) {
        return bad("low_freq_factor", s.low_freq_factor, "must be finite and > 0");
      }
      if (!(s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor))) {
        return bad("high_freq_factor", s.high_freq_factor,
                   "must be finite and > low_freq_factor (" + num(s.low_freq_factor) + ")");
      }
      break;
    case RopeType::kYarn:
      for (auto [name, v] : {std::pair<const char*, double>{"beta_fast", s.beta_fast},
                             {"beta_slow", s.beta_slow},
                             {"mscale", s.mscale},
                             {"mscale_all_dim", s.mscale_all_dim}}) {
        if (!std::isfinite(v) || v < 0.0) return bad(name, v, "must be finite and >= 0");
      }
      if (s.attention_factor && !(std::isfinite(*s.attention_factor) && *s.attention_factor > 0)) {
        return bad("attention_factor", *s.attention_factor, "must be finite and > 0");
      }
      // The factor multiplies cos and sin in float, the logits by its square: both must be
      // normal floats (an attention_factor of 1e39, or mscale 1e300 over mscale_all_dim 1e-300,
      // was accepted and became inf).
      if (const double af = yarn_attention_factor(s);
          !(af >= std::sqrt(static_cast<double>(std::numeric_limits<float>::min())) &&
            af <= std::sqrt(static_cast<double>(std::numeric_limits<float>::max())))) {
        return bad(s.attention_factor ? "attention_factor" : "mscale",
                   s.attention_factor ? *s.attention_factor : s.mscale,
                   "gives an attention factor of " + num(af) +
                       ": it and its square must be normal floats");
      }
      break;
  }
  return ok_status();
}

}  // namespace kvsplit::model
