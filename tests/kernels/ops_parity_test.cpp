// Element-wise / row-wise kernels against fp64 references and the CPU backend. Same source for the
// emulated kernels (tests/kernels) and the real ones (tests/gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kernel_test_util.h"
#include "kernels/common/paged_kv.h"
#include "kernels/ops/ops.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::testing {
namespace {

using kernels::ElemType;

std::vector<float> random_vec(size_t n, uint64_t seed, double range = 2.0) {
  oracle::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.uniform(-range, range));
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double atol,
                  double rtol, const char* what) {
  const oracle::Comparison c = oracle::compare(got.data(), want, atol, rtol);
  EXPECT_TRUE(c.ok) << what << ": " << c.message;
}

TEST(OpsParity, RmsNormAndFusedResidual) {
  KVSPLIT_REQUIRE_DEVICE();
  auto cpu = backend::make_cpu_backend(1);
  for (int dim : {64, 288, 1000}) {
    const int tokens = 5;
    const float eps = 1e-5f;
    const std::vector<float> x = random_vec(size_t(tokens) * dim, dim),
                             w = random_vec(dim, dim + 1),
                             res = random_vec(size_t(tokens) * dim, dim + 2);
    std::vector<double> want(x.size()), want_res(x.size()), want_fused(x.size());
    for (int t = 0; t < tokens; ++t) {
      double ss = 0, ss2 = 0;
      for (int i = 0; i < dim; ++i) {
        const double v = x[t * dim + i], r = double(res[t * dim + i]) + v;
        ss += v * v;
        ss2 += r * r;
        want_res[t * dim + i] = r;
      }
      const double inv = 1.0 / std::sqrt(ss / dim + eps), inv2 = 1.0 / std::sqrt(ss2 / dim + eps);
      for (int i = 0; i < dim; ++i) {
        want[t * dim + i] = x[t * dim + i] * inv * w[i];
        want_fused[t * dim + i] = want_res[t * dim + i] * inv2 * w[i];
      }
    }
    DevArray<float> dx(x), dw(w), dout(x.size()), dres(res);
    ASSERT_TRUE(
        kernels::launch_rmsnorm(dx.get(), dw.get(), tokens, dim, eps, dout.get(), nullptr, nullptr)
            .ok());
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> got = dout.to_host();
    expect_close(got, want, 1e-5, 1e-5, "rmsnorm vs fp64");
    std::vector<float> cpu_out(x.size());
    ASSERT_TRUE(cpu->rmsnorm(x.data(), w.data(), tokens, dim, eps, cpu_out.data()).ok());
    expect_close(got, std::vector<double>(cpu_out.begin(), cpu_out.end()), 1e-5, 1e-5,
                 "rmsnorm vs CPU");

    ASSERT_TRUE(kernels::launch_rmsnorm(dx.get(), dw.get(), tokens, dim, eps, dout.get(),
                                        dres.get(), nullptr)
                    .ok());
    ASSERT_EQ(device_sync(), "");
    expect_close(dres.to_host(), want_res, 1e-6, 1e-6, "fused residual");
    expect_close(dout.to_host(), want_fused, 1e-5, 1e-5, "add_rmsnorm vs fp64");
  }
}

TEST(OpsParity, RopeBothStylesMatchCpu) {
  KVSPLIT_REQUIRE_DEVICE();
  auto cpu = backend::make_cpu_backend(1);
  const int tokens = 3, heads = 4, kv_heads = 2, hd = 64;
  for (bool interleaved : {true, false}) {
    for (int rot : {64, 32}) {
      // YaRN's attention factor scales cos and sin; exercise it on one style.
      const float af = interleaved ? 1.0f : 1.1386294f;
      std::vector<float> q = random_vec(size_t(tokens) * heads * hd, 5),
                         k = random_vec(size_t(tokens) * kv_heads * hd, 6);
      std::vector<float> inv_freq(rot / 2);
      for (int i = 0; i < rot / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / rot);
      const std::vector<int32_t> pos = {0, 7, 1000};
      DevArray<float> dq(q), dk(k), dfreq(inv_freq);
      DevArray<int32_t> dpos(pos);
      kernels::RopeParams p;
      p.q = dq.get();
      p.k = dk.get();
      p.positions = dpos.get();
      p.inv_freq = dfreq.get();
      p.num_tokens = tokens;
      p.num_heads = heads;
      p.num_kv_heads = kv_heads;
      p.head_dim = hd;
      p.rotary_dim = rot;
      p.interleaved = interleaved;
      p.attention_factor = af;
      ASSERT_TRUE(kernels::launch_rope(p, nullptr).ok());
      ASSERT_EQ(device_sync(), "");
      // fp64 reference for q.
      std::vector<double> want(q.begin(), q.end());
      for (int t = 0; t < tokens; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < rot / 2; ++i) {
            const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + rot / 2;
            const double ang = double(pos[t]) * inv_freq[i];
            double* x = want.data() + (t * heads + h) * hd;
            const double x0 = q[(t * heads + h) * hd + a], x1 = q[(t * heads + h) * hd + b];
            x[a] = (x0 * std::cos(ang) - x1 * std::sin(ang)) * af;
            x[b] = (x0 * std::sin(ang) + x1 * std::cos(ang)) * af;
          }
      expect_close(dq.to_host(), want, 2e-4, 1e-4, "rope q vs fp64");
      backend::RopeArgs args;
      args.style = interleaved ? backend::RopeStyle::kInterleaved : backend::RopeStyle::kHalf;
      args.head_dim = hd;
      args.rotary_dim = rot;
      args.inv_freq = inv_freq.data();
      args.attention_factor = af;
      ASSERT_TRUE(cpu->rope(q.data(), k.data(), pos.data(), tokens, heads, kv_heads, args).ok());
      expect_close(dq.to_host(), std::vector<double>(q.begin(), q.end()), 1e-5, 1e-5,
                   "rope q vs CPU");
      expect_close(dk.to_host(), std::vector<double>(k.begin(), k.end()), 1e-5, 1e-5,
                   "rope k vs CPU");
    }
  }
}

TEST(OpsParity, SwigluMatchesCpu) {
  KVSPLIT_REQUIRE_DEVICE();
  auto cpu = backend::make_cpu_backend(1);
  const int64_t n = 3000;
  const std::vector<float> g = random_vec(n, 8, 8.0), u = random_vec(n, 9);
  DevArray<float> dg(g), du(u), dout(n);
  ASSERT_TRUE(kernels::launch_swiglu(dg.get(), du.get(), n, dout.get(), nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
  expect_close(dout.to_host(), want, 1e-6, 1e-5, "swiglu vs fp64");
  std::vector<float> cpu_out(n);
  ASSERT_TRUE(cpu->swiglu(g.data(), u.data(), n, cpu_out.data()).ok());
  expect_close(dout.to_host(), std::vector<double>(cpu_out.begin(), cpu_out.end()), 1e-6, 1e-5,
               "swiglu vs CPU");
}

TEST(OpsParity, EmbeddingAllDtypesAndBadIds) {
  KVSPLIT_REQUIRE_DEVICE();
  const int rows = 50, cols = 72;
  const std::vector<float> table = random_vec(size_t(rows) * cols, 10);
  for (ElemType dt : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    const std::vector<unsigned char> raw = encode(table, dt);
    const std::vector<float> rounded = decode(raw, dt);
    const std::vector<int32_t> ids = {3, 0, 49, 3};
    DevArray<unsigned char> dtab(raw);
    DevArray<int32_t> dids(ids);
    DevArray<float> dout(ids.size() * cols);
    DevArray<int> flag(std::vector<int>{0});
    ASSERT_TRUE(kernels::launch_embedding(dids.get(), 4, dtab.get(), dt, rows, cols, dout.get(),
                                          flag.get(), nullptr)
                    .ok());
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> got = dout.to_host();
    for (size_t t = 0; t < ids.size(); ++t)
      for (int c = 0; c < cols; ++c) ASSERT_EQ(got[t * cols + c], rounded[ids[t] * cols + c]);
    EXPECT_EQ(flag.to_host()[0], 0);
    DevArray<int32_t> bad(std::vector<int32_t>{1, 50});
    ASSERT_TRUE(kernels::launch_embedding(bad.get(), 2, dtab.get(), dt, rows, cols, dout.get(),
                                          flag.get(), nullptr)
                    .ok());
    ASSERT_EQ(device_sync(), "");
    EXPECT_EQ(flag.to_host()[0], 1);
    EXPECT_EQ(dout.to_host()[cols], 0.f);  // the bad row is zeros, nothing read out of bounds
  }
}

TEST(OpsParity, KvAppendScattersAndRounds) {
  KVSPLIT_REQUIRE_DEVICE();
  const int num_blocks = 4, kvh = 2, bs = 16, hd = 64, tokens = 5;
  const std::vector<float> k = random_vec(size_t(tokens) * kvh * hd, 11),
                           v = random_vec(size_t(tokens) * kvh * hd, 12);
  const std::vector<int32_t> slots = {3 * 16 + 15, -1, 0, 2 * 16 + 5, 1 * 16 + 1};
  const kernels::PagedKvLayout layout{kvh, bs, hd};
  for (ElemType dt : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    const size_t elems = size_t(num_blocks) * layout.block_elems();
    std::vector<float> sentinel(elems, 7.f);
    DevArray<unsigned char> pages(encode(sentinel, dt));
    DevArray<float> dk(k), dv(v);
    DevArray<int32_t> dslots(slots);
    DevArray<int> flag(std::vector<int>{0});
    kernels::KvAppendParams p;
    p.pages = pages.get();
    p.dtype = dt;
    p.num_blocks = num_blocks;
    p.num_kv_heads = kvh;
    p.block_size = bs;
    p.head_dim = hd;
    p.k = dk.get();
    p.v = dv.get();
    p.slot_mapping = dslots.get();
    p.num_tokens = tokens;
    p.error_flag = flag.get();
    ASSERT_TRUE(kernels::launch_kv_append(p, nullptr).ok());
    ASSERT_EQ(device_sync(), "");
    std::vector<float> want = sentinel;
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int h = 0; h < kvh; ++h)
        for (int d = 0; d < hd; ++d) {
          want[layout.offset(slots[t] / bs, 0, h, slots[t] % bs) + d] = k[(t * kvh + h) * hd + d];
          want[layout.offset(slots[t] / bs, 1, h, slots[t] % bs) + d] = v[(t * kvh + h) * hd + d];
        }
    }
    const std::vector<float> want_rounded = decode(encode(want, dt), dt);
    const std::vector<float> got = decode(pages.to_host(), dt);
    ASSERT_EQ(got, want_rounded);  // bit-exact conversion and placement, nothing else touched
    EXPECT_EQ(flag.to_host()[0], 0);
    DevArray<int32_t> bad(std::vector<int32_t>{num_blocks * bs + 3});
    p.slot_mapping = bad.get();
    p.num_tokens = 1;
    ASSERT_TRUE(kernels::launch_kv_append(p, nullptr).ok());
    ASSERT_EQ(device_sync(), "");
    EXPECT_EQ(flag.to_host()[0], 1);
    EXPECT_EQ(decode(pages.to_host(), dt), want_rounded);
  }
}

TEST(OpsParity, ArgmaxLowestIndexOnTiesAndNaN) {
  KVSPLIT_REQUIRE_DEVICE();
  const int vocab = 1000;
  std::vector<float> logits = random_vec(size_t(4) * vocab, 13);
  logits[0 * vocab + 777] = 50.f;
  logits[1 * vocab + 900] = 60.f;
  logits[1 * vocab + 300] = 60.f;  // tie: lowest index wins
  logits[2 * vocab + 5] = std::numeric_limits<float>::quiet_NaN();
  logits[2 * vocab + 6] = 70.f;
  for (int i = 0; i < vocab; ++i) logits[3 * vocab + i] = -1.f;  // all equal -> 0
  DevArray<float> dl(logits);
  DevArray<int32_t> ids(4);
  ASSERT_TRUE(kernels::launch_argmax(dl.get(), 4, vocab, ids.get(), nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  EXPECT_EQ(ids.to_host(), (std::vector<int32_t>{777, 300, 6, 0}));
}

TEST(OpsParity, BadArgumentsAreStatusErrors) {
  EXPECT_EQ(
      kernels::launch_rmsnorm(nullptr, nullptr, 2, 8, 1e-5f, nullptr, nullptr, nullptr).code(),
      StatusCode::kInvalidArgument);
  kernels::RopeParams p;
  p.num_tokens = 1;
  float dummy[4] = {};
  int32_t pos = 0;
  p.q = p.k = dummy;
  p.positions = &pos;
  p.inv_freq = dummy;
  p.head_dim = 4;
  p.rotary_dim = 3;
  EXPECT_EQ(kernels::launch_rope(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.rotary_dim = 4;
  p.attention_factor = 0.0f;
  EXPECT_EQ(kernels::launch_rope(p, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::launch_argmax(dummy, 1, 0, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::testing
