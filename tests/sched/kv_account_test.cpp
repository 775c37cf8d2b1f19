// Effective-KV accounting units (docs/kvm.md): kv_level counts each resident page at its rung's
// page bytes (host, disk and evicted pages: 0) and the computed tokens of resident pages;
// KvAccount integrates the level held between its points.
#include "sched/kv_account.h"

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "kv/page_ops.h"

namespace kvsplit::sched {
namespace {

using kernels::KvPrecision;
using kv::PageLocation;

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 64, kBlock = 16;

std::unique_ptr<kv::KvPool> make_pool(backend::Backend& be) {
  kv::KvPoolConfig c;
  c.num_blocks = 8;
  c.block_size = kBlock;
  auto pool = kv::KvPool::create(be, c, kv::KvShape{kLayers, kKvHeads, kHeadDim});
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

TEST(KvLevel, CountsEachResidentPageAtItsRungAndNothingElse) {
  auto be = std::move(backend::create_backend("cpu", 1)).value();
  auto pool = make_pool(*be);
  const int64_t full = int64_t{2} * kKvHeads * kBlock * kHeadDim * 4 * kLayers;  // f32 K and V
  const kernels::QuantPageLayout ql{kKvHeads, kBlock, kHeadDim};
  const int64_t b8 = ql.bytes(KvPrecision::kInt8) * kLayers;
  const int64_t b4 = ql.bytes(KvPrecision::kInt4) * kLayers;
  ASSERT_GT(b8, 0);
  ASSERT_LT(b4, b8);

  // No page entries: every page full precision; the second page is 2 tokens short and the
  // third, reserved but not written yet, counts bytes but no tokens.
  kv::BlockTable t;
  t.blocks = {0, 1, 2};
  KvLevel l = kv_level(*pool, t, 2 * kBlock - 2);
  EXPECT_EQ(l.bytes, 3 * full);
  EXPECT_EQ(l.tokens, 2 * kBlock - 2);
  EXPECT_EQ(l.pages_full, 3);

  // One page per location / rung; 5 pages and 2 tokens computed over 6 pages.
  t.blocks = {0, -1, -1, -1, -1, 1};
  t.pages.resize(6);
  t.pages[1].precision = KvPrecision::kInt8;
  t.pages[2].precision = KvPrecision::kInt4;
  t.pages[3].location = PageLocation::kEvicted;
  t.pages[3].precision = KvPrecision::kEvicted;
  t.pages[4].location = PageLocation::kHost;
  l = kv_level(*pool, t, 5 * kBlock + 2);
  EXPECT_EQ(l.pages_full, 2);
  EXPECT_EQ(l.pages_int8, 1);
  EXPECT_EQ(l.pages_int4, 1);
  EXPECT_EQ(l.bytes, 2 * full + b8 + b4);
  EXPECT_EQ(l.tokens, 3 * kBlock + 2);  // pages 0-2 whole; page 5 holds 2 tokens
  t.pages[5].location = PageLocation::kDisk;
  l = kv_level(*pool, t, 5 * kBlock + 2);
  EXPECT_EQ(l.bytes, full + b8 + b4);
  EXPECT_EQ(l.tokens, 3 * kBlock);
  // The key summaries of the quantized and evicted pages are device bytes too (f16 min and max).
  const int64_t summary = int64_t{2} * kKvHeads * kHeadDim * 2 * kLayers;
  t.pages[1].summary = 0;
  t.pages[2].summary = 1;
  t.pages[3].summary = 2;
  l = kv_level(*pool, t, 5 * kBlock + 2);
  EXPECT_EQ(l.bytes, full + b8 + b4 + 3 * summary);
  EXPECT_EQ(l.pages_int8 + l.pages_int4, 2);
  EXPECT_EQ(kv::resident_bytes(*pool, t), l.bytes);

  EXPECT_EQ(kv_level(*pool, kv::BlockTable{}, 0), KvLevel{});
}

TEST(KvAccount, IntegratesTheLevelHeldBetweenPoints) {
  using namespace std::chrono_literals;
  const auto t0 = std::chrono::steady_clock::time_point{} + 10s;
  KvAccount a;
  a.update(t0, KvLevel{100, 4});  // nothing before the first point
  EXPECT_EQ(a.byte_seconds(), 0);
  a.update(t0 + 2s, KvLevel{300, 8});
  EXPECT_DOUBLE_EQ(a.byte_seconds(), 200);
  EXPECT_DOUBLE_EQ(a.token_seconds(), 8);
  a.update(t0 + 2s, KvLevel{50, 1});  // same instant: replaces the level, adds nothing
  a.close(t0 + 2500ms);
  EXPECT_DOUBLE_EQ(a.byte_seconds(), 225);
  EXPECT_DOUBLE_EQ(a.token_seconds(), 8.5);
  a.close(t0 + 10s);  // closed: holds nothing
  EXPECT_DOUBLE_EQ(a.byte_seconds(), 225);
  EXPECT_EQ(a.level(), KvLevel{});
  EXPECT_TRUE(a.trace().empty());  // no trace unless a test asks for it
}

}  // namespace
}  // namespace kvsplit::sched
