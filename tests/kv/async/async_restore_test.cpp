// Asynchronous recall (kv/page_ops.h: kRestore as a fenced copy, complete_restores): on a CPU
// backend whose fenced copies run on its copy thread, with a delay standing in for a slow link,
// a restored page keeps its resident copy until the copy lands, a bounded wait expires and is
// counted once, the committed page is bit-exact (a quantized recall's is the demoted page), and
// releasing or swapping a table with a restore in flight leaks nothing.
#include <gtest/gtest.h>

#include <vector>

#include "kv/kv_pool.h"
#include "kv/page_ops.h"
#include "kv/page_pool_fixture.h"
#include "kv/swap.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

using testing::kBlock;
using testing::kLayers;
// Each fenced copy starts 1 s after it was queued: the "not landed yet" checks hold however
// loaded the machine (a bounded wait is 1 ms).
constexpr int64_t kDelayUs = 1'000'000;

// The fixture's pool (16 host slots) on a CPU backend whose fenced copies run on its copy thread,
// each starting `delay_us` after it was queued.
struct Fixture : testing::PagePoolFixture {
  explicit Fixture(int64_t delay_us = kDelayUs)
      : PagePoolFixture(/*host_pages=*/16, 8, 8, 8, async_options(delay_us)) {}
  static backend::BackendOptions async_options(int64_t delay_us) {
    backend::BackendOptions o;
    o.async_copies = true;
    o.fenced_copy_delay_us = delay_us;
    return o;
  }
  Status apply(BlockTable& t, std::vector<PageTransition> plan, PageOpStats* st) {
    return apply_page_transitions(*pool, t, 4 * kBlock, plan, st);
  }
};

TEST(AsyncRestore, PageKeepsItsResidentCopyUntilTheCopyLandsThenIsBitExact) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 7);
  const std::vector<float> before = f.page(t, 1);
  PageOpStats st;
  ASSERT_TRUE(f.apply(t, {{1, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  const int32_t int4_block = t.blocks[1];
  ASSERT_TRUE(f.apply(t, {{1, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  // Queued, not landed: still int4, the full block taken for it, the original still held.
  ASSERT_EQ(t.restoring.size(), 1u);
  EXPECT_TRUE(t.pages[1].restoring);
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kInt4);
  EXPECT_EQ(t.blocks[1], int4_block);
  EXPECT_EQ(f.pool->allocator().num_used(), 4);  // 3 full pages + the restore's block
  EXPECT_EQ(f.pool->host_allocator().num_used(), 1);
  EXPECT_EQ(st.restored, 0);
  // Device bytes: 3 full pages, the int4 copy still read with its key summary, and the restore's
  // block.
  const int64_t full = f.pool->page_layer_bytes(KvPrecision::kFull) * kLayers;
  const int64_t int4 = f.pool->page_layer_bytes(KvPrecision::kInt4) * kLayers;
  const int64_t summary = f.pool->summary_layer_bytes() * kLayers;
  EXPECT_EQ(resident_bytes(*f.pool, t), 4 * full + int4 + summary);
  // Further transitions leave a restoring page alone (no second restore, no demotion).
  ASSERT_TRUE(f.apply(t,
                      {{1, PageOp::kRestore, KvPrecision::kFull},
                       {1, PageOp::kEvict, KvPrecision::kEvicted}},
                      &st)
                  .ok());
  EXPECT_EQ(t.restoring.size(), 1u);
  EXPECT_EQ(st.evicted, 0);
  // A bounded wait far below the delay: not landed, counted late once.
  ASSERT_TRUE(complete_restores(*f.pool, t, 1000, &st).ok());
  EXPECT_EQ(st.restores_late, 1);
  EXPECT_EQ(t.restoring.size(), 1u);
  ASSERT_TRUE(complete_restores(*f.pool, t, 0, &st).ok());
  EXPECT_EQ(st.restores_late, 1);  // the same restore is not counted twice
  // Until it lands: committed, bit-exact from the original, tiers freed.
  ASSERT_TRUE(complete_restores(*f.pool, t, -1, &st).ok());
  EXPECT_TRUE(t.restoring.empty());
  EXPECT_FALSE(t.pages[1].restoring);
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kFull);
  EXPECT_EQ(f.page(t, 1), before);
  EXPECT_EQ(st.restored, 1);
  EXPECT_GE(st.restore_seconds, kDelayUs * 1e-6 * 0.9);  // queued-to-commit latency
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 0);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->summary_allocator().num_used(), 0);
  f.pool->release(t);
  f.expect_all_free();
}

TEST(AsyncRestore, AnEvictedPageComesBackOnceLanded) {
  Fixture f(20'000);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 8);
  const std::vector<float> before = f.page(t, 0);
  PageOpStats st;
  ASSERT_TRUE(f.apply(t, {{0, PageOp::kEvict, KvPrecision::kEvicted}}, &st).ok());
  ASSERT_TRUE(f.apply(t, {{0, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_FALSE(t.pages[0].resident());  // still evicted while the copy is in flight
  EXPECT_EQ(t.blocks[0], -1);
  ASSERT_TRUE(complete_restores(*f.pool, t, -1, &st).ok());
  ASSERT_TRUE(t.pages[0].resident());
  EXPECT_EQ(f.page(t, 0), before);
  f.pool->release(t);
  f.expect_all_free();
}

// A recall at a quantized rung copies its original asynchronously too: the page stays evicted
// (its arena page and a full block for the copy taken) until the copy lands, then it is exactly
// the page the demotion to that rung made, and the full block is free again. Released in
// flight, it leaks nothing.
TEST(AsyncRestore, AQuantizedRecallLandsThenIsTheDemotedPage) {
  Fixture f(200'000);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 12);
  PageOpStats st;
  ASSERT_TRUE(f.apply(t, {{1, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  const std::vector<uint8_t> demoted = f.arena_bytes(t, 1, KvPrecision::kInt4);
  ASSERT_TRUE(f.apply(t,
                      {{1, PageOp::kEvict, KvPrecision::kEvicted},
                       {1, PageOp::kRestore, KvPrecision::kInt4}},
                      &st)
                  .ok());
  ASSERT_EQ(t.restoring.size(), 1u);
  EXPECT_TRUE(t.pages[1].restoring);
  EXPECT_FALSE(t.pages[1].resident());
  EXPECT_EQ(f.pool->allocator().num_used(), 4);  // 3 full pages + the copy's block
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 1);
  const int64_t full = f.pool->page_layer_bytes(KvPrecision::kFull) * kLayers;
  const int64_t int4 = f.pool->page_layer_bytes(KvPrecision::kInt4) * kLayers;
  const int64_t summary = f.pool->summary_layer_bytes() * kLayers;
  EXPECT_EQ(resident_bytes(*f.pool, t), 4 * full + int4 + summary);
  EXPECT_EQ(st.restored, 0);
  ASSERT_TRUE(complete_restores(*f.pool, t, 1000, &st).ok());
  EXPECT_EQ(st.restores_late, 1);
  ASSERT_TRUE(complete_restores(*f.pool, t, -1, &st).ok());
  EXPECT_TRUE(t.restoring.empty());
  ASSERT_TRUE(t.pages[1].resident());
  EXPECT_FALSE(t.pages[1].restoring);
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kInt4);
  EXPECT_EQ(f.arena_bytes(t, 1, KvPrecision::kInt4), demoted);
  EXPECT_EQ(st.restored_quantized, 1);
  EXPECT_GE(st.restore_seconds, 0.2 * 0.9);
  EXPECT_EQ(f.pool->allocator().num_used(), 3);       // the copy's block is free again
  EXPECT_EQ(f.pool->host_allocator().num_used(), 1);  // the original stays
  // Another one released in flight: its block and arena page go back.
  ASSERT_TRUE(f.apply(t,
                      {{2, PageOp::kEvict, KvPrecision::kEvicted},
                       {2, PageOp::kRestore, KvPrecision::kInt8}},
                      &st)
                  .ok());
  ASSERT_EQ(t.restoring.size(), 1u);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 1);
  f.pool->release(t);
  f.expect_all_free();
}

TEST(AsyncRestore, ReleaseWithRestoresInFlightLeaksNothing) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 9);
  PageOpStats st;
  ASSERT_TRUE(f.apply(t,
                      {{0, PageOp::kDemote, KvPrecision::kInt8},
                       {1, PageOp::kEvict, KvPrecision::kEvicted},
                       {2, PageOp::kDemote, KvPrecision::kInt4}},
                      &st)
                  .ok());
  ASSERT_TRUE(f.apply(t,
                      {{0, PageOp::kRestore, KvPrecision::kFull},
                       {1, PageOp::kRestore, KvPrecision::kFull},
                       {2, PageOp::kRestore, KvPrecision::kFull}},
                      &st)
                  .ok());
  ASSERT_EQ(t.restoring.size(), 3u);
  f.pool->release(t);  // waits for the copies (the originals are freed), frees their blocks
  EXPECT_TRUE(t.restoring.empty());
  f.expect_all_free();
}

TEST(AsyncRestore, SwapOutLandsRestoresFirstAndTheRoundTripIsBitExact) {
  Fixture f(20'000);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 10);
  std::vector<std::vector<float>> before;
  for (int i = 0; i < 4; ++i) before.push_back(f.page(t, i));
  PageOpStats st;
  ASSERT_TRUE(f.apply(t, {{2, PageOp::kDemote, KvPrecision::kInt8}}, &st).ok());
  ASSERT_TRUE(f.apply(t, {{2, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  ASSERT_EQ(t.restoring.size(), 1u);
  SwapStats ss;
  auto out = swap_out(*f.pool, t, &ss);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_TRUE(*out);
  EXPECT_TRUE(t.restoring.empty());
  EXPECT_EQ(ss.pages_out, 4);  // the restored page went out at full precision with the rest
  EXPECT_EQ(f.pool->allocator().num_used(), 0);
  auto in = swap_in(*f.pool, t, &ss);
  ASSERT_TRUE(in.ok() && *in);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f.page(t, i), before[i]) << "page " << i;
  f.pool->release(t);
  f.expect_all_free();
}

}  // namespace
}  // namespace kvsplit::kv
