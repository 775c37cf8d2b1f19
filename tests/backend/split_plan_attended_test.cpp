// The split-K planner over the pages attention reads (plan_decode_splits with page precisions,
// docs/kv-cache.md "Split-K plan"): evicted pages are skipped by attention, so a sequence is split
// as the resident pages it has, wherever they lie, and the splits' bounds place each split's
// attended pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/split_plan.h"
#include "kernels/common/kv_quant.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend {
namespace {

constexpr uint8_t kFull = static_cast<uint8_t>(kernels::KvPrecision::kFull);
constexpr uint8_t kInt8 = static_cast<uint8_t>(kernels::KvPrecision::kInt8);
constexpr uint8_t kEvict = static_cast<uint8_t>(kernels::KvPrecision::kEvicted);

// The plan's shape: what sizes the work (the bounds place it). A plan without splits has a
// nominal chunk (its longest span), so its chunk is not compared.
void expect_same_shape(const SplitPlan& got, const SplitPlan& want) {
  if (got.has_splits() || want.has_splits()) EXPECT_EQ(got.chunk_tokens, want.chunk_tokens);
  EXPECT_EQ(got.num_splits, want.num_splits);
  EXPECT_EQ(got.split_offset, want.split_offset);
  EXPECT_EQ(got.total_splits, want.total_splits);
  EXPECT_EQ(got.max_splits, want.max_splits);
  EXPECT_EQ(got.window, want.window);
}

// Every split of a plan with bounds covers [begin, next begin or kv_len); together they cover the
// window's span, each but the last holds chunk_tokens attended keys and every one holds some.
void expect_bounds_cover_attended(const SplitPlan& p, const std::vector<int32_t>& kv_lens,
                                  const std::vector<uint8_t>& prec, int max_blocks, int bs,
                                  int window) {
  ASSERT_EQ(p.split_begin.size(), static_cast<size_t>(p.total_splits));
  ASSERT_TRUE(
      check_split_plan(p, static_cast<int>(kv_lens.size()), bs, window, kv_lens.data()).ok());
  for (size_t s = 0; s < kv_lens.size(); ++s) {
    const int n = p.num_splits[s];
    const int32_t* b = &p.split_begin[p.split_offset[s]];
    EXPECT_EQ(b[0], kernels::window_decode_base(kv_lens[s], window, bs)) << "seq " << s;
    for (int j = 0; j < n; ++j) {
      const int end = j + 1 < n ? b[j + 1] : kv_lens[s];
      int keys = 0;
      for (int k = b[j]; k < end; ++k) keys += prec[s * max_blocks + k / bs] != kEvict;
      if (j + 1 < n) {
        EXPECT_EQ(keys, p.chunk_tokens) << "seq " << s << " split " << j;
      } else {
        EXPECT_GT(keys, 0) << "seq " << s << " split " << j;
        EXPECT_LE(keys, p.chunk_tokens) << "seq " << s << " split " << j;
      }
    }
  }
}

// 64 pages of which 48 are evicted (the sink page, the recent ones and every fourth in between
// stay) against 16 pages all resident: the same plan. With the default floor (512 keys) neither is
// split: 256 keys are attended. Before, the 1024-key span was split in two, the first split
// reading 128 keys and the second 128 too, merged for nothing.
TEST(PlanAttendedSplits, AMostlyEvictedSequenceIsPlannedAsItsResidentPages) {
  constexpr int kBs = 16, kPages = 64;
  std::vector<uint8_t> prec(kPages, kEvict);
  int resident = 0;
  for (int b = 0; b < kPages; ++b) {
    if (b == 0 || b >= kPages - 8 || (b % 8 == 4)) {
      prec[b] = b % 3 == 0 ? kInt8 : kFull;
      ++resident;
    }
  }
  ASSERT_EQ(resident, 16);
  const std::vector<int32_t> evicted_len = {kPages * kBs}, resident_len = {resident * kBs};
  const PlanPages pages{prec.data(), kPages};
  EXPECT_EQ(attended_keys(evicted_len[0], 0, kBs, pages, 0), resident * kBs);

  const SplitPlan defaults = plan_decode_splits(evicted_len.data(), 1, 1, kBs, 64, {}, 0, pages);
  expect_same_shape(defaults, plan_decode_splits(resident_len.data(), 1, 1, kBs, 64));
  EXPECT_FALSE(defaults.has_splits());
  EXPECT_TRUE(check_split_plan(defaults, 1, kBs, 0, evicted_len.data()).ok());

  SplitPlanConfig cfg;
  cfg.min_chunk_tokens = 48;  // 3 pages: 16 resident pages make 6 splits
  const SplitPlan split = plan_decode_splits(evicted_len.data(), 1, 1, kBs, 64, cfg, 0, pages);
  const SplitPlan want = plan_decode_splits(resident_len.data(), 1, 1, kBs, 64, cfg);
  expect_same_shape(split, want);
  EXPECT_EQ(split.num_splits[0], 6);
  EXPECT_TRUE(want.split_begin.empty());  // nothing evicted: uniform chunks, as before
  expect_bounds_cover_attended(split, evicted_len, prec, kPages, kBs, 0);
}

// A batch: each sequence planned as its resident pages, the chunk sized on the batch's attended
// keys (here 12 + 40 pages, against 64 + 40 positions).
TEST(PlanAttendedSplits, ABatchIsPlannedAsItsResidentPages) {
  constexpr int kBs = 8, kMax = 64;
  std::vector<uint8_t> prec(2 * kMax, kFull);
  for (int b = 4; b < 56; ++b) prec[b] = kEvict;  // sequence 0: pages 0-3 and 56-63 resident
  const std::vector<int32_t> lens = {kMax * kBs - 3, 40 * kBs};
  const std::vector<int32_t> compact = {12 * kBs - 3, 40 * kBs};
  SplitPlanConfig cfg;
  cfg.min_chunk_tokens = kBs;
  for (int kv_heads : {1, 2}) {
    for (int parallelism : {4, 16, 64}) {
      const SplitPlan got = plan_decode_splits(lens.data(), 2, kv_heads, kBs, parallelism, cfg, 0,
                                               {prec.data(), kMax});
      expect_same_shape(got,
                        plan_decode_splits(compact.data(), 2, kv_heads, kBs, parallelism, cfg));
      if (got.has_splits()) expect_bounds_cover_attended(got, lens, prec, kMax, kBs, 0);
    }
  }
}

// No page evicted (quantized ones are attended): the plan is the uniform one, bit for bit.
TEST(PlanAttendedSplits, NoEvictedPageGivesTheUniformPlan) {
  constexpr int kBs = 16, kMax = 40;
  std::vector<uint8_t> prec(2 * kMax, kFull);
  for (size_t i = 0; i < prec.size(); i += 3) prec[i] = kInt8;
  const std::vector<int32_t> lens = {kMax * kBs, 300};
  SplitPlanConfig cfg;
  cfg.min_chunk_tokens = 32;
  const SplitPlan a = plan_decode_splits(lens.data(), 2, 1, kBs, 64, cfg, 0, {prec.data(), kMax});
  const SplitPlan b = plan_decode_splits(lens.data(), 2, 1, kBs, 64, cfg);
  ASSERT_TRUE(a.has_splits());
  expect_same_shape(a, b);
  EXPECT_TRUE(a.split_begin.empty());
}

// Random tables, windows and configs: the plan of a table with evicted pages has the shape of the
// plan of its resident pages packed together (kv_len = its attended keys, no window), and bounds
// that cover the span with every split attending keys.
TEST(PlanAttendedSplits, RandomTablesArePlannedAsTheirResidentPages) {
  uint64_t x = 777;
  auto next = [&x](int n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((x >> 33) % static_cast<uint64_t>(n));
  };
  int with_bounds = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int num_seqs = 1 + next(6);
    const int bs = 1 << (2 + next(4));
    const int max_blocks = 1 + next(80);
    const int window = next(3) == 0 ? 1 + next(max_blocks * bs) : 0;
    std::vector<int32_t> lens(num_seqs), compact(num_seqs);
    std::vector<uint8_t> prec(static_cast<size_t>(num_seqs) * max_blocks);
    const int evict_pct = next(100);
    for (int s = 0; s < num_seqs; ++s) {
      lens[s] = 1 + next(max_blocks * bs);
      for (int b = 0; b < max_blocks; ++b) {
        const bool last = (b + 1) * bs >= lens[s];  // the page being written stays
        prec[s * max_blocks + b] = !last && next(100) < evict_pct ? kEvict : kFull;
      }
      compact[s] = attended_keys(lens[s], window, bs, {prec.data(), max_blocks}, s);
    }
    SplitPlanConfig cfg;
    cfg.min_chunk_tokens = next(200);
    cfg.max_splits_per_seq = 1 + next(40);
    const int kv_heads = 1 + next(4), parallelism = 1 + next(100);
    const SplitPlan got = plan_decode_splits(lens.data(), num_seqs, kv_heads, bs, parallelism, cfg,
                                             window, {prec.data(), max_blocks});
    const SplitPlan want =
        plan_decode_splits(compact.data(), num_seqs, kv_heads, bs, parallelism, cfg);
    if (got.has_splits() || want.has_splits()) EXPECT_EQ(got.chunk_tokens, want.chunk_tokens);
    EXPECT_EQ(got.num_splits, want.num_splits);
    EXPECT_EQ(got.split_offset, want.split_offset);
    EXPECT_EQ(got.total_splits, want.total_splits);
    EXPECT_TRUE(check_split_plan(got, num_seqs, bs, window, lens.data()).ok());
    if (!got.split_begin.empty()) {
      ++with_bounds;
      expect_bounds_cover_attended(got, lens, prec, max_blocks, bs, window);
    }
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
  EXPECT_GT(with_bounds, 50);
}

// Which backends plan on the attended pages (SplitPlanConfig::attended).
TEST(PlanAttendedSplits, AutoPlansOnAttendedPagesWhereEvictedPagesCostNothing) {
  SplitPlanConfig c;
  EXPECT_TRUE(plan_on_attended(c, /*skips_evicted=*/true));    // the CPU backend
  EXPECT_FALSE(plan_on_attended(c, /*skips_evicted=*/false));  // CUDA
  c.attended = SplitPlanConfig::Attended::kOn;
  EXPECT_TRUE(plan_on_attended(c, false));
  c.attended = SplitPlanConfig::Attended::kOff;
  EXPECT_FALSE(plan_on_attended(c, true));
}

// check_split_plan refuses bounds that leave keys out, overlap or are not page aligned.
TEST(CheckSplitPlan, RefusesBadSplitBounds) {
  constexpr int kBs = 16;
  std::vector<uint8_t> prec(10, kFull);
  prec[2] = prec[3] = prec[4] = kEvict;
  const std::vector<int32_t> lens = {10 * kBs};
  SplitPlanConfig cfg;
  cfg.min_chunk_tokens = 2 * kBs;
  const SplitPlan good = plan_decode_splits(lens.data(), 1, 1, kBs, 64, cfg, 0, {prec.data(), 10});
  ASSERT_EQ(good.split_begin, (std::vector<int32_t>{0, 5 * kBs, 7 * kBs, 9 * kBs}));
  EXPECT_TRUE(check_split_plan(good, 1, kBs, 0, lens.data()).ok());
  EXPECT_TRUE(check_split_plan(good, 1, kBs, 0, nullptr).ok());
  auto refused = [&](const SplitPlan& p, const int32_t* l) {
    return check_split_plan(p, 1, kBs, 0, l).code() == StatusCode::kInvalidArgument;
  };
  SplitPlan p = good;
  p.split_begin.pop_back();  // one bound short
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.split_begin[2] = 7 * kBs + 1;  // not page aligned
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.split_begin[2] = 5 * kBs;  // an empty split
  EXPECT_TRUE(refused(p, nullptr));
  p = good;
  p.split_begin[0] = kBs;                                     // keys [0, 16) left out
  EXPECT_TRUE(check_split_plan(p, 1, kBs, 0, nullptr).ok());  // not seen without kv_lens
  EXPECT_TRUE(refused(p, lens.data()));
  p = good;
  p.split_begin[3] = 10 * kBs;  // the last split starts at kv_len: empty
  EXPECT_TRUE(refused(p, lens.data()));
}

}  // namespace
}  // namespace kvsplit::backend
