// Quantized-KV page kernels (quantize / dequantize / summarize one page) against the CPU backend,
// bit for bit: the same group functions of kernels/common/kv_quant.h run on the same f32 values
// (f16 / bf16 pages are widened exactly). Same source for the emulated kernels (tests/kernels) and
// the real ones (tests/gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kv_quant_ops.h"
#include "kernel_test_util.h"
#include "kernels/kv_pages/kv_page_ops.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::testing {
namespace {

using kernels::ElemType;
using kernels::KvPrecision;
using kernels::QuantPageLayout;

struct PageShape {
  int num_kv_heads, block_size, head_dim;
};

// One full page of random values in [-range, range], rounded to `dtype`, with the groups' corner
// cases: an all-zero token row, a NaN (poisons its int8 row, its int4 key channel and value row),
// a huge value (saturates the f16 parameters), denormals, and a constant key channel.
std::vector<float> make_page(const QuantPageLayout& l, ElemType dtype, oracle::Rng& rng,
                             double range, bool specials) {
  std::vector<float> page(static_cast<size_t>(2 * l.values_per_kv()));
  for (float& x : page) x = static_cast<float>(rng.uniform(-range, range));
  if (specials && l.block_size >= 4) {
    const int hd = l.head_dim;
    for (int d = 0; d < hd; ++d) page[l.token_index(0, 0, 1) * hd + d] = 0.f;  // zero K row
    page[l.token_index(1, 0, 2) * hd + 1] = std::numeric_limits<float>::quiet_NaN();
    page[l.token_index(0, l.num_kv_heads - 1, 3) * hd + hd - 1] =
        std::numeric_limits<float>::quiet_NaN();
    page[l.token_index(1, l.num_kv_heads - 1, 0) * hd] = 3.0e5f;  // beyond f16
    page[l.token_index(0, 0, 0) * hd + 2] = 1e-41f;               // f32 denormal
    for (int slot = 0; slot < l.block_size; ++slot)
      page[l.token_index(0, 0, slot) * hd + 3] = 0.75f;  // constant key channel: scale 0
  }
  return decode(encode(page, dtype), dtype);
}

std::string bytes_diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i])
      return "byte " + std::to_string(i) + ": got " + std::to_string(got[i]) + " want " +
             std::to_string(want[i]);
  return "";
}

class KvPageParity : public ::testing::TestWithParam<ElemType> {};

TEST_P(KvPageParity, QuantizeDequantizeSummarizeMatchTheCpuBackendBitForBit) {
  KVSPLIT_REQUIRE_DEVICE();
  const ElemType dtype = GetParam();
  const PageShape shapes[] = {{4, 16, 8}, {2, 16, 64}, {1, 16, 128}, {3, 8, 32}, {2, 5, 6}};
  oracle::Rng rng(77 + static_cast<int>(dtype));
  int compared = 0;
  for (const PageShape& sh : shapes) {
    for (int variant = 0; variant < 3; ++variant) {
      // Summaries in 1 part, and in the block size's next divisors (5: 1 and 5 parts).
      std::vector<int> divisors;
      for (int d = 1; d <= sh.block_size; ++d)
        if (sh.block_size % d == 0) divisors.push_back(d);
      const int parts = divisors[static_cast<size_t>(variant) % divisors.size()];
      const QuantPageLayout l{sh.num_kv_heads, sh.block_size, sh.head_dim, parts};
      const double range = variant == 2 ? 60000.0 : (variant == 1 ? 1e-3 : 4.0);
      const std::vector<float> page = make_page(l, dtype, rng, range, variant == 0);
      const std::string what = "kv heads " + std::to_string(sh.num_kv_heads) + " block " +
                               std::to_string(sh.block_size) + " head_dim " +
                               std::to_string(sh.head_dim) + " variant " + std::to_string(variant) +
                               " summary parts " + std::to_string(parts);
      DevArray<unsigned char> src(encode(page, dtype));
      // Summary.
      std::vector<kernels::KvSummaryElem> want_sum(static_cast<size_t>(l.summary_elems()));
      ASSERT_TRUE(
          backend::cpu_summarize_kv_page(page.data(), ElemType::kF32, l, want_sum.data()).ok());
      DevArray<kernels::KvSummaryElem> sum(
          std::vector<kernels::KvSummaryElem>(want_sum.size(), 0x1234));
      ASSERT_TRUE(kernels::launch_summarize_kv_page(src.get(), dtype, l, sum.get(), nullptr).ok());
      ASSERT_EQ(device_sync(), "");
      const std::vector<kernels::KvSummaryElem> got_sum = sum.to_host();
      ASSERT_EQ(got_sum, want_sum) << what;  // f16 bits, rounded outwards alike
      for (KvPrecision p : {KvPrecision::kInt8, KvPrecision::kInt4}) {
        SCOPED_TRACE(what + (p == KvPrecision::kInt8 ? " int8" : " int4"));
        const size_t bytes = static_cast<size_t>(l.bytes(p));
        std::vector<uint8_t> want(bytes, 0x5A);
        ASSERT_TRUE(
            backend::cpu_quantize_kv_page(page.data(), ElemType::kF32, l, p, want.data()).ok());
        DevArray<uint8_t> q(std::vector<uint8_t>(bytes, 0xA5));  // padding must be written too
        const Status st =
            kernels::launch_quantize_kv_page(src.get(), dtype, l, p, q.get(), nullptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_EQ(device_sync(), "");
        const std::vector<uint8_t> got = q.to_host();
        ASSERT_EQ(bytes_diff(got, want), "");
        // Dequantize (from the CPU's bytes, so a quantize bug cannot hide a dequantize one) into
        // every full dtype: f32 bit-exact, f16 / bf16 the f32 values rounded to nearest even.
        std::vector<float> want_f32(page.size());
        ASSERT_TRUE(
            backend::cpu_dequantize_kv_page(want.data(), p, l, want_f32.data(), ElemType::kF32)
                .ok());
        DevArray<uint8_t> qsrc(want);
        for (ElemType out_t : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
          DevArray<unsigned char> out(page.size() * kernels::elem_size(out_t));
          ASSERT_TRUE(
              kernels::launch_dequantize_kv_page(qsrc.get(), p, l, out.get(), out_t, nullptr).ok());
          ASSERT_EQ(device_sync(), "");
          const std::vector<unsigned char> want_raw = encode(want_f32, out_t);
          const std::vector<unsigned char> got_raw = out.to_host();
          if (out_t == ElemType::kF32) {
            // Bit-exact, but a NaN only as a NaN: a GPU's arithmetic returns the canonical NaN
            // where the host keeps the payload of a NaN scale (0x7fffe000).
            ASSERT_EQ(got_raw.size(), want_raw.size());
            for (size_t i = 0; i < want_f32.size(); ++i) {
              float g, w;
              std::memcpy(&g, got_raw.data() + 4 * i, 4);
              std::memcpy(&w, want_raw.data() + 4 * i, 4);
              if (std::isnan(w)) {
                ASSERT_TRUE(std::isnan(g)) << "f32 element " << i;
              } else {
                ASSERT_EQ(std::memcmp(&g, &w, 4), 0)
                    << "f32 element " << i << ": " << g << " vs " << w;
              }
            }
            continue;
          }
          ASSERT_EQ(std::memcmp(got_raw.data(), want_raw.data(), want_raw.size()), 0)
              << kernels::elem_name(out_t);
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 30);
}

INSTANTIATE_TEST_SUITE_P(Kernels, KvPageParity,
                         ::testing::Values(ElemType::kF32, ElemType::kF16, ElemType::kBF16),
                         [](const ::testing::TestParamInfo<ElemType>& i) {
                           return std::string(kernels::elem_name(i.param));
                         });

// Validation happens before anything touches memory: host buffers stand in for device pointers,
// so this runs (and means the same) with or without a device.
TEST(KvPageLaunch, BadArgumentsAreRejected) {
  const QuantPageLayout l{2, 16, 8};
  std::vector<float> page_buf(static_cast<size_t>(2 * l.values_per_kv()));
  std::vector<uint8_t> q_buf(static_cast<size_t>(l.bytes(KvPrecision::kInt8)));
  std::vector<kernels::KvSummaryElem> sum_buf(static_cast<size_t>(2 * 2 * 8));
  float* page = page_buf.data();
  kernels::KvSummaryElem* sum = sum_buf.data();
  uint8_t* q = q_buf.data();
  const auto code = [](const Status& s) { return s.code(); };
  EXPECT_EQ(code(kernels::launch_quantize_kv_page(page, ElemType::kF32, l, KvPrecision::kFull, q,
                                                  nullptr)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(kernels::launch_quantize_kv_page(nullptr, ElemType::kF32, l, KvPrecision::kInt8, q,
                                                  nullptr)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(kernels::launch_quantize_kv_page(page, ElemType::kF32, {2, 16, 7},
                                                  KvPrecision::kInt8, q, nullptr)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(kernels::launch_dequantize_kv_page(q, KvPrecision::kEvicted, l, page,
                                                    ElemType::kF32, nullptr)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(kernels::launch_summarize_kv_page(page, ElemType::kF32, {0, 16, 8}, sum, nullptr)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(kernels::launch_summarize_kv_page(page, ElemType::kF32, l, nullptr, nullptr)),
            StatusCode::kInvalidArgument);
  for (int parts : {0, 3, 32}) {  // summary_parts must be >= 1 and divide the block size
    EXPECT_EQ(code(kernels::launch_summarize_kv_page(page, ElemType::kF32, {2, 16, 8, parts}, sum,
                                                     nullptr)),
              StatusCode::kInvalidArgument)
        << parts;
  }
}

// A misaligned page is refused before any launch: on a GPU the 16-byte stores of the quantized
// page (and any element access off its alignment) are a sticky misaligned-address error, which
// the emulator (memcpy loads and stores) would never show. Host buffers as above; each pointer is
// offset from a 16-byte aligned base with room to spare, so a launch that is not refused stays in
// bounds under the emulator and fails only the expectations.
TEST(KvPageLaunch, MisalignedPagesAreRejected) {
  const QuantPageLayout l{2, 16, 8};
  const size_t page_bytes = static_cast<size_t>(2 * l.values_per_kv()) * sizeof(float);
  const size_t q_bytes = static_cast<size_t>(l.bytes(KvPrecision::kInt8));
  std::vector<uint8_t> page_buf(page_bytes + 64), q_buf(q_bytes + 64), sum_buf(2 * 2 * 8 * 2 + 64);
  const auto base16 = [](std::vector<uint8_t>& v) {
    const auto a = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + ((16 - a % 16) % 16);
  };
  uint8_t* page = base16(page_buf);
  uint8_t* q = base16(q_buf);
  uint8_t* sum = base16(sum_buf);
  const auto summary = [](uint8_t* p) { return reinterpret_cast<kernels::KvSummaryElem*>(p); };
  const auto expect_misaligned = [](const Status& s, const char* what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what << ": " << s.to_string();
    EXPECT_NE(s.message().find("aligned"), std::string::npos) << what << ": " << s.to_string();
  };
  for (KvPrecision p : {KvPrecision::kInt8, KvPrecision::kInt4}) {
    for (int off : {1, 4, 8}) {  // the quantized page: 16-byte stores
      expect_misaligned(
          kernels::launch_quantize_kv_page(page, ElemType::kF32, l, p, q + off, nullptr),
          "quantize dst");
      expect_misaligned(
          kernels::launch_dequantize_kv_page(q + off, p, l, page, ElemType::kF32, nullptr),
          "dequantize src");
    }
    expect_misaligned(kernels::launch_quantize_kv_page(page + 2, ElemType::kF32, l, p, q, nullptr),
                      "quantize f32 src");
    expect_misaligned(kernels::launch_quantize_kv_page(page + 1, ElemType::kBF16, l, p, q, nullptr),
                      "quantize bf16 src");
    expect_misaligned(
        kernels::launch_dequantize_kv_page(q, p, l, page + 2, ElemType::kF32, nullptr),
        "dequantize f32 dst");
    expect_misaligned(
        kernels::launch_dequantize_kv_page(q, p, l, page + 1, ElemType::kF16, nullptr),
        "dequantize f16 dst");
  }
  expect_misaligned(
      kernels::launch_summarize_kv_page(page + 2, ElemType::kF32, l, summary(sum), nullptr),
      "summarize src");
  expect_misaligned(
      kernels::launch_summarize_kv_page(page, ElemType::kF32, l, summary(sum + 1), nullptr),
      "summarize dst");
}

}  // namespace
}  // namespace kvsplit::testing
