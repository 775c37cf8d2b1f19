#include "backend/split_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace kvsplit::backend {
namespace {

// Structural invariants every plan must satisfy for the given kv_lens.
void expect_well_formed(const SplitPlan& p, const std::vector<int32_t>& kv_lens, int block_size) {
  ASSERT_EQ(p.num_seqs(), static_cast<int>(kv_lens.size()));
  ASSERT_EQ(p.split_offset.size(), kv_lens.size());
  EXPECT_GT(p.chunk_tokens, 0);
  EXPECT_EQ(p.chunk_tokens % block_size, 0);
  int offset = 0;
  int max_splits = 0;
  for (size_t s = 0; s < kv_lens.size(); ++s) {
    EXPECT_GE(p.num_splits[s], 1);
    EXPECT_EQ(p.split_offset[s], offset) << "seq " << s;
    // The splits cover kv_len exactly: none empty, none missing.
    EXPECT_GE(int64_t{p.num_splits[s]} * p.chunk_tokens, kv_lens[s]);
    if (kv_lens[s] > 0) {
      EXPECT_LT(int64_t{p.num_splits[s] - 1} * p.chunk_tokens, kv_lens[s]);
    }
    offset += p.num_splits[s];
    max_splits = std::max(max_splits, p.num_splits[s]);
  }
  EXPECT_EQ(p.total_splits, offset);
  EXPECT_EQ(p.max_splits, max_splits);
}

TEST(MakeSplitPlan, ChunksAreBlockMultiplesAndOffsetsArePrefixSums) {
  const std::vector<int32_t> kv_lens = {1, 16, 17, 100, 0, 257};
  const SplitPlan p = make_split_plan(kv_lens.data(), 6, 16, 40);  // rounds up to 48
  EXPECT_EQ(p.chunk_tokens, 48);
  expect_well_formed(p, kv_lens, 16);
  EXPECT_EQ(p.num_splits, (std::vector<int32_t>{1, 1, 1, 3, 1, 6}));
  EXPECT_EQ(p.split_offset, (std::vector<int32_t>{0, 1, 2, 3, 6, 7}));
  EXPECT_EQ(p.total_splits, 13);
  EXPECT_EQ(p.max_splits, 6);
  EXPECT_TRUE(p.has_splits());
}

TEST(MakeSplitPlan, NonPositiveChunkMeansNoSplit) {
  const std::vector<int32_t> kv_lens = {5, 1000, 33};
  for (int chunk : {0, -1}) {
    const SplitPlan p = make_split_plan(kv_lens.data(), 3, 8, chunk);
    expect_well_formed(p, kv_lens, 8);
    EXPECT_FALSE(p.has_splits());
    EXPECT_EQ(p.total_splits, 3);
    EXPECT_GE(p.chunk_tokens, 1000);
  }
}

TEST(MakeSplitPlan, EmptyBatch) {
  const SplitPlan p = make_split_plan(nullptr, 0, 16, 64);
  EXPECT_EQ(p.num_seqs(), 0);
  EXPECT_EQ(p.total_splits, 0);
  EXPECT_FALSE(p.has_splits());
}

TEST(PlanDecodeSplits, WideBatchIsNotSplit) {
  // 16 seqs x 8 kv heads = 128 work items >= 16 threads x 2.
  const std::vector<int32_t> kv_lens(16, 4000);
  const SplitPlan p = plan_decode_splits(kv_lens.data(), 16, 8, 16, 16);
  expect_well_formed(p, kv_lens, 16);
  EXPECT_FALSE(p.has_splits());
}

TEST(PlanDecodeSplits, NarrowBatchSplitsLongSequencesOnly) {
  SplitPlanConfig cfg;
  cfg.min_chunk_tokens = 100;  // rounded up to 112 (block 16)
  const std::vector<int32_t> kv_lens = {8000, 50};
  const SplitPlan p = plan_decode_splits(kv_lens.data(), 2, 1, 16, 64, cfg);
  expect_well_formed(p, kv_lens, 16);
  EXPECT_GT(p.num_splits[0], 1);
  EXPECT_EQ(p.num_splits[1], 1);
  EXPECT_GE(p.chunk_tokens, 112);
  EXPECT_LE(p.max_splits, cfg.max_splits_per_seq);
  // Aims at parallelism x work_items_per_unit items.
  EXPECT_GE(p.total_splits, 64 * cfg.work_items_per_unit / 2);
}

TEST(PlanDecodeSplits, RespectsCapAndFloor) {
  SplitPlanConfig cfg;
  cfg.max_splits_per_seq = 4;
  cfg.min_chunk_tokens = 10;
  const std::vector<int32_t> kv_lens = {100000};
  const SplitPlan p = plan_decode_splits(kv_lens.data(), 1, 1, 32, 1000, cfg);
  expect_well_formed(p, kv_lens, 32);
  EXPECT_EQ(p.max_splits, 4);

  cfg.max_splits_per_seq = 64;
  cfg.min_chunk_tokens = 512;
  const std::vector<int32_t> short_lens = {600};
  const SplitPlan q = plan_decode_splits(short_lens.data(), 1, 1, 16, 1000, cfg);
  expect_well_formed(q, short_lens, 16);
  EXPECT_LE(q.max_splits, 2);  // 600 tokens, chunks of >= 512
  EXPECT_GE(q.chunk_tokens, 512);
}

TEST(PlanDecodeSplits, ShortSequencesAreNotSplit) {
  const std::vector<int32_t> kv_lens = {10, 200, 255};
  const SplitPlan p =
      plan_decode_splits(kv_lens.data(), 3, 1, 16, 64);  // default floor: 512 tokens
  expect_well_formed(p, kv_lens, 16);
  EXPECT_FALSE(p.has_splits());
}

TEST(PlanDecodeSplits, RandomShapesAreWellFormed) {
  uint64_t x = 12345;
  auto next = [&x](int n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((x >> 33) % static_cast<uint64_t>(n));
  };
  for (int iter = 0; iter < 500; ++iter) {
    const int num_seqs = 1 + next(20);
    const int block_size = 1 << next(6);
    std::vector<int32_t> kv_lens(num_seqs);
    for (auto& l : kv_lens) l = next(5000);
    SplitPlanConfig cfg;
    cfg.min_chunk_tokens = next(600);
    cfg.max_splits_per_seq = 1 + next(70);
    cfg.work_items_per_unit = 1 + next(4);
    const SplitPlan p =
        plan_decode_splits(kv_lens.data(), num_seqs, 1 + next(8), block_size, 1 + next(200), cfg);
    expect_well_formed(p, kv_lens, block_size);
    EXPECT_TRUE(check_split_plan(p, num_seqs, block_size, 0, kv_lens.data()).ok());
    EXPECT_LE(p.max_splits, std::max(1, cfg.max_splits_per_seq));
    if (p.has_splits()) {
      EXPECT_GE(p.chunk_tokens, cfg.min_chunk_tokens);
    }
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
}

// check_split_plan without host kv_lens (the CUDA backend's case) still refuses a plan whose
// offsets, totals or max_splits disagree with its splits (the partial workspace, the grid and the
// merge follow them); with kv_lens it also refuses splits that leave keys out.
TEST(CheckSplitPlan, RefusesInconsistentPlans) {
  const std::vector<int32_t> kv_lens = {40, 20};
  const SplitPlan good = make_split_plan(kv_lens.data(), 2, 16, 16);
  ASSERT_EQ(good.max_splits, 3);
  EXPECT_TRUE(check_split_plan(good, 2, 16, 0, nullptr).ok());
  EXPECT_TRUE(check_split_plan(good, 2, 16, 0, kv_lens.data()).ok());
  auto refused = [&](SplitPlan p, const int32_t* lens) {
    return check_split_plan(p, 2, 16, 0, lens).code() == StatusCode::kInvalidArgument;
  };
  SplitPlan p = good;
  p.split_offset[1] = 5;
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.total_splits = 9;
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.max_splits = 2;
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.num_splits[1] = 0;
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.chunk_tokens = 24;
  EXPECT_TRUE(refused(p, nullptr));
  EXPECT_EQ(check_split_plan(good, 3, 16, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_split_plan(good, 2, 16, 32, nullptr).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> longer = {60, 20};  // 48 tokens of splits for 60 keys
  EXPECT_TRUE(check_split_plan(good, 2, 16, 0, nullptr).ok());
  EXPECT_EQ(check_split_plan(good, 2, 16, 0, longer.data()).code(), StatusCode::kInvalidArgument);
}

// The device image (what CudaBackend uploads and compares with once per layer): the three arrays
// in order, and a comparison that sees a change in any word or in the length.
TEST(SplitPlanImage, ConcatenatesTheArraysAndComparesEveryWord) {
  const std::vector<int32_t> kv_lens = {40, 9, 70};
  SplitPlan plan = make_split_plan(kv_lens.data(), 3, /*block_size=*/8, /*chunk_tokens=*/16);
  plan.split_begin.assign(static_cast<size_t>(plan.total_splits), 0);
  for (int i = 0; i < plan.total_splits; ++i) plan.split_begin[static_cast<size_t>(i)] = 8 * i;
  std::vector<int32_t> image(plan.image_words(), -1);
  ASSERT_EQ(image.size(), 3u + 3u + static_cast<size_t>(plan.total_splits));
  plan.write_image(image.data());
  std::vector<int32_t> expect = plan.num_splits;
  expect.insert(expect.end(), plan.split_offset.begin(), plan.split_offset.end());
  expect.insert(expect.end(), plan.split_begin.begin(), plan.split_begin.end());
  EXPECT_EQ(image, expect);
  EXPECT_TRUE(plan.image_equals(image));

  for (size_t w = 0; w < image.size(); ++w) {  // any one word changed
    std::vector<int32_t> other = image;
    other[w] += 1;
    EXPECT_FALSE(plan.image_equals(other)) << "word " << w;
  }
  std::vector<int32_t> longer = image;
  longer.push_back(0);
  EXPECT_FALSE(plan.image_equals(longer));
  EXPECT_FALSE(plan.image_equals({}));
  // Without split_begin (uniform chunks) the image is two arrays shorter by total_splits words.
  SplitPlan uniform = plan;
  uniform.split_begin.clear();
  EXPECT_FALSE(uniform.image_equals(image));
  std::vector<int32_t> two(uniform.image_words());
  uniform.write_image(two.data());
  EXPECT_TRUE(uniform.image_equals(two));
  EXPECT_FALSE(plan.image_equals(two));
}

}  // namespace
}  // namespace kvsplit::backend
