// rope_inv_freq and rope_attention_factor per RoPE type against HF transformers' own numbers.
//
// Every expected table below was printed by tests/model/rope_reference.py, which calls
// transformers 5.24.0's modeling_rope_utils (`ROPE_INIT_FUNCTIONS[rope_type]`, and
// `LlamaRotaryEmbedding.compute_default_rope_parameters` for "default") with torch 2.15 on a
// LlamaConfig with head_dim 16 (8 frequencies), hidden_size 64, 4 heads and the
// max_position_embeddings and rope_parameters named in each case. HF computes in fp32 torch;
// rope.cpp rounds once from double, so values may differ in the last ulp: EXPECT_FLOAT_EQ allows 4.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "model/model_config.h"

namespace kvsplit::model {
namespace {

struct HfCase {
  std::string name;
  float theta;
  int max_seq_len;
  std::optional<RopeScaling> scaling;
  std::array<float, 8> inv_freq;  // HF's inv_freq
  double attention_factor;        // HF's attention_scaling
};

RopeScaling scaling(RopeType type, double factor, int original) {
  RopeScaling s;
  s.type = type;
  s.factor = factor;
  s.original_max_position_embeddings = original;
  return s;
}

RopeScaling yarn(double factor, int original) { return scaling(RopeType::kYarn, factor, original); }

std::vector<HfCase> hf_cases() {
  std::vector<HfCase> cases;
  // default: rope_theta 10000.
  cases.push_back({"default",
                   10000.0f,
                   64,
                   std::nullopt,
                   {1, 0.316227764f, 0.100000001f, 0.0316227786f, 0.00999999978f, 0.00316227786f,
                    0.00100000005f, 0.000316227786f},
                   1.0});
  // linear: factor 4.
  cases.push_back({"linear",
                   10000.0f,
                   64,
                   scaling(RopeType::kLinear, 4.0, 0),
                   {0.25f, 0.079056941f, 0.0250000004f, 0.00790569466f, 0.00249999994f,
                    0.000790569466f, 0.000250000012f, 7.90569466e-05f},
                   1.0});
  // dynamic: factor 4, max_position_embeddings 64, HF seq_len None (= 64): plain frequencies.
  cases.push_back({"dynamic_at_max_pos",
                   10000.0f,
                   64,
                   scaling(RopeType::kDynamic, 4.0, 64),
                   {1, 0.316227764f, 0.100000001f, 0.0316227786f, 0.00999999978f, 0.00316227786f,
                    0.00100000005f, 0.000316227786f},
                   1.0});
  // dynamic: the same config, HF seq_len 256 (here: max_seq_len 256).
  cases.push_back({"dynamic_at_256",
                   10000.0f,
                   256,
                   scaling(RopeType::kDynamic, 4.0, 64),
                   {1, 0.219212472f, 0.0480541028f, 0.0105340583f, 0.00230919686f, 0.000506204728f,
                    0.000110966386f, 2.43252125e-05f},
                   1.0});
  // llama3: hf-tiny/llama3-tiny's parameters (theta 500000, factor 8, low 1, high 4, original
  // 64): frequency 0 is kept, 1 lies in the smooth band, the rest are divided by 8.
  cases.push_back({"llama3_tiny",
                   500000.0f,
                   1024,
                   RopeScaling::llama3(8.0, 1.0, 4.0, 64),
                   {1, 0.079403013f, 0.00470075384f, 0.000911583134f, 0.000176776681f,
                    3.42810235e-05f, 6.64786967e-06f, 1.28917316e-06f},
                   1.0});
  // yarn: factor 4, original 4096 (max_position_embeddings 16384), beta 32/1, truncate.
  cases.push_back({"yarn",
                   10000.0f,
                   16384,
                   yarn(4.0, 4096),
                   {1, 0.316227764f, 0.100000001f, 0.025693506f, 0.00624999963f, 0.00138349656f,
                    0.000250000012f, 7.90569466e-05f},
                   1.138629436111989});
  // yarn: beta_fast 16, beta_slow 2, truncate false (a fractional correction range).
  RopeScaling untruncated = yarn(4.0, 4096);
  untruncated.beta_fast = 16.0;
  untruncated.beta_slow = 2.0;
  untruncated.truncate = false;
  cases.push_back({"yarn_untruncated",
                   10000.0f,
                   16384,
                   untruncated,
                   {1, 0.316227764f, 0.100000001f, 0.0316227786f, 0.00676161889f, 0.000825104478f,
                    0.000250000012f, 7.90569466e-05f},
                   1.138629436111989});
  // yarn: mscale 1, mscale_all_dim 0.5 (attention factor = ratio of two get_mscale values).
  RopeScaling mscale = yarn(4.0, 4096);
  mscale.mscale = 1.0;
  mscale.mscale_all_dim = 0.5;
  cases.push_back({"yarn_mscale",
                   10000.0f,
                   16384,
                   mscale,
                   {1, 0.316227764f, 0.100000001f, 0.025693506f, 0.00624999963f, 0.00138349656f,
                    0.000250000012f, 7.90569466e-05f},
                   1.0648216253695715});
  // yarn: theta 1e6, factor 8, original 4096, explicit attention_factor 1.5.
  RopeScaling explicit_factor = yarn(8.0, 4096);
  explicit_factor.attention_factor = 1.5;
  cases.push_back({"yarn_attention_factor",
                   1000000.0f,
                   32768,
                   explicit_factor,
                   {1, 0.177827939f, 0.0223994683f, 0.00234308885f, 0.000125000006f,
                    2.22284925e-05f, 3.95284678e-06f, 7.02926684e-07f},
                   1.5});
  return cases;
}

TEST(RopeHf, InvFreqAndAttentionFactorMatchTransformers) {
  for (const HfCase& hc : hf_cases()) {
    SCOPED_TRACE(hc.name);
    ModelConfig c;
    c.head_dim = 16;
    c.rope_theta = hc.theta;
    c.max_seq_len = hc.max_seq_len;
    c.rope_scaling = hc.scaling;
    const std::vector<float> f = rope_inv_freq(c);
    ASSERT_EQ(f.size(), 8u);
    for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(f[i], hc.inv_freq[i]) << "i=" << i;
    // HF multiplies fp32 cos/sin by the Python float; torch rounds it to fp32 first.
    EXPECT_EQ(rope_attention_factor(c), static_cast<float>(hc.attention_factor));
  }
}

TEST(RopeHf, DefaultIsBitExactRunC) {
  // No scaling, and scalings that reduce to none, give run.c's float frequencies bit for bit.
  ModelConfig c;
  c.head_dim = 16;
  c.rope_theta = 10000.0f;
  c.max_seq_len = 64;
  const std::vector<float> plain = rope_inv_freq(c);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(plain[i], 1.0f / std::pow(10000.0f, (2.0f * i) / 16.0f));
  c.rope_scaling = scaling(RopeType::kDynamic, 4.0, 64);  // at its original length
  EXPECT_EQ(rope_inv_freq(c), plain);
  // A huge factor too: factor * 1 - (factor - 1) rounded to 0 and gave a base of 0 (inf freqs).
  c.rope_scaling = scaling(RopeType::kDynamic, 1e17, 64);
  EXPECT_EQ(rope_inv_freq(c), plain);
  c.rope_scaling = scaling(RopeType::kLinear, 1.0, 0);
  EXPECT_EQ(rope_inv_freq(c), plain);
  EXPECT_EQ(rope_attention_factor(c), 1.0f);
}

TEST(RopeHf, YarnFactorOneHasNoAttentionScaling) {
  ModelConfig c;
  c.head_dim = 16;
  c.max_seq_len = 4096;
  c.rope_scaling = yarn(1.0, 4096);
  EXPECT_EQ(rope_attention_factor(c), 1.0f);  // get_mscale(1) = 1
}

TEST(RopeHf, ValidationNamesTheField) {
  ModelConfig c;
  c.architecture = "x";
  c.dim = c.hidden_dim = 64;
  c.num_layers = 1;
  c.num_heads = c.num_kv_heads = 4;
  c.head_dim = 16;
  c.vocab_size = 32;
  c.max_seq_len = 64;
  struct Case {
    RopeScaling s;
    std::string needle;
  };
  RopeScaling llama3_bad = RopeScaling::llama3(8.0, 4.0, 1.0, 64);
  RopeScaling yarn_af = yarn(4.0, 64);
  yarn_af.attention_factor = -1.0;
  RopeScaling yarn_beta = yarn(4.0, 64);
  yarn_beta.beta_fast = std::numeric_limits<double>::quiet_NaN();
  const Case cases[] = {
      {scaling(RopeType::kLinear, 0.5, 0), "rope linear: factor = 0.5 must be finite and >= 1"},
      {scaling(RopeType::kDynamic, 2.0, 0),
       "rope dynamic: original_max_position_embeddings = 0 must be > 0"},
      {llama3_bad, "rope llama3: high_freq_factor = 1 must be finite and > low_freq_factor (4)"},
      {yarn_af, "rope yarn: attention_factor = -1 must be finite and > 0"},
      {yarn_beta, "rope yarn: beta_fast = nan"},
      // Past its original length (64 > 32) the base grows with the factor, here beyond a float.
      {scaling(RopeType::kDynamic, 1e300, 32),
       "rope dynamic: factor = 1e+300 gives a rope base of"},
  };
  for (const Case& k : cases) {
    c.rope_scaling = k.s;
    Status st = validate_model_config(c, "src");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << k.needle;
    EXPECT_NE(st.message().find("src: " + k.needle), std::string::npos) << st.message();
  }
  c.rope_scaling = scaling(RopeType::kDynamic, 2.0, 64);
  c.head_dim = 2;
  EXPECT_NE(validate_model_config(c, "src").message().find("head_dim = 2 must be > 2"),
            std::string::npos);
}

}  // namespace
}  // namespace kvsplit::model
