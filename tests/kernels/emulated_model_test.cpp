// stories260K through LlamaModel with every non-GEMM op running the CUDA kernel sources under the
// emulation harness (tests/kernels/emulated_backend.h): the head_dim-8 attention instantiations,
// rope, rmsnorm, kv_append, embedding and swiglu reproduce the llama2.c goldens.
#include <gtest/gtest.h>

#include <cstdio>

#include "emulated_backend.h"
#include "model_golden_check.h"

namespace kvsplit::testing {
namespace {

TEST(EmulatedModel, Stories260KLogitsMatchGoldens) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  auto g = load_golden_model(be);
  ASSERT_NE(g, nullptr);
  const LogitsError e = golden_logits_error(*g, /*chunk=*/0);  // prefill, and decode unsplit
  EXPECT_LT(e.max_abs, 1e-4);
  EXPECT_EQ(e.argmax_mismatches, 0);
  EXPECT_GT(be.decode_calls(), 0);
}

TEST(EmulatedModel, Stories260KGreedyGoldens) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  auto g = load_golden_model(be);
  ASSERT_NE(g, nullptr);
  // Two cases as one batch, the first 21 tokens of each golden (prompts of 5 tokens: KV up to 25
  // positions), decode split-K with one page (16 tokens) per split, so two splits per sequence
  // from position 17 on and the merge kernel run. Sized for the ASan build (slow fibers).
  expect_greedy_goldens(*g, /*max_steps=*/64, /*max_cases=*/2, /*chunk=*/16, /*max_new=*/20);
}

// Greedy ids picked by the sampling kernel (the backend has sample_tokens) equal the host argmax
// of the logits rows they replace; mixed with kLast / kAll / kNone steps.
TEST(EmulatedModel, DeviceArgmaxRowsMatchLogitsRows) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  ASSERT_TRUE(be.has_sample_tokens());
  auto g = load_golden_model(be);
  ASSERT_NE(g, nullptr);
  expect_argmax_rows_match_logits(*g, 4);  // one prompt per logits kind (sized for ASan)
}

// bf16 weights (f32 GEMM on the CPU, so activations are not rounded as cuBLAS rounds them):
// sizes the bf16 tolerance of the GPU test (tests/gpu/cuda_model_test.cpp).
TEST(EmulatedModel, Stories260KBf16WeightsWithinTolerance) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be(backend::DType::kBF16);
  auto g = load_golden_model(be);
  ASSERT_NE(g, nullptr);
  const LogitsError e = golden_logits_error(*g, -1);
  std::printf("bf16 weights: max |logit - golden| = %.4f, argmax mismatches %d / 16\n", e.max_abs,
              e.argmax_mismatches);
  EXPECT_LT(e.max_abs, 0.5);
  EXPECT_LE(e.argmax_mismatches, 2);
}

// Sliding-window layers through the model on the kernels against the CPU backend
// (model_golden_check.h).
TEST(EmulatedModel, SlidingWindowLayersMatchTheCpuBackend) {
  EmulatedKernelBackend be;
  expect_sliding_window_logits_match_cpu(be, 1e-4);
  EXPECT_GT(be.decode_calls(), 0);
}

}  // namespace
}  // namespace kvsplit::testing
