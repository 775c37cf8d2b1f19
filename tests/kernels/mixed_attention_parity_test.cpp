// Mixed-precision paged attention kernels (full / int8 / int4 / evicted pages, the scoring side
// outputs) against the fp64 mixed oracle, which dequantizes the same pages, and the CPU backend.
// Random mixes with shuffled arena ids, MHA / GQA / MQA, every compiled head_dim and KV dtype,
// partial last pages, split-K on and off, prefill (chunked), and bad arguments. Same source for
// the emulated kernels (tests/kernels, label emulated) and the real ones (tests/gpu, label gpu).
#include <gtest/gtest.h>

#include <algorithm>
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
#if defined(KVSPLIT_EMULATE_CUDA)
#include "kernels/attention/mixed_attention.cuh"  // mixed_smem_layout
#endif
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
using oracle::MixedResult;
using oracle::Scoring;

constexpr double kAtol = 2e-5, kRtol = 2e-4;  // f32 kernel vs fp64 oracle, same page values
constexpr int kEvict = static_cast<int>(KvPrecision::kEvicted);

// Device copies of one mixed call (host args `a`, pages encoded as `dtype`) and its parameters.
struct DeviceMixed {
  DevArray<float> q, out, part_o, part_m, part_l, relevance, bound, score_max;
  DevArray<kernels::KvSummaryElem> summaries;
  DevArray<unsigned char> pages;
  DevArray<uint8_t> precision, int8_pages, int4_pages, score_seqs;
  DevArray<int32_t> query_start, kv_lens, tables, num_splits, split_offset, split_begin, slots;
  DevArray<int> error_flag;
  kernels::MixedAttentionParams mp;
};

// `pages`: the case's f32 pages (already rounded to dtype); m / sc may be null.
std::unique_ptr<DeviceMixed> upload(const backend::AttentionArgs& a,
                                    const std::vector<float>& pages, ElemType dtype,
                                    const MixedCase* m, const Scoring* sc,
                                    const backend::SplitPlan* plan) {
  auto d = std::make_unique<DeviceMixed>();
  const size_t q_elems = static_cast<size_t>(a.num_tokens) * a.num_heads * a.head_dim;
  d->q = DevArray<float>(std::vector<float>(a.q, a.q + q_elems));
  d->out = DevArray<float>(std::vector<float>(q_elems, std::numeric_limits<float>::quiet_NaN()));
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
  p.max_query_len = a.max_query_len;
  p.window = a.window;
  p.error_flag = d->error_flag.get();
  if (plan) {
    p.max_splits = std::max(plan->max_splits, 1);
    if (plan->has_splits()) {
      const size_t heads = static_cast<size_t>(plan->total_splits) * a.num_heads;
      d->num_splits = DevArray<int32_t>(plan->num_splits);
      d->split_offset = DevArray<int32_t>(plan->split_offset);
      d->part_o = DevArray<float>(heads * a.head_dim);
      d->part_m = DevArray<float>(heads);
      d->part_l = DevArray<float>(heads);
      p.chunk_tokens = plan->chunk_tokens;
      p.num_splits = d->num_splits.get();
      p.split_offset = d->split_offset.get();
      if (!plan->split_begin.empty()) {
        d->split_begin = DevArray<int32_t>(plan->split_begin);
        p.split_begin = d->split_begin.get();
      }
      p.part_o = d->part_o.get();
      p.part_m = d->part_m.get();
      p.part_l = d->part_l.get();
    }
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
    d->score_max = DevArray<float>(static_cast<size_t>(a.num_seqs) * a.num_heads);
    mp.score_seqs = d->score_seqs.get();
    mp.token_relevance = d->relevance.get();
    mp.summary_slots = d->slots.get();
    mp.summaries = a.summaries ? d->summaries.get() : nullptr;
    mp.num_summary_slots = a.num_summary_slots;
    mp.summary_parts = a.summary_parts;
    mp.page_bound = d->bound.get();
    mp.score_max = d->score_max.get();
  }
  return d;
}

// Shapes the kernels are compiled for: head_dim 8 / 64 / 128, block 16, MHA / GQA / MQA.
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
      break;  // GQA, groups 4, 8, 16 (prefill blocks of 4, 2, 1 tokens)
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

ElemType dtype_of(int i) {
  const ElemType all[] = {ElemType::kF32, ElemType::kF16, ElemType::kBF16};
  return all[i % 3];
}

// Rounds the case's pages to `dtype` (the oracle and the quantizer then see the stored values).
void round_pages(AttentionCase& c, ElemType dtype) {
  c.pages = decode(encode(c.pages, dtype), dtype);
}

// Runs the mixed decode kernel on `a` with `plan`; checks its output, error flag and side outputs
// (relevance, page bounds) against the oracle's `want`. *got: the output; *got_sc: sc with the
// kernel's side outputs.
void run_mixed_decode(const backend::AttentionArgs& a, const std::vector<float>& pages,
                      ElemType dtype, const MixedCase& m, const Scoring& sc,
                      const backend::SplitPlan& plan, const MixedResult& want, const std::string& w,
                      std::vector<float>* got, Scoring* got_sc) {
  auto d = upload(a, pages, dtype, &m, &sc, &plan);
  const Status st = kernels::launch_mixed_decode(d->mp, nullptr);
  ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
  ASSERT_EQ(device_sync(), "") << w;
  *got = d->out.to_host();
  const oracle::Comparison cmp = oracle::compare(got->data(), want.out, kAtol, kRtol);
  ASSERT_TRUE(cmp.ok) << w << ": " << cmp.message;
  ASSERT_EQ(d->error_flag.to_host()[0], 0) << w;
  got_sc->relevance = d->relevance.to_host();
  got_sc->bound = d->bound.to_host();
  oracle::expect_side_outputs(a, want, *got_sc, w, {2e-5, 2e-5});
}

TEST(MixedAttentionParity, DecodeMatchesTheMixedOracleWithAndWithoutSplits) {
  KVSPLIT_REQUIRE_DEVICE();
  ThreadPool pool(2);
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(2024);
  int quantized_pages = 0, evicted_pages = 0, runs = 0;
#if defined(KVSPLIT_TEST_GPU)
  const int iters = 60, max_len = 2000;
#else
  const int iters = 20, max_len = 600;  // sized for the ASan build (slow fibers)
#endif
  for (int iter = 0; iter < iters; ++iter) {
    CaseSpec spec = random_shape(rng, 8100 + iter);
    const int num_seqs = rng.range(1, 4);
    for (int s = 0; s < num_seqs; ++s) spec.kv_lens.push_back(oracle::random_len(rng, max_len));
    if (iter % 6 == 0) spec.q_range = 8.0;                       // peaked softmax
    if (iter % 3 == 1) spec.window = rng.range(1, max_len / 2);  // sliding window (pages poisoned)
    const ElemType dtype = dtype_of(iter);
    AttentionCase c = oracle::make_case(spec);
    round_pages(c, dtype);
    const int parts = 1 << (iter % 3);  // summaries of 1, 2 or 4 parts (block 16)
    Scoring sc(c, *cpu, rng, parts);
    const bool all_full = iter % 6 == 5;  // side outputs with page_precision null
    oracle::MixSpec mix;
    if (all_full) mix = {0.0, 0.0, 0.0};
    MixedCase m = oracle::make_mixed(c, *cpu, rng, mix);
    ASSERT_TRUE(m.quantized_ok);
    for (uint8_t p : m.precision) {
      quantized_pages += p == 1 || p == 2;
      evicted_pages += p == kEvict;
    }
    backend::AttentionArgs a = c.args();
    m.apply(a);
    sc.apply(a);
    const MixedResult want = oracle::mixed_attention(a);
    if (all_full) a.page_precision = nullptr;
    const std::string what =
        "iter " + std::to_string(iter) + " " + kernels::elem_name(dtype) + " heads " +
        std::to_string(spec.num_heads) + "/" + std::to_string(spec.num_kv_heads) + " hd " +
        std::to_string(spec.head_dim) + " summary parts " + std::to_string(parts);
    for (const backend::SplitPlan& plan : oracle::plans_for(c, rng, m.precision)) {
      const std::string w = what + " chunk " + std::to_string(plan.chunk_tokens);
      std::vector<float> got;
      Scoring got_sc = sc;
      run_mixed_decode(a, c.pages, dtype, m, sc, plan, want, w, &got, &got_sc);
      if (HasFatalFailure()) return;
      if (dtype == ElemType::kF32) {  // and the CPU backend on the same call
        sc.reset();
        std::fill(c.out.begin(), c.out.end(), std::numeric_limits<float>::quiet_NaN());
        ASSERT_TRUE(backend::cpu_attention_decode(a, plan, pool).ok()) << w;
        const std::vector<double> cpu_out(c.out.begin(), c.out.end());
        EXPECT_TRUE(oracle::compare(got.data(), cpu_out, kAtol, kRtol).ok) << w << " vs CPU";
        for (size_t i = 0; i < sc.relevance.size(); ++i)
          ASSERT_NEAR(got_sc.relevance[i], sc.relevance[i], 2e-5) << w << " relevance " << i;
        sc.reset();
      }
      ++runs;
      if (HasFailure()) FAIL() << w;
    }
  }
  EXPECT_EQ(runs, 5 * iters);  // oracle::plans_for: 3 fixed plans, 2 by the planner
  EXPECT_GT(quantized_pages, iters * 2);
  EXPECT_GT(evicted_pages, iters / 2);
}

// Device-sized mixed decode: 64K keys (partial last page) beside a short sequence, every
// precision mixed in, with and without splits of 2K and 16K keys (33 and 5 splits). The random
// cases above stay under 2K keys; the fiber emulator is too slow for this size, so it runs on a
// GPU only (on a real GPU index math and split counts at this size are what could break).
TEST(MixedAttentionParity, LongDecodeWithSplitsMatchesTheOracleOnAGpu) {
#if !defined(KVSPLIT_TEST_GPU)
  GTEST_SKIP() << "device-sized (64K keys): too slow for the emulator; runs in gpu_tests";
#else
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(6464);
  int runs = 0;
  for (int iter = 0; iter < 3; ++iter) {
    CaseSpec spec;
    spec.seed = 6400 + iter;
    spec.num_kv_heads = 2;
    spec.num_heads = iter == 0 ? 2 : 8 * iter;  // MHA, then groups of 4 and 8
    spec.head_dim = iter == 2 ? 64 : 128;
    spec.block_size = 16;
    spec.kv_lens = {65536 + 7, rng.range(1, 300)};
    const ElemType dtype = dtype_of(iter);
    AttentionCase c = oracle::make_case(spec);
    round_pages(c, dtype);
    Scoring sc(c, *cpu, rng, 2);
    MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
    ASSERT_TRUE(m.quantized_ok);
    backend::AttentionArgs a = c.args();
    m.apply(a);
    sc.apply(a);
    const MixedResult want = oracle::mixed_attention(a);
    for (int chunk : {0, 2048, 16384}) {
      const backend::SplitPlan plan =
          backend::make_split_plan(c.kv_lens.data(), c.num_seqs, spec.block_size, chunk, 0);
      const std::string w = "iter " + std::to_string(iter) + " " + kernels::elem_name(dtype) +
                            " chunk " + std::to_string(chunk);
      std::vector<float> got;
      Scoring got_sc = sc;
      run_mixed_decode(a, c.pages, dtype, m, sc, plan, want, w, &got, &got_sc);
      if (HasFatalFailure()) return;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 9);
#endif
}

TEST(MixedAttentionParity, PrefillMatchesTheMixedOracle) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(515);
#if defined(KVSPLIT_TEST_GPU)
  const int iters = 30, max_len = 1200;
#else
  const int iters = 12, max_len = 200;
#endif
  int quantized_pages = 0;
  for (int iter = 0; iter < iters; ++iter) {
    CaseSpec spec = random_shape(rng, 9100 + iter);
    const int num_seqs = rng.range(1, 3);
    for (int s = 0; s < num_seqs; ++s) {
      const int kv_len = oracle::random_len(rng, max_len);
      spec.kv_lens.push_back(kv_len);
      spec.q_lens.push_back(rng.range(0, 1) ? kv_len : rng.range(1, kv_len));  // chunked prefill
    }
    if (iter % 3 == 1) spec.window = rng.range(1, max_len / 2);  // sliding window
    const ElemType dtype = dtype_of(iter);
    AttentionCase c = oracle::make_case(spec);
    round_pages(c, dtype);
    MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
    ASSERT_TRUE(m.quantized_ok);
    for (uint8_t p : m.precision) quantized_pages += p == 1 || p == 2;
    backend::AttentionArgs a = c.args();
    m.apply(a);
    const MixedResult want = oracle::mixed_attention(a);
    auto d = upload(a, c.pages, dtype, &m, nullptr, nullptr);
    const Status st = kernels::launch_mixed_prefill(d->mp, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> got = d->out.to_host();
    const oracle::Comparison cmp = oracle::compare(got.data(), want.out, kAtol, kRtol);
    ASSERT_TRUE(cmp.ok) << "iter " << iter << " " << kernels::elem_name(dtype) << ": "
                        << cmp.message;
    EXPECT_EQ(d->error_flag.to_host()[0], 0);
  }
  EXPECT_GT(quantized_pages, iters);
}

// Sequence 0: every page evicted but the partial last one; sequence 1: evicted pages between
// quantized ones; sequence 2: nothing resident at all (output 0, page bounds +inf).
TEST(MixedAttentionParity, EvictedRunsAndNothingResident) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
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
  backend::AttentionArgs a = c.args();
  m.apply(a);
  sc.apply(a);
  const MixedResult want = oracle::mixed_attention(a);
  for (const backend::SplitPlan& plan : oracle::plans_for(c, rng, m.precision)) {
    const std::string w = "chunk " + std::to_string(plan.chunk_tokens);
    auto d = upload(a, c.pages, ElemType::kF32, &m, &sc, &plan);
    ASSERT_TRUE(kernels::launch_mixed_decode(d->mp, nullptr).ok());
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> got = d->out.to_host();
    ASSERT_TRUE(oracle::compare(got.data(), want.out, kAtol, kRtol).ok) << w;
    for (int i = 0; i < spec.num_heads * spec.head_dim; ++i)
      ASSERT_EQ(got[2 * spec.num_heads * spec.head_dim + i], 0.f) << w << ": nothing resident: 0";
    Scoring got_sc = sc;
    got_sc.relevance = d->relevance.to_host();
    got_sc.bound = d->bound.to_host();
    for (int b = 0; b < 3; ++b) {
      const size_t row = 2 * static_cast<size_t>(c.max_blocks_per_seq) + b;
      EXPECT_EQ(got_sc.bound[row], std::numeric_limits<float>::infinity()) << w << " page " << b;
      got_sc.bound[row] = got_sc.bound0[row];  // checked; the oracle has no finite max
    }
    got_sc.score_seqs[2] = 0;
    oracle::expect_side_outputs(a, want, got_sc, w, {2e-5, 2e-5});
    EXPECT_EQ(d->error_flag.to_host()[0], 0);
  }
}

// The benchmark's stage probes (MixedAttentionParams::probe, bench_attention --probe) leave out
// exactly the stage they name: without P.V every output is 0; without q.k every score is 0, so
// the output is what q = 0 gives (the uniform average of the attended V rows); page info loaded
// once changes nothing when every sequence fits one tile; without row loads it still runs (its
// outputs are not defined).
TEST(MixedAttentionLaunch, StageProbesLeaveOutTheirStage) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(77);
  CaseSpec spec;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.kv_lens = {3 * 16 + 5, 40};  // each within one tile of 64 keys
  AttentionCase c = oracle::make_case(spec);
  MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0.3, 0.3, 0.0});
  ASSERT_TRUE(m.quantized_ok);
  backend::AttentionArgs a = c.args();
  m.apply(a);
  const backend::SplitPlan none;
  auto run = [&](int probe) {
    auto d = upload(a, c.pages, ElemType::kF32, &m, nullptr, &none);
    d->mp.probe = probe;
    EXPECT_TRUE(kernels::launch_mixed_decode(d->mp, nullptr).ok()) << "probe " << probe;
    EXPECT_EQ(device_sync(), "") << "probe " << probe;
    EXPECT_EQ(d->error_flag.to_host()[0], 0) << "probe " << probe;
    return d->out.to_host();
  };
  const std::vector<float> every_stage = run(0);
  const MixedResult want = oracle::mixed_attention(a);
  ASSERT_TRUE(oracle::compare(every_stage.data(), want.out, kAtol, kRtol).ok);
  EXPECT_EQ(run(kernels::kMixedProbeNoPageInfo), every_stage);
  for (float x : run(kernels::kMixedProbeNoPv)) ASSERT_EQ(x, 0.f);
  std::vector<float> zero_q(c.q.size(), 0.f);
  backend::AttentionArgs az = a;
  az.q = zero_q.data();
  const MixedResult uniform = oracle::mixed_attention(az);
  const std::vector<float> no_scores = run(kernels::kMixedProbeNoScores);
  const oracle::Comparison cmp = oracle::compare(no_scores.data(), uniform.out, kAtol, kRtol);
  EXPECT_TRUE(cmp.ok) << cmp.message;
  (void)run(kernels::kMixedProbeNoRows);
}

#if defined(KVSPLIT_EMULATE_CUDA)
// The cp.async pipeline of the mixed kernel (raw rows and page parameters staged per tile) with
// one and with two stages forced, each under both copy timings (copies landing at their wait, and
// at their issue: an issue into a stage, or a page-info slot, that other threads still read would
// corrupt it). Every run matches the fp64 oracle, the outputs are bit-identical whatever the
// stages and timing (the pipeline moves bytes, never arithmetic), and so are the scoring side
// outputs. Two stages where only one fits are refused with the sizes named.
TEST(MixedAttentionPipeline, OneAndTwoStagesUnderBothCopyTimings) {
  struct Restore {
    ~Restore() {
      emu::set_async_copy_mode(emu::AsyncCopyMode::kDeferred);
      emu::set_max_dynamic_smem_bytes(emu::kMaxDynamicSmemBytes);
    }
  } restore;
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(4242);
  int runs = 0;
  for (const int head_dim : {128, 64, 8}) {
    {
      // bf16 at d128 (16-byte row pieces), f16 at d64 (two 16-byte int4 pieces per row), f32 at
      // d8 (8- and 4-byte code pieces).
      const ElemType dtype = head_dim == 128  ? ElemType::kBF16
                             : head_dim == 64 ? ElemType::kF16
                                              : ElemType::kF32;
      CaseSpec spec;
      spec.seed = 31 + head_dim;
      spec.num_heads = 8;
      spec.num_kv_heads = 2;
      spec.head_dim = head_dim;
      spec.block_size = 16;
      spec.kv_lens = {5 * 64 + 21, 64, 3};  // several tiles, one whole tile, a partial page
      AttentionCase c = oracle::make_case(spec);
      round_pages(c, dtype);
      Scoring sc(c, *cpu, rng);
      std::fill(sc.score_seqs.begin(), sc.score_seqs.end(), 1);
      MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0.3, 0.3, 0.2});
      ASSERT_TRUE(m.quantized_ok);
      backend::AttentionArgs a = c.args();
      m.apply(a);
      sc.apply(a);
      const MixedResult want = oracle::mixed_attention(a);
      for (const backend::SplitPlan& plan : oracle::plans_for(c, rng, m.precision)) {
        std::vector<float> first_out, first_rel, first_bound;
        for (const int stages : {1, 2}) {
          for (const auto mode : {emu::AsyncCopyMode::kDeferred, emu::AsyncCopyMode::kEager}) {
            const std::string w = std::string(kernels::elem_name(dtype)) + " hd " +
                                  std::to_string(head_dim) + " chunk " +
                                  std::to_string(plan.chunk_tokens) + " stages " +
                                  std::to_string(stages) +
                                  (mode == emu::AsyncCopyMode::kEager ? " eager" : " deferred");
            emu::set_async_copy_mode(mode);
            auto d = upload(a, c.pages, dtype, &m, &sc, &plan);
            d->mp.base.pipeline_stages = stages;
            const Status st = kernels::launch_mixed_decode(d->mp, nullptr);
            ASSERT_TRUE(st.ok()) << w << ": " << st.to_string();
            ASSERT_EQ(device_sync(), "") << w;
            const std::vector<float> got = d->out.to_host();
            const oracle::Comparison cmp = oracle::compare(got.data(), want.out, kAtol, kRtol);
            ASSERT_TRUE(cmp.ok) << w << ": " << cmp.message;
            Scoring got_sc = sc;
            got_sc.relevance = d->relevance.to_host();
            got_sc.bound = d->bound.to_host();
            oracle::expect_side_outputs(a, want, got_sc, w, {2e-5, 2e-5});
            if (first_out.empty()) {
              first_out = got;
              first_rel = got_sc.relevance;
              first_bound = got_sc.bound;
            } else {
              EXPECT_EQ(got, first_out) << w << ": outputs depend on the pipeline";
              EXPECT_EQ(got_sc.relevance, first_rel) << w;
              EXPECT_EQ(got_sc.bound, first_bound) << w;
            }
            ++runs;
          }
        }
      }
      // Chunked prefill: the last 40 rows of each sequence (all of the shorter ones).
      CaseSpec pspec = spec;
      pspec.q_lens = {40, 40, 3};
      AttentionCase pc = oracle::make_case(pspec);
      round_pages(pc, dtype);
      MixedCase pm = oracle::make_mixed(pc, *cpu, rng, oracle::MixSpec{0.3, 0.3, 0.0});
      ASSERT_TRUE(pm.quantized_ok);
      backend::AttentionArgs pa = pc.args();
      pm.apply(pa);
      const MixedResult pwant = oracle::mixed_attention(pa);
      std::vector<float> first;
      for (const int stages : {1, 2}) {
        for (const auto mode : {emu::AsyncCopyMode::kDeferred, emu::AsyncCopyMode::kEager}) {
          emu::set_async_copy_mode(mode);
          auto d = upload(pa, pc.pages, dtype, &pm, nullptr, nullptr);
          d->mp.base.pipeline_stages = stages;
          ASSERT_TRUE(kernels::launch_mixed_prefill(d->mp, nullptr).ok());
          ASSERT_EQ(device_sync(), "");
          const std::vector<float> got = d->out.to_host();
          ASSERT_TRUE(oracle::compare(got.data(), pwant.out, kAtol, kRtol).ok)
              << "prefill stages " << stages;
          if (first.empty()) first = got;
          EXPECT_EQ(got, first) << "prefill stages " << stages;
          ++runs;
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * (5 * 4 + 4));  // 5 plans (oracle::plans_for) x 4 pipelines, 4 prefills
  // Two stages forced where only one fits: kUnimplemented with the sizes; one stage runs.
  emu::set_async_copy_mode(emu::AsyncCopyMode::kDeferred);
  CaseSpec spec;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.kv_lens = {200};
  AttentionCase c = oracle::make_case(spec);
  MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0.3, 0.3, 0.0});
  ASSERT_TRUE(m.quantized_ok);
  backend::AttentionArgs a = c.args();
  m.apply(a);
  const backend::SplitPlan none;
  auto d = upload(a, c.pages, ElemType::kF32, &m, nullptr, &none);
  emu::set_max_dynamic_smem_bytes(
      kernels::mixed_smem_layout(kernels::kPrefillMaxRows, 128, 4, true, 1).total);
  d->mp.base.pipeline_stages = 2;
  const Status st = kernels::launch_mixed_decode(d->mp, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
  EXPECT_NE(st.message().find("two pipeline stages"), std::string::npos) << st.message();
  d->mp.base.pipeline_stages = 1;
  ASSERT_TRUE(kernels::launch_mixed_decode(d->mp, nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  const std::vector<float> got = d->out.to_host();
  EXPECT_TRUE(oracle::compare(got.data(), oracle::mixed_attention(a).out, kAtol, kRtol).ok);
}
#endif

// A GQA group past what the register P.V covers (32 query rows per block at d128) is refused with
// the limit named, never computed wrongly.
TEST(MixedAttentionLaunch, GqaGroupsPastTheRegisterTileAreUnimplemented) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(64);
  CaseSpec spec;
  spec.num_heads = 64;
  spec.num_kv_heads = 1;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.kv_lens = {40};
  AttentionCase c = oracle::make_case(spec);
  MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{});
  ASSERT_TRUE(m.quantized_ok);
  backend::AttentionArgs a = c.args();
  m.apply(a);
  const backend::SplitPlan plan = backend::make_split_plan(c.kv_lens.data(), 1, 16, 0);
  auto d = upload(a, c.pages, ElemType::kF32, &m, nullptr, &plan);
  const Status st = kernels::launch_mixed_decode(d->mp, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
  EXPECT_NE(st.message().find("at most 32 query rows per block"), std::string::npos)
      << st.to_string();
}

// Host-visible errors are Status; bad values inside device arrays set the error flag and the
// page (or bound) is skipped.
TEST(MixedAttentionLaunch, BadArgumentsAreRejectedOrFlagged) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(8);
  CaseSpec spec;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.kv_lens = {70, 33};
  AttentionCase c = oracle::make_case(spec);
  Scoring sc(c, *cpu, rng);
  std::fill(sc.score_seqs.begin(), sc.score_seqs.end(), 1);
  const std::vector<std::vector<int>> force = {{1, 2, kEvict, 0, 0}, {2, 0, 0}};
  MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0, 0, 0}, force);
  ASSERT_TRUE(m.quantized_ok);
  const backend::SplitPlan plan =
      backend::make_split_plan(c.kv_lens.data(), c.num_seqs, spec.block_size, 0);
  // Runs decode after `mutate` (host copies); returns (status, error flag).
  const auto run = [&](auto&& mutate) {
    MixedCase mm = m;
    Scoring ss = sc;
    backend::AttentionArgs a = c.args();
    mm.apply(a);
    ss.apply(a);
    mutate(a, mm, ss);
    auto d = upload(a, c.pages, ElemType::kF32, &mm, &ss, &plan);
    const Status st = kernels::launch_mixed_decode(d->mp, nullptr);
    EXPECT_EQ(device_sync(), "");
    return std::make_pair(st.code(), d->error_flag.to_host()[0]);
  };
  using R = std::pair<StatusCode, int>;
  const R ok{StatusCode::kOk, 0}, flagged{StatusCode::kOk, 1};
  EXPECT_EQ(run([](auto&, auto&, auto&) {}), ok);
  EXPECT_EQ(run([](auto&, MixedCase& mm, auto&) { mm.precision[1] = 4; }), flagged);
  EXPECT_EQ(run([](auto&, MixedCase& mm, auto&) { mm.tables[0] = mm.num_int8; }), flagged);
  EXPECT_EQ(run([](auto&, MixedCase& mm, auto&) { mm.tables[1] = -1; }), flagged);
  EXPECT_EQ(run([](backend::AttentionArgs& a, auto&, auto&) { a.int4_pages = nullptr; }), flagged);
  EXPECT_EQ(run([&](auto&, MixedCase& mm, auto&) { mm.tables[3] = c.num_blocks; }), flagged);
  EXPECT_EQ(run([](auto&, auto&, Scoring& ss) { ss.slots[0] = ss.num_slots; }), flagged);
  // An evicted page's id is ignored, whatever it is.
  EXPECT_EQ(run([](auto&, MixedCase& mm, auto&) { mm.tables[2] = -12345; }), ok);
  // Rows of 4 pages (the first sequence's first 4 of its 5): its fifth page is past its row,
  // where the next row's first (a valid page) lies. Flagged, not read.
  EXPECT_EQ(run([](backend::AttentionArgs& a, MixedCase& mm, Scoring& ss) {
              const int w = a.max_blocks_per_seq, keep = 4;
              auto narrow = [&](auto& v) {
                auto out = v;
                out.clear();
                for (int s = 0; s < a.num_seqs; ++s)
                  out.insert(out.end(), v.begin() + s * w, v.begin() + s * w + keep);
                v = out;
              };
              narrow(mm.tables);
              narrow(mm.precision);
              narrow(ss.slots);
              mm.apply(a);
              ss.apply(a);
              a.max_blocks_per_seq = keep;
            }),
            flagged);
  // Host-visible: missing outputs, the score_max workspace, scoring on prefill, shapes.
  backend::AttentionArgs a = c.args();
  m.apply(a);
  sc.apply(a);
  auto d = upload(a, c.pages, ElemType::kF32, &m, &sc, &plan);
  kernels::MixedAttentionParams mp = d->mp;
  mp.score_max = nullptr;
  EXPECT_EQ(kernels::launch_mixed_decode(mp, nullptr).code(), StatusCode::kInvalidArgument);
  mp = d->mp;
  mp.page_bound = nullptr;
  EXPECT_EQ(kernels::launch_mixed_decode(mp, nullptr).code(), StatusCode::kInvalidArgument);
  mp = d->mp;
  EXPECT_EQ(kernels::launch_mixed_prefill(mp, nullptr).code(), StatusCode::kInvalidArgument);
  mp.score_seqs = nullptr;
  EXPECT_EQ(kernels::launch_mixed_prefill(mp, nullptr).code(), StatusCode::kOk);
  mp.base.head_dim = 96;
  EXPECT_EQ(kernels::launch_mixed_decode(mp, nullptr).code(), StatusCode::kUnimplemented);
  // Page arrays not 16-byte aligned (the rows are staged by 16-byte copies): refused, naming them.
  for (int which = 0; which < 3; ++which) {
    mp = d->mp;
    const void** arr = which == 0 ? &mp.base.kv : which == 1 ? &mp.int8_pages : &mp.int4_pages;
    *arr = static_cast<const unsigned char*>(*arr) + 4;
    const Status st = kernels::launch_mixed_decode(mp, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << which;
    EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.message();
  }
  EXPECT_EQ(device_sync(), "");
}

}  // namespace
}  // namespace kvsplit::testing
