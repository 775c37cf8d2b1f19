// The shared stories260K model in both formats: config values and cross-format weight equality;
// every shared HF checkpoint uses all its tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

using kvsplit::testing::model_path;

bool same_bytes(const WeightTensor& a, const WeightTensor& b) {
  return a.shape == b.shape && a.dtype == b.dtype &&
         std::memcmp(a.data, b.data, a.numel() * backend::dtype_size(a.dtype)) == 0;
}

const float* f32(const WeightTensor& t) { return static_cast<const float*>(t.data); }

// HF q/k rows are permuted for rotate_half (convert_llama_weights_to_hf.py / export.py):
// hf[h*hd + t*hd/2 + i] = llama2c[h*hd + 2*i + t], t in {0, 1}, i in [0, hd/2).
void expect_permuted(const WeightTensor& hf, const WeightTensor& l2c, int heads, int hd) {
  ASSERT_EQ(hf.shape, l2c.shape);
  const int64_t in = hf.shape[1];
  int64_t checked = 0;
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < 2; ++t) {
      for (int i = 0; i < hd / 2; ++i) {
        const float* a = f32(hf) + (int64_t{h} * hd + t * hd / 2 + i) * in;
        const float* b = f32(l2c) + (int64_t{h} * hd + 2 * i + t) * in;
        ASSERT_EQ(std::memcmp(a, b, in * 4), 0) << "head " << h << " pair " << i << " t " << t;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, hf.shape[0]);
}

TEST(LoaderReal, Llama2cConfigAndTokenizer) {
  KVSPLIT_REQUIRE_MODELS();
  auto m = load_model(model_path("stories260K.bin"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.architecture, "llama2c");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_style, backend::RopeStyle::kInterleaved);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1}));
  ASSERT_NE(m->tokenizer, nullptr);  // tok512.bin found beside the model
  EXPECT_EQ(m->tokenizer->vocab_size(), 512);
  EXPECT_EQ(m->weights.lm_head.data, m->weights.embedding.data);
}

TEST(LoaderReal, HfConfig) {
  KVSPLIT_REQUIRE_MODELS();
  auto m = load_model(model_path("stories260K-hf"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_style, backend::RopeStyle::kHalf);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids,
            (std::vector<int32_t>{2, 1}));  // generation_config's [2, 1] (config: 2)
  ASSERT_NE(m->tokenizer, nullptr);
  EXPECT_EQ(m->tokenizer->vocab_size(), 512);
  // Tied: lm_head.weight is in the file, but the embedding is used.
  EXPECT_EQ(m->weights.lm_head.data, m->weights.embedding.data);
}

// Every shared HF checkpoint uses all its tensors; stories260K-hf with num_hidden_layers lowered
// to 4 is refused naming the fifth layer's (it loaded and generated wrong tokens).
TEST(LoaderReal, HfCheckpointsUseEveryTensor) {
  KVSPLIT_REQUIRE_MODELS();
  LoadOptions o;
  o.load_tokenizer = false;
  for (const char* rel : {"stories260K-hf", "hf-tiny/llama3-tiny", "hf-tiny/mistral-tiny",
                          "hf-tiny/qwen2-tiny", "recall-llama"}) {
    if (!std::filesystem::exists(model_path(rel))) continue;
    auto m = load_model(model_path(rel), o);
    EXPECT_TRUE(m.ok()) << rel << ": " << m.status().to_string();
  }
  kvsplit::testing::TempDir dir;
  const std::filesystem::path m = dir.path() / "m";
  std::filesystem::copy(model_path("stories260K-hf"), m);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(m / "config.json"));
  cfg["num_hidden_layers"] = 4;
  std::ofstream(m / "config.json") << cfg.dump();
  auto bad = load_model(m.string(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("9 weight tensors that config.json's model does not use "
                                        "(num_hidden_layers 4, no q/k/v biases)"),
            std::string::npos)
      << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("model.layers.4.input_layernorm.weight"), std::string::npos)
      << bad.status().to_string();
}

TEST(LoaderReal, SameWeightsInBothFormats) {
  KVSPLIT_REQUIRE_MODELS();
  LoadOptions o;
  o.load_tokenizer = false;
  auto a = load_model(model_path("stories260K.bin"), o);
  auto b = load_model(model_path("stories260K-hf"), o);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const ModelWeights& l2c = a->weights;
  const ModelWeights& hf = b->weights;
  EXPECT_TRUE(same_bytes(l2c.embedding, hf.embedding));
  EXPECT_TRUE(same_bytes(l2c.final_norm, hf.final_norm));
  ASSERT_EQ(l2c.layers.size(), 5u);
  ASSERT_EQ(hf.layers.size(), 5u);
  for (int l = 0; l < 5; ++l) {
    SCOPED_TRACE(l);
    const LayerWeights& x = l2c.layers[l];
    const LayerWeights& y = hf.layers[l];
    EXPECT_TRUE(same_bytes(x.wv, y.wv));
    EXPECT_TRUE(same_bytes(x.wo, y.wo));
    EXPECT_TRUE(same_bytes(x.attn_norm, y.attn_norm));
    EXPECT_TRUE(same_bytes(x.ffn_norm, y.ffn_norm));
    EXPECT_TRUE(same_bytes(x.w_gate, y.w_gate));
    EXPECT_TRUE(same_bytes(x.w_up, y.w_up));
    EXPECT_TRUE(same_bytes(x.w_down, y.w_down));
    // q/k differ by the documented row permutation only.
    EXPECT_FALSE(same_bytes(x.wq, y.wq));
    expect_permuted(y.wq, x.wq, 8, 8);
    expect_permuted(y.wk, x.wk, 4, 8);
  }
}

TEST(LoaderReal, WeightsOutliveTheLoadedModel) {
  KVSPLIT_REQUIRE_MODELS();
  LoadOptions o;
  o.load_tokenizer = false;
  ModelWeights w;
  {
    auto m = load_model(model_path("stories260K-hf"), o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    w = m->weights;
  }
  // The mapping lives as long as a copy of `storage` does: reading must be fine (ASan checks).
  float sum = 0;
  for (int64_t i = 0; i < w.embedding.numel(); ++i) sum += f32(w.embedding)[i];
  EXPECT_TRUE(std::isfinite(sum));
  EXPECT_NE(sum, 0.0f);
}

}  // namespace
}  // namespace kvsplit::model
