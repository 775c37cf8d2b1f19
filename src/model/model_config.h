// Hyperparameters of a Llama-family model, filled by the loaders.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kvsplit/status.h"

namespace kvsplit::model {

// RoPE variants with frequency scaling, as HF transformers' modeling_rope_utils names them
// (`rope_type`); plain RoPE ("default") is `ModelConfig::rope_scaling` unset.
enum class RopeType : uint8_t {
  kLinear,   // inv_freq / factor
  kDynamic,  // NTK-aware: the base grows with the context length
  kLlama3,   // wavelength bands: long ones / factor, short ones kept, smooth in between
  kYarn,     // per-dimension ramp between interpolation and extrapolation + attention factor
};

// "linear", "dynamic", "llama3", "yarn".
const char* rope_type_name(RopeType type);

// Parameters of a scaled RoPE (docs/models.md gives each type's formula). Doubles, as HF reads
// them from JSON into Python floats.
struct RopeScaling {
  RopeType type = RopeType::kLlama3;
  double factor = 1.0;  // context extension ratio, >= 1
  // llama3, yarn: the pre-training context length. dynamic: the length past which the base grows
  // (HF uses max_position_embeddings).
  int original_max_position_embeddings = 0;
  double low_freq_factor = 1.0;            // llama3
  double high_freq_factor = 4.0;           // llama3
  double beta_fast = 32.0;                 // yarn: ramp end, in rotations over the original context
  double beta_slow = 1.0;                  // yarn: ramp start
  double mscale = 0.0;                     // yarn, 0 = unset (attention factor from factor alone)
  double mscale_all_dim = 0.0;             // yarn, 0 = unset
  std::optional<double> attention_factor;  // yarn: explicit; else derived (HF get_mscale)
  bool truncate = true;                    // yarn: floor/ceil the correction range

  static RopeScaling llama3(double factor, double low_freq_factor, double high_freq_factor,
                            int original_max_position_embeddings);
};

// Upper bound on ModelConfig::max_seq_len (validate_model_config).
inline constexpr int64_t kMaxContextLength = int64_t{1} << 24;

struct ModelConfig {
  std::string architecture;  // "llama2c", "LlamaForCausalLM", "MistralForCausalLM",
                             // "Qwen2ForCausalLM", "synthetic"
  int dim = 0;               // hidden_size
  int hidden_dim = 0;        // intermediate_size
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // usually dim / num_heads; HF `head_dim` may differ
  int vocab_size = 0;
  int max_seq_len = 0;  // context length
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  backend::RopeStyle rope_style = backend::RopeStyle::kInterleaved;
  std::optional<RopeScaling> rope_scaling;  // unset: plain RoPE
  bool tie_word_embeddings = true;
  bool qkv_bias = false;  // Qwen2
  int32_t bos_token_id = 1;
  std::vector<int32_t> eos_token_ids;  // generation stops on any of these
  // Sliding-window attention (Mistral, Qwen2's sliding layers): layer_window[l] > 0 means layer l's
  // query at position p attends keys [max(0, p - W + 1), p] (backend::AttentionArgs::window); 0
  // means full causal attention. Empty: every layer full. Otherwise num_layers entries.
  std::vector<int> layer_window;

  int q_dim() const { return num_heads * head_dim; }
  int window_of(int layer) const { return layer_window.empty() ? 0 : layer_window[layer]; }
  bool has_sliding_window() const {
    for (int w : layer_window)
      if (w > 0) return true;
    return false;
  }
  // How far back any query reads once every layer slides: the largest window (keys more than
  // that behind the next position are never read again, kv::drop_behind_window), or 0 when some
  // layer attends the whole context.
  int kv_window() const {
    int w = 0;
    for (int lw : layer_window) {
      if (lw <= 0) return 0;
      w = std::max(w, lw);
    }
    return w;
  }
  int kv_dim() const { return num_kv_heads * head_dim; }
};

// Rotary inverse frequencies [head_dim / 2] for this config, by HF's formula for its RoPE type
// (src/model/rope.cpp; dynamic NTK is evaluated at max(max_seq_len, original length)).
std::vector<float> rope_inv_freq(const ModelConfig& config);

// The factor multiplying cos and sin (HF `attention_scaling`): 1 except for YaRN.
float rope_attention_factor(const ModelConfig& config);

// Checks what every loader guarantees: positive sizes within sane bounds (see docs/models.md),
// num_heads % num_kv_heads == 0, even head_dim, finite positive norm_eps / rope_theta, valid
// rope_scaling. kInvalidArgument "<source>: <field> ..." naming the first fault.
Status validate_model_config(const ModelConfig& config, const std::string& source);
// Its first part: every size in [1, its bound] (dim, hidden_dim, num_layers, heads, head_dim,
// vocab_size, max_seq_len). A loader checks these before it allocates anything by them.
Status validate_model_sizes(const ModelConfig& config, const std::string& source);

// The rope_scaling part of validate_model_config (src/model/rope.cpp).
Status validate_rope_scaling(const ModelConfig& config, const std::string& source);

}  // namespace kvsplit::model
