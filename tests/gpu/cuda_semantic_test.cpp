// The semantic cut end to end on a CUDA device (label `gpu`; skips without one): the checks of
// tests/kernels/semantic_cut_check.h with the CUDA backend (f32 weights, as the golden test).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "kernel_test_util.h"
#include "semantic_cut_check.h"

namespace kvsplit::testing {
namespace {

std::unique_ptr<backend::Backend> cuda_f32() {
  backend::BackendOptions o;
  o.weight_dtype = backend::DType::kF32;
  auto b = backend::create_backend("cuda", o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

TEST(CudaSemanticCut, NeverDegradingCutKeepsGreedyGoldens) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto be = cuda_f32();
  ASSERT_NE(be, nullptr);
  expect_never_degrading_cut_keeps_goldens(*be);
}

// cuBLAS GEMMs round differently from the CPU's, so only the tokens (and that pages went down
// to int8 and int4) are compared, not the demotion counts.
TEST(CudaSemanticCut, ForcedDemotionMatchesTheCpuBackend) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto be = cuda_f32();
  ASSERT_NE(be, nullptr);
  expect_forced_demotion_matches_cpu(*be, /*same_counts=*/false);
}

TEST(CudaSemanticCut, QuantizedRecallMatchesTheCpuBackend) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto be = cuda_f32();
  ASSERT_NE(be, nullptr);
  expect_quantized_recall_matches_cpu(*be, /*same_counts=*/false);
}

TEST(CudaSemanticCut, RecallsFromSummariesInPartsMatchTheCpuBackend) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto be = cuda_f32();
  ASSERT_NE(be, nullptr);
  expect_quantized_recall_matches_cpu(*be, /*same_counts=*/false, /*summary_parts=*/4);
}

}  // namespace
}  // namespace kvsplit::testing
