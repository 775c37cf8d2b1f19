// Mixed-precision CPU attention (semantic cut) against the fp64 mixed oracle, which dequantizes the
// same pages: random mixes of full / int8 / int4 / evicted pages with shuffled arena ids, MHA, GQA
// and MQA, partial last pages, split-K on and off, the scoring side outputs (token relevance, Quest
// page bounds), prefill, and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/split_plan.h"
#include "common/thread_pool.h"
#include "oracle/attention_oracle.h"
#include "oracle/mixed_attention_oracle.h"
#include "oracle/mixed_scoring.h"

namespace kvsplit::backend {
namespace {

using kernels::KvPrecision;
using oracle::AttentionCase;
using oracle::CaseSpec;
using oracle::MixedCase;
using oracle::MixedResult;
using oracle::plans_for;
using oracle::random_len;
using oracle::Scoring;

constexpr double kOracleTol = 1e-5;  // f32 kernel vs fp64 oracle on the same dequantized values
constexpr int kEvict = static_cast<int>(KvPrecision::kEvicted);

CaseSpec random_shape(oracle::Rng& rng, uint64_t seed) {
  CaseSpec s;
  s.seed = seed;
  switch (rng.range(0, 2)) {
    case 0:
      s.num_kv_heads = rng.range(1, 3);
      s.num_heads = s.num_kv_heads;
      break;  // MHA
    case 1:
      s.num_kv_heads = 2;
      s.num_heads = 2 * (2 << rng.range(0, 2));
      break;  // GQA (group 4, 8, 16: also exercises row blocks of 1..4)
    default:
      s.num_kv_heads = 1;
      s.num_heads = rng.range(2, 7);
      break;  // MQA
  }
  const int head_dims[] = {8, 32, 64, 128};
  const int block_sizes[] = {8, 16, 32};
  s.head_dim = head_dims[rng.range(0, 3)];
  s.block_size = block_sizes[rng.range(0, 2)];
  return s;
}

TEST(CpuMixedAttention, DecodeMatchesTheMixedOracleWithAndWithoutSplits) {
  ThreadPool pool(3);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(4242);
  int quantized_pages = 0, evicted_pages = 0;
  for (int iter = 0; iter < 50; ++iter) {
    CaseSpec spec = random_shape(rng, 7000 + iter);
    const int num_seqs = rng.range(1, 5);
    for (int s = 0; s < num_seqs; ++s)
      spec.kv_lens.push_back(random_len(rng, iter % 5 ? 500 : 1500));
    if (iter % 6 == 0) spec.q_range = 8.0;               // peaked softmax
    if (iter % 4 == 2) spec.window = rng.range(1, 400);  // sliding window (earlier pages poisoned)
    AttentionCase c = oracle::make_case(spec);
    const int parts = 1 << (iter % 4);  // summaries of 1, 2, 4 or 8 parts (blocks 8, 16, 32)
    Scoring sc(c, *cpu, rng, parts);
    const bool all_full = iter % 10 == 9;  // side outputs on the plain path (page_precision null)
    oracle::MixSpec mix;
    if (all_full) mix = {0.0, 0.0, 0.0};
    MixedCase m = oracle::make_mixed(c, *cpu, rng, mix);
    ASSERT_TRUE(m.quantized_ok);
    for (uint8_t p : m.precision) {
      quantized_pages += p == 1 || p == 2;
      evicted_pages += p == kEvict;
    }
    AttentionArgs a = c.args();
    m.apply(a);
    sc.apply(a);
    const MixedResult want = oracle::mixed_attention(a);
    if (all_full) a.page_precision = nullptr;
    const std::string what =
        "iter " + std::to_string(iter) + " heads " + std::to_string(spec.num_heads) + "/" +
        std::to_string(spec.num_kv_heads) + " hd " + std::to_string(spec.head_dim) + " bs " +
        std::to_string(spec.block_size) + " window " + std::to_string(spec.window) +
        " summary parts " + std::to_string(parts);
    for (const SplitPlan& plan : plans_for(c, rng, m.precision)) {
      const std::string w = what + " chunk " + std::to_string(plan.chunk_tokens);
      std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
      sc.reset();
      const Status st = cpu_attention_decode(a, plan, pool);
      ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
      const oracle::Comparison cmp =
          oracle::compare(c.out.data(), want.out, kOracleTol, kOracleTol);
      ASSERT_TRUE(cmp.ok) << w << ": " << cmp.message;
      oracle::expect_side_outputs(a, want, sc, w);
      if (HasFailure()) FAIL() << w;
    }
  }
  EXPECT_GT(quantized_pages, 200);
  EXPECT_GT(evicted_pages, 50);
}

// Pages larger than a key tile (a quantized page folds as several tiles) and one-token pages.
TEST(CpuMixedAttention, PagesOfOneTokenAndPagesLargerThanATile) {
  ThreadPool pool(2);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(31);
  for (int block_size : {1, 128}) {
    for (int iter = 0; iter < 4; ++iter) {
      CaseSpec spec;
      spec.seed = 600 + iter;
      spec.num_heads = 6;
      spec.num_kv_heads = 2;
      spec.head_dim = iter % 2 ? 64 : 32;
      spec.block_size = block_size;
      spec.kv_lens = {rng.range(1, 700), rng.range(300, 900)};
      AttentionCase c = oracle::make_case(spec);
      Scoring sc(c, *cpu, rng);
      MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
      ASSERT_TRUE(m.quantized_ok);
      AttentionArgs a = c.args();
      m.apply(a);
      sc.apply(a);
      const MixedResult want = oracle::mixed_attention(a);
      for (const SplitPlan& plan : plans_for(c, rng, m.precision)) {
        const std::string w = "block " + std::to_string(block_size) + " iter " +
                              std::to_string(iter) + " chunk " + std::to_string(plan.chunk_tokens);
        std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
        sc.reset();
        const Status st = cpu_attention_decode(a, plan, pool);
        ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
        const oracle::Comparison cmp =
            oracle::compare(c.out.data(), want.out, kOracleTol, kOracleTol);
        ASSERT_TRUE(cmp.ok) << w << ": " << cmp.message;
        oracle::expect_side_outputs(a, want, sc, w);
        if (HasFailure()) FAIL() << w;
      }
    }
  }
}

TEST(CpuMixedAttention, PrefillMatchesTheMixedOracle) {
  ThreadPool pool(3);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(99);
  for (int iter = 0; iter < 30; ++iter) {
    CaseSpec spec = random_shape(rng, 9000 + iter);
    const int num_seqs = rng.range(1, 4);
    for (int s = 0; s < num_seqs; ++s) {
      const int kv_len = random_len(rng, 300);
      spec.kv_lens.push_back(kv_len);
      spec.q_lens.push_back(rng.range(0, 1) ? kv_len : rng.range(1, kv_len));  // chunked prefill
    }
    AttentionCase c = oracle::make_case(spec);
    MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
    ASSERT_TRUE(m.quantized_ok);
    AttentionArgs a = c.args();
    m.apply(a);
    const MixedResult want = oracle::mixed_attention(a);
    const Status st = cpu_attention_prefill(a, pool);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const oracle::Comparison cmp = oracle::compare(c.out.data(), want.out, kOracleTol, kOracleTol);
    ASSERT_TRUE(cmp.ok) << "iter " << iter << ": " << cmp.message;
  }
}

// A row's result does not depend on which rows share its block of the fold: the last query of a
// prefill chunk (its rows blocked with the chunk's other tokens) equals, bit for bit, the decode of
// that token over the same pages (its rows blocked with its own group only). MHA (where int4 keys
// take the folded path), GQA with a group of 5 (a block of 4 and one of 1 in decode, other
// blocks in prefill) and MQA; pages mostly int4, some full and int8, head dims with and without
// channels past the whole groups.
TEST(CpuMixedAttention, PrefillLastRowEqualsDecodeBitwise) {
  ThreadPool pool(2);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(4242);
  int checked = 0;
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int, int>>{{3, 3}, {10, 2}, {6, 1}}) {
    for (const int hd : {8, 40, 64, 128}) {
      for (const int q_len : {2, 3, 7}) {
        CaseSpec spec;
        spec.seed = 7000 + static_cast<uint64_t>(heads * 1000 + hd * 10 + q_len);
        spec.num_heads = heads;
        spec.num_kv_heads = kv_heads;
        spec.head_dim = hd;
        spec.block_size = 16;
        const int kv_len = rng.range(40, 300);
        spec.kv_lens = {kv_len};
        spec.q_lens = {q_len};
        AttentionCase c = oracle::make_case(spec);
        const int pages = (kv_len + spec.block_size - 1) / spec.block_size;
        std::vector<std::vector<int>> force(1);
        for (int i = 0; i < pages; ++i) {
          force[0].push_back(i == pages - 1 ? 0 : i % 5 == 1 ? 1 : i % 5 == 3 ? 0 : 2);
        }
        MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0, 0, 0}, force);
        ASSERT_TRUE(m.quantized_ok);
        AttentionArgs a = c.args();
        m.apply(a);
        ASSERT_TRUE(cpu_attention_prefill(a, pool).ok());
        const int64_t row = int64_t{heads} * hd;  // floats of one token's output
        const std::vector<float> from_prefill(c.out.end() - row, c.out.end());

        // The chunk's last token alone: one query, the same pages and kv_len.
        AttentionArgs d = a;
        std::vector<float> out(static_cast<size_t>(row), std::nanf(""));
        const int32_t query_start[2] = {0, 1};
        d.q = c.q.data() + (q_len - 1) * row;
        d.out = out.data();
        d.num_tokens = 1;
        d.query_start = query_start;
        d.max_query_len = 1;
        const SplitPlan plan = make_split_plan(c.kv_lens.data(), 1, spec.block_size, 0);
        ASSERT_TRUE(cpu_attention_decode(d, plan, pool).ok());
        for (int64_t i = 0; i < row; ++i) {
          ASSERT_EQ(out[i], from_prefill[i])
              << heads << "/" << kv_heads << " hd " << hd << " q_len " << q_len << " element " << i;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 36);
}

// Sequence 0: every page evicted but the partial last one; sequence 1: evicted pages between
// quantized ones; sequence 2: nothing resident at all (output 0, page bounds +inf).
// MHA keys of int4 pages take the folded path (one query row per kv head: the key scale folded
// into the query, the zero point into a per-page constant) for head_dim >= one channel group of
// the SIMD width; head dims that leave a vector chunk or a scalar tail past the whole groups, pages
// of one token and pages larger than a key tile, against the fp64 oracle on the same pages.
TEST(CpuMixedAttention, MhaInt4PagesAtEveryHeadDimMatchTheOracle) {
  ThreadPool pool(2);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(99);
  int checked = 0;
  for (const int hd : {8, 16, 32, 34, 40, 48, 72, 96, 130}) {
    for (const int bs : {1, 16, 80}) {
      CaseSpec spec;
      spec.seed = 900 + static_cast<uint64_t>(hd * 7 + bs);
      spec.num_heads = 3;
      spec.num_kv_heads = 3;
      spec.head_dim = hd;
      spec.block_size = bs;
      spec.kv_lens = {rng.range(1, 300), rng.range(100, 400)};
      AttentionCase c = oracle::make_case(spec);
      std::vector<std::vector<int>> force(spec.kv_lens.size());
      for (size_t q = 0; q < force.size(); ++q) {
        const int pages = (spec.kv_lens[q] + bs - 1) / bs;
        // int4, a few full, the last page full (the cut never demotes the page being written)
        for (int i = 0; i < pages; ++i) force[q].push_back(i % 7 == 3 || i == pages - 1 ? 0 : 2);
      }
      MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0, 0, 0}, force);
      ASSERT_TRUE(m.quantized_ok) << "hd " << hd << " bs " << bs;
      AttentionArgs a = c.args();
      m.apply(a);
      const MixedResult want = oracle::mixed_attention(a);
      for (const SplitPlan& plan : plans_for(c, rng, m.precision)) {
        std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
        ASSERT_TRUE(cpu_attention_decode(a, plan, pool).ok());
        const oracle::Comparison cmp =
            oracle::compare(c.out.data(), want.out, kOracleTol, kOracleTol);
        ASSERT_TRUE(cmp.ok) << "hd " << hd << " bs " << bs << " chunk " << plan.chunk_tokens << ": "
                            << cmp.message;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 27);
}

TEST(CpuMixedAttention, EvictedRunsAndNothingResident) {
  ThreadPool pool(2);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(5);
  CaseSpec spec;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.kv_lens = {6 * 16 + 5, 7 * 16, 3 * 16};
  AttentionCase c = oracle::make_case(spec);
  Scoring sc(c, *cpu, rng);
  std::fill(sc.score_seqs.begin(), sc.score_seqs.end(), 1);
  ASSERT_GT(sc.num_slots, 0);
  for (int b = 0; b < 3; ++b) sc.slots[2 * static_cast<size_t>(c.max_blocks_per_seq) + b] = 0;
  const std::vector<std::vector<int>> force = {{kEvict, kEvict, kEvict, kEvict, kEvict, kEvict, 0},
                                               {kEvict, 1, kEvict, kEvict, 2, kEvict, 1},
                                               {kEvict, kEvict, kEvict}};
  MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0, 0, 0}, force);
  ASSERT_TRUE(m.quantized_ok);
  AttentionArgs a = c.args();
  m.apply(a);
  sc.apply(a);
  const MixedResult want = oracle::mixed_attention(a);
  for (const SplitPlan& plan : plans_for(c, rng, m.precision)) {
    std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
    sc.reset();
    ASSERT_TRUE(cpu_attention_decode(a, plan, pool).ok());
    const oracle::Comparison cmp = oracle::compare(c.out.data(), want.out, kOracleTol, kOracleTol);
    ASSERT_TRUE(cmp.ok) << "chunk " << plan.chunk_tokens << ": " << cmp.message;
    for (int i = 0; i < spec.num_heads * spec.head_dim; ++i) {
      ASSERT_EQ(c.out[2 * spec.num_heads * spec.head_dim + i], 0.f) << "nothing resident: 0";
    }
    for (int b = 0; b < 3; ++b) {
      const size_t row = 2 * static_cast<size_t>(c.max_blocks_per_seq) + b;
      EXPECT_EQ(sc.bound[row], std::numeric_limits<float>::infinity()) << "page " << b;
      sc.bound[row] = sc.bound0[row];  // checked; the oracle has no finite max to compare with
    }
    sc.score_seqs[2] = 0;
    oracle::expect_side_outputs(a, want, sc, "chunk " + std::to_string(plan.chunk_tokens));
    sc.score_seqs[2] = 1;
  }
}

// A page summarized in more parts is bounded no higher than in fewer (each part's range lies
// inside the page's) and, on random keys, mostly lower; every bound still covers the page's keys
// (expect_side_outputs: >= the relevance of each full-precision token).
TEST(CpuMixedAttention, MorePartsGiveATighterBoundThatStillCoversTheKeys) {
  ThreadPool pool(2);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  int pages = 0, tighter = 0;
  for (int iter = 0; iter < 6; ++iter) {
    CaseSpec spec;
    spec.seed = 900 + iter;
    spec.num_heads = 8;
    spec.num_kv_heads = iter % 2 ? 2 : 8;
    spec.head_dim = iter % 3 ? 64 : 128;
    spec.block_size = 16;
    spec.kv_lens = {16 * 20 + 3, 16 * 9};
    std::vector<std::vector<float>> bounds;
    for (int parts : {1, 4}) {
      // The same case, summary slots and precisions for both (make_mixed poisons the case's
      // demoted pages: a fresh case each time).
      AttentionCase c = oracle::make_case(spec);
      oracle::Rng rng(77 + iter);
      Scoring sc(c, *cpu, rng, parts);
      std::fill(sc.score_seqs.begin(), sc.score_seqs.end(), 1);
      std::fill(sc.bound0.begin(), sc.bound0.end(), 0.f);
      sc.reset();
      MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
      ASSERT_TRUE(m.quantized_ok);
      AttentionArgs a = c.args();
      m.apply(a);
      sc.apply(a);
      const MixedResult want = oracle::mixed_attention(a);
      const SplitPlan plan = make_split_plan(c.kv_lens.data(), c.num_seqs, spec.block_size, 0);
      ASSERT_TRUE(cpu_attention_decode(a, plan, pool).ok());
      oracle::expect_side_outputs(a, want, sc, "parts " + std::to_string(parts));
      bounds.push_back(sc.bound);
      if (parts == 4) {
        for (size_t row = 0; row < sc.slots.size(); ++row) {
          if (sc.slots[row] < 0) continue;
          ++pages;
          ASSERT_LE(bounds[1][row], bounds[0][row] * (1 + 1e-6f))
              << "iter " << iter << " row " << row;
          tighter += bounds[1][row] < bounds[0][row] * 0.99f;
        }
      }
    }
  }
  EXPECT_GT(pages, 100);
  EXPECT_GT(tighter, pages / 2) << "four parts should tighten most bounds of random keys";
}

TEST(CpuMixedAttention, RejectsBadMixedArguments) {
  ThreadPool pool(1);
  std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  oracle::Rng rng(8);
  CaseSpec spec;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 32;
  spec.block_size = 8;
  spec.kv_lens = {40, 17};
  AttentionCase c = oracle::make_case(spec);
  Scoring sc(c, *cpu, rng);
  const std::vector<std::vector<int>> force = {{1, 2, kEvict, 0, 1}, {2, 0, 0}};
  MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0, 0, 0}, force);
  ASSERT_TRUE(m.quantized_ok);
  const SplitPlan plan = make_split_plan(c.kv_lens.data(), c.num_seqs, spec.block_size, 0);
  const auto run = [&](auto&& mutate) {
    MixedCase mm = m;
    Scoring ss = sc;
    AttentionArgs a = c.args();
    mm.apply(a);
    ss.apply(a);
    mutate(a, mm, ss);
    return cpu_attention_decode(a, plan, pool).code();
  };
  EXPECT_EQ(run([](AttentionArgs&, MixedCase&, Scoring&) {}), StatusCode::kOk);
  EXPECT_EQ(run([](AttentionArgs&, MixedCase& mm, Scoring&) { mm.precision[1] = 4; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([&](AttentionArgs&, MixedCase& mm, Scoring&) { mm.tables[0] = mm.num_int8; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([](AttentionArgs&, MixedCase& mm, Scoring&) { mm.tables[1] = -1; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([](AttentionArgs& a, MixedCase&, Scoring&) { a.int4_pages = nullptr; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([](AttentionArgs& a, MixedCase&, Scoring&) { a.int8_pages = nullptr; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([](AttentionArgs& a, MixedCase&, Scoring&) { a.kv.data = nullptr; }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([&](AttentionArgs& a, MixedCase& mm, Scoring&) {
              mm.tables[3] = c.num_blocks;  // a full page outside kv
            }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([](AttentionArgs&, MixedCase&, Scoring& ss) {
              ss.score_seqs[0] = 1;
              ss.slots[0] = ss.num_slots;
            }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(run([](AttentionArgs& a, MixedCase&, Scoring& ss) {
              ss.score_seqs[0] = 1;
              a.summaries = nullptr;
            }),
            StatusCode::kInvalidArgument);
  for (int parts : {0, 3}) {  // summary_parts must be >= 1 and divide the block size (8)
    EXPECT_EQ(run([&](AttentionArgs& a, MixedCase&, Scoring& ss) {
                ss.score_seqs[0] = 1;
                a.summary_parts = parts;
              }),
              StatusCode::kInvalidArgument)
        << parts;
  }
  // An evicted page's id is ignored, whatever it is.
  EXPECT_EQ(run([](AttentionArgs&, MixedCase& mm, Scoring&) { mm.tables[2] = -12345; }),
            StatusCode::kOk);
  // Prefill: mixed pages are supported, the scoring side outputs are decode-only.
  AttentionArgs a = c.args();
  m.apply(a);
  EXPECT_EQ(cpu_attention_prefill(a, pool).code(), StatusCode::kOk);
  sc.apply(a);
  EXPECT_EQ(cpu_attention_prefill(a, pool).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::backend
