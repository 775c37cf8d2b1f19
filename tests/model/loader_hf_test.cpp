// HF directories built in a TempDir: single and sharded safetensors (f32/f16/bf16), Qwen2
// biases, config parsing, and every malformed case.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/loader.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::TempDir;
using nlohmann::json;

struct Tensor {
  std::string name;
  std::string dtype;  // F32, F16, BF16 (encoded here), or anything else (written as raw bytes)
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Values are multiples of 1/64 in [-2, 2): exact in f16 and bf16.
std::vector<float> values_for(size_t n, uint32_t salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(int((i * 37 + salt * 101) % 256) - 128) / 64.0f;
  return v;
}

uint16_t f32_to_f16_exact(float f) {  // for values exactly representable, normal range
  if (f == 0.0f) return 0;
  uint16_t sign = f < 0 ? 0x8000 : 0;
  float a = std::fabs(f);
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp16 = e - 1 + 15;
  uint16_t mant = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
  return sign | static_cast<uint16_t>(exp16 << 10) | mant;
}

float f16_to_f32(uint16_t h) {
  if ((h & 0x7fff) == 0) return 0.0f;
  int exp = (h >> 10) & 0x1f;
  float v = std::ldexp(1.0f + (h & 0x3ff) / 1024.0f, exp - 15);
  return (h & 0x8000) ? -v : v;
}

float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string encode(const Tensor& t) {
  std::string out;
  if (t.dtype == "F32") {
    out.resize(t.values.size() * 4);
    std::memcpy(out.data(), t.values.data(), out.size());
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    for (float v : t.values) {
      uint16_t h;
      if (t.dtype == "F16") {
        h = f32_to_f16_exact(v);
      } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        h = static_cast<uint16_t>(u >> 16);
      }
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  } else {
    out.assign(t.values.size(), '\x01');  // one byte per element (I8 / U8)
  }
  return out;
}

void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

// As the safetensors writer does: tensors back to back (they must tile the data section), the
// widest dtype first so every tensor stays aligned, the header padded with spaces to 8 bytes.
void write_safetensors(const std::string& path, std::vector<Tensor> ts) {
  std::stable_sort(ts.begin(), ts.end(), [](const Tensor& a, const Tensor& b) {
    return (a.dtype == "F32") > (b.dtype == "F32");
  });
  json h;
  h["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& t : ts) {
    std::string bytes = encode(t);
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  write_raw(path, header, data);
}

// Tiny model: dim 8, hidden 12, 2 layers, 2 heads / 1 kv head, head_dim 4, vocab 16, ctx 32.
json tiny_config(const std::string& arch = "LlamaForCausalLM") {
  return {{"architectures", {arch}},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"vocab_size", 16},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 500000.0},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"hidden_act", "silu"}};
}

std::vector<Tensor> tiny_tensors(const std::string& dtype, bool biases, bool lm_head) {
  std::vector<Tensor> ts;
  uint32_t salt = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    ts.push_back({name, dtype, shape, values_for(n, salt++)});
  };
  add("model.embed_tokens.weight", {16, 8});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {8});
    add(p + "self_attn.q_proj.weight", {8, 8});
    add(p + "self_attn.k_proj.weight", {4, 8});
    add(p + "self_attn.v_proj.weight", {4, 8});
    add(p + "self_attn.o_proj.weight", {8, 8});
    if (biases) {
      add(p + "self_attn.q_proj.bias", {8});
      add(p + "self_attn.k_proj.bias", {4});
      add(p + "self_attn.v_proj.bias", {4});
    }
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "mlp.gate_proj.weight", {12, 8});
    add(p + "mlp.up_proj.weight", {12, 8});
    add(p + "mlp.down_proj.weight", {8, 12});
  }
  add("model.norm.weight", {8});
  if (lm_head) add("lm_head.weight", {16, 8});
  return ts;
}

void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }

void write_model(const TempDir& dir, const json& config, const std::vector<Tensor>& ts) {
  write_json(dir.file("config.json"), config);
  write_safetensors(dir.file("model.safetensors"), ts);
}

LoadOptions no_tokenizer() {
  LoadOptions o;
  o.load_tokenizer = false;
  return o;
}

StatusOr<LoadedModel> load(const TempDir& dir) {
  return load_hf_dir(dir.path().string(), no_tokenizer());
}

void expect_error(const StatusOr<LoadedModel>& m, StatusCode code,
                  const std::vector<std::string>& needles) {
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status().to_string();
  for (const auto& n : needles) {
    EXPECT_NE(m.status().message().find(n), std::string::npos)
        << "'" << n << "' not in: " << m.status().message();
  }
}

float value_at(const WeightTensor& t, int64_t i) {
  const auto* p = static_cast<const uint16_t*>(t.data);
  switch (t.dtype) {
    case backend::DType::kF32:
      return static_cast<const float*>(t.data)[i];
    case backend::DType::kF16:
      return f16_to_f32(p[i]);
    case backend::DType::kBF16:
      return bf16_to_f32(p[i]);
  }
  return NAN;
}

const WeightTensor* find(const ModelWeights& w, const std::string& name) {
  if (name == "model.embed_tokens.weight") return &w.embedding;
  if (name == "model.norm.weight") return &w.final_norm;
  if (name == "lm_head.weight") return &w.lm_head;
  int l = name[13] - '0';
  const LayerWeights& lw = w.layers.at(l);
  const std::string s = name.substr(15);
  const std::map<std::string, const WeightTensor*> m = {
      {"input_layernorm.weight", &lw.attn_norm},
      {"self_attn.q_proj.weight", &lw.wq},
      {"self_attn.k_proj.weight", &lw.wk},
      {"self_attn.v_proj.weight", &lw.wv},
      {"self_attn.o_proj.weight", &lw.wo},
      {"self_attn.q_proj.bias", &lw.bq},
      {"self_attn.k_proj.bias", &lw.bk},
      {"self_attn.v_proj.bias", &lw.bv},
      {"post_attention_layernorm.weight", &lw.ffn_norm},
      {"mlp.gate_proj.weight", &lw.w_gate},
      {"mlp.up_proj.weight", &lw.w_up},
      {"mlp.down_proj.weight", &lw.w_down}};
  return m.at(s);
}

void expect_values(const ModelWeights& w, const std::vector<Tensor>& ts) {
  for (const auto& t : ts) {
    const WeightTensor* wt = find(w, t.name);
    ASSERT_TRUE(wt->present()) << t.name;
    ASSERT_EQ(wt->shape, t.shape) << t.name;
    for (size_t i = 0; i < t.values.size(); ++i) {
      ASSERT_EQ(value_at(*wt, i), t.values[i]) << t.name << "[" << i << "]";
    }
  }
}

TEST(LoaderHf, SingleFileF32) {
  TempDir dir;
  auto ts = tiny_tensors("F32", false, true);
  write_model(dir, tiny_config(), ts);
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_style, backend::RopeStyle::kHalf);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2}));
  expect_values(m->weights, ts);
  EXPECT_NE(m->weights.lm_head.data, m->weights.embedding.data);
}

TEST(LoaderHf, ShardedF16Bf16RoundTrip) {
  TempDir dir;
  auto ts = tiny_tensors("F16", false, true);
  for (size_t i = 0; i < ts.size(); i += 2) ts[i].dtype = "BF16";  // mixed dtypes
  std::vector<Tensor> a(ts.begin(), ts.begin() + ts.size() / 2),
      b(ts.begin() + ts.size() / 2, ts.end());
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), a);
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), b);
  json map;
  for (const auto& t : a) map[t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) map[t.name] = "model-00002-of-00002.safetensors";
  write_json(dir.file("model.safetensors.index.json"),
             {{"metadata", {{"total_size", 0}}}, {"weight_map", map}});
  write_json(dir.file("config.json"), tiny_config());
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->weights.embedding.dtype, backend::DType::kBF16);
  EXPECT_EQ(m->weights.layers[0].attn_norm.dtype, backend::DType::kF16);
  expect_values(m->weights, ts);
  EXPECT_EQ(m->weights.storage.size(), 4u);  // both shard mappings and their aligned copies
}

TEST(LoaderHf, Qwen2Biases) {
  TempDir dir;
  auto ts = tiny_tensors("F32", true, false);
  json cfg = tiny_config("Qwen2ForCausalLM");
  cfg["tie_word_embeddings"] = true;
  cfg.erase("bos_token_id");
  write_model(dir, cfg, ts);
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->config.qkv_bias);
  EXPECT_EQ(m->config.bos_token_id, -1);  // Qwen2 has no default BOS
  EXPECT_EQ(m->weights.layers[1].bk.shape, (std::vector<int64_t>{4}));
  expect_values(m->weights, ts);
  EXPECT_EQ(m->weights.lm_head.data, m->weights.embedding.data);  // tied and absent

  TempDir nobias;
  write_model(nobias, cfg, tiny_tensors("F32", false, false));
  expect_error(load(nobias), StatusCode::kInvalidArgument,
               {"model.safetensors", "missing tensor model.layers.0.self_attn.q_proj.bias"});
}

TEST(LoaderHf, TiedWithLmHeadUsesEmbedding) {
  TempDir dir;
  json cfg = tiny_config();
  cfg["tie_word_embeddings"] = true;
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->weights.lm_head.data, m->weights.embedding.data);
}

TEST(LoaderHf, UntiedWithoutLmHead) {
  TempDir dir;
  write_model(dir, tiny_config(), tiny_tensors("F32", false, false));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "missing tensor lm_head.weight"});
}

// Weights config.json gives the model no place for are an error naming them (they loaded, and
// the model ran without them: a checkpoint of 5 layers with num_hidden_layers 4 gave wrong tokens
// with exit 0). Known buffers pass; other unknown names pass with one warning naming them.
TEST(LoaderHf, TensorsTheConfigDoesNotUse) {
  TempDir layers;
  json cfg = tiny_config();
  cfg["num_hidden_layers"] = 1;
  write_model(layers, cfg, tiny_tensors("F32", false, true));
  expect_error(
      load(layers), StatusCode::kInvalidArgument,
      {layers.file("model.safetensors"), "9 weight tensors",
       "(num_hidden_layers 1, no q/k/v biases); config.json and the weights disagree",
       "model.layers.1.input_layernorm.weight, model.layers.1.mlp.down_proj.weight", "and 5 more"});

  for (const char* stray : {"model.layers.0.self_attn.q_proj.bias", "lm_head.bias"}) {
    TempDir dir;
    auto ts = tiny_tensors("F32", false, true);
    ts.push_back({stray, "F32", {8}, values_for(8, 99)});
    write_model(dir, tiny_config(), ts);
    expect_error(load(dir), StatusCode::kInvalidArgument,
                 {"1 weight tensors", std::string("does not use (num_hidden_layers 2, no q/k/v "
                                                  "biases); config.json and the weights "
                                                  "disagree: ") +
                                          stray});
  }

  std::ostringstream log;
  struct RestoreLogger {
    std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
    ~RestoreLogger() { spdlog::set_default_logger(saved); }
  } restore;
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "loader_hf_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  TempDir buffers;
  auto ts = tiny_tensors("F32", false, true);
  ts.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, values_for(2, 98)});
  write_model(buffers, tiny_config(), ts);
  ASSERT_TRUE(load(buffers).ok());
  EXPECT_EQ(log.str().find("[warning]"), std::string::npos) << log.str();
  TempDir unknown;
  ts.push_back({"model.extra.foo", "F32", {2}, values_for(2, 97)});
  write_model(unknown, tiny_config(), ts);
  auto m = load(unknown);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_values(m->weights, tiny_tensors("F32", false, true));
  EXPECT_NE(log.str().find(unknown.file("model.safetensors") +
                           ": 1 tensors unknown to the model, not used: model.extra.foo"),
            std::string::npos)
      << log.str();
}

TEST(LoaderHf, MissingTensor) {
  TempDir dir;
  auto ts = tiny_tensors("F32", false, true);
  std::erase_if(ts, [](const Tensor& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; });
  write_model(dir, tiny_config(), ts);
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {"model.safetensors", "missing tensor model.layers.1.mlp.up_proj.weight"});
}

TEST(LoaderHf, WrongShape) {
  TempDir dir;
  auto ts = tiny_tensors("F32", false, true);
  for (auto& t : ts) {
    if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {8, 4};
  }
  write_model(dir, tiny_config(), ts);
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {"model.safetensors", "model.layers.0.self_attn.k_proj.weight", "shape [8, 4]",
                "expected [4, 8]"});
}

TEST(LoaderHf, ExplicitHeadDim) {
  TempDir dir;
  json cfg = tiny_config();
  cfg["head_dim"] = 6;  // q_dim 12, kv_dim 6 != hidden_size
  auto ts = tiny_tensors("F32", false, true);
  for (auto& t : ts) {
    auto set = [&](std::vector<int64_t> s) {
      t.shape = s;
      t.values = values_for(s[0] * s[1], 1);
    };
    if (t.name.find("q_proj.weight") != std::string::npos) set({12, 8});
    if (t.name.find("k_proj.weight") != std::string::npos) set({6, 8});
    if (t.name.find("v_proj.weight") != std::string::npos) set({6, 8});
    if (t.name.find("o_proj.weight") != std::string::npos) set({8, 12});
  }
  write_model(dir, cfg, ts);
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.head_dim, 6);
  EXPECT_EQ(m->config.q_dim(), 12);
  expect_values(m->weights, ts);
}

TEST(LoaderHf, UnknownArchitecture) {
  TempDir dir;
  write_model(dir, tiny_config("GPT2LMHeadModel"), tiny_tensors("F32", false, true));
  expect_error(
      load(dir), StatusCode::kInvalidArgument,
      {dir.file("config.json"), "unknown architecture GPT2LMHeadModel", "LlamaForCausalLM"});
}

// No `architectures` (a config saved from LlamaConfig): model_type names the causal LM.
TEST(LoaderHf, ModelTypeStandsInForMissingArchitectures) {
  TempDir dir;
  json cfg = tiny_config();
  cfg.erase("architectures");
  cfg["model_type"] = "llama";
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.architecture, "LlamaForCausalLM");
  cfg["model_type"] = "gpt2";
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("config.json"), "no 'architectures', and model_type 'gpt2'"});
  cfg.erase("model_type");
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  expect_error(load(dir), StatusCode::kInvalidArgument, {"model_type ''", "LlamaForCausalLM"});
  // Both given: they must agree, as transformers builds model_type's class (a Mistral label on a
  // llama config ran with Mistral's default window here, with full attention there).
  cfg["architectures"] = {"MistralForCausalLM"};
  cfg["model_type"] = "llama";
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  expect_error(
      load(dir), StatusCode::kInvalidArgument,
      {dir.file("config.json"), "model_type 'llama' (transformers builds LlamaForCausalLM)",
       "disagrees with architectures[0] MistralForCausalLM"});
  cfg["model_type"] = "llama4";
  cfg["architectures"] = {"LlamaForCausalLM"};
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {"model_type 'llama4' (none of llama, mistral, qwen2)", "LlamaForCausalLM"});
  cfg["architectures"] = {"LlamaForSequenceClassification"};  // unknown, not a disagreement
  cfg["model_type"] = "llama";
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {"unknown architecture LlamaForSequenceClassification"});
  cfg["architectures"] = {"LlamaForCausalLM"};
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  ASSERT_TRUE(load(dir).ok());
  cfg.erase("model_type");
  cfg["architectures"] = "LlamaForCausalLM";  // not a list
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  expect_error(load(dir), StatusCode::kInvalidArgument, {"'architectures' must be a list"});
}

TEST(LoaderHf, BadJsonConfig) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), tiny_tensors("F32", false, true));
  std::ofstream(dir.file("config.json")) << "{\"hidden_size\": 8,";
  expect_error(load(dir), StatusCode::kInvalidArgument, {dir.file("config.json"), "bad JSON"});
}

TEST(LoaderHf, BadConfigValues) {
  struct Case {
    const char* key;
    json value;
    std::string needle;
  };
  const Case cases[] = {
      {"hidden_size", "8", "'hidden_size' must be an integer"},
      {"num_attention_heads", 0, "'num_attention_heads' = 0 out of range"},
      {"num_key_value_heads", 3, "not a multiple of num_kv_heads"},
      {"vocab_size", nullptr, "missing field 'vocab_size'"},
      {"tie_word_embeddings", "yes", "'tie_word_embeddings' must be true or false"},
      {"eos_token_id", "x", "'eos_token_id' must be token ids"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    TempDir dir;
    json cfg = tiny_config();
    cfg[c.key] = c.value;
    write_model(dir, cfg, tiny_tensors("F32", false, true));
    expect_error(load(dir), StatusCode::kInvalidArgument, {dir.file("config.json"), c.needle});
  }
}

TEST(LoaderHf, RopeScaling) {
  TempDir dir;
  json cfg = tiny_config();
  cfg["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(m->config.rope_scaling.has_value());
  EXPECT_EQ(m->config.rope_scaling->type, RopeType::kLlama3);
  EXPECT_FLOAT_EQ(m->config.rope_scaling->factor, 8.0f);
  EXPECT_FLOAT_EQ(m->config.rope_scaling->high_freq_factor, 4.0f);
  EXPECT_EQ(m->config.rope_scaling->original_max_position_embeddings, 8192);
  // tests/model/hf_config_test.cpp covers both config forms, every type and every error.
}

// transformers' generate() stops on the generation config's eos_token_id when the file has one.
TEST(LoaderHf, GenerationConfigEosReplacesTheConfigs) {
  TempDir dir;
  json cfg = tiny_config();
  cfg["eos_token_id"] = {2, 5};
  write_model(dir, cfg, tiny_tensors("F32", false, true));
  write_json(dir.file("generation_config.json"), {{"eos_token_id", {5, 7}}, {"bos_token_id", 1}});
  auto m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.eos_token_ids, (std::vector<int32_t>{5, 7}));
  write_json(dir.file("generation_config.json"), {{"bos_token_id", 1}});  // no key: config's
  m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->config.eos_token_ids, (std::vector<int32_t>{2, 5}));
  write_json(dir.file("generation_config.json"), {{"eos_token_id", nullptr}});  // none
  m = load(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->config.eos_token_ids.empty());
  std::ofstream(dir.file("generation_config.json")) << "[";
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("generation_config.json"), "bad JSON"});
}

TEST(LoaderHf, BadSafetensorsHeaderJson) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  write_raw(dir.file("model.safetensors"), "{\"a\": {\"dtype\": ", std::string(64, '\0'));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "bad JSON"});
  // One tensor named twice: refused, not the last entry taken.
  const std::string entry = R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  write_raw(dir.file("model.safetensors"), "{\"a\": " + entry + ", \"a\": " + entry + "}",
            std::string(4, '\0'));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "duplicate key 'a'"});
}

TEST(LoaderHf, HeaderLengthPastEof) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  {
    uint64_t n = 4096;
    std::ofstream out(dir.file("model.safetensors"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "header length 4096 runs past the end"});
  std::ofstream(dir.file("model.safetensors"), std::ios::binary) << "abc";
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "truncated"});
}

TEST(LoaderHf, TruncatedData) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  write_safetensors(dir.file("model.safetensors"), tiny_tensors("F32", false, true));
  std::filesystem::resize_file(dir.file("model.safetensors"),
                               std::filesystem::file_size(dir.file("model.safetensors")) - 16);
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "lm_head.weight", "outside the data section"});
}

TEST(LoaderHf, OffsetsDisagreeWithShape) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  json h = {{"model.norm.weight", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {0, 16}}}}};
  write_raw(dir.file("model.safetensors"), h.dump(), std::string(32, '\0'));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors"), "model.norm.weight", "span 16 bytes", "needs 32"});
  h = {{"model.norm.weight", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {32, 0}}}}};
  write_raw(dir.file("model.safetensors"), h.dump(), std::string(32, '\0'));
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {"model.norm.weight", "data_offsets [32, 0]"});
}

TEST(LoaderHf, UnsupportedDtype) {
  TempDir dir;
  auto ts = tiny_tensors("F32", false, true);
  for (auto& t : ts) {
    if (t.name == "model.layers.1.self_attn.v_proj.weight") t.dtype = "I8";
  }
  write_model(dir, tiny_config(), ts);
  expect_error(
      load(dir), StatusCode::kUnimplemented,
      {dir.file("model.safetensors"), "model.layers.1.self_attn.v_proj.weight", "dtype I8"});
  json h = {{"x", {{"dtype", "Q4_K"}, {"shape", {2}}, {"data_offsets", {0, 2}}}}};
  write_raw(dir.file("model.safetensors"), h.dump(), "ab");
  expect_error(load(dir), StatusCode::kUnimplemented, {"tensor x", "dtype Q4_K"});
}

TEST(LoaderHf, ShardIndexErrors) {
  TempDir dir;
  auto ts = tiny_tensors("F32", false, true);
  write_json(dir.file("config.json"), tiny_config());
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), ts);
  json map;
  for (const auto& t : ts) map[t.name] = "model-00001-of-00002.safetensors";
  map["lm_head.weight"] = "model-00002-of-00002.safetensors";  // never written
  write_json(dir.file("model.safetensors.index.json"), {{"weight_map", map}});
  expect_error(load(dir), StatusCode::kNotFound,
               {dir.file("model.safetensors.index.json"), "model-00002-of-00002.safetensors"});

  map["lm_head.weight"] = "../elsewhere.safetensors";
  write_json(dir.file("model.safetensors.index.json"), {{"weight_map", map}});
  expect_error(load(dir), StatusCode::kInvalidArgument, {"must be a plain file name"});

  std::ofstream(dir.file("model.safetensors.index.json")) << "{\"weight_map\": {";
  expect_error(load(dir), StatusCode::kInvalidArgument,
               {dir.file("model.safetensors.index.json"), "bad JSON"});

  write_json(dir.file("model.safetensors.index.json"), {{"metadata", {}}});
  expect_error(load(dir), StatusCode::kInvalidArgument, {"missing 'weight_map'"});
}

TEST(LoaderHf, NoWeightsOrTokenizer) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  expect_error(load(dir), StatusCode::kNotFound, {"no model.safetensors"});
  write_safetensors(dir.file("model.safetensors"), tiny_tensors("F32", false, true));
  expect_error(load_hf_dir(dir.path().string(), LoadOptions{}), StatusCode::kNotFound,
               {dir.file("tokenizer.json")});
}

TEST(Safetensors, TensorLookup) {
  TempDir dir;
  write_safetensors(dir.file("a.safetensors"), {{"w", "BF16", {2, 3}, values_for(6, 9)}});
  auto f = SafetensorsFile::open(dir.file("a.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->contains("w"));
  auto t = f->tensor("w");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, backend::DType::kBF16);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(value_at(*t, 5), values_for(6, 9)[5]);
  EXPECT_EQ(f->tensor("nope").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvsplit::model
