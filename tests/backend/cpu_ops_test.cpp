// CpuBackend ops (memory, embedding, rmsnorm, add_rmsnorm, rope, swiglu, kv_append) against
// straightforward fp64 references on seeded random inputs, plus their bad-input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "kernels/common/paged_kv.h"

namespace kvsplit::backend {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

class CpuOps : public ::testing::TestWithParam<int> {  // param: threads
 protected:
  void SetUp() override { be_ = make_cpu_backend(GetParam()); }
  std::unique_ptr<Backend> be_;
};

TEST_P(CpuOps, IdentityAndMemory) {
  EXPECT_EQ(be_->kind(), DeviceKind::kCpu);
  EXPECT_EQ(be_->parallelism(), GetParam());
  EXPECT_NE(be_->name().find(std::to_string(GetParam()) + " thread"), std::string::npos)
      << be_->name();
  auto p = be_->alloc(1000);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 64, 0u);
  std::vector<uint8_t> src(1000), dst(1000, 0);
  std::iota(src.begin(), src.end(), 0);
  ASSERT_TRUE(be_->copy_h2d(*p, src.data(), 1000).ok());
  ASSERT_TRUE(be_->copy_d2h(dst.data(), *p, 1000).ok());
  EXPECT_EQ(src, dst);
  ASSERT_TRUE(be_->memset_zero(*p, 500).ok());
  ASSERT_TRUE(be_->copy_d2h(dst.data(), *p, 1000).ok());
  EXPECT_EQ(dst[499], 0);
  EXPECT_EQ(dst[500], src[500]);
  EXPECT_EQ(be_->copy_d2d(nullptr, *p, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(be_->synchronize().ok());
  be_->free(*p);
}

TEST_P(CpuOps, HostMemoryIsAlignedAndTheAsyncCopiesCompleteBySynchronize) {
  EXPECT_FALSE(be_->host_memory_pinned());
  auto h = be_->alloc_host(10000);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*h) % 4096, 0u);
  auto d = be_->alloc(10000);
  ASSERT_TRUE(d.ok());
  auto* host = static_cast<uint8_t*>(*h);
  std::iota(host, host + 10000, 0);
  ASSERT_TRUE(be_->copy_h2d_async(*d, host, 10000).ok());
  ASSERT_TRUE(be_->synchronize().ok());
  std::fill(host, host + 10000, 0);
  ASSERT_TRUE(be_->copy_d2h_async(host, *d, 10000).ok());
  ASSERT_TRUE(be_->synchronize().ok());
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(host[i], static_cast<uint8_t>(i)) << i;
  // A batch: three ranges each way, the host side reordered.
  std::vector<uint8_t> back(10000, 0);
  const Backend::CopyRange out[] = {{back.data() + 6000, host + 6000, 4000},
                                    {back.data(), host, 1000},
                                    {back.data() + 1000, host + 1000, 5000}};
  ASSERT_TRUE(be_->copy_batch_async(Backend::CopyDir::kHostToDevice, out, 3).ok());
  std::fill(host, host + 10000, 0);
  const Backend::CopyRange in[] = {{host, back.data(), 10000}};
  ASSERT_TRUE(be_->copy_batch_async(Backend::CopyDir::kDeviceToHost, in, 1).ok());
  ASSERT_TRUE(be_->synchronize().ok());
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(host[i], static_cast<uint8_t>(i)) << i;
  EXPECT_EQ(be_->alloc_host(SIZE_MAX - 100).status().code(), StatusCode::kResourceExhausted);
  be_->free(*d);
  be_->free_host(*h);
}

TEST_P(CpuOps, LargeCopyBatchesStreamTheirStoresAndStayExact) {
  // Over the streaming threshold (8 MiB in all), with unaligned ends and odd sizes.
  const size_t n = (size_t{12} << 20) + 777;
  std::vector<uint8_t> src(n), dst(n + 64, 0xee);
  std::mt19937 rng(3);
  for (auto& x : src) x = static_cast<uint8_t>(rng());
  const size_t cut1 = (size_t{5} << 20) + 13, cut2 = (size_t{9} << 20) + 1;
  const Backend::CopyRange copies[] = {{dst.data() + 3, src.data(), cut1},
                                       {dst.data() + 3 + cut1, src.data() + cut1, cut2 - cut1},
                                       {dst.data() + 3 + cut2, src.data() + cut2, n - cut2}};
  ASSERT_TRUE(be_->copy_batch_async(Backend::CopyDir::kDeviceToHost, copies, 3).ok());
  ASSERT_TRUE(be_->synchronize().ok());
  EXPECT_EQ(dst[0], 0xee);
  EXPECT_EQ(dst[2], 0xee);
  EXPECT_EQ(std::memcmp(dst.data() + 3, src.data(), n), 0);
  EXPECT_EQ(dst[n + 3], 0xee);
  const Backend::CopyRange bad[] = {{nullptr, src.data(), 8}};
  EXPECT_EQ(be_->copy_batch_async(Backend::CopyDir::kHostToDevice, bad, 1).code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CpuOps, EmbeddingPackedPlainAndBf16) {
  const int rows = 53, dim = 37;
  auto table = random_vec(rows * dim, 1);
  auto up = be_->upload_matrix(table.data(), DType::kF32, rows, dim);
  ASSERT_TRUE(up.ok());
  const std::vector<int32_t> ids = {0, 52, 7, 7, 31};
  std::vector<float> a(ids.size() * dim), b(ids.size() * dim);
  ASSERT_TRUE(be_->embedding(ids.data(), ids.size(), *up, a.data()).ok());
  ASSERT_TRUE(be_->embedding(ids.data(), ids.size(),
                             MatrixView{table.data(), DType::kF32, rows, dim}, b.data())
                  .ok());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int c = 0; c < dim; ++c) {
      ASSERT_EQ(a[t * dim + c], table[ids[t] * dim + c]);
      ASSERT_EQ(b[t * dim + c], table[ids[t] * dim + c]);
    }
  std::vector<uint16_t> bf(rows * dim);
  for (int i = 0; i < rows * dim; ++i)
    bf[i] = static_cast<uint16_t>(0x3f80 + i % 128);  // 1 + i/128
  ASSERT_TRUE(be_->embedding(ids.data(), ids.size(), MatrixView{bf.data(), DType::kBF16, rows, dim},
                             b.data())
                  .ok());
  EXPECT_EQ(b[1 * dim + 3], 1.0f + ((52 * dim + 3) % 128) / 128.0f);
  auto up_bf = be_->upload_matrix(bf.data(), DType::kBF16, rows, dim);  // packed, kept 16-bit
  ASSERT_TRUE(up_bf.ok());
  ASSERT_TRUE(be_->embedding(ids.data(), ids.size(), *up_bf, a.data()).ok());
  EXPECT_EQ(a, b);

  for (int32_t bad : {-1, rows, 1 << 30}) {
    const std::vector<int32_t> bad_ids = {1, bad};
    Status st = be_->embedding(bad_ids.data(), 2, *up, a.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.message();
  }
}

double rms_scale(const float* x, int dim, float eps) {
  double ss = 0;
  for (int j = 0; j < dim; ++j) ss += double(x[j]) * x[j];
  return 1.0 / std::sqrt(ss / dim + eps);
}

TEST_P(CpuOps, RmsnormAndAddRmsnorm) {
  for (int dim : {1, 7, 64, 771}) {
    for (int tokens : {1, 5, 64}) {
      auto x = random_vec(tokens * dim, dim + tokens);
      auto w = random_vec(dim, 99);
      auto res = random_vec(tokens * dim, 7 * dim + tokens);
      std::vector<float> out(tokens * dim), res2 = res;
      ASSERT_TRUE(be_->rmsnorm(x.data(), w.data(), tokens, dim, 1e-5f, out.data()).ok());
      for (int t = 0; t < tokens; ++t) {
        const double s = rms_scale(&x[t * dim], dim, 1e-5f);
        for (int j = 0; j < dim; ++j)
          ASSERT_NEAR(out[t * dim + j], w[j] * x[t * dim + j] * s,
                      1e-5 * (1 + std::abs(w[j] * x[t * dim + j] * s)));
      }
      ASSERT_TRUE(
          be_->add_rmsnorm(res2.data(), x.data(), w.data(), tokens, dim, 1e-6f, out.data()).ok());
      for (int t = 0; t < tokens; ++t) {
        std::vector<float> sum(dim);
        for (int j = 0; j < dim; ++j) {
          sum[j] = res[t * dim + j] + x[t * dim + j];
          ASSERT_EQ(res2[t * dim + j], sum[j]);
        }
        const double s = rms_scale(sum.data(), dim, 1e-6f);
        for (int j = 0; j < dim; ++j)
          ASSERT_NEAR(out[t * dim + j], w[j] * sum[j] * s,
                      1e-5 * (1 + std::abs(w[j] * sum[j] * s)));
      }
    }
  }
  std::vector<float> v(4);
  EXPECT_EQ(be_->rmsnorm(v.data(), v.data(), 1, 0, 1e-5f, v.data()).code(),
            StatusCode::kInvalidArgument);
}

// fp64 rope reference on one head; cos and sin scaled by the attention factor (HF YaRN).
void rope_ref(std::vector<double>& x, bool interleaved, int rotary_dim, int pos,
              const float* inv_freq, double attention_factor) {
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + rotary_dim / 2;
    const double ang = double(float(pos) * inv_freq[i]);
    const double c = std::cos(ang) * attention_factor, s = std::sin(ang) * attention_factor;
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

TEST_P(CpuOps, RopeBothStylesVsReference) {
  struct Case {
    RopeStyle style;
    int head_dim, rotary_dim, heads, kv_heads, tokens;
    float attention_factor;
  };
  const Case cases[] = {{RopeStyle::kInterleaved, 8, 8, 8, 4, 5, 1.0f},
                        {RopeStyle::kHalf, 8, 8, 8, 4, 5, 1.0f},
                        {RopeStyle::kHalf, 64, 32, 3, 1, 9, 1.0f},  // partial rotary
                        {RopeStyle::kInterleaved, 128, 128, 4, 2, 17, 1.0f},
                        {RopeStyle::kHalf, 16, 16, 4, 2, 7, 1.1386294f}};  // YaRN factor 4
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "style=" << int(c.style) << " head_dim=" << c.head_dim
                                      << " attention_factor=" << c.attention_factor);
    std::vector<float> inv_freq(c.rotary_dim / 2);
    for (int i = 0; i < c.rotary_dim / 2; ++i)
      inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / c.rotary_dim);
    std::vector<int32_t> pos(c.tokens);
    for (int t = 0; t < c.tokens; ++t) pos[t] = (t * 37 + 3) % 500;  // not monotone
    auto q = random_vec(c.tokens * c.heads * c.head_dim, 5);
    auto k = random_vec(c.tokens * c.kv_heads * c.head_dim, 6);
    auto q2 = q, k2 = k;
    RopeArgs args{c.style, c.head_dim, c.rotary_dim, inv_freq.data(), c.attention_factor};
    ASSERT_TRUE(
        be_->rope(q2.data(), k2.data(), pos.data(), c.tokens, c.heads, c.kv_heads, args).ok());
    auto check = [&](const std::vector<float>& in, const std::vector<float>& got, int heads) {
      for (int t = 0; t < c.tokens; ++t)
        for (int h = 0; h < heads; ++h) {
          const size_t base = (size_t(t) * heads + h) * c.head_dim;
          std::vector<double> ref(in.begin() + base, in.begin() + base + c.head_dim);
          rope_ref(ref, c.style == RopeStyle::kInterleaved, c.rotary_dim, pos[t], inv_freq.data(),
                   c.attention_factor);
          for (int d = 0; d < c.head_dim; ++d)
            ASSERT_NEAR(got[base + d], ref[d], 1e-5) << t << " " << h << " " << d;
        }
    };
    check(q, q2, c.heads);
    check(k, k2, c.kv_heads);
  }
  std::vector<float> inv(4, 1.f), q(8);
  int32_t p = 0;
  EXPECT_EQ(be_->rope(q.data(), q.data(), &p, 1, 1, 1, RopeArgs{RopeStyle::kHalf, 8, 7, inv.data()})
                .code(),
            StatusCode::kInvalidArgument);
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    EXPECT_EQ(be_->rope(q.data(), q.data(), &p, 1, 1, 1,
                        RopeArgs{RopeStyle::kHalf, 8, 8, inv.data(), bad})
                  .code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST_P(CpuOps, Swiglu) {
  const int64_t n = 100003;
  auto g = random_vec(n, 8, -20.f, 20.f);
  auto u = random_vec(n, 9);
  std::vector<float> out(n);
  ASSERT_TRUE(be_->swiglu(g.data(), u.data(), n, out.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    ASSERT_NEAR(out[i], ref, 1e-6 * (1 + std::abs(ref))) << i;
  }
}

TEST_P(CpuOps, KvAppendShuffledBlocks) {
  const int num_blocks = 7, kv_heads = 3, block_size = 4, head_dim = 5, tokens = 13;
  const kernels::PagedKvLayout layout{kv_heads, block_size, head_dim};
  std::vector<float> pages(num_blocks * layout.block_elems(), -7.f);
  LayerKv kv{pages.data(), DType::kF32, num_blocks, kv_heads, block_size, head_dim};
  std::vector<int32_t> table = {5, 2, 6, 0};  // shuffled physical blocks of one sequence
  std::vector<int32_t> slots(tokens);
  for (int t = 0; t < tokens; ++t)
    slots[t] = static_cast<int32_t>(kernels::slot_of(table.data(), block_size, t));
  slots[4] = -1;  // padding token: skipped
  auto k = random_vec(tokens * kv_heads * head_dim, 10);
  auto v = random_vec(tokens * kv_heads * head_dim, 11);
  ASSERT_TRUE(be_->kv_append(kv, k.data(), v.data(), slots.data(), tokens).ok());
  size_t written = 0;
  for (int t = 0; t < tokens; ++t) {
    const int32_t block = table[t / block_size];
    for (int h = 0; h < kv_heads; ++h)
      for (int d = 0; d < head_dim; ++d) {
        const float gk = pages[layout.offset(block, 0, h, t % block_size) + d];
        const float gv = pages[layout.offset(block, 1, h, t % block_size) + d];
        if (t == 4) {
          EXPECT_EQ(gk, -7.f);
          EXPECT_EQ(gv, -7.f);
        } else {
          EXPECT_EQ(gk, k[(t * kv_heads + h) * head_dim + d]);
          EXPECT_EQ(gv, v[(t * kv_heads + h) * head_dim + d]);
          written += 2;
        }
      }
  }
  // Nothing else was touched.
  EXPECT_EQ(std::count(pages.begin(), pages.end(), -7.f),
            static_cast<long>(pages.size() - written));

  int32_t bad_slot = num_blocks * block_size;
  EXPECT_EQ(be_->kv_append(kv, k.data(), v.data(), &bad_slot, 1).code(),
            StatusCode::kInvalidArgument);
  LayerKv half = kv;
  half.dtype = DType::kF16;
  EXPECT_EQ(be_->kv_append(half, k.data(), v.data(), slots.data(), 1).code(),
            StatusCode::kUnimplemented);
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuOps, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace kvsplit::backend

namespace kvsplit::testing {
namespace {

// The default time marks (host clock; the CPU backend's calls finish their work before
// returning): the span between two marks covers what ran between them, handles are checked, and
// release_time_marks forgets them.
TEST(CpuBackend, TimeMarksSpanTheWorkBetweenThem) {
  auto be = backend::make_cpu_backend(1);
  auto a = be->mark_time();
  ASSERT_TRUE(a.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  auto b = be->mark_time();
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
  auto t = be->seconds_between(*a, *b);
  ASSERT_TRUE(t.ok());
  EXPECT_GE(*t, 0.003);
  auto back = be->seconds_between(*b, *a);
  ASSERT_TRUE(back.ok());
  EXPECT_LE(*back, -0.003);
  EXPECT_EQ(be->seconds_between(*a, *b + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(be->seconds_between(-1, *b).status().code(), StatusCode::kInvalidArgument);
  be->release_time_marks();
  EXPECT_EQ(be->seconds_between(*a, *b).status().code(), StatusCode::kInvalidArgument);
  auto c = be->mark_time();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 0);  // handles start again
}

}  // namespace
}  // namespace kvsplit::testing
