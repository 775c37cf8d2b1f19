// Hyperparameters of a Llama-family model, filled by the loaders.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kvsplit/status.h"

namespace kvsplit::model {

// Llama-3 style frequency scaling ("rope_type": "llama3").
struct RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // "llama2c", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "synthetic"
  int dim = 0;               // hidden_size
  int hidden_dim = 0;        // intermediate_size
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;          // usually dim / num_heads; HF `head_dim` may differ
  int vocab_size = 0;
  int max_seq_len = 0;       // context length
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  backend::RopeStyle rope_style = backend::RopeStyle::kInterleaved;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = true;
  bool qkv_bias = false;     // Qwen2
  int32_t bos_token_id = 1;
  std::vector<int32_t> eos_token_ids;  // generation stops on any of these

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
};

// Rotary inverse frequencies [head_dim / 2] for this config (Llama-3 scaling applied when set).
std::vector<float> rope_inv_freq(const ModelConfig& config);

// Checks what every loader guarantees: positive sizes within sane bounds (see docs/models.md),
// num_heads % num_kv_heads == 0, even head_dim, finite positive norm_eps / rope_theta, valid
// rope_scaling. kInvalidArgument "<source>: <field> ..." naming the first fault.
Status validate_model_config(const ModelConfig& config, const std::string& source);

}  // namespace kvsplit::model
