// CPU paged attention against the fp64 oracle: the split-K property test (split-K decode equals
// no split, both equal the oracle), prefill and chunked prefill, NaN checks and bad arguments.
#include "backend/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backend/split_plan.h"
#include "common/thread_pool.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::backend {
namespace {

using oracle::AttentionCase;
using oracle::CaseSpec;

constexpr double kOracleTol = 1e-5;  // f32 kernel vs fp64 oracle (abs and rel)
constexpr double kSplitTol = 2e-6;   // split-K vs no split: same data, different summation order

std::string describe(const CaseSpec& s) {
  std::string kv;
  for (size_t i = 0; i < s.kv_lens.size() && i < 6; ++i) kv += std::to_string(s.kv_lens[i]) + ",";
  return "heads " + std::to_string(s.num_heads) + "/" + std::to_string(s.num_kv_heads) +
         " head_dim " + std::to_string(s.head_dim) + " block " + std::to_string(s.block_size) +
         " seqs " + std::to_string(s.kv_lens.size()) + " kv_lens " + kv + " seed " +
         std::to_string(s.seed);
}

// A random decode/prefill shape: MHA, GQA or MQA; head_dim {8, 64, 80, 128}; block {1, 8, 16, 32}.
CaseSpec random_shape(oracle::Rng& rng, uint64_t seed) {
  CaseSpec s;
  s.seed = seed;
  switch (rng.range(0, 2)) {
    case 0:
      s.num_kv_heads = rng.range(1, 4);
      s.num_heads = s.num_kv_heads;
      break;  // MHA
    case 1:
      s.num_kv_heads = rng.range(2, 3);
      s.num_heads = s.num_kv_heads * (2 << rng.range(0, 2));
      break;  // GQA
    default:
      s.num_kv_heads = 1;
      s.num_heads = rng.range(2, 8);
      break;  // MQA
  }
  const int head_dims[] = {8, 64, 80, 128};
  const int block_sizes[] = {1, 8, 16, 32};
  s.head_dim = head_dims[rng.range(0, 3)];
  s.block_size = block_sizes[rng.range(0, 3)];
  return s;
}

// kv_len in [1, max_len], log-uniform so short and long contexts both occur.
int random_len(oracle::Rng& rng, int max_len) {
  const double x = rng.uniform(0.0, std::log(static_cast<double>(max_len)));
  return std::clamp(static_cast<int>(std::exp(x)), 1, max_len);
}

void expect_matches_oracle(const AttentionCase& c, const std::vector<double>& want,
                           const std::string& what) {
  const oracle::Comparison cmp = oracle::compare(c.out.data(), want, kOracleTol, kOracleTol);
  EXPECT_TRUE(cmp.ok) << what << ": " << cmp.message;
}

TEST(CpuAttentionDecode, SplitKEqualsNoSplitAndTheOracle) {
  ThreadPool pool(3);
  oracle::Rng rng(2024);
  int split_cases = 0;
  for (int iter = 0; iter < 120; ++iter) {
    CaseSpec spec = random_shape(rng, 1000 + iter);
    const int num_seqs = rng.range(1, 16);
    const int max_len = iter % 4 == 0 ? 2000 : 400;
    for (int s = 0; s < num_seqs; ++s) spec.kv_lens.push_back(random_len(rng, max_len));
    if (iter % 7 == 0) spec.q_range = 12.0;  // peaked softmax: exercises the max rescaling
    AttentionCase c = oracle::make_case(spec);
    const AttentionArgs args = c.args();
    const std::string what = describe(spec);
    const std::vector<double> want = oracle::attention_f32(args);

    const backend::SplitPlan no_split =
        backend::make_split_plan(c.kv_lens.data(), num_seqs, spec.block_size, 0);
    ASSERT_TRUE(cpu_attention_decode(args, no_split, pool).ok()) << what;
    expect_matches_oracle(c, want, what + " (no split)");
    const std::vector<float> base = c.out;

    // Split counts from 2 up to the maximum (one block per split), plus the heuristic planner.
    const int max_kv = *std::max_element(spec.kv_lens.begin(), spec.kv_lens.end());
    const int max_blocks = (max_kv + spec.block_size - 1) / spec.block_size;
    std::vector<backend::SplitPlan> plans;
    plans.push_back(
        backend::make_split_plan(c.kv_lens.data(), num_seqs, spec.block_size, spec.block_size));
    if (max_blocks > 2) {
      const int splits = rng.range(2, std::min(max_blocks, 64));
      plans.push_back(backend::make_split_plan(c.kv_lens.data(), num_seqs, spec.block_size,
                                               (max_kv + splits - 1) / splits));
    }
    backend::SplitPlanConfig cfg;
    cfg.min_chunk_tokens = 32;
    plans.push_back(backend::plan_decode_splits(c.kv_lens.data(), num_seqs, spec.num_kv_heads,
                                                spec.block_size, 32, cfg));
    for (const backend::SplitPlan& plan : plans) {
      std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(cpu_attention_decode(args, plan, pool).ok()) << what;
      const std::string w = what + " chunk " + std::to_string(plan.chunk_tokens) + " max_splits " +
                            std::to_string(plan.max_splits);
      expect_matches_oracle(c, want, w);
      for (size_t i = 0; i < base.size(); ++i) {
        ASSERT_NEAR(c.out[i], base[i], kSplitTol * (1.0 + std::abs(base[i]))) << w << " elem " << i;
      }
      split_cases += plan.has_splits();
    }
    if (HasFailure()) FAIL() << "stopping at iteration " << iter;
  }
  EXPECT_GT(split_cases, 150);  // the loop did exercise split plans
}

TEST(CpuAttentionPrefill, MatchesTheOracleIncludingChunkedPrefill) {
  ThreadPool pool(3);
  oracle::Rng rng(77);
  for (int iter = 0; iter < 60; ++iter) {
    CaseSpec spec = random_shape(rng, 5000 + iter);
    const int num_seqs = rng.range(1, 6);
    for (int s = 0; s < num_seqs; ++s) {
      const int kv_len = random_len(rng, 300);
      // Full prefill, chunked prefill over a cached prefix, single-token rows, idle sequences.
      int q_len = kv_len;
      switch (rng.range(0, 3)) {
        case 0:
          break;
        case 1:
          q_len = rng.range(1, kv_len);
          break;
        case 2:
          q_len = 1;
          break;
        default:
          q_len = rng.range(0, std::min(kv_len, 3));
          break;
      }
      spec.kv_lens.push_back(kv_len);
      spec.q_lens.push_back(q_len);
    }
    AttentionCase c = oracle::make_case(spec);
    const AttentionArgs args = c.args();
    ASSERT_TRUE(cpu_attention_prefill(args, pool).ok()) << describe(spec);
    expect_matches_oracle(c, oracle::attention_f32(args), describe(spec));
    if (HasFailure()) FAIL() << "stopping at iteration " << iter;
  }
}

// A sliding window: 1, just under / at a page, random, or past kv_len (masks nothing).
int random_window(oracle::Rng& rng, int block_size, int max_len) {
  switch (rng.range(0, 4)) {
    case 0:
      return 1;
    case 1:
      return std::max(1, block_size - 1);
    case 2:
      return block_size;
    case 3:
      return max_len + rng.range(0, 5);
    default:
      return rng.range(1, max_len);
  }
}

// Windowed decode: every plan (no split, one page per split, random, the heuristic) matches the
// oracle, which attends only [kv_len - W, kv_len); the pages wholly before the window are NaN
// (make_case poisons them), so reading one would show. And the window does change the output.
TEST(CpuAttentionDecode, SlidingWindowReadsOnlyTheWindow) {
  ThreadPool pool(3);
  oracle::Rng rng(4242);
  int differs = 0, skipped_pages = 0;
  for (int iter = 0; iter < 80; ++iter) {
    CaseSpec spec = random_shape(rng, 9000 + iter);
    const int num_seqs = rng.range(1, 8);
    const int max_len = iter % 4 == 0 ? 1500 : 300;
    for (int s = 0; s < num_seqs; ++s) spec.kv_lens.push_back(random_len(rng, max_len));
    spec.window = random_window(rng, spec.block_size, max_len);
    AttentionCase c = oracle::make_case(spec);
    const AttentionArgs args = c.args();
    const std::string what = describe(spec) + " window " + std::to_string(spec.window);
    const std::vector<double> want = oracle::attention_f32(args);
    for (int s = 0; s < num_seqs; ++s) skipped_pages += c.unread_pages(s);

    const int32_t* kvl = c.kv_lens.data();
    const int bs = spec.block_size, W = spec.window;
    backend::SplitPlanConfig cfg;
    cfg.min_chunk_tokens = 16;
    const backend::SplitPlan plans[] = {
        backend::make_split_plan(kvl, num_seqs, bs, 0, W),
        backend::make_split_plan(kvl, num_seqs, bs, bs, W),
        backend::make_split_plan(kvl, num_seqs, bs, rng.range(1, 200), W),
        backend::plan_decode_splits(kvl, num_seqs, spec.num_kv_heads, bs, 32, cfg, W)};
    for (const backend::SplitPlan& plan : plans) {
      std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(cpu_attention_decode(args, plan, pool).ok()) << what;
      expect_matches_oracle(c, want, what + " chunk " + std::to_string(plan.chunk_tokens));
    }
    AttentionArgs full = args;
    full.window = 0;
    const std::vector<double> unwindowed = oracle::attention_f32(full);
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::abs(want[i] - unwindowed[i]) > 1e-3) {
        ++differs;
        break;
      }
    }
    if (HasFailure()) FAIL() << "stopping at iteration " << iter;
  }
  EXPECT_GT(differs, 20);         // the window did mask keys
  EXPECT_GT(skipped_pages, 100);  // and whole pages were left unread (poisoned)
}

// Windowed prefill, chunked prefill over a cached prefix and single-token rows: each row attends
// its own window.
TEST(CpuAttentionPrefill, SlidingWindowPerRow) {
  ThreadPool pool(3);
  oracle::Rng rng(99);
  for (int iter = 0; iter < 50; ++iter) {
    CaseSpec spec = random_shape(rng, 12000 + iter);
    const int num_seqs = rng.range(1, 5);
    for (int s = 0; s < num_seqs; ++s) {
      const int kv_len = random_len(rng, 300);
      spec.kv_lens.push_back(kv_len);
      spec.q_lens.push_back(rng.range(0, 2) == 0 ? kv_len : rng.range(1, kv_len));
    }
    spec.window = random_window(rng, spec.block_size, 300);
    AttentionCase c = oracle::make_case(spec);
    const AttentionArgs args = c.args();
    const std::string what = describe(spec) + " window " + std::to_string(spec.window);
    ASSERT_TRUE(cpu_attention_prefill(args, pool).ok()) << what;
    expect_matches_oracle(c, oracle::attention_f32(args), what);
    if (HasFailure()) FAIL() << "stopping at iteration " << iter;
  }
}

TEST(CpuAttentionPrefill, SingleTokenRowsEqualDecode) {
  ThreadPool pool(2);
  CaseSpec spec;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.kv_lens = {1, 15, 16, 17, 300};
  AttentionCase c = oracle::make_case(spec);
  const AttentionArgs args = c.args();
  ASSERT_TRUE(cpu_attention_prefill(args, pool).ok());
  const std::vector<float> prefill = c.out;
  const backend::SplitPlan plan = backend::make_split_plan(c.kv_lens.data(), 5, 16, 0);
  ASSERT_TRUE(cpu_attention_decode(args, plan, pool).ok());
  for (size_t i = 0; i < prefill.size(); ++i) ASSERT_EQ(prefill[i], c.out[i]) << i;
}

TEST(CpuAttention, DeterministicAcrossThreadCountsAndConcurrentCallers) {
  CaseSpec spec;
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.kv_lens = {1500, 37, 800};
  AttentionCase c1 = oracle::make_case(spec);
  AttentionCase c2 = oracle::make_case(spec);
  const backend::SplitPlan plan = backend::make_split_plan(c1.kv_lens.data(), 3, 16, 128);
  ThreadPool p1(1);
  ASSERT_TRUE(cpu_attention_decode(c1.args(), plan, p1).ok());
  const std::vector<float> single = c1.out;
  // Two callers, each with its own pool (and so its own workspace), at the same time.
  Status s1, s2;
  std::thread t1([&] {
    ThreadPool p(2);
    for (int i = 0; i < 20; ++i) s1 = cpu_attention_decode(c1.args(), plan, p);
  });
  std::thread t2([&] {
    ThreadPool p(3);
    for (int i = 0; i < 20; ++i) s2 = cpu_attention_decode(c2.args(), plan, p);
  });
  t1.join();
  t2.join();
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(c1.out, single);  // bitwise: the summation order does not depend on threads
  EXPECT_EQ(c2.out, single);
}

TEST(CpuAttention, LargeScoresStayFinite) {
  ThreadPool pool(2);
  CaseSpec spec;
  spec.head_dim = 64;
  spec.kv_lens = {200, 3};
  spec.q_range = 200.0;  // scores of order 1e3: exp would overflow without the max shift
  spec.kv_range = 3.0;
  AttentionCase c = oracle::make_case(spec);
  const AttentionArgs args = c.args();
  const backend::SplitPlan plan = backend::make_split_plan(c.kv_lens.data(), 2, 16, 32);
  ASSERT_TRUE(cpu_attention_decode(args, plan, pool).ok());
  // Near-one-hot softmax: compare with an absolute tolerance scaled to the values.
  const oracle::Comparison cmp =
      oracle::compare(c.out.data(), oracle::attention_f32(args), 1e-4, 1e-4);
  EXPECT_EQ(cmp.num_nan, 0);
  EXPECT_TRUE(cmp.ok) << cmp.message;
}

// ---- bad arguments ----

class CpuAttentionBadArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    CaseSpec spec;
    spec.num_heads = 4;
    spec.num_kv_heads = 2;
    spec.head_dim = 8;
    spec.block_size = 4;
    spec.kv_lens = {5, 9};
    c_ = oracle::make_case(spec);
    plan_ = backend::make_split_plan(c_.kv_lens.data(), 2, 4, 4);
  }
  // Both entry points reject `a` with `code`, and the message mentions `needle`.
  void expect_rejected(const AttentionArgs& a, StatusCode code, const std::string& needle,
                       bool check_prefill = true) {
    const Status d = cpu_attention_decode(a, plan_, pool_);
    EXPECT_EQ(d.code(), code) << d.to_string();
    EXPECT_NE(d.message().find(needle), std::string::npos) << d.to_string();
    if (check_prefill) {
      const Status p = cpu_attention_prefill(a, pool_);
      EXPECT_EQ(p.code(), code) << p.to_string();
      EXPECT_NE(p.message().find(needle), std::string::npos) << p.to_string();
    }
  }
  ThreadPool pool_{2};
  AttentionCase c_;
  backend::SplitPlan plan_;
};

TEST_F(CpuAttentionBadArgs, ValidCaseIsAccepted) {
  EXPECT_TRUE(cpu_attention_decode(c_.args(), plan_, pool_).ok());
  EXPECT_TRUE(cpu_attention_prefill(c_.args(), pool_).ok());
}

TEST_F(CpuAttentionBadArgs, Rejected) {
  AttentionArgs a = c_.args();
  a.num_heads = 3;
  expect_rejected(a, StatusCode::kInvalidArgument, "not a multiple");
  a = c_.args();
  a.kv.dtype = DType::kF16;
  expect_rejected(a, StatusCode::kUnimplemented, "f32");
  a = c_.args();
  a.kv.head_dim = 16;
  expect_rejected(a, StatusCode::kInvalidArgument, "KV pages hold");
  c_.kv_lens[1] = 0;  // kv_len < q_len
  expect_rejected(c_.args(), StatusCode::kInvalidArgument, "kv_len 0 < q_len 1");
  c_.kv_lens[1] = 9;
  c_.block_tables[c_.max_blocks_per_seq + 2] = c_.num_blocks;  // seq 1, block 2
  expect_rejected(c_.args(), StatusCode::kInvalidArgument, "sequence 1 block 2");
  c_.block_tables[c_.max_blocks_per_seq + 2] = -1;
  expect_rejected(c_.args(), StatusCode::kInvalidArgument, "outside [0,");
  c_.block_tables[c_.max_blocks_per_seq + 2] = 0;
  a = c_.args();
  a.max_blocks_per_seq = 2;  // seq 1 needs 3 blocks
  expect_rejected(a, StatusCode::kInvalidArgument, "needs 3 blocks");
  a = c_.args();
  a.q = nullptr;
  expect_rejected(a, StatusCode::kInvalidArgument, "null");
  a = c_.args();
  a.num_tokens = 3;
  expect_rejected(a, StatusCode::kInvalidArgument, "query_start");
}

TEST_F(CpuAttentionBadArgs, DecodeRejectsMismatchedPlansAndMultiTokenQueries) {
  const AttentionArgs a = c_.args();
  backend::SplitPlan p = backend::make_split_plan(c_.kv_lens.data(), 1, 4, 4);  // one sequence only
  EXPECT_EQ(cpu_attention_decode(a, p, pool_).code(), StatusCode::kInvalidArgument);
  p = plan_;
  p.chunk_tokens = 6;  // not a multiple of block_size
  EXPECT_EQ(cpu_attention_decode(a, p, pool_).code(), StatusCode::kInvalidArgument);
  const int32_t short_lens[] = {5, 4};  // plan made for a shorter sequence 1
  p = backend::make_split_plan(short_lens, 2, 4, 4);
  const Status st = cpu_attention_decode(a, p, pool_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st.to_string();

  CaseSpec spec = c_.spec;
  spec.q_lens = {2, 1};
  AttentionCase multi = oracle::make_case(spec);
  const Status m = cpu_attention_decode(multi.args(), plan_, pool_);
  EXPECT_EQ(m.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.message().find("exactly one query"), std::string::npos) << m.to_string();
}

TEST_F(CpuAttentionBadArgs, WindowMustBeNonNegativeAndMatchThePlan) {
  AttentionArgs a = c_.args();
  a.window = -1;
  expect_rejected(a, StatusCode::kInvalidArgument, "negative window");
  a.window = 4;  // plan_ was made without a window
  const Status st = cpu_attention_decode(a, plan_, pool_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("window"), std::string::npos) << st.to_string();
  const backend::SplitPlan windowed =
      backend::make_split_plan(c_.kv_lens.data(), 2, c_.spec.block_size, 4, 4);
  EXPECT_TRUE(cpu_attention_decode(a, windowed, pool_).ok());
}

TEST_F(CpuAttentionBadArgs, EmptyBatchIsANoOp) {
  AttentionArgs a = c_.args();
  a.num_seqs = 0;
  a.num_tokens = 0;
  const backend::SplitPlan empty = backend::make_split_plan(nullptr, 0, 4, 0);
  EXPECT_TRUE(cpu_attention_decode(a, empty, pool_).ok());
  EXPECT_TRUE(cpu_attention_prefill(a, pool_).ok());
}

}  // namespace
}  // namespace kvsplit::backend
