// The sharded scoring fields of decode attention (AttentionArgs::head_max, score_max; spatial
// cut, kv-cuts.md §4) in the CUDA kernels against the CPU backend and the fp64 mixed oracle:
// head_max from the paged kernels (all-full pages) and the mixed ones, with and without split-K,
// alone and beside the scoring side outputs; the scoring-only kernel (launch_mixed_score) against
// given maxima (a shard's view: the maximum over the whole sequence, >= its own, or -inf when no
// shard holds a resident key). Random MHA / GQA / MQA shapes, every compiled head_dim and KV
// dtype, partial last pages, several sequences. Same source for the emulated kernels
// (tests/kernels, label emulated) and the real ones (tests/gpu, label gpu).
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
#include "kernel_test_util.h"
#include "kernels/attention/mixed_attention.h"
#include "kernels/attention/paged_attention.h"
#include "oracle/attention_oracle.h"
#include "oracle/mixed_attention_oracle.h"
#include "oracle/mixed_scoring.h"

namespace kvsplit::testing {
namespace {

using kernels::ElemType;
using kernels::KvPrecision;
using oracle::AttentionCase;
using oracle::CaseSpec;
using oracle::MixedCase;
using oracle::Scoring;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr int kEvict = static_cast<int>(KvPrecision::kEvicted);
constexpr double kAtol = 2e-5, kRtol = 2e-4;

// Device copies of one decode call (host args `a`, pages encoded as `dtype`) and its parameters.
struct DeviceCall {
  DevArray<float> q, out, lse, head_max, part_o, part_m, part_l, relevance, bound, score_max,
      given_max;
  DevArray<kernels::KvSummaryElem> summaries;
  DevArray<unsigned char> pages;
  DevArray<uint8_t> precision, int8_pages, int4_pages, score_seqs;
  DevArray<int32_t> query_start, kv_lens, tables, num_splits, split_offset, slots;
  DevArray<int> error_flag;
  kernels::MixedAttentionParams mp;  // mp.base: the paged kernels' parameters
};

// `m`, `sc`: null for all-full pages / no scoring. out and lse start as `out_fill`.
std::unique_ptr<DeviceCall> upload(const backend::AttentionArgs& a, const std::vector<float>& pages,
                                   ElemType dtype, const MixedCase* m, const Scoring* sc,
                                   const backend::SplitPlan& plan, float out_fill) {
  auto d = std::make_unique<DeviceCall>();
  const size_t q_elems = static_cast<size_t>(a.num_tokens) * a.num_heads * a.head_dim;
  const size_t heads = static_cast<size_t>(a.num_seqs) * a.num_heads;
  d->q = DevArray<float>(std::vector<float>(a.q, a.q + q_elems));
  d->out = DevArray<float>(std::vector<float>(q_elems, out_fill));
  d->lse = DevArray<float>(std::vector<float>(heads, out_fill));
  d->pages = DevArray<unsigned char>(encode(pages, dtype));
  d->query_start =
      DevArray<int32_t>(std::vector<int32_t>(a.query_start, a.query_start + a.num_seqs + 1));
  d->kv_lens = DevArray<int32_t>(std::vector<int32_t>(a.kv_lens, a.kv_lens + a.num_seqs));
  const size_t rows = static_cast<size_t>(a.num_seqs) * a.max_blocks_per_seq;
  d->tables = DevArray<int32_t>(std::vector<int32_t>(a.block_tables, a.block_tables + rows));
  d->error_flag = DevArray<int>(std::vector<int>{0});
  kernels::MixedAttentionParams& mp = d->mp;
  kernels::PagedAttentionParams& p = mp.base;
  p.q = d->q.get();
  p.out = d->out.get();
  p.lse = d->lse.get();
  p.kv = d->pages.get();
  p.kv_dtype = dtype;
  p.num_seqs = a.num_seqs;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.head_dim = a.head_dim;
  p.block_size = a.kv.block_size;
  p.num_blocks = a.kv.num_blocks;
  p.scale = a.scale;
  p.query_start = d->query_start.get();
  p.kv_lens = d->kv_lens.get();
  p.block_tables = d->tables.get();
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.max_query_len = 1;
  p.error_flag = d->error_flag.get();
  p.max_splits = std::max(plan.max_splits, 1);
  if (plan.has_splits()) {
    const size_t parts = static_cast<size_t>(plan.total_splits) * a.num_heads;
    d->num_splits = DevArray<int32_t>(plan.num_splits);
    d->split_offset = DevArray<int32_t>(plan.split_offset);
    d->part_o = DevArray<float>(parts * a.head_dim);
    d->part_m = DevArray<float>(parts);
    d->part_l = DevArray<float>(parts);
    p.chunk_tokens = plan.chunk_tokens;
    p.num_splits = d->num_splits.get();
    p.split_offset = d->split_offset.get();
    p.part_o = d->part_o.get();
    p.part_m = d->part_m.get();
    p.part_l = d->part_l.get();
  }
  if (a.head_max) {
    d->head_max = DevArray<float>(std::vector<float>(heads, kNan));
    p.head_max = d->head_max.get();
  }
  if (m && a.page_precision) {
    d->precision = DevArray<uint8_t>(m->precision);
    d->int8_pages = DevArray<uint8_t>(m->int8_arena);
    d->int4_pages = DevArray<uint8_t>(m->int4_arena);
    mp.page_precision = d->precision.get();
    mp.int8_pages = a.int8_pages ? d->int8_pages.get() : nullptr;
    mp.num_int8_blocks = a.num_int8_blocks;
    mp.int4_pages = a.int4_pages ? d->int4_pages.get() : nullptr;
    mp.num_int4_blocks = a.num_int4_blocks;
  }
  if (sc && a.score_seqs) {
    d->score_seqs = DevArray<uint8_t>(sc->score_seqs);
    d->relevance = DevArray<float>(sc->relevance);
    d->bound = DevArray<float>(sc->bound);
    d->slots = DevArray<int32_t>(sc->slots);
    d->summaries = DevArray<kernels::KvSummaryElem>(sc->summaries);
    d->score_max = DevArray<float>(heads);
    mp.score_seqs = d->score_seqs.get();
    mp.token_relevance = d->relevance.get();
    mp.summary_slots = d->slots.get();
    mp.summaries = a.summaries ? d->summaries.get() : nullptr;
    mp.num_summary_slots = a.num_summary_slots;
    mp.summary_parts = a.summary_parts;
    mp.page_bound = d->bound.get();
    mp.score_max = d->score_max.get();
  }
  if (a.score_max)
    d->given_max = DevArray<float>(std::vector<float>(a.score_max, a.score_max + heads));
  return d;
}

// What CudaBackend::attention_decode launches for `a` (no score_max): the paged kernels and the
// merge for all-full pages without scoring, else the mixed kernels.
Status launch_decode(const backend::AttentionArgs& a, const DeviceCall& d) {
  if (a.page_precision == nullptr && a.score_seqs == nullptr) {
    KVSPLIT_RETURN_IF_ERROR(kernels::launch_paged_decode(d.mp.base, nullptr));
    return kernels::launch_merge_states(d.mp.base, nullptr);
  }
  return kernels::launch_mixed_decode(d.mp, nullptr);
}

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
      break;  // GQA, groups 4, 8, 16
    default:
      s.num_kv_heads = 1;
      s.num_heads = rng.range(2, 7);
      break;  // MQA
  }
  const int head_dims[] = {8, 64, 128};
  s.head_dim = head_dims[rng.range(0, 2)];
  s.block_size = 16;
  return s;
}

// Expects got == want where want is +-inf, else |got - want| <= atol + rtol |want|.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol,
                  double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " [" << i << "]";
      continue;
    }
    ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "] is NaN";
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " [" << i << "]";
  }
}

// Every case runs every split plan three ways, each against the CPU backend on the same call:
//   1. head_max alone (out, lse, head_max),
//   2. head_max beside the scoring side outputs (relevance and bounds against its own maxima),
//   3. scoring only against given maxima (relevance and bounds; out and lse untouched).
TEST(ShardedScoringParity, HeadMaxAndScoringOnlyMatchTheCpuBackend) {
  KVSPLIT_REQUIRE_DEVICE();
  ThreadPool pool(2);
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(1313);
#if defined(KVSPLIT_TEST_GPU)
  const int iters = 48, max_len = 2000;
#else
  const int iters = 24, max_len = 600;  // sized for the ASan build (slow fibers)
#endif
  int runs = 0, paged_runs = 0, split_runs = 0, empty_heads = 0, raised_heads = 0;
  for (int iter = 0; iter < iters; ++iter) {
    CaseSpec spec = random_shape(rng, 13000 + iter);
    const int num_seqs = rng.range(1, 4);
    for (int s = 0; s < num_seqs; ++s) spec.kv_lens.push_back(oracle::random_len(rng, max_len));
    if (iter % 5 == 0) spec.q_range = 8.0;  // peaked softmax
    const ElemType dtype = static_cast<ElemType>(iter % 3);
    AttentionCase c = oracle::make_case(spec);
    c.pages = decode(encode(c.pages, dtype), dtype);  // the CPU sees the stored values
    Scoring sc(c, *cpu, rng);
    // Even iterations: every page full precision (the paged kernels for call 1). Odd: a mix,
    // and every third odd one has a sequence with nothing resident (head_max -inf).
    const bool mixed = iter % 2 == 1;
    std::vector<std::vector<int>> force;
    if (mixed && iter % 3 == 0) {
      force.resize(num_seqs);
      force[num_seqs - 1].assign(c.max_blocks_per_seq, kEvict);
    }
    MixedCase m = oracle::make_mixed(
        c, *cpu, rng, mixed ? oracle::MixSpec{} : oracle::MixSpec{0.0, 0.0, 0.0}, force);
    ASSERT_TRUE(m.quantized_ok);
    backend::AttentionArgs base = c.args();
    base.max_query_len = 1;
    backend::AttentionArgs with_precision = base;  // the oracle reads page_precision
    m.apply(with_precision);
    if (mixed) base = with_precision;
    const oracle::MixedResult want = oracle::mixed_attention(with_precision);
    const size_t heads = static_cast<size_t>(num_seqs) * spec.num_heads;
    const std::string what =
        "iter " + std::to_string(iter) + " " + kernels::elem_name(dtype) +
        (mixed ? " mixed" : " full") + " heads " + std::to_string(spec.num_heads) + "/" +
        std::to_string(spec.num_kv_heads) + " hd " + std::to_string(spec.head_dim);
    for (const backend::SplitPlan& plan : oracle::plans_for(c, rng)) {
      const std::string w = what + " chunk " + std::to_string(plan.chunk_tokens);
      split_runs += plan.has_splits();
      // 1. head_max alone.
      std::vector<float> cpu_max(heads, kNan), cpu_lse(heads, kNan);
      backend::AttentionArgs a = base;
      a.head_max = cpu_max.data();
      a.lse = cpu_lse.data();
      std::fill(c.out.begin(), c.out.end(), kNan);
      ASSERT_TRUE(backend::cpu_attention_decode(a, plan, pool).ok()) << w;
      const std::vector<float> cpu_out = c.out;
      auto d = upload(a, c.pages, dtype, &m, nullptr, plan, kNan);
      Status st = launch_decode(a, *d);
      ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
      ASSERT_EQ(device_sync(), "") << w;
      paged_runs += !mixed;
      const std::vector<float> got_max = d->head_max.to_host();
      expect_close(got_max, cpu_max, kAtol, kRtol, w + " head_max vs CPU");
      for (size_t i = 0; i < heads; ++i) {
        empty_heads += std::isinf(cpu_max[i]);
        if (std::isinf(want.max_score[i])) {
          ASSERT_EQ(got_max[i], -kInf) << w << " head " << i << ": nothing resident";
        } else {
          ASSERT_NEAR(got_max[i], want.max_score[i], kAtol + kRtol * std::fabs(want.max_score[i]))
              << w << " head_max vs oracle " << i;
        }
      }
      expect_close(d->out.to_host(), cpu_out, kAtol, kRtol, w + " out vs CPU");
      expect_close(d->lse.to_host(), cpu_lse, kAtol, kRtol, w + " lse vs CPU");
      ASSERT_EQ(d->error_flag.to_host()[0], 0) << w;

      // 2. head_max beside the scoring side outputs.
      sc.reset();
      a.head_max = nullptr;
      sc.apply(a);
      std::vector<float> hm2(heads, kNan);
      a.head_max = hm2.data();
      d = upload(a, c.pages, dtype, &m, &sc, plan, kNan);
      ASSERT_TRUE(backend::cpu_attention_decode(a, plan, pool).ok()) << w;
      st = launch_decode(a, *d);
      ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
      ASSERT_EQ(device_sync(), "") << w;
      expect_close(d->head_max.to_host(), hm2, kAtol, kRtol, w + " scored head_max vs CPU");
      expect_close(d->relevance.to_host(), sc.relevance, 2e-5, 0, w + " relevance vs CPU");
      expect_close(d->bound.to_host(), sc.bound, 2e-5, 2e-5, w + " bound vs CPU");

      // 3. Scoring only against the sequence's maxima over every shard: this call's own maxima
      // raised by up to 3 on some heads (another shard attends more), a head with nothing
      // resident here given another shard's finite maximum or -inf (no shard holds a key).
      std::vector<float> given(heads);
      for (size_t i = 0; i < heads; ++i) {
        const bool raise = rng.range(0, 1) == 1;
        raised_heads += raise;
        if (std::isinf(cpu_max[i]))
          given[i] = raise ? static_cast<float>(rng.uniform(-2.0, 2.0)) : -kInf;
        else
          given[i] = cpu_max[i] + (raise ? static_cast<float>(rng.uniform(0.0, 3.0)) : 0.f);
      }
      sc.reset();
      backend::AttentionArgs b = base;
      sc.apply(b);
      b.score_max = given.data();
      std::fill(c.out.begin(), c.out.end(), 7.f);
      ASSERT_TRUE(backend::cpu_attention_decode(b, plan, pool).ok()) << w;
      d = upload(b, c.pages, dtype, &m, &sc, plan, 7.f);
      kernels::MixedAttentionParams only = d->mp;
      only.score_max = nullptr;  // not needed: the maxima are given
      st = kernels::launch_mixed_score(only, d->given_max.get(), nullptr);
      ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
      ASSERT_EQ(device_sync(), "") << w;
      for (float x : c.out) ASSERT_EQ(x, 7.f) << w << ": the CPU scoring-only call wrote out";
      for (float x : d->out.to_host()) ASSERT_EQ(x, 7.f) << w << ": scoring only wrote out";
      for (float x : d->lse.to_host()) ASSERT_EQ(x, 7.f) << w << ": scoring only wrote lse";
      expect_close(d->relevance.to_host(), sc.relevance, 2e-5, 0, w + " given-max relevance");
      expect_close(d->bound.to_host(), sc.bound, 2e-5, 2e-5, w + " given-max bound");
      ASSERT_EQ(d->error_flag.to_host()[0], 0) << w;
      sc.reset();
      ++runs;
      if (HasFailure()) FAIL() << w;
    }
  }
  EXPECT_EQ(runs, 3 * iters);
  EXPECT_GT(paged_runs, 0);
  EXPECT_GT(split_runs, iters);
  EXPECT_GT(empty_heads, 0);  // some sequence had nothing resident
  EXPECT_GT(raised_heads, 0);
}

// A shard's view, exactly: the pages of one sequence dealt over 2-3 "shards" (the others' pages
// marked evicted), each shard's head_max through the kernels, their maximum (the merged m_h)
// fed back to each shard's scoring-only call; the relevance taken over shards equals the
// unsharded scored call's, and the merged maxima its head_max (bit for bit: same scores, and a
// maximum of maxima).
TEST(ShardedScoringParity, ShardsScoredAgainstTheMergedMaximaEqualTheUnshardedCall) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(77);
  for (int iter = 0; iter < 6; ++iter) {
    CaseSpec spec = random_shape(rng, 7700 + iter);
    const int num_seqs = rng.range(1, 3);
    for (int s = 0; s < num_seqs; ++s) spec.kv_lens.push_back(rng.range(20, 300));
    AttentionCase c = oracle::make_case(spec);
    Scoring sc(c, *cpu, rng);
    MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0.2, 0.2, 0.1});
    ASSERT_TRUE(m.quantized_ok);
    backend::AttentionArgs a = c.args();
    a.max_query_len = 1;
    m.apply(a);
    sc.apply(a);
    const size_t heads = static_cast<size_t>(num_seqs) * spec.num_heads;
    std::vector<float> whole_max(heads);
    a.head_max = whole_max.data();
    const backend::SplitPlan plan = backend::make_split_plan(
        c.kv_lens.data(), c.num_seqs, spec.block_size, spec.block_size * rng.range(0, 3));
    auto whole = upload(a, c.pages, ElemType::kF32, &m, &sc, plan, kNan);
    ASSERT_TRUE(launch_decode(a, *whole).ok());
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> want_max = whole->head_max.to_host();
    const std::vector<float> want_rel = whole->relevance.to_host();
    const std::vector<float> want_bound = whole->bound.to_host();

    const int num_shards = 2 + iter % 2;
    std::vector<int> owner(m.precision.size());
    for (int& o : owner) o = rng.range(0, num_shards - 1);
    std::vector<std::unique_ptr<DeviceCall>> shard(num_shards);
    std::vector<MixedCase> shard_m(num_shards, m);
    std::vector<float> merged(heads, -kInf);
    for (int z = 0; z < num_shards; ++z) {  // each shard's maxima
      for (size_t row = 0; row < owner.size(); ++row)
        if (owner[row] != z) shard_m[z].precision[row] = kEvict;
      backend::AttentionArgs az = a;
      shard_m[z].apply(az);
      az.score_seqs = nullptr;
      shard[z] = upload(az, c.pages, ElemType::kF32, &shard_m[z], nullptr, plan, kNan);
      ASSERT_TRUE(launch_decode(az, *shard[z]).ok());
      ASSERT_EQ(device_sync(), "");
      const std::vector<float> hm = shard[z]->head_max.to_host();
      for (size_t i = 0; i < heads; ++i) merged[i] = std::max(merged[i], hm[i]);
    }
    ASSERT_EQ(merged, want_max) << "iter " << iter << ": a maximum of maxima";
    std::vector<float> rel = sc.relevance0, bound = sc.bound0;
    for (int z = 0; z < num_shards; ++z) {  // each shard scores against the merged maxima
      sc.reset();
      backend::AttentionArgs az = a;
      shard_m[z].apply(az);
      sc.apply(az);
      az.head_max = nullptr;
      az.score_max = merged.data();
      auto d = upload(az, c.pages, ElemType::kF32, &shard_m[z], &sc, plan, kNan);
      ASSERT_TRUE(kernels::launch_mixed_score(d->mp, d->given_max.get(), nullptr).ok());
      ASSERT_EQ(device_sync(), "");
      const std::vector<float> r = d->relevance.to_host(), b = d->bound.to_host();
      for (size_t i = 0; i < rel.size(); ++i) rel[i] = std::max(rel[i], r[i]);
      for (size_t i = 0; i < bound.size(); ++i) bound[i] = std::max(bound[i], b[i]);
    }
    EXPECT_EQ(rel, want_rel) << "iter " << iter;
    EXPECT_EQ(bound, want_bound) << "iter " << iter;
    sc.reset();
  }
}

// Host-visible misuse is kInvalidArgument.
TEST(ShardedScoringLaunch, MisuseIsRejected) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(3);
  CaseSpec spec;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.kv_lens = {40, 17};
  AttentionCase c = oracle::make_case(spec);
  Scoring sc(c, *cpu, rng);
  backend::AttentionArgs a = c.args();
  a.max_query_len = 1;
  sc.apply(a);
  std::vector<float> hm(8, 0.f);
  a.head_max = hm.data();
  const backend::SplitPlan plan =
      backend::make_split_plan(c.kv_lens.data(), c.num_seqs, spec.block_size, 0);
  auto d = upload(a, c.pages, ElemType::kF32, nullptr, &sc, plan, kNan);
  const DevArray<float> given_max(std::vector<float>(8, 0.f));
  const float* given = given_max.get();
  // The scoring-only launch writes no head_max and needs score_seqs and the maxima.
  EXPECT_EQ(kernels::launch_mixed_score(d->mp, given, nullptr).code(),
            StatusCode::kInvalidArgument);
  kernels::MixedAttentionParams mp = d->mp;
  mp.base.head_max = nullptr;
  EXPECT_TRUE(kernels::launch_mixed_score(mp, given, nullptr).ok());
  EXPECT_EQ(kernels::launch_mixed_score(mp, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  mp.score_seqs = nullptr;
  EXPECT_EQ(kernels::launch_mixed_score(mp, given, nullptr).code(), StatusCode::kInvalidArgument);
  // head_max is for decode only.
  mp = d->mp;
  mp.score_seqs = nullptr;
  EXPECT_EQ(kernels::launch_paged_prefill(mp.base, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::launch_mixed_prefill(mp, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(device_sync(), "");
}

}  // namespace
}  // namespace kvsplit::testing
