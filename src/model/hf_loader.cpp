// Hugging Face model directories: config.json (+ generation_config.json) and model.safetensors
// or model.safetensors.index.json with shards. Weights are views into the shard mappings.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include "common/json_util.h"
#include "common/log.h"
#include "model/hf_config.h"
#include "model/loader.h"
#include "model/safetensors.h"

namespace kvsplit::model {

namespace {

namespace fs = std::filesystem;
using common::Json;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The first few of `names` and how many more: "a, b, c, d and 5 more".
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 4;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

// A buffer transformers may save beside the weights that holds no parameter: older Llama
// checkpoints' RoPE frequencies, which the model recomputes from config.json.
bool is_buffer(std::string_view name) { return name.ends_with(".rotary_emb.inv_freq"); }

// A name in the namespace of the weights map_weights reads (a layer, the embedding, the final
// norm, the LM head): left unused, it is a weight the config gives the model no place for.
bool is_model_weight(std::string_view name) {
  return name.starts_with("model.layers.") || name.starts_with("model.embed_tokens.") ||
         name.starts_with("model.norm.") || name.starts_with("lm_head.");
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

  // The tensor, checked against `shape`, and marked used; "missing tensor" / shape errors name
  // the file.
  StatusOr<WeightTensor> get(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return invalid_argument(where_ + ": missing tensor " + name);
    used_.insert(name);
    const SafetensorsFile& f = files_[it->second];
    KVSPLIT_ASSIGN_OR_RETURN(WeightTensor t, f.tensor(name));
    if (t.shape != shape) {
      return invalid_argument(f.path() + ": tensor " + name + " has shape " + shape_str(t.shape) +
                              ", expected " + shape_str(shape) + " from config.json");
    }
    return t;
  }

  // After every get(): the tensors nothing read. Weights the config has no place for (a layer at
  // or past num_hidden_layers, a bias the architecture has none of) are kInvalidArgument naming
  // them, as the model would run without them (transformers only warns "Some weights of the model
  // checkpoint were not used"); known buffers pass; any other name is one warning.
  Status check_all_used(const ModelConfig& c) const {
    std::vector<std::string> weights, other;
    for (const auto& [name, shard] : by_name_) {
      if (used_.count(name) != 0 || is_buffer(name)) continue;
      (is_model_weight(name) ? weights : other).push_back(name);
    }
    if (!weights.empty()) {
      return invalid_argument(where_ + ": " + std::to_string(weights.size()) +
                              " weight tensors that config.json's model does not use "
                              "(num_hidden_layers " +
                              std::to_string(c.num_layers) + ", " +
                              (c.qkv_bias ? "q/k/v biases" : "no q/k/v biases") +
                              "); config.json and the weights disagree: " + name_list(weights));
    }
    if (!other.empty()) {
      KVSPLIT_LOG_WARN("{}: {} tensors unknown to the model, not used: {}", where_, other.size(),
                       name_list(other));
    }
    return ok_status();
  }

  void keep_alive(ModelWeights* w) const {
    for (const auto& f : files_) {
      w->storage.push_back(f.mapping());
      w->storage.push_back(f.copies());
    }
  }

 private:
  std::string where_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> by_name_;
  std::set<std::string> used_;  // the names get() found
};

Status map_weights(const ModelConfig& c, TensorSource& src, ModelWeights* w) {
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
  KVSPLIT_RETURN_IF_ERROR(src.check_all_used(c));
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
