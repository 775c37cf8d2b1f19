// Synthetic presets, rope_inv_freq, validate_model_config and MmapFile.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numbers>

#include "common/mmap_file.h"
#include "model/loader.h"
#include "test_util.h"

namespace kvsplit::model {
namespace {

LoadOptions no_tokenizer() {
  LoadOptions o;
  o.load_tokenizer = false;
  return o;
}

std::vector<const WeightTensor*> all_tensors(const ModelWeights& w) {
  std::vector<const WeightTensor*> out = {&w.embedding, &w.final_norm, &w.lm_head};
  for (const auto& l : w.layers) {
    for (const WeightTensor* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      out.push_back(t);
    }
  }
  return out;
}

bool same_bytes(const WeightTensor& a, const WeightTensor& b) {
  return a.shape == b.shape && a.dtype == b.dtype &&
         std::memcmp(a.data, b.data, a.numel() * backend::dtype_size(a.dtype)) == 0;
}

TEST(LoaderSynthetic, Stories260kShapesAndValues) {
  auto m = load_synthetic("synthetic:stories260k", LoadOptions{});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.architecture, "synthetic");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.rope_style, backend::RopeStyle::kHalf);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_TRUE(c.tie_word_embeddings);
  ASSERT_NE(m->tokenizer, nullptr);
  EXPECT_EQ(m->tokenizer->kind(), "bytes");
  const ModelWeights& w = m->weights;
  EXPECT_EQ(w.lm_head.data, w.embedding.data);
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.layers[0].wk.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(w.layers[0].w_down.shape, (std::vector<int64_t>{64, 172}));
  for (const WeightTensor* t : all_tensors(w)) {
    ASSERT_EQ(t->dtype, backend::DType::kF32);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(t->data) % 64, 0u);
    const float* p = static_cast<const float*>(t->data);
    const bool norm = t->shape.size() == 1;
    const float bound = norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(t->shape.back()));
    double mean = 0;
    for (int64_t i = 0; i < t->numel(); ++i) {
      const float v = norm ? p[i] - 1.0f : p[i];
      ASSERT_LE(std::fabs(v), bound * 1.0001f);
      mean += v;
    }
    mean /= t->numel();
    EXPECT_LT(std::fabs(mean), bound * 0.3) << "not centred";
  }
  // Distinct per layer: a decode benchmark really streams every layer.
  for (int l = 1; l < 5; ++l) {
    EXPECT_NE(w.layers[l].wq.data, w.layers[0].wq.data);
    EXPECT_FALSE(same_bytes(w.layers[l].wq, w.layers[0].wq));
  }
}

// A tokenizer file given with a synthetic model is loaded (it was ignored for the byte stand-in),
// checked against the preset's vocabulary, and a missing one is an error naming it.
TEST(LoaderSynthetic, LoadsTheTokenizerFileGiven) {
  LoadOptions o;
  o.tokenizer_path = testing::model_path("tok512.bin");
  auto m = load_synthetic("synthetic:stories260k", o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_NE(m->tokenizer, nullptr);
  EXPECT_EQ(m->tokenizer->kind(), "llama2c");
  auto ids = m->tokenizer->encode("Once upon a time", /*add_bos=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size(), 10u);  // the byte stand-in takes one id per byte (17 with BOS)

  o.tokenizer_path = testing::model_path("no-such-tokenizer.bin");
  auto missing = load_synthetic("synthetic:stories260k", o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no-such-tokenizer.bin"), std::string::npos)
      << missing.status().to_string();

  // Llama-2's 32K vocabulary is larger than the preset's 512: refused, not indexed out of range.
  o.tokenizer_path = testing::model_path("tokenizers/llama2/tokenizer.json");
  auto big = load_synthetic("synthetic:stories260k", o);
  EXPECT_FALSE(big.ok());
}

TEST(LoaderSynthetic, DeterministicBySeed) {
  auto a = load_synthetic("synthetic:stories260k@seed=7", no_tokenizer());
  auto b = load_synthetic("stories260k@seed=7", no_tokenizer());
  auto c = load_synthetic("synthetic:stories260k", no_tokenizer());
  auto d = load_synthetic("synthetic:stories260k@seed=0", no_tokenizer());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  auto ta = all_tensors(a->weights), tb = all_tensors(b->weights), tc = all_tensors(c->weights),
       td = all_tensors(d->weights);
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_TRUE(same_bytes(*ta[i], *tb[i])) << i;
    EXPECT_FALSE(same_bytes(*ta[i], *tc[i])) << i;
    EXPECT_TRUE(same_bytes(*tc[i], *td[i])) << i;
  }
}

TEST(LoaderSynthetic, Llama110m) {
  auto m = load_model("synthetic:llama-110m", no_tokenizer());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.dim, 768);
  EXPECT_EQ(c.hidden_dim, 2048);
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.num_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.max_seq_len, 1024);
  EXPECT_TRUE(c.tie_word_embeddings);
  const ModelWeights& w = m->weights;
  int64_t params = w.embedding.numel() + w.final_norm.numel();
  for (const auto& l : w.layers) {
    for (const WeightTensor* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      EXPECT_EQ(t->dtype, backend::DType::kF32);
      params += t->numel();
    }
  }
  EXPECT_EQ(params, 24576000 + 768 + 12 * (2 * 768 + 4 * 768 * 768 + 3 * 2048 * 768));
  EXPECT_NE(w.layers[11].w_down.data, w.layers[0].w_down.data);
  EXPECT_FALSE(same_bytes(w.layers[11].w_down, w.layers[0].w_down));
}

TEST(LoaderSynthetic, LargePresetConfigs) {
  auto t = synthetic_config("synthetic:tinyllama-1.1b");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dim, 2048);
  EXPECT_EQ(t->hidden_dim, 5632);
  EXPECT_EQ(t->num_layers, 22);
  EXPECT_EQ(t->num_heads, 32);
  EXPECT_EQ(t->num_kv_heads, 4);
  EXPECT_EQ(t->head_dim, 64);
  EXPECT_EQ(t->max_seq_len, 2048);
  EXPECT_FALSE(t->tie_word_embeddings);
  EXPECT_FALSE(t->rope_scaling.has_value());
  auto l = synthetic_config("llama3-8b@seed=3");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->dim, 4096);
  EXPECT_EQ(l->hidden_dim, 14336);
  EXPECT_EQ(l->num_layers, 32);
  EXPECT_EQ(l->num_kv_heads, 8);
  EXPECT_EQ(l->vocab_size, 128256);
  EXPECT_EQ(l->max_seq_len, 8192);
  EXPECT_FLOAT_EQ(l->rope_theta, 500000.0f);
  ASSERT_TRUE(l->rope_scaling.has_value());
  EXPECT_FLOAT_EQ(l->rope_scaling->factor, 8.0f);
  EXPECT_FALSE(l->tie_word_embeddings);
}

// Generates gigabytes: run with KVSPLIT_BIG_TESTS=1.
TEST(LoaderSynthetic, LargePresetsUseBf16AndSharedLayers) {
  if (std::getenv("KVSPLIT_BIG_TESTS") == nullptr) GTEST_SKIP() << "set KVSPLIT_BIG_TESTS=1";
  {
    auto m = load_model("synthetic:tinyllama-1.1b", no_tokenizer());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->weights.layers[0].wq.dtype, backend::DType::kBF16);
    EXPECT_NE(m->weights.layers[21].wq.data, m->weights.layers[0].wq.data);
    EXPECT_NE(m->weights.lm_head.data, m->weights.embedding.data);
  }
  auto m = load_model("synthetic:llama3-8b", no_tokenizer());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->weights.layers[0].w_gate.dtype, backend::DType::kBF16);
  EXPECT_EQ(m->weights.layers[31].w_gate.data, m->weights.layers[0].w_gate.data);
  EXPECT_EQ(m->weights.lm_head.shape, (std::vector<int64_t>{128256, 4096}));
}

// @ctx=N sets the context length only: the weights are those of the same seed without it.
TEST(LoaderSynthetic, ContextOption) {
  auto c = synthetic_config("synthetic:llama-110m@ctx=32768");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->max_seq_len, 32768);
  EXPECT_EQ(c->dim, 768);
  auto base = synthetic_config("synthetic:llama-110m");
  ASSERT_TRUE(base.ok());
  EXPECT_EQ(base->max_seq_len, 1024);

  auto a = load_synthetic("synthetic:stories260k@seed=7,ctx=4096", no_tokenizer());
  auto b = load_synthetic("stories260k@ctx=4096,seed=7", no_tokenizer());
  auto r = load_synthetic("synthetic:stories260k@seed=7", no_tokenizer());
  auto z = load_synthetic("synthetic:stories260k@ctx=100", no_tokenizer());
  auto z0 = load_synthetic("synthetic:stories260k", no_tokenizer());
  ASSERT_TRUE(a.ok() && b.ok() && r.ok() && z.ok() && z0.ok()) << a.status().to_string();
  EXPECT_EQ(a->config.max_seq_len, 4096);
  EXPECT_EQ(b->config.max_seq_len, 4096);
  EXPECT_EQ(r->config.max_seq_len, 512);
  EXPECT_EQ(z->config.max_seq_len, 100);
  EXPECT_EQ(a->source, "synthetic:stories260k@seed=7,ctx=4096");
  EXPECT_EQ(r->source, "synthetic:stories260k@seed=7");
  auto ta = all_tensors(a->weights), tb = all_tensors(b->weights), tr = all_tensors(r->weights),
       tz = all_tensors(z->weights), tz0 = all_tensors(z0->weights);
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_TRUE(same_bytes(*ta[i], *tb[i])) << i;
    EXPECT_TRUE(same_bytes(*ta[i], *tr[i])) << i;
    EXPECT_TRUE(same_bytes(*tz[i], *tz0[i])) << i;
  }
}

TEST(LoaderSynthetic, BadSpecs) {
  for (const char* spec :
       {"synthetic:nope", "synthetic:", "synthetic:stories260k@seed=",
        "synthetic:stories260k@seed=x1", "synthetic:stories260k@foo=1",
        "synthetic:stories260k@ctx=0", "synthetic:stories260k@ctx=", "synthetic:stories260k@ctx=-5",
        "synthetic:stories260k@ctx=99999999999", "synthetic:stories260k@seed=1,ctx=8,seed=2",
        "synthetic:stories260k@seed=1,", "synthetic:stories260k@seed=1;ctx=8",
        "synthetic:stories260k@ctx=8@seed=1"}) {
    auto m = load_model(spec, no_tokenizer());
    ASSERT_FALSE(m.ok()) << spec;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(m.status().message().find(spec), std::string::npos) << m.status().message();
  }
  auto m = load_model("synthetic:nope", no_tokenizer());
  EXPECT_NE(m.status().message().find("stories260k, llama-110m"), std::string::npos);
}

TEST(RopeInvFreq, MatchesLlama2cFloatFormula) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope_theta = 10000.0f;
  auto f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    // run.c: freq = 1.0f / powf(10000.0f, head_dim / (float)head_size), head_dim = 2i.
    EXPECT_EQ(f[i], 1.0f / powf(10000.0f, static_cast<float>(2 * i) / 8.0f)) << i;
    EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / 8.0), 1e-7) << i;
  }
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[1], 0.1f, 1e-8);
}

TEST(RopeInvFreq, Llama3Scaling) {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling = RopeScaling::llama3(8.0, 1.0, 4.0, 8192);
  auto f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 64u);
  // Reference values (HF _compute_llama3_parameters evaluated in float64 outside this code base).
  const std::pair<int, double> ref[] = {{0, 1.0},
                                        {10, 0.12868737343265052},
                                        {20, 0.016560440080994446},
                                        {30, 0.0013718935677611381},
                                        {40, 3.428102195952591e-05},
                                        {63, 3.068925988914511e-07}};
  for (auto [i, v] : ref) EXPECT_NEAR(f[i], v, v * 1e-6) << i;
  // Independent restatement: per band in wavelength terms (2048 = 8192/4, 8192 = 8192/1).
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128.0);
    const double wavelen = 2 * std::numbers::pi / base;
    double want;
    if (wavelen < 2048) {
      want = base;
    } else if (wavelen > 8192) {
      want = base / 8;
    } else {
      const double t = (8192 / wavelen - 1) / 3;  // 0 at the long end, 1 at the short end
      want = base / 8 + t * (base - base / 8);
    }
    EXPECT_NEAR(f[i], want, want * 1e-6) << i;
    if (i > 0) {
      EXPECT_LT(f[i], f[i - 1]);
    }
  }
}

TEST(ValidateModelConfig, NamesTheField) {
  auto c = synthetic_config("stories260k");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(validate_model_config(*c, "x").ok());
  ModelConfig bad = *c;
  bad.num_kv_heads = 3;
  Status s = validate_model_config(bad, "src");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("src: num_heads (8) is not a multiple of num_kv_heads (3)"),
            std::string::npos)
      << s.message();
  bad = *c;
  bad.eos_token_ids = {600};
  EXPECT_NE(validate_model_config(bad, "src").message().find("eos token id 600"),
            std::string::npos);
  bad = *c;
  bad.rope_scaling = RopeScaling::llama3(8.0, 4.0, 1.0, 8192);
  EXPECT_FALSE(validate_model_config(bad, "src").ok());
}

TEST(MmapFile, OpensAndRefusesBadPaths) {
  kvsplit::testing::TempDir dir;
  std::string path = dir.file("data");
  std::ofstream(path, std::ios::binary) << "hello";
  auto f = common::MmapFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->size(), 5u);
  EXPECT_EQ(std::memcmp((*f)->data(), "hello", 5), 0);
  auto missing = common::MmapFile::open(dir.file("missing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos);
  auto d = common::MmapFile::open(dir.path().string());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("is a directory"), std::string::npos);
  std::ofstream(dir.file("empty")).close();
  auto e = common::MmapFile::open(dir.file("empty"));
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("empty file"), std::string::npos);
}

}  // namespace
}  // namespace kvsplit::model
