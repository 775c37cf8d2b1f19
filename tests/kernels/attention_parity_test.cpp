// Paged attention kernels (prefill, split-K decode + merge) against the fp64 oracle and, for f32
// pages, against the CPU backend. Same source for the emulated kernels (tests/kernels) and the
// real ones (tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/attention/paged_attention.h"
#if defined(KVSPLIT_EMULATE_CUDA)
#include "kernels/attention/paged_attention.cuh"  // attn_smem_layout
#endif
#include "backend/cpu/attention.h"
#include "backend/split_plan.h"
#include "common/thread_pool.h"
#include "kernel_test_util.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::testing {
namespace {

using kernels::ElemType;

// Outputs are compared with |got - want| <= atol + rtol * |want|. The oracle reads the same
// rounded page values as the kernel, so the budget covers fp32 accumulation order only.
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return {2e-5, 2e-4};
    case ElemType::kF16:
      return {2e-5, 2e-4};
    case ElemType::kBF16:
      return {2e-5, 2e-4};
  }
  return {0, 0};
}

struct AttnCase {
  std::string name;
  int num_heads, num_kv_heads, head_dim;
  ElemType dtype;
  std::vector<int> kv_lens;
  std::vector<int> q_lens;        // empty: decode
  std::vector<int> chunk_tokens;  // decode: split chunk sizes to try (0 = no split)
  int window = 0;                 // sliding window (0: none); pages before it are NaN-poisoned
};

void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }

// Device copies of one oracle case with pages in `dtype`.
struct DeviceCase {
  DevArray<float> q, out;
  DevArray<unsigned char> pages;
  DevArray<int32_t> query_start, kv_lens, block_tables;
  DevArray<int> error_flag;
  kernels::PagedAttentionParams params;
};

DeviceCase upload(oracle::AttentionCase& c, ElemType dtype) {
  DeviceCase d;
  d.q = DevArray<float>(c.q);
  d.out = DevArray<float>(c.out);  // NaN-filled: every element must be written
  d.pages = DevArray<unsigned char>(encode(c.pages, dtype));
  d.query_start = DevArray<int32_t>(c.query_start);
  d.kv_lens = DevArray<int32_t>(c.kv_lens);
  d.block_tables = DevArray<int32_t>(c.block_tables);
  d.error_flag = DevArray<int>(std::vector<int>{0});
  const backend::AttentionArgs a = c.args();
  kernels::PagedAttentionParams& p = d.params;
  p.q = d.q.get();
  p.out = d.out.get();
  p.kv = d.pages.get();
  p.kv_dtype = dtype;
  p.num_seqs = a.num_seqs;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.head_dim = a.head_dim;
  p.block_size = a.kv.block_size;
  p.num_blocks = a.kv.num_blocks;
  p.scale = a.scale;
  p.query_start = d.query_start.get();
  p.kv_lens = d.kv_lens.get();
  p.block_tables = d.block_tables.get();
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.max_query_len = a.max_query_len;
  p.window = a.window;
  p.error_flag = d.error_flag.get();
  return d;
}

// fp64 reference over the dtype-rounded pages.
std::vector<double> reference(oracle::AttentionCase& c, ElemType dtype) {
  const std::vector<float> rounded = decode(encode(c.pages, dtype), dtype);
  return oracle::attention(c.args(), [&](int64_t i) { return static_cast<double>(rounded[i]); });
}

// Runs one case (prefill, or decode at each of its split chunk sizes) against the fp64 oracle
// and, for f32 pages, the CPU backend.
void check_case(const AttnCase& tc) {
  oracle::CaseSpec spec;
  spec.num_heads = tc.num_heads;
  spec.num_kv_heads = tc.num_kv_heads;
  spec.head_dim = tc.head_dim;
  spec.kv_lens = tc.kv_lens;
  spec.q_lens = tc.q_lens;
  spec.window = tc.window;
  spec.seed = 1234 + tc.head_dim + tc.num_heads * 7 + static_cast<int>(tc.dtype);
  oracle::AttentionCase c = oracle::make_case(spec);
  const std::vector<double> want = reference(c, tc.dtype);
  const Tolerance tol = tolerance(tc.dtype);
  ThreadPool pool(2);

  if (!tc.q_lens.empty()) {
    DeviceCase d = upload(c, tc.dtype);
    ASSERT_TRUE(kernels::launch_paged_prefill(d.params, nullptr).ok());
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> got = d.out.to_host();
    const oracle::Comparison cmp = oracle::compare(got.data(), want, tol.atol, tol.rtol);
    EXPECT_TRUE(cmp.ok) << "prefill vs oracle: " << cmp.message;
    EXPECT_EQ(d.error_flag.to_host()[0], 0);
    if (tc.dtype == ElemType::kF32) {
      ASSERT_TRUE(backend::cpu_attention_prefill(c.args(), pool).ok());
      const oracle::Comparison cpu = oracle::compare(
          got.data(), [&] { return std::vector<double>(c.out.begin(), c.out.end()); }(), tol.atol,
          tol.rtol);
      EXPECT_TRUE(cpu.ok) << "prefill vs CPU backend: " << cpu.message;
    }
    return;
  }

  for (int chunk : tc.chunk_tokens) {
    SCOPED_TRACE("chunk_tokens " + std::to_string(chunk));
    const backend::SplitPlan plan =
        backend::make_split_plan(c.kv_lens.data(), c.num_seqs, spec.block_size, chunk, tc.window);
    DeviceCase d = upload(c, tc.dtype);
    DevArray<int32_t> num_splits(plan.num_splits), split_offset(plan.split_offset);
    const size_t total = static_cast<size_t>(std::max(plan.total_splits, 1));
    DevArray<float> part_o(total * tc.num_heads * tc.head_dim), part_m(total * tc.num_heads),
        part_l(total * tc.num_heads);
    kernels::PagedAttentionParams p = d.params;
    p.chunk_tokens = plan.chunk_tokens;
    p.max_splits = plan.max_splits;
    p.num_splits = num_splits.get();
    p.split_offset = split_offset.get();
    p.part_o = part_o.get();
    p.part_m = part_m.get();
    p.part_l = part_l.get();
    const Status st = kernels::launch_paged_decode(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const Status mst = kernels::launch_merge_states(p, nullptr);
    ASSERT_TRUE(mst.ok()) << mst.to_string();
    ASSERT_EQ(device_sync(), "");
    const std::vector<float> got = d.out.to_host();
    const oracle::Comparison cmp = oracle::compare(got.data(), want, tol.atol, tol.rtol);
    EXPECT_TRUE(cmp.ok) << "decode vs oracle (max_splits " << plan.max_splits
                        << "): " << cmp.message;
    EXPECT_EQ(d.error_flag.to_host()[0], 0);
    if (tc.dtype == ElemType::kF32) {
      std::fill(c.out.begin(), c.out.end(), std::nanf(""));
      ASSERT_TRUE(backend::cpu_attention_decode(c.args(), plan, pool).ok());
      const std::vector<double> cpu_out(c.out.begin(), c.out.end());
      const oracle::Comparison cpu = oracle::compare(got.data(), cpu_out, tol.atol, tol.rtol);
      EXPECT_TRUE(cpu.ok) << "decode vs CPU backend: " << cpu.message;
    }
  }
}

class AttentionParity : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionParity, MatchesOracleAndCpu) {
  KVSPLIT_REQUIRE_DEVICE();
  check_case(GetParam());
}

std::vector<AttnCase> cases() {
  std::vector<AttnCase> out;
  const std::vector<int> skewed = {1, 17, 130, 300};  // partial last blocks, one tiny sequence
  const std::vector<int> chunks = {0, 16, 64, 112};
  struct Heads {
    const char* name;
    int h, kvh;
  };
  const Heads heads[] = {{"mha", 4, 4}, {"gqa", 8, 2}, {"mqa", 8, 1}};
  const std::pair<const char*, ElemType> dtypes[] = {
      {"f32", ElemType::kF32}, {"f16", ElemType::kF16}, {"bf16", ElemType::kBF16}};
  for (int hd : {64, 128}) {
    for (const Heads& h : heads) {
      for (const auto& [dname, dt] : dtypes) {
        const std::string base = std::string(h.name) + "_d" + std::to_string(hd) + "_" + dname;
        out.push_back({"decode_" + base, h.h, h.kvh, hd, dt, skewed, {}, chunks});
        out.push_back({"prefill_" + base, h.h, h.kvh, hd, dt, {5, 40, 97}, {5, 23, 33}, {}});
      }
    }
  }
  // Wide MQA group (32 query heads on one KV head), and many short sequences.
  out.push_back({"decode_mqa32_d128_bf16", 32, 1, 128, ElemType::kBF16, {70, 9}, {}, {0, 32}});
  out.push_back({"prefill_mqa32_d64_f16", 32, 1, 64, ElemType::kF16, {20, 3}, {20, 2}, {}});
  std::vector<int> many(24);
  for (int i = 0; i < 24; ++i) many[i] = 1 + (i * 37) % 90;
  out.push_back({"decode_many_seqs_gqa_d64_f16", 8, 2, 64, ElemType::kF16, many, {}, {0, 32}});
  // Sliding windows (block 16): one key, under a page, unaligned, and wider than some sequences.
  for (int w : {1, 15, 37, 200}) {
    const std::string ws = "_w" + std::to_string(w);
    out.push_back({"decode_gqa_d64_f16" + ws, 8, 2, 64, ElemType::kF16, skewed, {}, chunks, w});
    out.push_back(
        {"prefill_gqa_d64_bf16" + ws, 8, 2, 64, ElemType::kBF16, {5, 40, 97}, {5, 23, 33}, {}, w});
  }
  out.push_back({"decode_mha_d128_f32_w50", 4, 4, 128, ElemType::kF32, skewed, {}, chunks, 50});
  out.push_back(
      {"prefill_mqa_d128_f32_w20", 8, 1, 128, ElemType::kF32, {5, 40, 97}, {5, 23, 33}, {}, 20});
#if defined(KVSPLIT_TEST_GPU)
  // Device-sized shapes (too slow for the fiber emulator): kv_len up to 16K with partial last
  // blocks, 64 sequences of skewed lengths, up to 64 splits per sequence, a long cached prefix.
  std::vector<int> skew64(64);
  for (int i = 0; i < 64; ++i) skew64[i] = 1 + (i * i * 97 + 13 * i) % 1200;
  skew64[0] = 16384;
  skew64[1] = 1;
  skew64[2] = 16383;
  out.push_back(
      {"decode_large_gqa_d128_bf16", 8, 2, 128, ElemType::kBF16, skew64, {}, {0, 256, 2048}});
  out.push_back({"decode_long_mqa_d64_f16", 8, 1, 64, ElemType::kF16, {16383, 5000}, {}, {0, 256}});
  out.push_back({"decode_long_mha_d128_f32", 4, 4, 128, ElemType::kF32, {9001, 17}, {}, {0, 1024}});
  out.push_back({"decode_large_gqa_d128_bf16_w4096",
                 8,
                 2,
                 128,
                 ElemType::kBF16,
                 skew64,
                 {},
                 {0, 256, 2048},
                 4096});
  out.push_back({"prefill_long_prefix_gqa_d128_bf16_w1000",
                 8,
                 2,
                 128,
                 ElemType::kBF16,
                 {3000, 1000},
                 {1000, 1000},
                 {},
                 1000});
  out.push_back({"prefill_long_prefix_gqa_d128_bf16",
                 8,
                 2,
                 128,
                 ElemType::kBF16,
                 {3000, 1000},
                 {1000, 1000},
                 {}});
#endif
  // head_dim 8 (stories260K: 8 query / 4 KV heads), every KV dtype.
  for (const auto& [dname, dt] : dtypes) {
    out.push_back({std::string("decode_gqa_d8_") + dname, 8, 4, 8, dt, skewed, {}, chunks});
    out.push_back(
        {std::string("prefill_gqa_d8_") + dname, 8, 4, 8, dt, {5, 40, 97}, {5, 23, 33}, {}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionParity, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<AttnCase>& i) { return i.param.name; });

#if defined(KVSPLIT_EMULATE_CUDA)
// The cp.async pipeline under the other copy timing (copies land at issue: an issue into a stage
// that other threads still read would corrupt it), and the one-stage kernel that a device with
// less shared memory per block gets (the emulated limit is lowered until two stages no longer
// fit; the emulator rejects any launch above it, so passing means one stage ran). Below one
// stage's size the launch is kUnimplemented, naming the sizes.
TEST(AttentionPipeline, EagerCopiesAndOneStageFallback) {
  struct Restore {
    ~Restore() {
      emu::set_async_copy_mode(emu::AsyncCopyMode::kDeferred);
      emu::set_max_dynamic_smem_bytes(emu::kMaxDynamicSmemBytes);
    }
  } restore;
  std::vector<AttnCase> picked;
  for (const AttnCase& c : cases()) {
    // GQA at d128 in every KV dtype, decode and prefill, and the wide MQA group (sized for ASan).
    if ((c.head_dim == 128 && c.name.find("_gqa_") != std::string::npos) ||
        c.name.find("mqa32") != std::string::npos)
      picked.push_back(c);
  }
  ASSERT_EQ(picked.size(), 8u);
  for (const AttnCase& c : picked) {
    const int elem = c.dtype == ElemType::kF32 ? 4 : 2;
    // One stage for every row count a block of this case can have (at most kPrefillMaxRows, or
    // the GQA group when it is larger); two stages exceed it.
    const int max_rows = std::max(kernels::kPrefillMaxRows, c.num_heads / c.num_kv_heads);
    const size_t one_stage = kernels::attn_smem_layout(max_rows, c.head_dim, elem, 1).total;
    SCOPED_TRACE(c.name);
    emu::set_max_dynamic_smem_bytes(emu::kMaxDynamicSmemBytes);
    emu::set_async_copy_mode(emu::AsyncCopyMode::kEager);
    check_case(c);
    emu::set_max_dynamic_smem_bytes(one_stage);
    for (auto mode : {emu::AsyncCopyMode::kDeferred, emu::AsyncCopyMode::kEager}) {
      emu::set_async_copy_mode(mode);
      check_case(c);
    }
  }
  // Too little shared memory for even one stage.
  emu::set_async_copy_mode(emu::AsyncCopyMode::kDeferred);
  emu::set_max_dynamic_smem_bytes(16 * 1024);
  oracle::CaseSpec spec;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 128;
  spec.kv_lens = {40};
  oracle::AttentionCase c = oracle::make_case(spec);
  DeviceCase d = upload(c, ElemType::kBF16);
  const Status st = kernels::launch_paged_decode(d.params, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
  EXPECT_NE(st.message().find("this device allows 16384"), std::string::npos) << st.message();
  // Forcing the stage count: two where only one fits is kUnimplemented, one runs, 3 is invalid.
  emu::set_max_dynamic_smem_bytes(kernels::attn_smem_layout(4, 128, 2, 1).total);
  d.params.pipeline_stages = 2;
  EXPECT_EQ(kernels::launch_paged_decode(d.params, nullptr).code(), StatusCode::kUnimplemented);
  d.params.pipeline_stages = 1;
  EXPECT_TRUE(kernels::launch_paged_decode(d.params, nullptr).ok());
  const std::vector<float> got = d.out.to_host();
  EXPECT_TRUE(oracle::compare(got.data(), reference(c, ElemType::kBF16), 2e-5, 2e-4).ok);
  d.params.pipeline_stages = 3;
  EXPECT_EQ(kernels::launch_paged_decode(d.params, nullptr).code(), StatusCode::kInvalidArgument);
}
#endif

TEST(AttentionLaunch, UnsupportedShapesAreUnimplemented) {
  kernels::PagedAttentionParams p;
  p.num_seqs = 1;
  p.num_tokens = 1;
  p.num_heads = 4;
  p.num_kv_heads = 4;
  p.head_dim = 96;
  p.block_size = 16;
  EXPECT_EQ(kernels::launch_paged_decode(p, nullptr).code(), StatusCode::kUnimplemented);
  p.head_dim = 64;
  p.block_size = 32;
  EXPECT_EQ(kernels::launch_paged_prefill(p, nullptr).code(), StatusCode::kUnimplemented);
  p.block_size = 16;
  p.num_kv_heads = 3;
  EXPECT_EQ(kernels::launch_paged_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.num_kv_heads = 4;
  EXPECT_EQ(kernels::launch_paged_decode(p, nullptr).code(),
            StatusCode::kInvalidArgument);  // nulls
}

// A GQA group past what the register P.V covers (4 rows x 8 channels per thread: 32 query rows per
// block at d128) is refused with the limit named, for decode and prefill, never computed wrongly.
TEST(AttentionLaunch, GqaGroupsPastTheRegisterTileAreUnimplemented) {
  KVSPLIT_REQUIRE_DEVICE();
  for (bool prefill : {false, true}) {
    oracle::CaseSpec spec;
    spec.num_heads = 64;
    spec.num_kv_heads = 1;
    spec.head_dim = 128;
    spec.kv_lens = {20};
    if (prefill) spec.q_lens = {20};
    oracle::AttentionCase c = oracle::make_case(spec);
    DeviceCase d = upload(c, ElemType::kBF16);
    const Status st = prefill ? kernels::launch_paged_prefill(d.params, nullptr)
                              : kernels::launch_paged_decode(d.params, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
    EXPECT_NE(st.message().find("at most 32 query rows per block"), std::string::npos)
        << st.to_string();
  }
}

TEST(AttentionLaunch, BadBlockIdIsFlaggedNotRead) {
  KVSPLIT_REQUIRE_DEVICE();
  oracle::CaseSpec spec;
  spec.kv_lens = {40};
  oracle::AttentionCase c = oracle::make_case(spec);
  c.block_tables[1] = c.num_blocks + 1000;  // second page points outside the pool
  DeviceCase d = upload(c, ElemType::kF32);
  ASSERT_TRUE(kernels::launch_paged_decode(d.params, nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  EXPECT_EQ(d.error_flag.to_host()[0], 1);
}

// The kernels copy K and V rows by 16-byte cp.async: a misaligned page array is refused before
// the launch (only the mixed launcher checked it).
TEST(AttentionLaunch, MisalignedPagesAreRefused) {
  KVSPLIT_REQUIRE_DEVICE();
  oracle::CaseSpec spec;
  spec.kv_lens = {40};
  oracle::AttentionCase c = oracle::make_case(spec);
  DeviceCase d = upload(c, ElemType::kF32);
  d.params.kv = static_cast<const unsigned char*>(d.params.kv) + 4;  // still inside the array
  const Status st = kernels::launch_paged_decode(d.params, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.to_string();
}

// A kv_len that needs more pages than the table row holds: flagged, never read from past the row.
TEST(AttentionLaunch, KvLenPastTheTableRowIsFlagged) {
  KVSPLIT_REQUIRE_DEVICE();
  oracle::CaseSpec spec;
  spec.kv_lens = {40};  // three pages of 16
  oracle::AttentionCase c = oracle::make_case(spec);
  DeviceCase d = upload(c, ElemType::kF32);
  ASSERT_TRUE(kernels::launch_paged_decode(d.params, nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  ASSERT_EQ(d.error_flag.to_host()[0], 0);
  d.params.max_blocks_per_seq = 2;  // the row is two pages: the third is past it
  ASSERT_TRUE(kernels::launch_paged_decode(d.params, nullptr).ok());
  ASSERT_EQ(device_sync(), "");
  EXPECT_EQ(d.error_flag.to_host()[0], 1);
}

// A split plan that leaves keys out is flagged, never a silently shorter attention: the device
// kv_lens outgrew the plan's (made for 20 keys, the sequence has 40), or the plan has more splits
// than the grid runs (max_splits below num_splits).
TEST(AttentionLaunch, SplitPlanThatLeavesKeysOutIsFlagged) {
  KVSPLIT_REQUIRE_DEVICE();
  oracle::CaseSpec spec;
  spec.num_heads = 2;
  spec.num_kv_heads = 1;
  spec.kv_lens = {40};
  oracle::AttentionCase c = oracle::make_case(spec);
  const int32_t short_len = 20;
  struct Variant {
    const char* name;
    backend::SplitPlan plan;
    int flag;
  };
  backend::SplitPlan fits = backend::make_split_plan(c.kv_lens.data(), 1, 16, 16);
  backend::SplitPlan narrow = fits;
  narrow.max_splits = 2;  // three splits of 16, a grid of two
  for (const Variant& v :
       {Variant{"fits", fits, 0},
        Variant{"made for 20 keys", backend::make_split_plan(&short_len, 1, 16, 16), 1},
        Variant{"grid narrower than the plan", narrow, 1}}) {
    SCOPED_TRACE(v.name);
    ASSERT_GT(v.plan.max_splits, 1);
    DeviceCase d = upload(c, ElemType::kF32);
    DevArray<int32_t> num_splits(v.plan.num_splits), split_offset(v.plan.split_offset);
    const size_t parts = static_cast<size_t>(v.plan.total_splits) * spec.num_heads;
    DevArray<float> part_o(parts * spec.head_dim), part_m(parts), part_l(parts);
    kernels::PagedAttentionParams p = d.params;
    p.chunk_tokens = v.plan.chunk_tokens;
    p.max_splits = v.plan.max_splits;
    p.num_splits = num_splits.get();
    p.split_offset = split_offset.get();
    p.part_o = part_o.get();
    p.part_m = part_m.get();
    p.part_l = part_l.get();
    ASSERT_TRUE(kernels::launch_paged_decode(p, nullptr).ok());
    ASSERT_EQ(device_sync(), "");
    EXPECT_EQ(d.error_flag.to_host()[0], v.flag);
  }
}

}  // namespace
}  // namespace kvsplit::testing
