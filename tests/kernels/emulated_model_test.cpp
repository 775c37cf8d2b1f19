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
  for (int chunk : {-1, 0}) {  // decode: planner, no split
    const LogitsError e = golden_logits_error(*g, chunk);
    EXPECT_LT(e.max_abs, 1e-4) << "chunk " << chunk;
    EXPECT_EQ(e.argmax_mismatches, 0);
  }
  EXPECT_GT(be.decode_calls(), 0);
}

TEST(EmulatedModel, Stories260KGreedyGoldens) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  auto g = load_golden_model(be);
  ASSERT_NE(g, nullptr);
  // Two 64-step cases as one batch, decode split-K with one page (16 tokens) per split, so up to
  // 4 splits per sequence and the merge kernel run.
  expect_greedy_goldens(*g, /*max_steps=*/64, /*max_cases=*/2, /*chunk=*/16);
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

}  // namespace
}  // namespace kvsplit::testing
