// Hugging Face model directories: config.json (+ generation_config.json) and model.safetensors
// or model.safetensors.index.json with shards. Weights are views into the shard mappings.
#include <algorithm>
#include <filesystem>
#include <map>

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
    for (const auto& f : files_) {
      w->storage.push_back(f.mapping());
      w->storage.push_back(f.copies());
    }
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
