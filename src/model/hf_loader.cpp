// Hugging Face model directories: config.json (+ generation_config.json) and model.safetensors
// or model.safetensors.index.json with shards. Weights are views into the shard mappings.
#include <algorithm>
#include <filesystem>
#include <map>

#include "common/json_util.h"
#include "common/log.h"
#include "model/loader.h"
#include "model/safetensors.h"

namespace kvsplit::model {

namespace {

namespace fs = std::filesystem;
using common::Json;

constexpr const char* kSupportedArchs = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
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

Status parse_rope_scaling(const Json& j, const std::string& what, ModelConfig* c) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_object())
    return invalid_argument(what + ": 'rope_scaling' must be an object or null");
  const std::string sw = what + ": rope_scaling";
  std::string type;
  KVSPLIT_ASSIGN_OR_RETURN(type, common::json_string(*it, "rope_type", std::string(), sw));
  if (type.empty()) {
    KVSPLIT_ASSIGN_OR_RETURN(type, common::json_string(*it, "type", std::string("default"), sw));
  }
  if (type == "default") return ok_status();
  if (type != "llama3") {
    return unimplemented(what + ": rope_scaling type '" + type + "' is not supported (llama3)");
  }
  RopeScaling s;
  KVSPLIT_ASSIGN_OR_RETURN(double factor, common::json_number(*it, "factor", std::nullopt, sw));
  KVSPLIT_ASSIGN_OR_RETURN(double low,
                           common::json_number(*it, "low_freq_factor", std::nullopt, sw));
  KVSPLIT_ASSIGN_OR_RETURN(double high,
                           common::json_number(*it, "high_freq_factor", std::nullopt, sw));
  KVSPLIT_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                           get_int(*it, "original_max_position_embeddings", std::nullopt, sw));
  s.factor = static_cast<float>(factor);
  s.low_freq_factor = static_cast<float>(low);
  s.high_freq_factor = static_cast<float>(high);
  c->rope_scaling = s;
  return ok_status();
}

StatusOr<ModelConfig> parse_hf_config(const std::string& dir) {
  const std::string what = dir + "/config.json";
  KVSPLIT_ASSIGN_OR_RETURN(Json j, common::read_json_file(what));
  if (!j.is_object()) return invalid_argument(what + ": not a JSON object");
  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return invalid_argument(
        what + ": missing 'architectures' (supported: " + std::string(kSupportedArchs) + ")");
  }
  ModelConfig c;
  c.architecture = (*archs)[0].get<std::string>();
  const bool llama = c.architecture == "LlamaForCausalLM";
  const bool mistral = c.architecture == "MistralForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  if (!llama && !mistral && !qwen2) {
    return invalid_argument(what + ": unknown architecture " + c.architecture +
                            " (supported: " + kSupportedArchs + ")");
  }
  KVSPLIT_ASSIGN_OR_RETURN(std::string act, common::json_string(j, "hidden_act", "silu", what));
  if (act != "silu") return unimplemented(what + ": hidden_act '" + act + "' (supported: silu)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    KVSPLIT_ASSIGN_OR_RETURN(bool b, common::json_bool(j, key, false, what));
    if (b) return unimplemented(what + ": '" + key + "': true is not supported");
  }
  KVSPLIT_ASSIGN_OR_RETURN(c.dim, get_int(j, "hidden_size", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.hidden_dim, get_int(j, "intermediate_size", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.num_layers, get_int(j, "num_hidden_layers", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.num_heads, get_int(j, "num_attention_heads", std::nullopt, what));
  KVSPLIT_ASSIGN_OR_RETURN(c.num_kv_heads, get_int(j, "num_key_value_heads", c.num_heads, what));
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
  const int64_t default_ctx = llama ? 2048 : (mistral ? 131072 : 32768);
  KVSPLIT_ASSIGN_OR_RETURN(c.max_seq_len, get_int(j, "max_position_embeddings", default_ctx, what));
  KVSPLIT_ASSIGN_OR_RETURN(double eps, common::json_number(j, "rms_norm_eps", 1e-6, what));
  KVSPLIT_ASSIGN_OR_RETURN(double theta, common::json_number(j, "rope_theta", 10000.0, what));
  c.norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);
  KVSPLIT_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                           common::json_bool(j, "tie_word_embeddings", false, what));
  KVSPLIT_RETURN_IF_ERROR(parse_rope_scaling(j, what, &c));
  c.rope_style = backend::RopeStyle::kHalf;
  c.qkv_bias = qwen2;

  // Special ids: Llama/Mistral default to bos 1 / eos 2 (transformers); Qwen2 has no default.
  std::vector<int32_t> bos;
  KVSPLIT_RETURN_IF_ERROR(append_ids(j, "bos_token_id", what, &bos));
  KVSPLIT_RETURN_IF_ERROR(append_ids(j, "eos_token_id", what, &c.eos_token_ids));
  if (!j.contains("bos_token_id") && !qwen2) bos = {1};
  if (!j.contains("eos_token_id") && !qwen2) c.eos_token_ids = {2};
  const std::string gen_path = dir + "/generation_config.json";
  std::error_code ec;
  if (fs::exists(gen_path, ec)) {
    KVSPLIT_ASSIGN_OR_RETURN(Json g, common::read_json_file(gen_path));
    if (!g.is_object()) return invalid_argument(gen_path + ": not a JSON object");
    KVSPLIT_RETURN_IF_ERROR(append_ids(g, "eos_token_id", gen_path, &c.eos_token_ids));
    if (bos.empty()) KVSPLIT_RETURN_IF_ERROR(append_ids(g, "bos_token_id", gen_path, &bos));
  }
  c.bos_token_id = bos.empty() ? -1 : bos[0];

  if (mistral) {
    KVSPLIT_ASSIGN_OR_RETURN(int64_t window,
                             common::json_int(j, "sliding_window", int64_t{0}, what, 0, INT32_MAX));
    if (window > 0 && window < c.max_seq_len) {
      KVSPLIT_LOG_WARN(
          "{}: sliding_window {} < max_position_embeddings {}: no sliding-window "
          "attention here, context clamped to {}",
          what, window, c.max_seq_len, window);
      c.max_seq_len = static_cast<int>(window);
    }
  }
  KVSPLIT_RETURN_IF_ERROR(validate_model_config(c, what));
  return c;
}

// Every tensor of the checkpoint, from one file or from the shards of an index.
class TensorSource {
 public:
  Status open(const std::string& dir) {
    const std::string single = dir + "/model.safetensors";
    const std::string index = dir + "/model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(single, ec)) {
      where_ = single;
      KVSPLIT_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single));
      for (const auto& [name, e] : f.entries()) by_name_[name] = 0;
      files_.push_back(std::move(f));
      return ok_status();
    }
    if (!fs::exists(index, ec)) {
      return not_found(dir + ": no model.safetensors or model.safetensors.index.json");
    }
    where_ = index;
    KVSPLIT_ASSIGN_OR_RETURN(Json j, common::read_json_file(index));
    auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) {
      return invalid_argument(index + ": missing 'weight_map' object");
    }
    std::map<std::string, size_t> shard_ids;
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it.value().is_string()) {
        return invalid_argument(index + ": weight_map entry " + it.key() + " is not a file name");
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") {
        return invalid_argument(index + ": shard name '" + shard + "' must be a plain file name");
      }
      auto [sit, inserted] = shard_ids.emplace(shard, files_.size());
      if (inserted) {
        auto f = SafetensorsFile::open(dir + "/" + shard);
        if (!f.ok()) return f.status().with_prefix(index + ": shard " + shard);
        files_.push_back(std::move(f).value());
      }
      if (!files_[sit->second].contains(it.key())) {
        return invalid_argument(index + ": weight_map puts " + it.key() + " in " + shard +
                                ", which has no such tensor");
      }
      by_name_[it.key()] = sit->second;
    }
    return ok_status();
  }

  bool has(const std::string& name) const { return by_name_.count(name) != 0; }

  // The tensor, checked against `shape`; "missing tensor" / shape errors name the file.
  StatusOr<WeightTensor> get(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return invalid_argument(where_ + ": missing tensor " + name);
    const SafetensorsFile& f = files_[it->second];
    KVSPLIT_ASSIGN_OR_RETURN(WeightTensor t, f.tensor(name));
    if (t.shape != shape) {
      return invalid_argument(f.path() + ": tensor " + name + " has shape " + shape_str(t.shape) +
                              ", expected " + shape_str(shape) + " from config.json");
    }
    return t;
  }

  void keep_alive(ModelWeights* w) const {
    for (const auto& f : files_) w->storage.push_back(f.mapping());
  }

 private:
  std::string where_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> by_name_;
};

Status map_weights(const ModelConfig& c, const TensorSource& src, ModelWeights* w) {
  const int64_t dim = c.dim, hid = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  const int64_t vocab = c.vocab_size;
  KVSPLIT_ASSIGN_OR_RETURN(w->embedding, src.get("model.embed_tokens.weight", {vocab, dim}));
  w->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& lw = w->layers[l];
    KVSPLIT_ASSIGN_OR_RETURN(lw.attn_norm, src.get(p + "input_layernorm.weight", {dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.wq, src.get(p + "self_attn.q_proj.weight", {q, dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.wk, src.get(p + "self_attn.k_proj.weight", {kv, dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.wv, src.get(p + "self_attn.v_proj.weight", {kv, dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.wo, src.get(p + "self_attn.o_proj.weight", {dim, q}));
    if (c.qkv_bias) {
      KVSPLIT_ASSIGN_OR_RETURN(lw.bq, src.get(p + "self_attn.q_proj.bias", {q}));
      KVSPLIT_ASSIGN_OR_RETURN(lw.bk, src.get(p + "self_attn.k_proj.bias", {kv}));
      KVSPLIT_ASSIGN_OR_RETURN(lw.bv, src.get(p + "self_attn.v_proj.bias", {kv}));
    }
    KVSPLIT_ASSIGN_OR_RETURN(lw.ffn_norm, src.get(p + "post_attention_layernorm.weight", {dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.w_gate, src.get(p + "mlp.gate_proj.weight", {hid, dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.w_up, src.get(p + "mlp.up_proj.weight", {hid, dim}));
    KVSPLIT_ASSIGN_OR_RETURN(lw.w_down, src.get(p + "mlp.down_proj.weight", {dim, hid}));
  }
  KVSPLIT_ASSIGN_OR_RETURN(w->final_norm, src.get("model.norm.weight", {dim}));
  if (c.tie_word_embeddings) {
    // A tied checkpoint may still carry lm_head.weight (a copy); the embedding is authoritative.
    if (src.has("lm_head.weight"))
      KVSPLIT_RETURN_IF_ERROR(src.get("lm_head.weight", {vocab, dim}).status());
    w->lm_head = w->embedding;
  } else {
    KVSPLIT_ASSIGN_OR_RETURN(w->lm_head, src.get("lm_head.weight", {vocab, dim}));
  }
  src.keep_alive(w);
  return ok_status();
}

}  // namespace

StatusOr<LoadedModel> load_hf_dir(const std::string& dir, const LoadOptions& options) {
  LoadedModel m;
  KVSPLIT_ASSIGN_OR_RETURN(m.config, parse_hf_config(dir));
  TensorSource src;
  KVSPLIT_RETURN_IF_ERROR(src.open(dir));
  KVSPLIT_RETURN_IF_ERROR(map_weights(m.config, src, &m.weights));
  if (options.load_tokenizer) {
    std::string tok =
        options.tokenizer_path.empty() ? dir + "/tokenizer.json" : options.tokenizer_path;
    std::error_code ec;
    if (!fs::exists(tok, ec)) return not_found(tok + ": no tokenizer (pass a tokenizer path)");
    KVSPLIT_ASSIGN_OR_RETURN(m.tokenizer, load_tokenizer(tok, m.config.vocab_size));
  }
  m.source = "hf " + dir;
  KVSPLIT_LOG_INFO(
      "loaded {} ({}): dim {}, {} layers, {} heads ({} kv, head_dim {}), vocab {}, ctx {}",
      m.source, m.config.architecture, m.config.dim, m.config.num_layers, m.config.num_heads,
      m.config.num_kv_heads, m.config.head_dim, m.config.vocab_size, m.config.max_seq_len);
  return m;
}

}  // namespace kvsplit::model
