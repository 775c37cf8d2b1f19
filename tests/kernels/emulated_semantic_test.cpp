// The semantic cut end to end on the CUDA kernel sources (tests/kernels/emulated_backend.h runs
// every non-GEMM op, the page ops and the mixed-precision attention through the emulated kernels):
// stories260K with the cut acting between decode steps (checks in semantic_cut_check.h; the same
// checks run on a GPU in tests/gpu/cuda_semantic_test.cpp).
#include <gtest/gtest.h>

#include "emulated_backend.h"
#include "semantic_cut_check.h"

namespace kvsplit::testing {
namespace {

TEST(EmulatedSemanticCut, NeverDegradingCutKeepsGreedyGoldens) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  expect_never_degrading_cut_keeps_goldens(be);
  EXPECT_GT(be.mixed_calls(), 10);  // the scored steps ran the mixed-precision kernels
}

// GEMMs come from the CPU backend here, so the relevance the ladder sees matches the CPU's and
// the demotion counts must be equal too.
TEST(EmulatedSemanticCut, ForcedDemotionMatchesTheCpuBackend) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  expect_forced_demotion_matches_cpu(be, /*same_counts=*/true);
  EXPECT_GT(be.page_op_calls(), 0);
  EXPECT_GT(be.mixed_calls(), 0);
}

TEST(EmulatedSemanticCut, QuantizedRecallMatchesTheCpuBackend) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  expect_quantized_recall_matches_cpu(be, /*same_counts=*/true);
  EXPECT_GT(be.page_op_calls(), 0);
}

// Key summaries in 4 parts: summarized by the emulated page kernel, bounded by the emulated
// scoring kernel; the same evictions, recalls and tokens as the CPU backend.
TEST(EmulatedSemanticCut, RecallsFromSummariesInPartsMatchTheCpuBackend) {
  KVSPLIT_REQUIRE_MODELS();
  EmulatedKernelBackend be;
  expect_quantized_recall_matches_cpu(be, /*same_counts=*/true, /*summary_parts=*/4);
  EXPECT_GT(be.page_op_calls(), 0);
}

}  // namespace
}  // namespace kvsplit::testing
