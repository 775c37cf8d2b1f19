// Partial attention on the CPU backend (spatial cut): the log-sum-exp output (AttentionArgs::lse)
// of prefill and split-K decode, full and mixed pages, rows that attend no key, against the fp64
// oracles; and merge_attention_states merging shards of a call's pages back into the unsharded
// attention, plus its edge cases. The CUDA kernels run the same checks in
// tests/kernels/attention_lse_parity_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/split_plan.h"
#include "oracle/attention_oracle.h"
#include "oracle/mixed_attention_oracle.h"
#include "oracle/mixed_scoring.h"
#include "oracle/partial_attention.h"

namespace kvsplit::backend {
namespace {

using kernels::KvPrecision;
using oracle::AttentionCase;
using oracle::CaseSpec;

constexpr double kAtol = 1e-5, kRtol = 1e-4;
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kEvict = static_cast<int>(KvPrecision::kEvicted);

struct Result {
  Status status;
  std::vector<float> out, lse;
};

// Runs `a` (host arrays) with lse requested: decode with *plan, prefill when plan is null.
Result run(Backend& cpu, AttentionArgs a, const SplitPlan* plan) {
  Result r;
  r.out.assign(static_cast<size_t>(a.num_tokens) * a.num_heads * a.head_dim, kNan);
  r.lse.assign(static_cast<size_t>(a.num_tokens) * a.num_heads, kNan);
  a.out = r.out.data();
  a.lse = r.lse.data();
  r.status = plan ? cpu.attention_decode(a, *plan) : cpu.attention_prefill(a);
  return r;
}

void expect_matches(const Result& r, const std::vector<double>& want_out,
                    const std::vector<double>& want_lse, const std::string& w) {
  ASSERT_TRUE(r.status.ok()) << w << ": " << r.status.to_string();
  const oracle::Comparison out = oracle::compare(r.out.data(), want_out, kAtol, kRtol);
  EXPECT_TRUE(out.ok) << w << " out: " << out.message;
  const oracle::Comparison lse = oracle::compare_lse(r.lse.data(), want_lse, kAtol, kAtol);
  EXPECT_TRUE(lse.ok) << w << ": " << lse.message;
}

AttentionCase random_case(oracle::Rng& rng, uint64_t seed, bool prefill) {
  CaseSpec spec;
  spec.seed = seed;
  spec.num_kv_heads = rng.range(1, 2);
  spec.num_heads = spec.num_kv_heads * rng.range(1, 4);
  spec.head_dim = rng.range(0, 1) ? 64 : 16;
  const int num_seqs = rng.range(1, 3);
  for (int s = 0; s < num_seqs; ++s) {
    const int kv_len = oracle::random_len(rng, 300);
    spec.kv_lens.push_back(kv_len);
    if (prefill) spec.q_lens.push_back(rng.range(0, 1) ? kv_len : rng.range(1, kv_len));
  }
  return oracle::make_case(spec);
}

TEST(CpuAttentionLse, FullAndMixedPagesMatchTheOracle) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  oracle::Rng rng(11);
  for (int iter = 0; iter < 16; ++iter) {
    const bool prefill = iter % 2 == 1, mixed = iter % 4 >= 2;
    AttentionCase c = random_case(rng, 600 + iter, prefill);
    oracle::MixedCase m;
    if (mixed) m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
    AttentionArgs a = c.args();
    std::vector<double> want_out, want_lse;
    if (mixed) {
      m.apply(a);
      oracle::MixedResult want = oracle::mixed_attention(a);
      want_out = std::move(want.out);
      want_lse = std::move(want.lse);
    } else {
      want_out = oracle::attention_f32(a);
      want_lse = oracle::attention_lse(a, [&](int64_t i) { return double{c.pages[i]}; });
    }
    const std::string w = "iter " + std::to_string(iter);
    if (prefill) {
      expect_matches(run(*cpu, a, nullptr), want_out, want_lse, w + " prefill");
    } else {
      for (const SplitPlan& plan : oracle::plans_for(c, rng))
        expect_matches(run(*cpu, a, &plan), want_out, want_lse,
                       w + " decode chunk " + std::to_string(plan.chunk_tokens));
    }
    if (HasFailure()) FAIL() << w;
  }
}

// Decode: sequence 1 has every page evicted. Prefill: rows 0..31 of sequence 0 see only evicted
// pages. Those rows give out 0 and lse -inf; the others match the oracle.
TEST(CpuAttentionLse, RowsThatAttendNoKeyAreZeroAndMinusInfinity) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  oracle::Rng rng(5);
  for (const bool prefill : {false, true}) {
    CaseSpec spec;
    spec.num_heads = 4;
    spec.num_kv_heads = 2;
    spec.head_dim = 16;
    spec.kv_lens = {5 * 16 + 3, 3 * 16};
    if (prefill) spec.q_lens = {5 * 16 + 3, 20};
    AttentionCase c = oracle::make_case(spec);
    const std::vector<std::vector<int>> force =
        prefill ? std::vector<std::vector<int>>{{kEvict, kEvict, 1, kEvict, 2, 0}, {kEvict, 1, 0}}
                : std::vector<std::vector<int>>{{kEvict, 2, kEvict, 1, kEvict, 0},
                                                {kEvict, kEvict, kEvict}};
    oracle::MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0, 0, 0}, force);
    AttentionArgs a = c.args();
    m.apply(a);
    const oracle::MixedResult want = oracle::mixed_attention(a);
    const SplitPlan plan = make_split_plan(c.kv_lens.data(), c.num_seqs, 16, 32);
    const Result r = run(*cpu, a, prefill ? nullptr : &plan);
    expect_matches(r, want.out, want.lse, prefill ? "prefill" : "decode");
    int empty = 0;
    for (size_t row = 0; row < want.lse.size(); ++row) {
      if (!std::isinf(want.lse[row])) continue;
      ++empty;
      EXPECT_EQ(r.lse[row], kNegInf) << row;
      for (int d = 0; d < a.head_dim; ++d) ASSERT_EQ(r.out[row * a.head_dim + d], 0.f) << row;
    }
    EXPECT_EQ(empty, prefill ? 32 * 4 : 4);
  }
}

// A hand-built split plan is checked before it is used: max_splits must be the largest
// num_splits (the workspace and the merge follow it; a plan leaving it 0 wrote split outputs
// through an unsized buffer), and split bounds must fit an int, counted from the window's start.
TEST(CpuAttentionLse, InconsistentSplitPlansAreRefused) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  CaseSpec spec;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 16;
  spec.kv_lens = {20};
  AttentionCase c = oracle::make_case(spec);
  SplitPlan plan = make_split_plan(c.kv_lens.data(), 1, 16, 16);
  ASSERT_EQ(plan.max_splits, 2);
  EXPECT_TRUE(run(*cpu, c.args(), &plan).status.ok());
  SplitPlan unset = plan;
  unset.max_splits = 0;
  Result r = run(*cpu, c.args(), &unset);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("max_splits 0 is not the largest num_splits 2"),
            std::string::npos)
      << r.status.message();
  SplitPlan huge = plan;
  huge.chunk_tokens = 1 << 30;
  huge.num_splits = {4};
  huge.total_splits = 4;
  huge.max_splits = 4;
  EXPECT_EQ(run(*cpu, c.args(), &huge).status.code(), StatusCode::kInvalidArgument);

  // With a sliding window the splits start at the window's first page: a plan whose splits fit
  // an int from 0 can still run past it from there (the key bounds wrapped negative and the
  // decode read outside the pages).
  AttentionArgs far = c.args();
  const int bs = 1 << 24;
  std::vector<int32_t> far_len = {std::numeric_limits<int32_t>::max() - 8};
  std::vector<int32_t> far_table(128, 0);
  far.kv_lens = far_len.data();
  far.block_tables = far_table.data();
  far.max_blocks_per_seq = 128;
  far.kv.block_size = bs;
  far.kv.num_blocks = 1;
  far.window = bs;
  SplitPlan wrap = make_split_plan(far_len.data(), 1, bs, bs, bs);
  ASSERT_EQ(wrap.num_splits[0], 2);
  Result wr = run(*cpu, far, &wrap);
  EXPECT_EQ(wr.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wr.status.message().find("does not match kv_len"), std::string::npos)
      << wr.status.message();
}

// The sharded scoring fields: head_max is each head's maximum scaled score (between lse - log
// kv_len and lse), and a scoring-only call against those maxima (score_max) gives the same
// relevance as the ordinary scored call; misuse is refused.
TEST(CpuAttentionScoring, HeadMaxAndScoringOnlyCallAgreeWithTheScoredCall) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  oracle::Rng rng(11);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    AttentionCase c = random_case(rng, seed, /*prefill=*/false);
    AttentionArgs a = c.args();
    const SplitPlan plan = make_split_plan(c.kv_lens.data(), c.num_seqs, a.kv.block_size, 32);
    const size_t heads = size_t(a.num_seqs) * a.num_heads;
    std::vector<float> head_max(heads, kNan);
    a.head_max = head_max.data();
    const Result r = run(*cpu, a, &plan);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    for (int s = 0; s < a.num_seqs; ++s) {
      for (int h = 0; h < a.num_heads; ++h) {
        const float m = head_max[size_t(s) * a.num_heads + h];
        const float lse = r.lse[size_t(s) * a.num_heads + h];
        EXPECT_LE(m, lse + 1e-5f) << "seed " << seed;
        EXPECT_GE(m, lse - std::log(static_cast<float>(c.kv_lens[s])) - 1e-5f) << "seed " << seed;
      }
    }
    const size_t rel_size = size_t(a.num_seqs) * a.max_blocks_per_seq * a.kv.block_size;
    std::vector<uint8_t> flags(a.num_seqs, 1);
    std::vector<float> scored(rel_size, 0.f), only(rel_size, 0.f);
    AttentionArgs b = c.args();
    b.score_seqs = flags.data();
    b.token_relevance = scored.data();
    ASSERT_TRUE(run(*cpu, b, &plan).status.ok());
    b.token_relevance = only.data();
    b.score_max = head_max.data();
    std::vector<float> untouched(size_t(a.num_tokens) * a.num_heads * a.head_dim, 7.f);
    b.out = untouched.data();
    ASSERT_TRUE(cpu->attention_decode(b, plan).ok());
    EXPECT_EQ(only, scored) << "seed " << seed;
    for (float x : untouched) ASSERT_EQ(x, 7.f);  // scoring only: no output written
    float best = 0.f;
    for (float x : only) best = std::max(best, x);
    EXPECT_GT(best, 0.999f);
    // Misuse: score_max without score_seqs, with head_max, and either on prefill.
    AttentionArgs bad = c.args();
    bad.out = untouched.data();
    bad.score_max = head_max.data();
    EXPECT_EQ(cpu->attention_decode(bad, plan).code(), StatusCode::kInvalidArgument);
    bad.score_seqs = flags.data();
    bad.token_relevance = only.data();
    bad.head_max = head_max.data();
    EXPECT_EQ(cpu->attention_decode(bad, plan).code(), StatusCode::kInvalidArgument);
  }
  CaseSpec spec;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 16;
  spec.kv_lens = {40};
  spec.q_lens = {40};
  AttentionCase c = oracle::make_case(spec);
  AttentionArgs p = c.args();
  std::vector<float> out(size_t(40) * 2 * 16), hm(2);
  p.out = out.data();
  p.head_max = hm.data();
  EXPECT_EQ(cpu->attention_prefill(p).code(), StatusCode::kInvalidArgument);
}

TEST(CpuMergeAttentionStates, ShardsMergeToTheUnshardedAttention) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  oracle::Rng rng(21);
  for (int iter = 0; iter < 16; ++iter) {
    const bool prefill = iter % 2 == 1, mixed = iter % 8 < 4;
    const int num_parts = 1 + iter % 4;
    AttentionCase c = random_case(rng, 800 + iter, prefill);
    oracle::MixedCase m;
    if (mixed) m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0.2, 0.2, 0.15});
    AttentionArgs a = c.args();
    std::vector<double> want_out, want_lse;
    if (mixed) {
      m.apply(a);
      oracle::MixedResult want = oracle::mixed_attention(a);
      want_out = std::move(want.out);
      want_lse = std::move(want.lse);
    } else {
      want_out = oracle::attention_f32(a);
      want_lse = oracle::attention_lse(a, [&](int64_t i) { return double{c.pages[i]}; });
    }
    const size_t table_rows = static_cast<size_t>(a.num_seqs) * a.max_blocks_per_seq;
    const auto shards = oracle::shard_precisions(m.precision, table_rows, num_parts, rng);
    const SplitPlan plan = make_split_plan(c.kv_lens.data(), c.num_seqs, 16, 16 * (iter % 3));
    std::vector<Result> parts;
    std::vector<const float*> o, lse;
    for (int p = 0; p < num_parts; ++p) {
      AttentionArgs ap = a;
      ap.page_precision = shards[p].data();
      parts.push_back(run(*cpu, ap, prefill ? nullptr : &plan));
      ASSERT_TRUE(parts.back().status.ok()) << parts.back().status.to_string();
    }
    for (const Result& p : parts) {
      o.push_back(p.out.data());
      lse.push_back(p.lse.data());
    }
    const int64_t rows = int64_t{a.num_tokens} * a.num_heads;
    Result merged;
    merged.out.assign(rows * a.head_dim, kNan);
    merged.lse.assign(rows, kNan);
    merged.status = cpu->merge_attention_states(o.data(), lse.data(), num_parts, rows, a.head_dim,
                                                merged.out.data(), merged.lse.data());
    expect_matches(merged, want_out, want_lse,
                   "iter " + std::to_string(iter) + " parts " + std::to_string(num_parts));
    if (HasFailure()) FAIL() << iter;
  }
}

TEST(CpuMergeAttentionStates, EmptyPartsAndBadCounts) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  const int hd = 3;
  const std::vector<float> o0 = {1, 2, 3, 4, 5, 6}, o1(6, kNan);
  const std::vector<float> l0 = {0.5f, kNegInf}, l1 = {kNegInf, kNegInf};
  std::vector<const float*> o = {o0.data(), o1.data()}, lse = {l0.data(), l1.data()};
  std::vector<float> out(6, kNan), lse_out(2, kNan);
  ASSERT_TRUE(
      cpu->merge_attention_states(o.data(), lse.data(), 2, 2, hd, out.data(), lse_out.data()).ok());
  // Row 0: part 1 is empty, so the merge is part 0; row 1: empty everywhere.
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 0, 0, 0}));
  EXPECT_EQ(lse_out[0], 0.5f);
  EXPECT_EQ(lse_out[1], kNegInf);
  // Two equal parts: the same output, lse + log 2.
  std::vector<const float*> same_o = {o0.data(), o0.data()}, same_l = {l0.data(), l0.data()};
  ASSERT_TRUE(
      cpu->merge_attention_states(same_o.data(), same_l.data(), 2, 1, hd, out.data(), nullptr)
          .ok());
  EXPECT_NEAR(out[0], 1.f, 1e-6);
  EXPECT_NEAR(out[2], 3.f, 1e-6);
  ASSERT_TRUE(cpu->merge_attention_states(same_o.data(), same_l.data(), 2, 1, hd, out.data(),
                                          lse_out.data())
                  .ok());
  EXPECT_NEAR(lse_out[0], 0.5 + std::log(2.0), 1e-6);
  // A bad partial (NaN or +inf lse) makes its row NaN, never a row that leaves it out.
  for (const float bad : {kNan, std::numeric_limits<float>::infinity()}) {
    const std::vector<float> lb = {bad, 0.5f};
    std::vector<const float*> bo = {o0.data(), o0.data()}, bl = {l0.data(), lb.data()};
    ASSERT_TRUE(
        cpu->merge_attention_states(bo.data(), bl.data(), 2, 2, hd, out.data(), lse_out.data())
            .ok());
    for (int d = 0; d < hd; ++d) EXPECT_TRUE(std::isnan(out[d])) << bad << " " << d;
    EXPECT_TRUE(std::isnan(lse_out[0])) << bad;
    EXPECT_EQ(out[3], 4.f);  // row 1: part 0 empty, part 1 alone
    EXPECT_EQ(lse_out[1], 0.5f);
  }
  for (int n : {0, -3, Backend::kMaxMergeParts + 1}) {
    EXPECT_EQ(
        cpu->merge_attention_states(o.data(), lse.data(), n, 2, hd, out.data(), nullptr).code(),
        StatusCode::kInvalidArgument)
        << n;
  }
}

}  // namespace
}  // namespace kvsplit::backend
