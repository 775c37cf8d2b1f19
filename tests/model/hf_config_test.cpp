// parse_hf_config on config.json files written into a TempDir: both RoPE forms (rope_parameters,
// rope_theta + rope_scaling), every RoPE type, the context rule, and each unsupported field's
// error naming the file, the field and the value; parse_hf_config_json on text.
#include "model/hf_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::TempDir;
using nlohmann::json;

// dim 64, 2 layers, 4 heads / 2 kv heads, head_dim 16, vocab 32, ctx 32; no RoPE fields.
json base_config(const std::string& arch = "LlamaForCausalLM") {
  return {{"architectures", {arch}},  {"hidden_size", 64},
          {"intermediate_size", 96},  {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 32},         {"max_position_embeddings", 32}};
}

StatusOr<ModelConfig> parse(const json& cfg, std::string* path = nullptr) {
  TempDir dir;
  std::ofstream(dir.file("config.json")) << cfg.dump(2);
  if (path) *path = dir.file("config.json");
  return parse_hf_config(dir.path().string());
}

ModelConfig parse_ok(const json& cfg) {
  auto c = parse(cfg);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : ModelConfig{};
}

void expect_error(const json& cfg, StatusCode code, const std::string& needle) {
  std::string path;
  auto c = parse(cfg, &path);
  ASSERT_FALSE(c.ok()) << needle;
  EXPECT_EQ(c.status().code(), code) << c.status().to_string();
  EXPECT_EQ(c.status().message().rfind(path + ": ", 0), 0u) << c.status().message();
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "'" << needle << "' not in: " << c.status().message();
}

TEST(HfConfigRope, NoRopeFieldsIsPlainTheta10000) {
  ModelConfig c = parse_ok(base_config());
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.max_seq_len, 32);
}

TEST(HfConfigRope, BothFormsGiveTheSameConfig) {
  json v5 = base_config();  // transformers >= 5
  v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                           {"factor", 8.0},           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  json v4 = base_config();  // earlier: rope_theta + rope_scaling, `type` spelling
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = {{"type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 16}};
  for (const json& cfg : {v5, v4}) {
    ModelConfig c = parse_ok(cfg);
    EXPECT_EQ(c.rope_theta, 500000.0f);
    ASSERT_TRUE(c.rope_scaling.has_value());
    EXPECT_EQ(c.rope_scaling->type, RopeType::kLlama3);
    EXPECT_EQ(c.rope_scaling->factor, 8.0);
    EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 16);
    EXPECT_EQ(c.max_seq_len, 32);  // llama3: max_position_embeddings is the extended length
  }
  // Both forms at once: fine while they agree.
  json both = v5;
  both["rope_theta"] = 500000;
  both["rope_scaling"] = v4["rope_scaling"];
  EXPECT_EQ(parse_ok(both).rope_theta, 500000.0f);
}

TEST(HfConfigRope, FormsThatDisagreeNameBothFields) {
  json cfg = base_config();
  cfg["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  cfg["rope_theta"] = 10000.0;
  expect_error(cfg, StatusCode::kInvalidArgument,
               "rope_parameters.rope_theta = 1000000.0 disagrees with rope_theta = 10000.0");
  cfg.erase("rope_theta");
  cfg["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  expect_error(cfg, StatusCode::kInvalidArgument,
               "rope_parameters.rope_type = \"default\" disagrees with rope_scaling.type = "
               "\"linear\"");
  cfg = base_config();
  cfg["rope_scaling"] = {{"type", "linear"}, {"rope_type", "dynamic"}, {"factor", 2.0}};
  expect_error(cfg, StatusCode::kInvalidArgument, "disagrees with rope_scaling.type = \"linear\"");
  cfg = base_config();
  cfg["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 8}};
  cfg["original_max_position_embeddings"] = 16;
  expect_error(cfg, StatusCode::kInvalidArgument,
               "rope_scaling.original_max_position_embeddings = 8 disagrees with "
               "original_max_position_embeddings = 16");
}

TEST(HfConfigRope, PerLayerTypeParameters) {
  json cfg = base_config();
  cfg["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}}};
  EXPECT_EQ(parse_ok(cfg).rope_theta, 1e6f);
  // An entry for a layer type no layer uses is ignored.
  cfg["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_FALSE(parse_ok(cfg).rope_scaling.has_value());
  // Layers of two types with different RoPE: not supported.
  json qwen = base_config("Qwen2ForCausalLM");
  qwen["layer_types"] = {"full_attention", "sliding_attention"};
  qwen["rope_parameters"] = cfg["rope_parameters"];
  expect_error(qwen, StatusCode::kUnimplemented,
               "rope_parameters.full_attention = {\"rope_theta\":1000000.0,\"rope_type\":"
               "\"default\"} and rope_parameters.sliding_attention = {\"factor\":2.0,"
               "\"rope_type\":\"linear\"} differ: one RoPE for all layers is supported");
  qwen["rope_parameters"]["sliding_attention"] = qwen["rope_parameters"]["full_attention"];
  EXPECT_EQ(parse_ok(qwen).rope_theta, 1e6f);
  cfg["rope_parameters"].erase("full_attention");
  expect_error(cfg, StatusCode::kInvalidArgument,
               "rope_parameters is keyed by layer type but has no entry for 'full_attention'");
  cfg["rope_parameters"]["full_attention"] = nullptr;
  expect_error(cfg, StatusCode::kUnimplemented, "rope_parameters.full_attention = null");
  cfg["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}, {"rope_theta", 1e4}};
  expect_error(cfg, StatusCode::kInvalidArgument,
               "rope_parameters mixes per-layer-type entries with the plain field 'rope_theta'");
}

// transformers reads a legacy rope_scaling keyed by layer type as rope_parameters: its scaling
// applies (it was stored as unknown fields and plain RoPE ran, silently).
TEST(HfConfigRope, PerLayerTypeRopeScaling) {
  json cfg = base_config();
  cfg["rope_scaling"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}};
  const ModelConfig c = parse_ok(cfg);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, RopeType::kLinear);
  EXPECT_EQ(c.rope_scaling->factor, 2.0);
  cfg["rope_scaling"] = {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}};
  expect_error(cfg, StatusCode::kInvalidArgument,
               "rope_scaling is keyed by layer type but has no entry for 'full_attention'");
}

TEST(HfConfigRope, EveryTypeAndItsContext) {
  json cfg = base_config();
  cfg["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 10000.0}, {"factor", 2.5}};
  ModelConfig c = parse_ok(cfg);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, RopeType::kLinear);
  EXPECT_EQ(c.max_seq_len, 80);  // linear: max_position_embeddings x factor

  cfg["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  c = parse_ok(cfg);
  EXPECT_EQ(c.rope_scaling->type, RopeType::kDynamic);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 32);
  EXPECT_EQ(c.max_seq_len, 32);  // dynamic: unscaled, exactly HF within max_position_embeddings
  ModelConfig plain = c;
  plain.rope_scaling.reset();
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(plain));

  cfg["rope_parameters"] = {{"rope_type", "yarn"},
                            {"factor", 4.0},
                            {"original_max_position_embeddings", 16},
                            {"beta_fast", 16},
                            {"beta_slow", 2},
                            {"mscale", 1.0},
                            {"mscale_all_dim", 0.5},
                            {"attention_factor", 1.25},
                            {"truncate", false}};
  c = parse_ok(cfg);
  const RopeScaling& y = *c.rope_scaling;
  EXPECT_EQ(y.type, RopeType::kYarn);
  EXPECT_EQ(y.original_max_position_embeddings, 16);
  EXPECT_EQ(y.beta_fast, 16.0);
  EXPECT_EQ(y.beta_slow, 2.0);
  EXPECT_EQ(y.mscale, 1.0);
  EXPECT_EQ(y.mscale_all_dim, 0.5);
  EXPECT_EQ(y.attention_factor, 1.25);
  EXPECT_FALSE(y.truncate);
  EXPECT_EQ(c.max_seq_len, 64);  // yarn: original x factor
  EXPECT_EQ(rope_attention_factor(c), 1.25f);
  // HF reads truncate with get("truncate", True) and tests it for truth: an explicit null is
  // false, an absent key true.
  cfg["rope_parameters"]["truncate"] = nullptr;
  EXPECT_FALSE(parse_ok(cfg).rope_scaling->truncate);
  cfg["rope_parameters"].erase("truncate");
  EXPECT_TRUE(parse_ok(cfg).rope_scaling->truncate);

  // yarn without a factor: max_position_embeddings / original (HF, DeepSeek-V3 configs). The
  // inverse frequencies are HF's "yarn_factor_from_lengths" case of tests/model/rope_reference.py.
  cfg = base_config();
  cfg["max_position_embeddings"] = 8192;
  cfg["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", nullptr}, {"original_max_position_embeddings", 2048}};
  c = parse_ok(cfg);
  EXPECT_EQ(c.rope_scaling->factor, 4.0);
  EXPECT_EQ(c.max_seq_len, 8192);
  const float hf[8] = {1,
                       0.316227764f,
                       0.100000001f,
                       0.025693506f,
                       0.00624999963f,
                       0.00138349656f,
                       0.000250000012f,
                       7.90569466e-05f};
  const std::vector<float> f = rope_inv_freq(c);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(f[i], hf[i]) << i;
  EXPECT_EQ(rope_attention_factor(c), static_cast<float>(1.138629436111989));

  // yarn: a max_position_embeddings already past original x factor is kept.
  cfg["rope_scaling"]["factor"] = 2.0;
  EXPECT_EQ(parse_ok(cfg).max_seq_len, 8192);
  // llama3 without original_max_position_embeddings: max_position_embeddings (HF default).
  cfg["rope_scaling"] = {
      {"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 1}, {"high_freq_factor", 4}};
  EXPECT_EQ(parse_ok(cfg).rope_scaling->original_max_position_embeddings, 8192);
  // "default" in rope_scaling is plain RoPE; theta from the top level.
  cfg["rope_scaling"] = {{"type", "default"}};
  cfg["rope_theta"] = 250000;
  c = parse_ok(cfg);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_theta, 250000.0f);
}

TEST(HfConfigRope, Errors) {
  struct Case {
    json rope_parameters;  // null: not written
    json rope_scaling;     // null: not written
    StatusCode code;
    std::string needle;
  };
  const auto unimpl = StatusCode::kUnimplemented;
  const auto invalid = StatusCode::kInvalidArgument;
  const Case cases[] = {
      {nullptr,
       {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}},
       unimpl,
       "rope_scaling.type = 'longrope' is not supported (supported: default, linear, dynamic, "
       "llama3, yarn)"},
      {{{"rope_type", "su"}}, nullptr, unimpl, "rope_parameters.rope_type = 'su' is not supported"},
      {{{"rope_type", "proportional"}}, nullptr, unimpl, "rope_type = 'proportional'"},
      {{{"rope_type", 3}}, nullptr, invalid, "rope_parameters.rope_type must be a string, got 3"},
      {{{"rope_type", "linear"}}, nullptr, invalid, "missing field rope_parameters.factor"},
      {nullptr,
       {{"rope_type", "llama3"}, {"factor", 8.0}},
       invalid,
       "missing field rope_scaling.low_freq_factor"},
      {{{"rope_type", "dynamic"}, {"factor", "2"}},
       nullptr,
       invalid,
       "rope_parameters.factor must be a number, got \"2\""},
      {{{"rope_type", "linear"}, {"factor", 0.5}},
       nullptr,
       invalid,
       "rope linear: factor = 0.5 must be finite and >= 1"},
      {{{"rope_type", "linear"}, {"factor", 1e9}},
       nullptr,
       invalid,
       "rope linear factor 1000000000 gives a context of 32000000000 positions, more than "
       "16777216"},
      {{{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 8.5}},
       nullptr,
       invalid,
       "rope_parameters.original_max_position_embeddings must be a positive integer, got 8.5"},
      {{{"rope_type", "yarn"}, {"factor", 4}, {"truncate", "no"}},
       nullptr,
       invalid,
       "rope_parameters.truncate must be true or false"},
      {{{"rope_type", "default"}, {"partial_rotary_factor", 0.5}},
       nullptr,
       unimpl,
       "rope_parameters.partial_rotary_factor = 0.5: partial rotary embedding is not supported"},
      {"theta", nullptr, invalid, "'rope_parameters' must be an object or null, got \"theta\""},
      {nullptr, {1, 2}, invalid, "'rope_scaling' must be an object or null, got [1,2]"},
      {{{"rope_theta", 0.5}}, nullptr, invalid, "rope_theta = 0.500000 must be finite and > 1"},
      // Beyond a float: the conversion was undefined behaviour before the range check.
      {{{"rope_theta", 1e300}},
       nullptr,
       invalid,
       "rope_parameters.rope_theta = 1e+300 is outside the range of a float"},
      // An attention factor (or its square, the logits' scale) beyond a float: accepted, it
      // became inf in rope_attention_factor (fuzz/hf_config_fuzz.cpp checks it stays finite).
      {{{"rope_type", "yarn"}, {"factor", 2}, {"attention_factor", 1e39}},
       nullptr,
       invalid,
       "rope yarn: attention_factor = 1e+39 gives an attention factor of 1e+39: it and its square "
       "must be normal floats"},
      {{{"rope_type", "yarn"}, {"factor", 2}, {"attention_factor", 1e20}},
       nullptr,
       invalid,
       "attention_factor = 1e+20 gives"},
      {{{"rope_type", "yarn"}, {"factor", 2}, {"attention_factor", 1e-20}},
       nullptr,
       invalid,
       "attention_factor = 1e-20 gives"},
      {{{"rope_type", "yarn"}, {"factor", 2}, {"mscale", 1e300}, {"mscale_all_dim", 1e-300}},
       nullptr,
       invalid,
       "rope yarn: mscale = 1e+300 gives an attention factor of 6.931471806e+298"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.needle);
    json cfg = base_config();
    if (!k.rope_parameters.is_null()) cfg["rope_parameters"] = k.rope_parameters;
    if (!k.rope_scaling.is_null()) cfg["rope_scaling"] = k.rope_scaling;
    expect_error(cfg, k.code, k.needle);
  }
  json cfg = base_config();
  cfg["partial_rotary_factor"] = 0.25;
  expect_error(cfg, unimpl, "partial_rotary_factor = 0.25: partial rotary embedding");
  cfg["partial_rotary_factor"] = 1.0;
  parse_ok(cfg);
  cfg["rms_norm_eps"] = -1e39;
  expect_error(cfg, invalid, "rms_norm_eps = -1e+39 is outside the range of a float");
}

TEST(HfConfigFields, UnsupportedFieldsNameFieldAndValue) {
  struct Case {
    std::string arch, key;
    json value;
    std::string needle;
  };
  const Case cases[] = {
      {"LlamaForCausalLM", "hidden_act", "gelu",
       "hidden_act = 'gelu' is not supported (silu, swish)"},
      {"LlamaForCausalLM", "attention_bias", true, "attention_bias = true is not supported"},
      {"MistralForCausalLM", "attention_bias", true, "attention_bias = true is not supported"},
      {"Qwen2ForCausalLM", "mlp_bias", true, "mlp_bias = true is not supported"},
      {"LlamaForCausalLM", "mlp_bias", true, "mlp_bias = true is not supported"},
      {"LlamaForCausalLM",
       "quantization_config",
       {{"quant_method", "gptq"}},
       "quantization_config = {\"quant_method\":\"gptq\"} is not supported"},
      {"LlamaForCausalLM",
       "layer_types",
       {"full_attention", "sliding_attention"},
       "layer_types[1] = 'sliding_attention' is not supported (full_attention)"},
      {"Qwen2ForCausalLM",
       "layer_types",
       {"full_attention", "chunked_attention"},
       "layer_types[1] = 'chunked_attention' is not supported (full_attention, "
       "sliding_attention)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.arch + " " + k.key);
    json cfg = base_config(k.arch);
    cfg[k.key] = k.value;
    expect_error(cfg, StatusCode::kUnimplemented, k.needle);
  }
  json cfg = base_config();
  cfg["layer_types"] = {"full_attention"};
  expect_error(cfg, StatusCode::kInvalidArgument,
               "layer_types must be a list of 2 strings (num_hidden_layers)");
  // Accepted: swish (= silu), Qwen2's attention_bias (its q/k/v biases are fixed), false flags.
  cfg = base_config();
  cfg["hidden_act"] = "swish";
  cfg["attention_bias"] = false;
  cfg["mlp_bias"] = false;
  cfg["quantization_config"] = nullptr;
  parse_ok(cfg);
  cfg = base_config("Qwen2ForCausalLM");
  cfg["attention_bias"] = true;
  EXPECT_TRUE(parse_ok(cfg).qkv_bias);
}

// A config without num_key_value_heads takes transformers' default for its class: MistralConfig
// 8, Qwen2Config 32 (it took num_attention_heads), LlamaConfig num_attention_heads.
TEST(HfConfigFields, MissingKvHeadsTakeTheClassDefault) {
  json m = base_config("MistralForCausalLM");
  m["num_attention_heads"] = 16;
  m["hidden_size"] = 64;
  m.erase("num_key_value_heads");
  EXPECT_EQ(parse_ok(m).num_kv_heads, 8);
  m["num_key_value_heads"] = nullptr;  // None: num_attention_heads
  EXPECT_EQ(parse_ok(m).num_kv_heads, 16);
  json l = base_config();
  l.erase("num_key_value_heads");
  EXPECT_EQ(parse_ok(l).num_kv_heads, l["num_attention_heads"].get<int>());
  json q = base_config("Qwen2ForCausalLM");
  q["num_attention_heads"] = 64;
  q["hidden_size"] = 128;
  q.erase("num_key_value_heads");
  EXPECT_EQ(parse_ok(q).num_kv_heads, 32);
  q["num_key_value_heads"] = nullptr;
  EXPECT_EQ(parse_ok(q).num_kv_heads, 64);
}

// Sizes are checked before anything is allocated by them: num_hidden_layers 2e9 built a list of
// 2e9 layer types (bad_alloc, abort) before validate_model_config refused it. Here a short
// layer_types list shows the order: the size is refused first, not the list's length.
TEST(HfConfigFields, HugeSizesAreRefusedBeforeAnyAllocation) {
  json c = base_config();
  c["num_hidden_layers"] = 5000000;
  c["layer_types"] = {"full_attention"};
  expect_error(c, StatusCode::kInvalidArgument, "num_layers = 5000000 out of range [1, 1024]");
  c.erase("layer_types");
  c["num_hidden_layers"] = 2000000000;
  expect_error(c, StatusCode::kInvalidArgument, "num_layers = 2000000000 out of range");
}

TEST(HfConfigFields, SlidingWindow) {
  using W = std::vector<int>;
  // Mistral: every layer slides whenever sliding_window is not null; transformers' default 4096.
  // The context is never cut to the window.
  json m = base_config("MistralForCausalLM");
  m["sliding_window"] = nullptr;
  EXPECT_EQ(parse_ok(m).layer_window, W{});
  m["sliding_window"] = 32;  // a window as long as the context masks nothing
  EXPECT_EQ(parse_ok(m).layer_window, W{});
  m.erase("sliding_window");  // 4096 against a context of 32
  EXPECT_EQ(parse_ok(m).layer_window, W{});
  m["sliding_window"] = 16;
  ModelConfig c = parse_ok(m);
  EXPECT_EQ(c.layer_window, (W{16, 16}));
  EXPECT_EQ(c.max_seq_len, 32);
  EXPECT_EQ(c.window_of(1), 16);
  m.erase("sliding_window");
  m["max_position_embeddings"] = 8192;
  EXPECT_EQ(parse_ok(m).layer_window, (W{4096, 4096}));  // transformers' default window
  EXPECT_EQ(parse_ok(m).max_seq_len, 8192);
  // The context compared is the scaled one.
  m["max_position_embeddings"] = 1024;
  m["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse_ok(m).layer_window, W{});
  m["rope_scaling"] = {{"type", "linear"}, {"factor", 8.0}};
  EXPECT_EQ(parse_ok(m).layer_window, (W{4096, 4096}));
  m.erase("rope_scaling");
  m["sliding_window"] = 0;
  expect_error(m, StatusCode::kInvalidArgument, "sliding_window");

  // Qwen2: only with use_sliding_window, on layers from max_window_layers on (or layer_types).
  json q = base_config("Qwen2ForCausalLM");
  q["sliding_window"] = 16;
  q["use_sliding_window"] = false;
  EXPECT_EQ(parse_ok(q).layer_window, W{});
  q["use_sliding_window"] = true;
  q["max_window_layers"] = 2;  // no layer slides
  EXPECT_EQ(parse_ok(q).layer_window, W{});
  q["max_window_layers"] = 1;
  EXPECT_EQ(parse_ok(q).layer_window, (W{0, 16}));
  q["layer_types"] = {"full_attention", "full_attention"};  // explicit types win
  EXPECT_EQ(parse_ok(q).layer_window, W{});
  q["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_EQ(parse_ok(q).layer_window, (W{16, 0}));
  q["sliding_window"] = nullptr;
  EXPECT_EQ(parse_ok(q).layer_window, W{});
  // Llama has no sliding attention in transformers: the field is ignored.
  json l = base_config();
  l["sliding_window"] = 4;
  EXPECT_EQ(parse_ok(l).layer_window, W{});
}

TEST(ModelConfigValidate, LayerWindows) {
  ModelConfig c = parse_ok(base_config());
  c.layer_window = {4};  // one entry for two layers
  EXPECT_FALSE(validate_model_config(c, "t").ok());
  c.layer_window = {4, -1};
  const Status st = validate_model_config(c, "t");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer 1"), std::string::npos) << st.message();
  c.layer_window = {4, 0};
  EXPECT_TRUE(validate_model_config(c, "t").ok());
}

// The text entry point (what parse_hf_config calls, and what hf_config_fuzz runs): the same config
// as from the files, generation_config.json's ids applied, errors naming the text they are about.
TEST(HfConfigJson, TextEntryPointMatchesTheFiles) {
  json cfg = base_config();
  cfg["eos_token_id"] = 2;
  auto from_text = parse_hf_config_json(cfg.dump(), "cfg");
  ASSERT_TRUE(from_text.ok()) << from_text.status().to_string();
  const ModelConfig from_file = parse_ok(cfg);
  EXPECT_EQ(from_text->dim, from_file.dim);
  EXPECT_EQ(from_text->num_kv_heads, from_file.num_kv_heads);
  EXPECT_EQ(from_text->max_seq_len, from_file.max_seq_len);
  EXPECT_EQ(from_text->eos_token_ids, from_file.eos_token_ids);
  EXPECT_EQ(from_text->bos_token_id, from_file.bos_token_id);

  auto with_gen = parse_hf_config_json(cfg.dump(), "cfg", R"({"eos_token_id": [5, 7]})", "gen");
  ASSERT_TRUE(with_gen.ok()) << with_gen.status().to_string();
  EXPECT_EQ(with_gen->eos_token_ids, (std::vector<int32_t>{5, 7}));

  auto bad_gen = parse_hf_config_json(cfg.dump(), "cfg", "[", "gen");
  ASSERT_FALSE(bad_gen.ok());
  EXPECT_EQ(bad_gen.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_gen.status().message().rfind("gen: bad JSON", 0), 0u) << bad_gen.status().message();
  auto not_object = parse_hf_config_json(cfg.dump(), "cfg", "3", "gen");
  ASSERT_FALSE(not_object.ok());
  EXPECT_EQ(not_object.status().message(), "gen: not a JSON object");

  auto bad = parse_hf_config_json("{\"hidden_size\": ", "cfg");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("cfg: bad JSON", 0), 0u) << bad.status().message();
}

}  // namespace
}  // namespace kvsplit::model
