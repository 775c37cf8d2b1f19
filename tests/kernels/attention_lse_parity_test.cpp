// Partial attention for the spatial cut on the CUDA kernels: the log-sum-exp output
// (AttentionArgs::lse) of the all-full and mixed-precision kernels (prefill, decode with and
// without split-K) against the fp64 oracles and the CPU backend, and Backend::
// merge_attention_states (kernels/attention/merge_partials.h) merging shards of a sequence's
// pages back into the unsharded attention. Runs through the Backend interface, so the CUDA
// backend's argument plumbing is covered too: EmulatedKernelBackend under the emulation harness
// (tests/kernels, label emulated), CudaBackend on a real device (tests/gpu, label gpu; skips
// without one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/split_plan.h"
#include "kernel_test_util.h"
#include "oracle/attention_oracle.h"
#include "oracle/mixed_attention_oracle.h"
#include "oracle/mixed_scoring.h"
#include "oracle/partial_attention.h"
#if defined(KVSPLIT_TEST_GPU)
#include "backend/cuda/cuda_backend_factory.h"
#else
#include "emulated_backend.h"
#endif

namespace kvsplit::testing {
namespace {

using backend::AttentionArgs;
using backend::Backend;
using backend::SplitPlan;
using kernels::ElemType;
using kernels::KvPrecision;
using oracle::AttentionCase;
using oracle::CaseSpec;

constexpr double kAtol = 2e-5, kRtol = 2e-4;        // outputs: f32 kernel vs fp64 oracle
constexpr double kLseAtol = 2e-5, kLseRtol = 2e-5;  // lse: log of an f32 sum, m exact
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kNegInf = -std::numeric_limits<float>::infinity();

std::unique_ptr<Backend> make_device_backend() {
#if defined(KVSPLIT_TEST_GPU)
  backend::CudaBackendOptions opt;
  opt.weight_dtype = backend::DType::kF32;
  auto b = backend::create_cuda_backend(0, opt);
  return b.ok() ? std::move(*b) : nullptr;
#else
  return std::make_unique<EmulatedKernelBackend>();
#endif
}

// Arrays in one backend's memory, freed with it.
class DeviceArrays {
 public:
  explicit DeviceArrays(Backend& dev) : dev_(dev) {}
  // A copy of n elements of host array `src` (nullptr: nullptr).
  template <typename T>
  T* put(const T* src, size_t n) {
    if (src == nullptr) return nullptr;
    auto buf = backend::DeviceBuffer::make(dev_, n * sizeof(T) + 1);
    EXPECT_TRUE(buf.ok());
    if (!buf.ok()) return nullptr;
    EXPECT_TRUE(dev_.copy_h2d(buf->get(), src, n * sizeof(T)).ok());
    bufs_.push_back(std::move(*buf));
    return bufs_.back().get<T>();
  }
  template <typename T>
  T* put(const std::vector<T>& v) {
    return put(v.data(), v.size());
  }
  template <typename T>
  std::vector<T> get(const T* src, size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(dev_.copy_d2h(v.data(), src, n * sizeof(T)).ok());
    return v;
  }

 private:
  Backend& dev_;
  std::vector<backend::DeviceBuffer> bufs_;
};

// One attention call's results: host copies, and the device arrays (for merging).
struct CallResult {
  Status status;
  std::vector<float> out, lse;  // [num_tokens, num_heads, head_dim], [num_tokens, num_heads]
  float* dev_out = nullptr;
  float* dev_lse = nullptr;
};

// Runs host call `a` (f32 pages in a.kv.data, stored on the device as `dtype`) on `dev` with lse
// requested: decode with *plan, or prefill when plan is null. Device arrays live in `mem`.
CallResult run_on(Backend& dev, DeviceArrays& mem, const AttentionArgs& a, ElemType dtype,
                  const SplitPlan* plan) {
  const size_t rows = static_cast<size_t>(a.num_tokens) * a.num_heads;
  const size_t out_n = rows * a.head_dim;
  const size_t tables = static_cast<size_t>(a.num_seqs) * a.max_blocks_per_seq;
  const int64_t block_elems = int64_t{2} * a.num_kv_heads * a.kv.block_size * a.head_dim;
  const kernels::QuantPageLayout ql{a.num_kv_heads, a.kv.block_size, a.head_dim};
  AttentionArgs d = a;
  d.q = mem.put(a.q, out_n);
  d.out = mem.put(std::vector<float>(out_n, kNan));
  d.lse = mem.put(std::vector<float>(rows, kNan));
  const float* pages = static_cast<const float*>(a.kv.data);
  d.kv.data =
      mem.put(encode(std::vector<float>(pages, pages + a.kv.num_blocks * block_elems), dtype));
  d.kv.dtype = dtype;
  d.query_start = mem.put(a.query_start, a.num_seqs + 1);
  d.kv_lens = mem.put(a.kv_lens, a.num_seqs);
  d.block_tables = mem.put(a.block_tables, tables);
  d.page_precision = mem.put(a.page_precision, tables);
  d.int8_pages = mem.put(static_cast<const uint8_t*>(a.int8_pages),
                         a.num_int8_blocks * ql.bytes(KvPrecision::kInt8));
  d.int4_pages = mem.put(static_cast<const uint8_t*>(a.int4_pages),
                         a.num_int4_blocks * ql.bytes(KvPrecision::kInt4));
  CallResult r;
  r.status = plan ? dev.attention_decode(d, *plan) : dev.attention_prefill(d);
  if (r.status.ok()) r.status = dev.synchronize();
  r.dev_out = d.out;
  r.dev_lse = d.lse;
  r.out = mem.get(d.out, out_n);
  r.lse = mem.get(d.lse, rows);
  return r;
}

// The same call on the CPU backend (host memory, f32 pages).
CallResult run_on_cpu(Backend& cpu, AttentionArgs a, const SplitPlan* plan) {
  const size_t rows = static_cast<size_t>(a.num_tokens) * a.num_heads;
  CallResult r;
  r.out.assign(rows * a.head_dim, kNan);
  r.lse.assign(rows, kNan);
  a.out = r.out.data();
  a.lse = r.lse.data();
  r.status = plan ? cpu.attention_decode(a, *plan) : cpu.attention_prefill(a);
  return r;
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

ElemType dtype_of(int i) {
  const ElemType all[] = {ElemType::kF32, ElemType::kF16, ElemType::kBF16};
  return all[i % 3];
}

// A random decode (q_lens empty) or prefill case, pages rounded to `dtype`.
AttentionCase random_case(oracle::Rng& rng, uint64_t seed, bool prefill, int max_len,
                          ElemType dtype) {
  CaseSpec spec = random_shape(rng, seed);
  const int num_seqs = rng.range(1, 3);
  for (int s = 0; s < num_seqs; ++s) {
    const int kv_len = oracle::random_len(rng, max_len);
    spec.kv_lens.push_back(kv_len);
    if (prefill) spec.q_lens.push_back(rng.range(0, 1) ? kv_len : rng.range(1, kv_len));
  }
  if (rng.range(0, 4) == 0) spec.q_range = 8.0;  // peaked softmax
  AttentionCase c = oracle::make_case(spec);
  c.pages = decode(encode(c.pages, dtype), dtype);
  return c;
}

std::string describe(const AttentionCase& c, ElemType dtype) {
  return std::string(kernels::elem_name(dtype)) + " heads " + std::to_string(c.spec.num_heads) +
         "/" + std::to_string(c.spec.num_kv_heads) + " hd " + std::to_string(c.spec.head_dim);
}

// Checks one run against the oracle's out / lse and, when cpu is set, the CPU backend's run.
void expect_run(const CallResult& r, const std::vector<double>& want_out,
                const std::vector<double>& want_lse, const CallResult* cpu, const std::string& w) {
  ASSERT_TRUE(r.status.ok()) << w << ": " << r.status.to_string();
  const oracle::Comparison out = oracle::compare(r.out.data(), want_out, kAtol, kRtol);
  EXPECT_TRUE(out.ok) << w << " out: " << out.message;
  const oracle::Comparison lse = oracle::compare_lse(r.lse.data(), want_lse, kLseAtol, kLseRtol);
  EXPECT_TRUE(lse.ok) << w << ": " << lse.message;
  if (cpu == nullptr) return;
  ASSERT_TRUE(cpu->status.ok()) << w << " cpu: " << cpu->status.to_string();
  const oracle::Comparison c_lse =
      oracle::compare_lse(r.lse.data(), oracle::as_double(cpu->lse), kLseAtol, kLseRtol);
  EXPECT_TRUE(c_lse.ok) << w << " vs CPU: " << c_lse.message;
  const oracle::Comparison c_out =
      oracle::compare(r.out.data(), oracle::as_double(cpu->out), kAtol, kRtol);
  EXPECT_TRUE(c_out.ok) << w << " out vs CPU: " << c_out.message;
}

TEST(AttentionLseParity, AllFullPrefillAndDecodeMatchOracleAndCpu) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<Backend> dev = make_device_backend();
  ASSERT_NE(dev, nullptr);
  std::unique_ptr<Backend> cpu = backend::make_cpu_backend(2);
#if defined(KVSPLIT_TEST_GPU)
  const int iters = 36, max_len = 1500;
#else
  const int iters = 12, max_len = 300;
#endif
  oracle::Rng rng(4242);
  int runs = 0;
  for (int iter = 0; iter < iters; ++iter) {
    const ElemType dtype = dtype_of(iter);
    const bool prefill = iter % 2 == 1;
    AttentionCase c = random_case(rng, 7300 + iter, prefill, max_len, dtype);
    const AttentionArgs a = c.args();
    const std::vector<double> want_out = oracle::attention_f32(a);
    const auto load = [&](int64_t i) { return static_cast<double>(c.pages[i]); };
    const std::vector<double> want_lse = oracle::attention_lse(a, load);
    const std::string what = "iter " + std::to_string(iter) + " " + describe(c, dtype);
    std::vector<SplitPlan> plans;
    if (!prefill) plans = oracle::plans_for(c, rng);
    for (size_t i = 0; i < (prefill ? 1 : plans.size()); ++i) {
      const SplitPlan* plan = prefill ? nullptr : &plans[i];
      const std::string w =
          what + (prefill ? " prefill" : " decode chunk " + std::to_string(plan->chunk_tokens));
      DeviceArrays mem(*dev);
      const CallResult r = run_on(*dev, mem, a, dtype, plan);
      const CallResult cpu_run = run_on_cpu(*cpu, a, plan);
      expect_run(r, want_out, want_lse, dtype == ElemType::kF32 ? &cpu_run : nullptr, w);
      ++runs;
      if (HasFailure()) FAIL() << w;
    }
  }
  EXPECT_EQ(runs, iters / 2 + 3 * (iters / 2));
}

// Mixed pages (int8 / int4 / evicted), random, plus fixed cases where rows attend no key: a
// decode sequence with every page evicted, and prefill rows whose visible keys are all evicted.
TEST(AttentionLseParity, MixedPagesAndEmptyRowsMatchOracleAndCpu) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<Backend> dev = make_device_backend();
  ASSERT_NE(dev, nullptr);
  std::unique_ptr<Backend> cpu = backend::make_cpu_backend(2);
#if defined(KVSPLIT_TEST_GPU)
  const int iters = 30, max_len = 1200;
#else
  const int iters = 10, max_len = 250;
#endif
  oracle::Rng rng(77);
  int empty_rows = 0;
  for (int iter = 0; iter < iters + 2; ++iter) {
    const bool fixed = iter >= iters;
    const ElemType dtype = fixed ? ElemType::kF32 : dtype_of(iter);
    const bool prefill = fixed ? iter == iters + 1 : iter % 2 == 1;
    AttentionCase c;
    std::vector<std::vector<int>> force;
    const int kE = static_cast<int>(KvPrecision::kEvicted);
    if (!fixed) {
      c = random_case(rng, 9900 + iter, prefill, max_len, dtype);
    } else {
      CaseSpec spec;
      spec.num_heads = 8;
      spec.num_kv_heads = 2;
      spec.head_dim = 64;
      spec.seed = 31 + iter;
      spec.kv_lens = {5 * 16 + 3, 3 * 16};
      if (prefill) spec.q_lens = {5 * 16 + 3, 20};  // rows 0..31 of seq 0 see only evicted keys
      c = oracle::make_case(spec);
      force = prefill ? std::vector<std::vector<int>>{{kE, kE, 1, kE, 2, 0}, {kE, 1, 0}}
                      : std::vector<std::vector<int>>{{kE, 2, kE, 1, kE, 0}, {kE, kE, kE}};
    }
    oracle::MixedCase m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{}, force);
    ASSERT_TRUE(m.quantized_ok);
    AttentionArgs a = c.args();
    m.apply(a);
    const oracle::MixedResult want = oracle::mixed_attention(a);
    for (double x : want.lse) empty_rows += std::isinf(x);
    const std::string what = "iter " + std::to_string(iter) + " " + describe(c, dtype);
    std::vector<SplitPlan> plans;
    if (!prefill) plans = oracle::plans_for(c, rng);
    for (size_t i = 0; i < (prefill ? 1 : plans.size()); ++i) {
      const SplitPlan* plan = prefill ? nullptr : &plans[i];
      const std::string w =
          what + (prefill ? " prefill" : " decode chunk " + std::to_string(plan->chunk_tokens));
      DeviceArrays mem(*dev);
      const CallResult r = run_on(*dev, mem, a, dtype, plan);
      const CallResult cpu_run = run_on_cpu(*cpu, a, plan);
      expect_run(r, want.out, want.lse, dtype == ElemType::kF32 ? &cpu_run : nullptr, w);
      if (fixed) {  // rows that attend nothing: exactly 0 and -inf
        for (size_t row = 0; row < want.lse.size(); ++row) {
          if (!std::isinf(want.lse[row])) continue;
          EXPECT_EQ(r.lse[row], kNegInf) << w << " row " << row;
          for (int d = 0; d < a.head_dim; ++d)
            ASSERT_EQ(r.out[row * a.head_dim + d], 0.f) << w << " row " << row;
        }
      }
      if (HasFailure()) FAIL() << w;
    }
  }
  EXPECT_GE(empty_rows, 8 + 32 * 8);  // the fixed cases' empty rows at least
}

// Merges the parts' device results on `dev`; returns host (out, lse_out).
CallResult merge_on(Backend& dev, DeviceArrays& mem, const std::vector<CallResult>& parts,
                    int64_t rows, int head_dim) {
  std::vector<const float*> o, lse;
  for (const CallResult& p : parts) {
    o.push_back(p.dev_out);
    lse.push_back(p.dev_lse);
  }
  float* out = mem.put(std::vector<float>(rows * head_dim, kNan));
  float* lse_out = mem.put(std::vector<float>(rows, kNan));
  CallResult r;
  r.status = dev.merge_attention_states(o.data(), lse.data(), static_cast<int>(parts.size()), rows,
                                        head_dim, out, lse_out);
  if (r.status.ok()) r.status = dev.synchronize();
  r.out = mem.get(out, rows * head_dim);
  r.lse = mem.get(lse_out, rows);
  return r;
}

// The spatial cut end to end: a call's resident pages are dealt into 1..4 disjoint shards, each
// shard runs the mixed kernels with the other shards' pages evicted (lse requested), and the
// merge of the shards equals the unsharded attention (fp64 oracle, and the unsharded kernel run)
// on the device and on the CPU backend.
TEST(MergeAttentionStatesParity, ShardsMergeToTheUnshardedAttention) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<Backend> dev = make_device_backend();
  ASSERT_NE(dev, nullptr);
  std::unique_ptr<Backend> cpu = backend::make_cpu_backend(2);
#if defined(KVSPLIT_TEST_GPU)
  const int iters = 32, max_len = 1200;
#else
  const int iters = 12, max_len = 160;  // sized for the ASan build (slow fibers)
#endif
  oracle::Rng rng(1009);
  for (int iter = 0; iter < iters; ++iter) {
    const ElemType dtype = dtype_of(iter / 4);
    const bool prefill = iter % 2 == 1;
    const int num_parts = 1 + iter % 4;
    AttentionCase c = random_case(rng, 5100 + iter, prefill, max_len, dtype);
    // Half the cases start from mixed pages (quantized and already evicted ones).
    oracle::MixedCase m;
    const bool mixed = iter % 4 < 2;
    if (mixed) {
      m = oracle::make_mixed(c, *cpu, rng, oracle::MixSpec{0.2, 0.2, 0.15});
      ASSERT_TRUE(m.quantized_ok);
    }
    AttentionArgs a = c.args();
    if (mixed) m.apply(a);
    const size_t table_rows = static_cast<size_t>(a.num_seqs) * a.max_blocks_per_seq;
    std::vector<double> want_out, want_lse;
    if (mixed) {
      oracle::MixedResult want = oracle::mixed_attention(a);
      want_out = std::move(want.out);
      want_lse = std::move(want.lse);
    } else {
      want_out = oracle::attention_f32(a);
      want_lse = oracle::attention_lse(a, [&](int64_t i) { return double{c.pages[i]}; });
    }
    const std::vector<std::vector<uint8_t>> shards =
        oracle::shard_precisions(m.precision, table_rows, num_parts, rng);
    std::vector<SplitPlan> plans;
    if (!prefill) plans = oracle::plans_for(c, rng);
    const SplitPlan* plan = prefill ? nullptr : &plans[rng.range(0, 2)];
    const std::string w = "iter " + std::to_string(iter) + " " + describe(c, dtype) + " parts " +
                          std::to_string(num_parts) + (prefill ? " prefill" : " decode");
    const int64_t rows = int64_t{a.num_tokens} * a.num_heads;

    DeviceArrays mem(*dev);
    std::vector<CallResult> dev_parts, cpu_parts;
    for (int p = 0; p < num_parts; ++p) {
      AttentionArgs ap = a;
      ap.page_precision = shards[p].data();
      dev_parts.push_back(run_on(*dev, mem, ap, dtype, plan));
      ASSERT_TRUE(dev_parts.back().status.ok()) << w << ": " << dev_parts.back().status.to_string();
      if (dtype == ElemType::kF32) cpu_parts.push_back(run_on_cpu(*cpu, ap, plan));
    }
    const CallResult merged = merge_on(*dev, mem, dev_parts, rows, a.head_dim);
    const CallResult whole = run_on(*dev, mem, a, dtype, plan);
    expect_run(merged, want_out, want_lse, nullptr, w + " merged");
    ASSERT_TRUE(whole.status.ok()) << w << ": " << whole.status.to_string();
    expect_run(merged, oracle::as_double(whole.out), oracle::as_double(whole.lse), nullptr,
               w + " merged vs unsharded kernel");
    if (dtype == ElemType::kF32) {
      std::vector<const float*> o, lse;
      for (const CallResult& p : cpu_parts) {
        ASSERT_TRUE(p.status.ok()) << w << " cpu: " << p.status.to_string();
        o.push_back(p.out.data());
        lse.push_back(p.lse.data());
      }
      CallResult cpu_merged;
      cpu_merged.out.assign(rows * a.head_dim, kNan);
      cpu_merged.lse.assign(rows, kNan);
      cpu_merged.status =
          cpu->merge_attention_states(o.data(), lse.data(), num_parts, rows, a.head_dim,
                                      cpu_merged.out.data(), cpu_merged.lse.data());
      expect_run(cpu_merged, want_out, want_lse, nullptr, w + " CPU merged");
      expect_run(merged, want_out, want_lse, &cpu_merged, w + " merged vs CPU merged");
    }
    if (HasFailure()) FAIL() << w;
  }
}

// Hand-made parts: an empty part (lse -inf, o NaN: never read), rows empty in every part (out 0,
// lse -inf), 16 parts, an odd head_dim, lse_out null, and num_parts outside [1, 16].
TEST(MergeAttentionStatesParity, EdgeCases) {
  KVSPLIT_REQUIRE_DEVICE();
  std::unique_ptr<Backend> dev = make_device_backend();
  ASSERT_NE(dev, nullptr);
  std::unique_ptr<Backend> cpu = backend::make_cpu_backend(1);
  oracle::Rng rng(3);
  const int head_dim = 40;
  const int64_t rows = 7;
  const int max_parts = Backend::kMaxMergeParts;
  std::vector<std::vector<float>> o(max_parts), lse(max_parts);
  for (int p = 0; p < max_parts; ++p) {
    o[p].resize(rows * head_dim);
    lse[p].resize(rows);
    for (float& x : o[p]) x = static_cast<float>(rng.uniform(-1, 1));
    for (float& x : lse[p]) x = static_cast<float>(rng.uniform(-5, 5));
  }
  for (int64_t r = 0; r < rows; ++r) lse[1][r] = kNegInf;  // part 1: empty everywhere
  std::fill(o[1].begin(), o[1].end(), kNan);
  for (int p = 0; p < max_parts; ++p) lse[p][3] = kNegInf;  // row 3: empty in every part
  lse[0][5] = 80.f;                                         // row 5: one part dominates
  lse[2][5] = -80.f;

  // fp64 reference of the first n parts.
  const auto reference = [&](int n, std::vector<double>* out, std::vector<double>* l) {
    out->assign(rows * head_dim, 0.0);
    l->assign(rows, -std::numeric_limits<double>::infinity());
    for (int64_t r = 0; r < rows; ++r) {
      double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (int p = 0; p < n; ++p) m = std::max(m, double{lse[p][r]});
      if (std::isinf(m)) continue;
      for (int p = 0; p < n; ++p) {
        if (std::isinf(lse[p][r])) continue;
        const double w = std::exp(lse[p][r] - m);
        sum += w;
        for (int d = 0; d < head_dim; ++d) (*out)[r * head_dim + d] += w * o[p][r * head_dim + d];
      }
      for (int d = 0; d < head_dim; ++d) (*out)[r * head_dim + d] /= sum;
      (*l)[r] = m + std::log(sum);
    }
  };

  for (Backend* b : {dev.get(), cpu.get()}) {
    const std::string w = b->name();
    DeviceArrays mem(*b);
    std::vector<const float*> op, lp;
    for (int p = 0; p < max_parts; ++p) {
      op.push_back(mem.put(o[p]));
      lp.push_back(mem.put(lse[p]));
    }
    float* out = mem.put(std::vector<float>(rows * head_dim, kNan));
    float* lse_out = mem.put(std::vector<float>(rows, kNan));
    for (int n : {1, 2, 3, 16}) {
      std::vector<double> want_out, want_lse;
      reference(n, &want_out, &want_lse);
      ASSERT_TRUE(
          b->merge_attention_states(op.data(), lp.data(), n, rows, head_dim, out, lse_out).ok());
      ASSERT_TRUE(b->synchronize().ok());
      const std::vector<float> got = mem.get(out, rows * head_dim);
      const std::vector<float> got_lse = mem.get(lse_out, rows);
      const std::string wn = w + " parts " + std::to_string(n);
      const oracle::Comparison c = oracle::compare(got.data(), want_out, 1e-6, 1e-5);
      EXPECT_TRUE(c.ok) << wn << ": " << c.message;
      const oracle::Comparison cl = oracle::compare_lse(got_lse.data(), want_lse, 1e-5, 1e-6);
      EXPECT_TRUE(cl.ok) << wn << ": " << cl.message;
      EXPECT_EQ(got_lse[3], kNegInf) << wn;
      for (int d = 0; d < head_dim; ++d) ASSERT_EQ(got[3 * head_dim + d], 0.f) << wn;
    }
    // Without part 1 (empty): the same sums in the same order, so the same bits.
    std::vector<const float*> op2 = {op[0], op[1], op[2]}, lp2 = {lp[0], lp[1], lp[2]};
    std::vector<const float*> op3 = {op[0], op[2]}, lp3 = {lp[0], lp[2]};
    ASSERT_TRUE(
        b->merge_attention_states(op2.data(), lp2.data(), 3, rows, head_dim, out, lse_out).ok());
    ASSERT_TRUE(b->synchronize().ok());
    const std::vector<float> with_empty = mem.get(out, rows * head_dim);
    ASSERT_TRUE(
        b->merge_attention_states(op3.data(), lp3.data(), 2, rows, head_dim, out, nullptr).ok());
    ASSERT_TRUE(b->synchronize().ok());
    EXPECT_EQ(mem.get(out, rows * head_dim), with_empty) << w << ": lse_out null, empty part";
    // Every part empty everywhere: out 0, lse_out -inf.
    std::vector<const float*> empty_o = {op[1], op[1]}, empty_l = {lp[1], lp[1]};
    ASSERT_TRUE(
        b->merge_attention_states(empty_o.data(), empty_l.data(), 2, rows, head_dim, out, lse_out)
            .ok());
    ASSERT_TRUE(b->synchronize().ok());
    EXPECT_EQ(mem.get(out, rows * head_dim), std::vector<float>(rows * head_dim, 0.f)) << w;
    EXPECT_EQ(mem.get(lse_out, rows), std::vector<float>(rows, kNegInf)) << w;
    // Bad part counts; zero rows is a no-op.
    for (int n : {0, -1, max_parts + 1}) {
      EXPECT_EQ(
          b->merge_attention_states(op.data(), lp.data(), n, rows, head_dim, out, lse_out).code(),
          StatusCode::kInvalidArgument)
          << w << " num_parts " << n;
    }
    EXPECT_EQ(b->merge_attention_states(op.data(), lp.data(), 2, rows, 0, out, lse_out).code(),
              StatusCode::kInvalidArgument)
        << w;
    EXPECT_TRUE(b->merge_attention_states(op.data(), lp.data(), 2, 0, head_dim, out, lse_out).ok())
        << w;
    ASSERT_TRUE(b->synchronize().ok()) << w;
  }
}

}  // namespace
}  // namespace kvsplit::testing
