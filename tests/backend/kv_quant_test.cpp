// Quantized KV pages: the math of kernels/common/kv_quant.h (error bounds, parameter rounding,
// edge cases) and the CPU backend's quantize_kv_page / dequantize_kv_page / summarize_kv_page.
#include "kernels/common/kv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace kvsplit::backend {
namespace {

using kernels::KvPrecision;
using kernels::QuantPageLayout;

float half(uint16_t h) { return kernels::kvq_half_float(h); }
const uint16_t* f16_at(const std::vector<uint8_t>& page, int64_t offset) {
  return reinterpret_cast<const uint16_t*>(page.data() + offset);
}

// f32 page [2, num_kv_heads, block_size, head_dim]; `mode` picks the value distribution.
std::vector<float> random_page(const QuantPageLayout& l, uint32_t seed, int mode) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> page(static_cast<size_t>(2 * l.values_per_kv()));
  const float mag[] = {1.f, 1e-3f, 300.f, 1.f};
  for (size_t i = 0; i < page.size(); ++i) {
    float x = mode == 0 ? gauss(rng) : uni(rng) * mag[mode];
    if (mode == 3 && i % static_cast<size_t>(l.head_dim) == 5) x *= 40.f;  // an outlier channel
    if (mode == 3) x += 7.f;                                               // offset: asymmetric
    page[i] = x;
  }
  return page;
}

class KvQuant : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);

  std::vector<uint8_t> quantize(const std::vector<float>& src, const QuantPageLayout& l,
                                KvPrecision p) {
    std::vector<uint8_t> q(static_cast<size_t>(l.bytes(p)));
    const Status st = cpu_->quantize_kv_page(src.data(), DType::kF32, l, p, q.data());
    EXPECT_TRUE(st.ok()) << st.to_string();
    return q;
  }
  std::vector<float> dequantize(const std::vector<uint8_t>& q, const QuantPageLayout& l,
                                KvPrecision p) {
    std::vector<float> out(static_cast<size_t>(2 * l.values_per_kv()),
                           std::numeric_limits<float>::quiet_NaN());
    const Status st = cpu_->dequantize_kv_page(q.data(), p, l, out.data(), DType::kF32);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
};

TEST_F(KvQuant, BytesAndSectionOffsetsOfKnownShapes) {
  const QuantPageLayout l{8, 16, 128};
  EXPECT_EQ(l.bytes(KvPrecision::kInt8), 2 * 8 * 16 * 128 + 2 * 2 * 8 * 16);  // 33280
  EXPECT_EQ(l.int8_scales_offset(), 32768);
  EXPECT_EQ(l.bytes(KvPrecision::kInt4), 16384 + 2048 + 2048 + 256 + 256);
  EXPECT_EQ(l.int4_k_scale_offset(), 16384);
  EXPECT_EQ(l.int4_k_zero_offset(), 16384 + 2048);
  EXPECT_EQ(l.int4_v_scale_offset(), 16384 + 4096);
  EXPECT_EQ(l.int4_v_zero_offset(), 16384 + 4096 + 256);
  EXPECT_EQ(l.bytes(KvPrecision::kEvicted), 0);
  EXPECT_EQ(l.bytes(KvPrecision::kFull), -1);
  // Tiny shape: every section padded to 16 bytes.
  const QuantPageLayout t{1, 1, 2};
  EXPECT_EQ(t.bytes(KvPrecision::kInt8), 32);
  EXPECT_EQ(t.bytes(KvPrecision::kInt4), 80);
  EXPECT_EQ(t.int4_v_zero_offset() % 16, 0);
}

TEST_F(KvQuant, HalfRoundingDirections) {
  for (float x : {0.1f, -0.1f, 1.0f, 3.14159f, -65504.f, 65504.f, 1e-7f, -1e-7f, 1e-30f, 0.f}) {
    const float up = half(kernels::kvq_half_at_least(x));
    const float down = half(kernels::kvq_half_at_most(x));
    EXPECT_GE(up, x) << x;
    EXPECT_LE(down, x) << x;
    EXPECT_LE(up - down, std::max(std::abs(x) * 0x1p-10f, 0x1p-24f)) << x;  // one f16 step
  }
}

// Every element within scale / 2 of its dequantized value (int8), with tight scales.
TEST_F(KvQuant, Int8RoundTripWithinHalfAScale) {
  int checked = 0;
  for (int seed = 0; seed < 48; ++seed) {
    const int head_dims[] = {8, 32, 64, 128};
    const QuantPageLayout l{1 + seed % 3, seed % 2 ? 32 : 16, head_dims[seed / 2 % 4]};
    const std::vector<float> src = random_page(l, 100 + seed, seed % 4);
    const std::vector<uint8_t> q = quantize(src, l, KvPrecision::kInt8);
    const std::vector<float> back = dequantize(q, l, KvPrecision::kInt8);
    const uint16_t* scales = f16_at(q, l.int8_scales_offset());
    for (int64_t t = 0; t < 2 * int64_t{l.num_kv_heads} * l.block_size; ++t) {
      const float scale = half(scales[t]);
      float amax = 0.f;
      for (int d = 0; d < l.head_dim; ++d) amax = std::max(amax, std::abs(src[t * l.head_dim + d]));
      ASSERT_GE(scale * 127.f, amax) << "the scale must cover the group";
      ASSERT_LE(scale, amax / 127.f * (1.f + 0x1p-9f) + 0x1p-24f) << "scale not tight";
      for (int d = 0; d < l.head_dim; ++d) {
        const int64_t i = t * l.head_dim + d;
        ASSERT_LE(std::abs(src[i] - back[i]), 0.5f * scale * (1.f + 0x1p-20f))
            << "seed " << seed << " elem " << i << " x " << src[i] << " scale " << scale;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

// int4 KIVI: keys per channel, values per token, every element within scale / 2.
TEST_F(KvQuant, Int4RoundTripWithinHalfAScale) {
  int checked = 0;
  for (int seed = 0; seed < 48; ++seed) {
    const int head_dims[] = {8, 32, 64, 128};
    const QuantPageLayout l{1 + seed % 3, seed % 2 ? 32 : 16, head_dims[seed / 2 % 4]};
    const std::vector<float> src = random_page(l, 900 + seed, seed % 4);
    const std::vector<uint8_t> q = quantize(src, l, KvPrecision::kInt4);
    const std::vector<float> back = dequantize(q, l, KvPrecision::kInt4);
    const int hd = l.head_dim, bs = l.block_size;
    for (int sel = 0; sel < 2; ++sel) {
      for (int h = 0; h < l.num_kv_heads; ++h) {
        for (int slot = 0; slot < bs; ++slot) {
          for (int d = 0; d < hd; ++d) {
            const int64_t i = l.token_index(sel, h, slot) * hd + d;
            const int64_t pi = sel == 0 ? int64_t{h} * hd + d : int64_t{h} * bs + slot;
            const float scale =
                half(f16_at(q, sel == 0 ? l.int4_k_scale_offset() : l.int4_v_scale_offset())[pi]);
            const float zero =
                half(f16_at(q, sel == 0 ? l.int4_k_zero_offset() : l.int4_v_zero_offset())[pi]);
            ASSERT_LE(zero, src[i]) << "zero point above a value";
            ASSERT_GE(std::fma(scale, 15.f, zero), src[i]) << "range does not cover a value";
            const float tol =
                0.5f * scale * (1.f + 0x1p-20f) + 0x1p-22f * (std::abs(src[i]) + std::abs(zero));
            ASSERT_LE(std::abs(src[i] - back[i]), tol)
                << "seed " << seed << (sel ? " V" : " K") << " elem " << i << " scale " << scale;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST_F(KvQuant, KeysAreGroupedPerChannelAndValuesPerToken) {
  // A key channel with a huge range must not spoil the other channels (per-channel groups), and a
  // value token with a huge range must not spoil the other tokens (per-token groups).
  const QuantPageLayout l{1, 16, 8};
  std::vector<float> src = random_page(l, 5, 1);                                  // ~1e-3
  for (int slot = 0; slot < 16; ++slot) src[slot * 8 + 3] = 1000.f * (slot - 8);  // K channel 3
  for (int d = 0; d < 8; ++d) src[l.token_index(1, 0, 4) * 8 + d] = 500.f * d;    // V token 4
  const std::vector<float> back =
      dequantize(quantize(src, l, KvPrecision::kInt4), l, KvPrecision::kInt4);
  for (int slot = 0; slot < 16; ++slot) {
    for (int d = 0; d < 8; ++d) {
      const int64_t k = slot * 8 + d, v = l.token_index(1, 0, slot) * 8 + d;
      if (d != 3) {
        EXPECT_NEAR(back[k], src[k], 2e-4) << "K slot " << slot << " d " << d;
      }
      if (slot != 4) {
        EXPECT_NEAR(back[v], src[v], 2e-4) << "V slot " << slot << " d " << d;
      }
    }
  }
}

TEST_F(KvQuant, ZeroConstantDenormalAndLargeGroups) {
  const QuantPageLayout l{1, 16, 8};
  for (KvPrecision p : {KvPrecision::kInt8, KvPrecision::kInt4}) {
    SCOPED_TRACE(p == KvPrecision::kInt8 ? "int8" : "int4");
    // All zero: exact. Constant: exact for int4 when f16-representable (the zero point is the
    // value), within half an int8 step otherwise.
    for (float c : {0.f, 0.75f, -3.5f}) {
      const std::vector<float> src(32 * 8, c);
      const std::vector<float> back = dequantize(quantize(src, l, p), l, p);
      const float tol = p == KvPrecision::kInt4 ? 0.f : std::abs(c) / 254.f * (1.f + 0x1p-9f);
      for (float x : back) ASSERT_LE(std::abs(x - c), tol) << c;
    }
    // Denormal f32 inputs: error below the smallest nonzero scale's half step (2^-25).
    std::vector<float> src = random_page(l, 11, 1);
    for (float& x : src) x *= 1e-36f;
    std::vector<float> back = dequantize(quantize(src, l, p), l, p);
    for (size_t i = 0; i < src.size(); ++i) ASSERT_LE(std::abs(back[i] - src[i]), 0x1p-25f);
    // Values beyond the f16 parameter range saturate: finite, same sign, never inf/NaN.
    src = random_page(l, 12, 0);
    for (float& x : src) x *= 1e9f;
    src[3] = std::numeric_limits<float>::infinity();
    src[4] = -std::numeric_limits<float>::infinity();
    back = dequantize(quantize(src, l, p), l, p);
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_TRUE(std::isfinite(back[i])) << i;
      if (std::abs(src[i]) > 1e12f) {
        ASSERT_EQ(std::signbit(back[i]), std::signbit(src[i])) << i;
      }
    }
  }
  // Within the documented int8 bound (|x| <= 127 * 65504) large values keep the error bound.
  std::vector<float> src(32 * 8);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 8.0e6f * std::sin(0.37f * i);
  const std::vector<uint8_t> q = quantize(src, l, KvPrecision::kInt8);
  const std::vector<float> back = dequantize(q, l, KvPrecision::kInt8);
  for (size_t i = 0; i < src.size(); ++i) {
    const float scale = half(f16_at(q, l.int8_scales_offset())[i / 8]);
    ASSERT_TRUE(std::isfinite(scale));
    ASSERT_LE(std::abs(back[i] - src[i]), 0.5f * scale * (1.f + 0x1p-20f)) << i;
  }
}

// A NaN poisons its whole group (and only it): the int8 token, the int4 key channel, the int4
// value token.
TEST_F(KvQuant, NanPropagatesToItsGroupOnly) {
  const QuantPageLayout l{2, 16, 8};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> src = random_page(l, 21, 0);
  const int64_t k_tok = l.token_index(0, 1, 5), v_tok = l.token_index(1, 0, 9);
  src[k_tok * 8 + 2] = nan;  // K head 1, slot 5, channel 2
  src[v_tok * 8 + 6] = nan;  // V head 0, slot 9, channel 6
  const std::vector<float> b8 =
      dequantize(quantize(src, l, KvPrecision::kInt8), l, KvPrecision::kInt8);
  const std::vector<float> b4 =
      dequantize(quantize(src, l, KvPrecision::kInt4), l, KvPrecision::kInt4);
  for (int64_t t = 0; t < 2 * 2 * 16; ++t) {
    for (int d = 0; d < 8; ++d) {
      const int64_t i = t * 8 + d;
      const bool int8_poisoned = t == k_tok || t == v_tok;
      EXPECT_EQ(std::isnan(b8[i]), int8_poisoned) << "int8 token " << t << " d " << d;
      const bool k_channel = t >= l.token_index(0, 1, 0) && t < l.token_index(0, 1, 16) && d == 2;
      const bool int4_poisoned = k_channel || t == v_tok;
      EXPECT_EQ(std::isnan(b4[i]), int4_poisoned) << "int4 token " << t << " d " << d;
    }
  }
}

// Each part of a summary bounds the keys of its slots, tightly (kv_quant.h "key summaries").
TEST_F(KvQuant, SummaryBoundsEveryKeyOfItsPartTightly) {
  for (int seed = 0; seed < 16; ++seed) {
    const int parts = 1 << (seed % 5);  // 1, 2, 4, 8, 16 (one slot per part)
    const QuantPageLayout l{1 + seed % 3, 16, seed % 2 ? 64 : 8, parts};
    const std::vector<float> src = random_page(l, 300 + seed, seed % 4);
    std::vector<kernels::KvSummaryElem> sum(static_cast<size_t>(l.summary_elems()) + 1, 0xbeef);
    ASSERT_TRUE(cpu_->summarize_kv_page(src.data(), DType::kF32, l, sum.data()).ok());
    ASSERT_EQ(sum.back(), 0xbeef) << "wrote past summary_elems()";
    const int part_slots = l.block_size / parts;
    for (int part = 0; part < parts; ++part) {
      const kernels::KvSummaryElem* ps =
          sum.data() + int64_t{part} * 2 * l.num_kv_heads * l.head_dim;
      for (int h = 0; h < l.num_kv_heads; ++h) {
        for (int d = 0; d < l.head_dim; ++d) {
          const uint16_t mn_bits = ps[h * l.head_dim + d];
          const uint16_t mx_bits = ps[(l.num_kv_heads + h) * l.head_dim + d];
          const float mn = kernels::kvq_half_float(mn_bits), mx = kernels::kvq_half_float(mx_bits);
          float kmin = INFINITY, kmax = -INFINITY;
          for (int slot = part * part_slots; slot < (part + 1) * part_slots; ++slot) {
            const float k = src[l.token_index(0, h, slot) * l.head_dim + d];
            ASSERT_LE(mn, k) << "parts " << parts << " part " << part;
            ASSERT_GE(mx, k) << "parts " << parts << " part " << part;
            kmin = std::min(kmin, k);
            kmax = std::max(kmax, k);
          }
          // Tight: the f16 next to each bound, inwards, is past the part's own min / max.
          EXPECT_GT(kernels::kvq_half_float(kernels::kvq_half_next_up(mn_bits)), kmin);
          EXPECT_LT(kernels::kvq_half_float(kernels::kvq_half_next_down(mx_bits)), kmax);
        }
      }
    }
  }
}

// f16 bounds outside the f16 range: still bounds (inf, or the largest finite f16 inwards).
TEST(KvSummaryBits, RoundOutwardsAndStayBoundsBeyondTheF16Range) {
  using kernels::kvq_half_float;
  using kernels::kvq_summary_max_bits;
  using kernels::kvq_summary_min_bits;
  for (float x : {0.f, -0.f, 1.f, 0.1f, -0.1f, 1e-7f, -1e-7f, 65504.f, -65504.f, 3.14159f}) {
    EXPECT_LE(kvq_half_float(kvq_summary_min_bits(x)), x) << x;
    EXPECT_GE(kvq_half_float(kvq_summary_max_bits(x)), x) << x;
  }
  EXPECT_EQ(kvq_half_float(kvq_summary_min_bits(1e6f)), 65504.f);
  EXPECT_EQ(kvq_half_float(kvq_summary_max_bits(1e6f)), INFINITY);
  EXPECT_EQ(kvq_half_float(kvq_summary_min_bits(-1e6f)), -INFINITY);
  EXPECT_EQ(kvq_half_float(kvq_summary_max_bits(-1e6f)), -65504.f);
  EXPECT_EQ(kvq_half_float(kvq_summary_min_bits(INFINITY)), INFINITY);  // an all-NaN page's start
  EXPECT_EQ(kvq_half_float(kvq_summary_max_bits(-INFINITY)), -INFINITY);
  EXPECT_TRUE(std::isnan(kvq_half_float(kvq_summary_min_bits(NAN))));
}

TEST_F(KvQuant, OpsRejectBadArguments) {
  const QuantPageLayout l{1, 16, 8};
  std::vector<float> src(256, 1.f);
  std::vector<uint8_t> q(static_cast<size_t>(l.bytes(KvPrecision::kInt8)));
  std::vector<kernels::KvSummaryElem> sum(16);
  EXPECT_EQ(
      cpu_->quantize_kv_page(src.data(), DType::kBF16, l, KvPrecision::kInt8, q.data()).code(),
      StatusCode::kUnimplemented);
  EXPECT_EQ(
      cpu_->dequantize_kv_page(q.data(), KvPrecision::kInt8, l, src.data(), DType::kF16).code(),
      StatusCode::kUnimplemented);
  EXPECT_EQ(cpu_->summarize_kv_page(src.data(), DType::kF16, l, sum.data()).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(cpu_->quantize_kv_page(src.data(), DType::kF32, l, KvPrecision::kFull, q.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      cpu_->quantize_kv_page(src.data(), DType::kF32, l, KvPrecision::kEvicted, q.data()).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu_->quantize_kv_page(src.data(), DType::kF32, QuantPageLayout{1, 16, 7},
                                   KvPrecision::kInt4, q.data())
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu_->quantize_kv_page(nullptr, DType::kF32, l, KvPrecision::kInt8, q.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu_->dequantize_kv_page(q.data(), KvPrecision::kInt8, l, nullptr, DType::kF32).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu_->summarize_kv_page(src.data(), DType::kF32, QuantPageLayout{0, 16, 8}, sum.data())
                .code(),
            StatusCode::kInvalidArgument);
  // summary_parts must be >= 1 and divide block_size.
  for (int parts : {0, -1, 3, 32}) {
    EXPECT_EQ(cpu_->summarize_kv_page(src.data(), DType::kF32, QuantPageLayout{1, 16, 8, parts},
                                      sum.data())
                  .code(),
              StatusCode::kInvalidArgument)
        << parts;
  }
}

}  // namespace
}  // namespace kvsplit::backend
