// End to end on a CUDA device (label `gpu`; skips without one): stories260K through LlamaModel on
// the CUDA backend against the llama2.c goldens, per weight dtype, and the backend's sampling op
// against the host reference. Also the create_backend options, which need no device.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernel_test_util.h"
#include "kernels/attention/paged_attention.h"
#include "kvsplit/engine.h"
#include "model_golden_check.h"
#include "oracle/attention_oracle.h"
#include "sampling_reference.h"

namespace kvsplit::testing {
namespace {

std::unique_ptr<backend::Backend> cuda_backend(backend::DType weights) {
  backend::BackendOptions o;
  o.weight_dtype = weights;
  auto b = backend::create_backend("cuda", o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

TEST(CudaModel, Stories260KGreedyGoldensWithF32Weights) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto be = cuda_backend(backend::DType::kF32);
  ASSERT_NE(be, nullptr);
  auto g = load_golden_model(*be);
  ASSERT_NE(g, nullptr);
  expect_greedy_goldens(*g, /*max_steps=*/512, /*max_cases=*/12);                // planner
  expect_greedy_goldens(*g, /*max_steps=*/256, /*max_cases=*/12, /*chunk=*/16);  // split-K
}

// Sliding-window layers (per-layer windows, one split plan per window) against the CPU backend.
TEST(CudaModel, SlidingWindowLayersMatchTheCpuBackend) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = cuda_backend(backend::DType::kF32);
  ASSERT_NE(be, nullptr);
  expect_sliding_window_logits_match_cpu(*be, 1e-3);  // fp32 cuBLAS GEMM sums in its own order
}

// Greedy ids from the sampling kernel equal the host argmax of the logits rows they replace.
TEST(CudaModel, DeviceArgmaxRowsMatchLogitsRows) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto be = cuda_backend(backend::DType::kF32);
  ASSERT_NE(be, nullptr);
  ASSERT_TRUE(be->has_sample_tokens());
  auto g = load_golden_model(*be);
  ASSERT_NE(g, nullptr);
  expect_argmax_rows_match_logits(*g, 8);
}

// Tolerance table (max |logit - golden| over 8 positions x 512 logits, prefill and decode; logits
// of this model reach |15|): f32 weights tight (fp32 cuBLAS GEMM, sum order differs from run.c),
// bf16 / f16 loose (weights and GEMM activations rounded; under emulation with f32 activations
// bf16 weights give 0.07).
struct DtypeTolerance {
  backend::DType dtype;
  double max_abs;
  int max_argmax_mismatches;
};

TEST(CudaModel, Stories260KLogitsWithinTolerancePerWeightDtype) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  for (const DtypeTolerance& t : {DtypeTolerance{backend::DType::kF32, 2e-4, 0},
                                  DtypeTolerance{backend::DType::kBF16, 0.5, 2},
                                  DtypeTolerance{backend::DType::kF16, 0.25, 1}}) {
    auto be = cuda_backend(t.dtype);
    ASSERT_NE(be, nullptr);
    auto g = load_golden_model(*be);
    ASSERT_NE(g, nullptr);
    for (int chunk : {-1, 0}) {
      const LogitsError e = golden_logits_error(*g, chunk);
      std::printf("weights %s chunk %d: max |logit - golden| = %.6f, argmax mismatches %d / 16\n",
                  std::string(backend::dtype_name(t.dtype)).c_str(), chunk, e.max_abs,
                  e.argmax_mismatches);
      EXPECT_LT(e.max_abs, t.max_abs) << backend::dtype_name(t.dtype);
      EXPECT_LE(e.argmax_mismatches, t.max_argmax_mismatches) << backend::dtype_name(t.dtype);
    }
  }
}

TEST(CudaModel, SampleTokensMatchesHostReference) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = cuda_backend(backend::DType::kBF16);
  ASSERT_NE(be, nullptr);
  const int vocab = 32000, rows = 8;
  oracle::Rng rng(11);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (float& x : logits) x = static_cast<float>(rng.uniform(-8, 8));
  std::vector<backend::SamplingRow> params(rows);
  for (int r = 0; r < rows; ++r) {
    params[r].temperature = 0.6f + 0.1f * r;
    params[r].top_k = r % 3 == 0 ? 0 : 40 * r;
    params[r].top_p = r % 2 ? 0.9f : 1.f;
    params[r].min_p = r == 5 ? 0.02f : 0.f;
    params[r].seed = 1234 + r;
    params[r].step = 17;
  }
  auto dl = backend::DeviceBuffer::make(*be, logits.size() * 4);
  auto dids = backend::DeviceBuffer::make(*be, rows * 4);
  ASSERT_TRUE(dl.ok() && dids.ok());
  ASSERT_TRUE(be->copy_h2d(dl->get(), logits.data(), logits.size() * 4).ok());
  ASSERT_TRUE(
      be->sample_tokens(dl->get<float>(), rows, vocab, params.data(), dids->get<int32_t>()).ok());
  std::vector<int32_t> got(rows);
  ASSERT_TRUE(be->copy_d2h(got.data(), dids->get(), rows * 4).ok());
  int mismatches = 0;
  for (int r = 0; r < rows; ++r) {
    kernels::SampleRowParams p{params[r].temperature, params[r].top_p, params[r].min_p,
                               params[r].top_k,       params[r].seed,  params[r].step};
    const float* row = logits.data() + static_cast<size_t>(r) * vocab;
    const int32_t want = reference_sample(row, vocab, p);
    // Device expf may differ from the host's by an ulp, which moves a mass by ~2^-23 of itself;
    // a different pick then needs the draw to land within that of a boundary (never seen; allowed
    // once, and the pick must still be a kept token).
    if (got[r] != want) {
      ++mismatches;
      bool kept = false;
      for (const auto& c : reference_kept(row, vocab, p)) kept = kept || c.id == got[r];
      EXPECT_TRUE(kept) << "row " << r << " picked " << got[r] << ", not a kept token";
    }
  }
  EXPECT_LE(mismatches, 1);
  backend::SamplingRow bad;
  bad.top_p = 0.f;
  const Status st = be->sample_tokens(dl->get<float>(), 1, vocab, &bad, dids->get<int32_t>());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

// A model whose attention shape the kernels are not compiled for is refused when it is loaded:
// hf-tiny's Qwen2 (head_dim 32) started and then failed every request at its first attention
// launch. The shape check itself needs no device.
TEST(CudaModel, AnAttentionShapeTheKernelsLackIsRefusedWhenTheModelLoads) {
  EXPECT_TRUE(kernels::attention_shape_supported(8, 1).ok());    // stories260K
  EXPECT_TRUE(kernels::attention_shape_supported(128, 4).ok());  // Llama-3-8B
  EXPECT_TRUE(kernels::attention_shape_supported(128, 8).ok());  // Llama-3-70B
  EXPECT_TRUE(kernels::attention_shape_supported(64, 1).ok());   // llama-110m
  for (int d : {16, 32, 80, 96, 256}) {
    const Status st = kernels::attention_shape_supported(d, 1);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << d;
    EXPECT_NE(st.message().find("head_dim " + std::to_string(d) + " is not compiled"),
              std::string::npos)
        << st.message();
  }
  EXPECT_EQ(kernels::attention_shape_supported(128, 1024).code(), StatusCode::kUnimplemented);
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODEL("hf-tiny/qwen2-tiny");  // its own model: a missing one is not the refusal
  EngineConfig c;
  c.backend = "cuda";
  c.model = model_path("hf-tiny/qwen2-tiny");
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented) << e.status().to_string();
  EXPECT_NE(e.status().message().find("head_dim 32 is not compiled"), std::string::npos)
      << e.status().message();
}

TEST(BackendOptions, CpuAcceptsOnlyF32WeightsAndHasNoSamplingOp) {
  backend::BackendOptions o;
  o.threads = 1;
  o.weight_dtype = backend::DType::kBF16;
  auto bad = backend::create_backend("cpu", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().to_string().find("bf16"), std::string::npos);
  o.weight_dtype = backend::DType::kF32;
  auto cpu = backend::create_backend("cpu", o);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  EXPECT_EQ((*cpu)->sample_tokens(nullptr, 1, 8, nullptr, nullptr).code(),
            StatusCode::kUnimplemented);
  EXPECT_FALSE((*cpu)->has_sample_tokens());
  std::string why;
  if (!device_available(&why)) {
    o.weight_dtype = backend::DType::kF32;
    EXPECT_EQ(backend::create_backend("cuda", o).status().code(), StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace kvsplit::testing
