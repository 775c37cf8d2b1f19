// config.json (+ generation_config.json) of a HF model directory -> ModelConfig.
#include "model/hf_config.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>

#include "common/escape.h"

namespace kvsplit::model {

namespace {

namespace fs = std::filesystem;
using common::Json;

constexpr const char* kSupportedArchs = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";
constexpr const char* kFull = "full_attention";
constexpr const char* kSliding = "sliding_attention";
// transformers' default `sliding_window` of Mistral and Qwen2 when config.json has no such key.
constexpr int64_t kHfDefaultSlidingWindow = 4096;

enum class Arch { kLlama, kMistral, kQwen2 };

// The supported models: config.json's model_type, the causal LM class transformers builds for it
// (architectures[0]), and ours.
struct Supported {
  std::string_view model_type, architecture;
  Arch arch;
};
constexpr Supported kSupported[] = {{"llama", "LlamaForCausalLM", Arch::kLlama},
                                    {"mistral", "MistralForCausalLM", Arch::kMistral},
                                    {"qwen2", "Qwen2ForCausalLM", Arch::kQwen2}};

const Supported* supported_type(std::string_view model_type) {
  for (const Supported& s : kSupported)
    if (s.model_type == model_type) return &s;
  return nullptr;
}

const Supported* supported_architecture(std::string_view architecture) {
  for (const Supported& s : kSupported)
    if (s.architecture == architecture) return &s;
  return nullptr;
}

StatusOr<int> get_int(const Json& j, const char* key, std::optional<int64_t> fallback,
                      const std::string& what) {
  KVSPLIT_ASSIGN_OR_RETURN(int64_t v, common::json_int(j, key, fallback, what, 1, INT32_MAX));
  return static_cast<int>(v);
}

// Token ids given as an int, a list of ints, or null (-> nothing).
Status append_ids(const Json& j, const char* key, const std::string& what,
                  std::vector<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  auto add = [&](const Json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return invalid_argument(what + ": field '" + key + "' must be token ids, got " + it->dump());
    }
    auto id = static_cast<int32_t>(v.get<int64_t>());
    if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
    return ok_status();
  };
  if (it->is_array()) {
    for (const auto& v : *it) KVSPLIT_RETURN_IF_ERROR(add(v));
    return ok_status();
  }
  return add(*it);
}

// Fields that change the math of the layers and are not implemented.
Status check_unsupported_fields(const Json& j, const std::string& what, Arch arch) {
  KVSPLIT_ASSIGN_OR_RETURN(std::string act, common::json_string(j, "hidden_act", "silu", what));
  if (act != "silu" && act != "swish") {
    return unimplemented(what + ": hidden_act = '" + act + "' is not supported (silu, swish)");
  }
  // Qwen2 always has q/k/v biases and none on o_proj; transformers ignores `attention_bias` there.
  if (arch != Arch::kQwen2) {
    KVSPLIT_ASSIGN_OR_RETURN(bool b, common::json_bool(j, "attention_bias", false, what));
    if (b) return unimplemented(what + ": attention_bias = true is not supported");
  }
  KVSPLIT_ASSIGN_OR_RETURN(bool mlp_bias, common::json_bool(j, "mlp_bias", false, what));
  if (mlp_bias) return unimplemented(what + ": mlp_bias = true is not supported");
  auto q = j.find("quantization_config");
  if (q != j.end() && !q->is_null()) {
    return unimplemented(what + ": quantization_config = " + q->dump().substr(0, 80) +
                         " is not supported (f32/f16/bf16 weights only)");
  }
  return ok_status();
}

// The attention type of each layer: config.json's `layer_types`, else what transformers derives
// (Qwen2 with use_sliding_window: sliding from layer max_window_layers on; otherwise all full).
// Llama and Mistral have no per-layer types in transformers: only full_attention entries pass.
StatusOr<std::vector<std::string>> parse_layer_types(const Json& j, const std::string& what,
                                                     Arch arch, int num_layers) {
  std::vector<std::string> types(num_layers, kFull);
  auto lt = j.find("layer_types");
  if (lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || lt->size() != static_cast<size_t>(num_layers)) {
      return invalid_argument(what + ": layer_types must be a list of " +
                              std::to_string(num_layers) + " strings (num_hidden_layers)");
    }
    for (int i = 0; i < num_layers; ++i) {
      const Json& v = (*lt)[i];
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      const bool known = s == kFull || (s == kSliding && arch == Arch::kQwen2);
      if (!v.is_string() || !known) {
        return unimplemented(what + ": layer_types[" + std::to_string(i) + "] = '" + s +
                             "' is not supported (" + kFull +
                             (arch == Arch::kQwen2 ? std::string(", ") + kSliding : "") + ")");
      }
      types[i] = s;
    }
    return types;
  }
  if (arch == Arch::kQwen2) {
    KVSPLIT_ASSIGN_OR_RETURN(bool use, common::json_bool(j, "use_sliding_window", false, what));
    KVSPLIT_ASSIGN_OR_RETURN(
        int64_t first, common::json_int(j, "max_window_layers", int64_t{28}, what, 0, INT32_MAX));
    for (int i = 0; i < num_layers; ++i) {
      if (use && i >= first) types[i] = kSliding;
    }
  }
  return types;
}

// The sliding window of each layer (ModelConfig::layer_window; empty when none), as transformers
// applies it: Mistral on every layer whenever sliding_window is not null; Qwen2 on the layers
// typed sliding_attention, and only with use_sliding_window = true (transformers sets the window
// to None otherwise); Llama never. A window of at least the context masks nothing: dropped.
StatusOr<std::vector<int>> parse_layer_windows(const Json& j, const std::string& what, Arch arch,
                                               const std::vector<std::string>& layer_types,
                                               int context) {
  if (arch == Arch::kLlama) return std::vector<int>{};
  bool use = true;  // Mistral: whenever sliding_window is not null
  if (arch == Arch::kQwen2) {
    KVSPLIT_ASSIGN_OR_RETURN(use, common::json_bool(j, "use_sliding_window", false, what));
  }
  auto w = j.find("sliding_window");
  if (!use || (w != j.end() && w->is_null())) return std::vector<int>{};
  KVSPLIT_ASSIGN_OR_RETURN(
      int64_t window,
      common::json_int(j, "sliding_window", kHfDefaultSlidingWindow, what, 1, INT32_MAX));
  if (window >= context) return std::vector<int>{};
  std::vector<int> windows(layer_types.size(), 0);
  for (size_t l = 0; l < layer_types.size(); ++l) {
    if (arch == Arch::kMistral || layer_types[l] == kSliding) windows[l] = static_cast<int>(window);
  }
  if (std::ranges::none_of(windows, [](int x) { return x > 0; })) return std::vector<int>{};
  return windows;
}

Status parse_special_ids(const Json& j, const std::string& what, bool qwen2,
                         const std::optional<std::string_view>& generation_text,
                         const std::string& generation_what, ModelConfig* c) {
  // Llama/Mistral default to bos 1 / eos 2 (transformers); Qwen2 has no default.
  std::vector<int32_t> bos;
  KVSPLIT_RETURN_IF_ERROR(append_ids(j, "bos_token_id", what, &bos));
  KVSPLIT_RETURN_IF_ERROR(append_ids(j, "eos_token_id", what, &c->eos_token_ids));
  if (!j.contains("bos_token_id") && !qwen2) bos = {1};
  if (!j.contains("eos_token_id") && !qwen2) c->eos_token_ids = {2};
  if (generation_text) {
    KVSPLIT_ASSIGN_OR_RETURN(Json g, common::parse_json(*generation_text, generation_what));
    if (!g.is_object()) return invalid_argument(generation_what + ": not a JSON object");
    // transformers' generate() stops on the generation config's eos_token_id: it replaces
    // config.json's when the key is there.
    if (g.contains("eos_token_id")) {
      std::vector<int32_t> eos;
      KVSPLIT_RETURN_IF_ERROR(append_ids(g, "eos_token_id", generation_what, &eos));
      c->eos_token_ids = std::move(eos);
    }
    if (bos.empty()) KVSPLIT_RETURN_IF_ERROR(append_ids(g, "bos_token_id", generation_what, &bos));
  }
  c->bos_token_id = bos.empty() ? -1 : bos[0];
  return ok_status();
}

}  // namespace

StatusOr<ModelConfig> parse_hf_config(const std::string& dir) {
  const std::string what = dir + "/config.json";
  const std::string generation_what = dir + "/generation_config.json";
  KVSPLIT_ASSIGN_OR_RETURN(std::string text, common::read_regular_file(
                                                 what, common::kMaxJsonSideFileBytes, "JSON file"));
  std::optional<std::string> generation_text;
  std::error_code ec;
  if (fs::exists(generation_what, ec)) {
    KVSPLIT_ASSIGN_OR_RETURN(
        generation_text,
        common::read_regular_file(generation_what, common::kMaxJsonSideFileBytes, "JSON file"));
  }
  return parse_hf_config_json(
      text, what,
      generation_text ? std::optional<std::string_view>(*generation_text) : std::nullopt,
      generation_what);
}

StatusOr<ModelConfig> parse_hf_config_json(std::string_view text, const std::string& what,
                                           std::optional<std::string_view> generation_text,
                                           const std::string& generation_what) {
  KVSPLIT_ASSIGN_OR_RETURN(Json j, common::parse_json(text, what));
  if (!j.is_object()) return invalid_argument(what + ": not a JSON object");
  auto archs = j.find("architectures");
  ModelConfig c;
  // transformers' AutoModelForCausalLM builds the class of model_type (`architectures` is a
  // label): when a config has both, they must agree, or the checkpoint would run here as another
  // model than there (a Mistral label on a llama config gave it Mistral's default window).
  KVSPLIT_ASSIGN_OR_RETURN(std::string type, common::json_string(j, "model_type", "", what));
  const Supported* by_type = supported_type(type);
  if (archs != j.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return invalid_argument(what + ": 'architectures' must be a list of strings (supported: " +
                              std::string(kSupportedArchs) + ")");
    }
    c.architecture = (*archs)[0].get<std::string>();
    // An unsupported class is refused below as unknown, whatever its model_type.
    const Supported* by_arch = supported_architecture(c.architecture);
    if (by_arch != nullptr && !type.empty() && by_type != by_arch) {
      return invalid_argument(what + ": model_type '" + escape_for_message(type, 64) + "' (" +
                              (by_type == nullptr
                                   ? std::string("none of llama, mistral, qwen2")
                                   : "transformers builds " + std::string(by_type->architecture)) +
                              ") disagrees with architectures[0] " + c.architecture);
    }
  } else {
    // A config saved from a bare config class (LlamaConfig().save_pretrained) names no
    // architecture; its model_type says which causal LM transformers would build.
    if (by_type != nullptr) c.architecture = by_type->architecture;
    if (c.architecture.empty()) {
      return invalid_argument(
          what + ": no 'architectures', and model_type '" + type +
          "' is none of llama, mistral, qwen2 (supported: " + std::string(kSupportedArchs) + ")");
    }
  }
  const Supported* model = supported_architecture(c.architecture);
  if (model == nullptr) {
    return invalid_argument(what + ": unknown architecture " + c.architecture +
                            " (supported: " + kSupportedArchs + ")");
  }
  const Arch arch = model->arch;
  KVSPLIT_RETURN_IF_ERROR(check_unsupported_fields(j, what, arch));
  KVSPLIT_ASSIGN_OR_RETURN(c.dim, get_int(j, "hidden_size", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.hidden_dim, get_int(j, "intermediate_size", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.num_layers, get_int(j, "num_hidden_layers", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.num_heads, get_int(j, "num_attention_heads", std::nullopt, what));
  // transformers' defaults: absent, MistralConfig's 8, Qwen2Config's 32 (LlamaConfig:
  // num_attention_heads); null, num_attention_heads in every class.
  const auto kvh = j.find("num_key_value_heads");
  const bool kvh_absent = kvh == j.end();
  const int kvh_default = !kvh_absent              ? c.num_heads
                          : arch == Arch::kMistral ? 8
                          : arch == Arch::kQwen2   ? 32
                                                   : c.num_heads;
  KVSPLIT_ASSIGN_OR_RETURN(c.num_kv_heads, get_int(j, "num_key_value_heads", kvh_default, what));
  if (j.find("head_dim") == j.end() || j["head_dim"].is_null()) {
    if (c.dim % c.num_heads != 0) {
      return invalid_argument(what + ": hidden_size " + std::to_string(c.dim) +
                              " is not a multiple of num_attention_heads " +
                              std::to_string(c.num_heads) + " and no head_dim is given");
    }
  }
  KVSPLIT_ASSIGN_OR_RETURN(c.head_dim, get_int(j, "head_dim", c.dim / c.num_heads, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, "vocab_size", std::nullopt, what));
  // transformers' per-architecture defaults when absent.
  const int64_t default_ctx =
      arch == Arch::kLlama ? 2048 : (arch == Arch::kMistral ? 131072 : 32768);
  KVSPLIT_ASSIGN_OR_RETURN(c.max_seq_len, get_int(j, "max_position_embeddings", default_ctx, what));
  KVSPLIT_ASSIGN_OR_RETURN(double eps, common::json_number(j, "rms_norm_eps", 1e-6, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.norm_eps, common::to_float_field(eps, "rms_norm_eps", what));
  KVSPLIT_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                           common::json_bool(j, "tie_word_embeddings", false, what));
  // The sizes before anything is allocated by them: a num_hidden_layers of 2e9 made a list of
  // 2e9 layer types (bad_alloc, abort) before validate_model_config refused it.
  KVSPLIT_RETURN_IF_ERROR(validate_model_sizes(c, what));
  KVSPLIT_ASSIGN_OR_RETURN(std::vector<std::string> layer_types,
                           parse_layer_types(j, what, arch, c.num_layers));
  // RoPE last among the sizes: it may extend max_seq_len (linear, yarn).
  KVSPLIT_RETURN_IF_ERROR(parse_hf_rope(j, what, layer_types, &c));
  KVSPLIT_ASSIGN_OR_RETURN(c.layer_window,
                           parse_layer_windows(j, what, arch, layer_types, c.max_seq_len));
  c.rope_style = backend::RopeStyle::kHalf;
  c.qkv_bias = arch == Arch::kQwen2;
  KVSPLIT_RETURN_IF_ERROR(
      parse_special_ids(j, what, arch == Arch::kQwen2, generation_text, generation_what, &c));
  KVSPLIT_RETURN_IF_ERROR(validate_model_config(c, what));
  return c;
}

}  // namespace kvsplit::model
