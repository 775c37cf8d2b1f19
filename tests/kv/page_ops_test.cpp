#include "kv/page_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "forwarding_backend.h"
#include "kv/kv_pool.h"
#include "kv/page_pool_fixture.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

using testing::kBlock;
using testing::kLayers;
using Fixture = testing::PagePoolFixture;

Status apply(Fixture& f, BlockTable& t, int num_tokens, std::vector<PageTransition> plan,
             PageOpStats* stats) {
  return apply_page_transitions(*f.pool, t, num_tokens, plan, stats);
}

TEST(PageOps, LadderDownAndRecallIsBitExactAndFreesMemory) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 1);
  const std::vector<float> before = f.page(t, 1);
  const int64_t full_bytes = resident_bytes(*f.pool, t);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{1, PageOp::kDemote, KvPrecision::kInt8}}, &st).ok());
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kInt8);
  EXPECT_GE(t.pages[1].original, 0);
  EXPECT_GE(t.pages[1].summary, 0);
  EXPECT_EQ(f.pool->allocator().num_used(), 3);  // the full page went back to the pool
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 1);
  EXPECT_LT(resident_bytes(*f.pool, t), full_bytes);
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{1, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kInt4);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 1);
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{1, PageOp::kEvict, KvPrecision::kEvicted}}, &st).ok());
  EXPECT_FALSE(t.pages[1].resident());
  EXPECT_EQ(t.blocks[1], -1);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 0);
  EXPECT_GE(t.pages[1].summary, 0);  // the summary stays for recall
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{1, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_TRUE(t.pages[1].resident());
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kFull);
  EXPECT_EQ(f.page(t, 1), before);  // bit-exact from the host original
  EXPECT_EQ(resident_bytes(*f.pool, t), full_bytes);
  EXPECT_EQ(st.demoted_to_int8, 1);
  EXPECT_EQ(st.demoted_to_int4, 1);
  EXPECT_EQ(st.evicted, 1);
  EXPECT_EQ(st.restored, 1);
  EXPECT_EQ(st.originals_written, 1);                 // written once, on leaving full
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);  // released with the restore
  f.pool->release(t);
  f.expect_all_free();
}

TEST(PageOps, Int4DirectlyFromFullAndRestoreAreBitExact) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 3 * kBlock));
  f.fill(t, 2);
  const std::vector<float> before = f.page(t, 0);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{0, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{0, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_EQ(f.page(t, 0), before);
  f.pool->release(t);
  f.expect_all_free();
}

// Page i's bytes in the arena of rung p, every layer (the page must be resident at p).
// An evicted page recalled at int4 is the page the demotion to int4 made (quantized from the
// same original), keeps its original and summary, and re-enters the ladder with fresh step
// counters; from there a restore to full is still bit-exact.
TEST(PageOps, EvictedPageRecalledAtInt4IsTheDemotedPageAndKeepsItsOriginal) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 3 * kBlock));
  f.fill(t, 11);
  const std::vector<float> before = f.page(t, 1);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{1, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  const std::vector<uint8_t> demoted = f.arena_bytes(t, 1, KvPrecision::kInt4);
  const int32_t original = t.pages[1].original, summary = t.pages[1].summary;
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{1, PageOp::kEvict, KvPrecision::kEvicted}}, &st).ok());
  t.pages[1].low_steps = 5;
  t.pages[1].very_low_steps = 7;
  t.pages[1].relevance = 0.25f;
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{1, PageOp::kRestore, KvPrecision::kInt4}}, &st).ok());
  EXPECT_TRUE(t.pages[1].resident());
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kInt4);
  EXPECT_EQ(f.arena_bytes(t, 1, KvPrecision::kInt4), demoted);
  EXPECT_EQ(t.pages[1].original, original);
  EXPECT_EQ(t.pages[1].summary, summary);
  EXPECT_EQ(t.pages[1].low_steps, 0);
  EXPECT_EQ(t.pages[1].very_low_steps, 0);
  EXPECT_EQ(t.pages[1].relevance, 0.25f);  // its history so far, until its next score
  EXPECT_TRUE(t.pages[1].rescore);         // ... which replaces it (AttentionScorer::score)
  EXPECT_EQ(st.restored, 1);
  EXPECT_EQ(st.restored_quantized, 1);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 1);
  EXPECT_EQ(f.pool->allocator().num_used(), 2);  // no full block taken
  EXPECT_TRUE(t.pages[1].probed);
  EXPECT_EQ(st.recalls_confirmed, 0);
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{1, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_EQ(f.page(t, 1), before);
  EXPECT_EQ(st.restored, 2);
  EXPECT_EQ(st.restored_quantized, 1);
  EXPECT_EQ(st.recalls_confirmed, 1);  // the call was right: on to full
  EXPECT_FALSE(t.pages[1].probed);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->summary_allocator().num_used(), 0);
  // A page recalled at int4 that is evicted again before reaching full: the call was cold.
  ASSERT_TRUE(apply(f, t, 3 * kBlock,
                    {{0, PageOp::kEvict, KvPrecision::kEvicted},
                     {0, PageOp::kRestore, KvPrecision::kInt4},
                     {0, PageOp::kEvict, KvPrecision::kEvicted}},
                    &st)
                  .ok());
  EXPECT_EQ(st.recalls_cold, 1);
  EXPECT_EQ(st.recalls_confirmed, 1);
  EXPECT_FALSE(t.pages[0].probed);
  f.pool->release(t);
  f.expect_all_free();
}

// A quantized recall whose arena is full takes the next rung, and int4's the full pool; a
// resident page is left as it is; kRestore to kEvicted is an error.
TEST(PageOps, QuantizedRecallFallsBackToTheNextRungThenToFull) {
  Fixture f(/*host_pages=*/8, /*blocks=*/8, /*int8_blocks=*/1, /*int4_blocks=*/1);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 12);
  const std::vector<float> p1 = f.page(t, 1);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 4 * kBlock,
                    {{0, PageOp::kEvict, KvPrecision::kEvicted},
                     {1, PageOp::kEvict, KvPrecision::kEvicted},
                     {3, PageOp::kDemote, KvPrecision::kInt8}},  // takes the only int8 slot
                    &st)
                  .ok());
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{0, PageOp::kRestore, KvPrecision::kInt8}}, &st).ok());
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt4);  // int8 full: int4
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{1, PageOp::kRestore, KvPrecision::kInt4}}, &st).ok());
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kFull);  // int4 full too: the original copied back
  EXPECT_EQ(f.page(t, 1), p1);
  EXPECT_EQ(st.restored, 2);
  EXPECT_EQ(st.restored_quantized, 1);
  ASSERT_TRUE(apply(f, t, 4 * kBlock, {{3, PageOp::kRestore, KvPrecision::kInt4}}, &st).ok());
  EXPECT_EQ(t.pages[3].precision, KvPrecision::kInt8);  // resident: left alone
  EXPECT_EQ(st.restored, 2);
  EXPECT_EQ(apply(f, t, 4 * kBlock, {{3, PageOp::kRestore, KvPrecision::kEvicted}}, &st).code(),
            StatusCode::kInvalidArgument);
  f.pool->release(t);
  f.expect_all_free();
}

TEST(PageOps, HostTierFullStopsTheDescentAndLosesNothing) {
  Fixture f(/*host_pages=*/1);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 3 * kBlock));
  f.fill(t, 3);
  const std::vector<float> p1 = f.page(t, 1);
  PageOpStats st;
  ASSERT_TRUE(
      apply(f, t, 3 * kBlock,
            {{0, PageOp::kDemote, KvPrecision::kInt8}, {1, PageOp::kEvict, KvPrecision::kEvicted}},
            &st)
          .ok());
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);  // got the only host slot
  EXPECT_TRUE(t.pages[1].resident());                   // refused: nowhere to keep the original
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kFull);
  EXPECT_EQ(f.page(t, 1), p1);
  EXPECT_EQ(st.refused_host_full, 1);
  f.pool->release(t);
  f.expect_all_free();
}

TEST(PageOps, PartialPagesAreNeverDegradedAndDropIsIrreversible) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 2 * kBlock + 1));  // page 2 holds one token
  f.fill(t, 4);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 2 * kBlock + 1,
                    {{2, PageOp::kDemote, KvPrecision::kInt8},
                     {2, PageOp::kEvict, KvPrecision::kEvicted},
                     {1, PageOp::kDrop, KvPrecision::kEvicted}},
                    &st)
                  .ok());
  EXPECT_EQ(t.pages[2].precision, KvPrecision::kFull);
  EXPECT_TRUE(t.pages[2].resident());
  EXPECT_FALSE(t.pages[1].resident());
  EXPECT_EQ(t.pages[1].original, -1);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
  ASSERT_TRUE(apply(f, t, 2 * kBlock + 1, {{1, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_FALSE(t.pages[1].resident());
  EXPECT_EQ(st.refused_no_original, 1);
  f.pool->release(t);
  f.expect_all_free();
}

// kDrop of a page that went down the ladder before (it has a host original and a key summary):
// both go with it, and a later kRestore finds nothing to bring back. They were kept, and the
// dropped page came back at full precision.
TEST(PageOps, DropOfADemotedPageReleasesItsOriginalAndSummary) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 3 * kBlock));
  f.fill(t, 5);
  PageOpStats st;
  ASSERT_TRUE(
      apply(f, t, 3 * kBlock,
            {{1, PageOp::kDemote, KvPrecision::kInt8}, {1, PageOp::kDrop, KvPrecision::kEvicted}},
            &st)
          .ok());
  EXPECT_FALSE(t.pages[1].resident());
  EXPECT_EQ(t.pages[1].original, -1);
  EXPECT_EQ(t.pages[1].summary, -1);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->summary_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 0);
  ASSERT_TRUE(apply(f, t, 3 * kBlock, {{1, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_FALSE(t.pages[1].resident());
  EXPECT_EQ(st.refused_no_original, 1);
  f.pool->release(t);
  f.expect_all_free();
}

TEST(PageOps, NoFreePageRefusesTheRestoreAndBadTransitionsAreErrors) {
  Fixture f(/*host_pages=*/8, /*blocks=*/2);
  BlockTable t, other;
  ASSERT_TRUE(f.pool->reserve(t, 2 * kBlock));
  f.fill(t, 5);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 2 * kBlock, {{0, PageOp::kEvict, KvPrecision::kEvicted}}, &st).ok());
  ASSERT_TRUE(f.pool->reserve(other, kBlock));  // takes the freed page
  ASSERT_TRUE(apply(f, t, 2 * kBlock, {{0, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_FALSE(t.pages[0].resident());
  EXPECT_EQ(st.refused_no_space, 1);
  EXPECT_EQ(apply(f, t, 2 * kBlock, {{5, PageOp::kEvict, KvPrecision::kEvicted}}, &st).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(apply(f, t, 2 * kBlock, {{1, PageOp::kDemote, KvPrecision::kFull}}, &st).code(),
            StatusCode::kInvalidArgument);
  f.pool->release(t);
  f.pool->release(other);
  f.expect_all_free();
}

TEST(PageOps, FullInt8ArenaGoesToInt4AndARefusedDemotionTakesNothing) {
  Fixture f(/*host_pages=*/8, /*blocks=*/8, /*int8_blocks=*/1, /*int4_blocks=*/1);
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 4 * kBlock));
  f.fill(t, 7);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, 4 * kBlock,
                    {{0, PageOp::kDemote, KvPrecision::kInt8},
                     {1, PageOp::kDemote, KvPrecision::kInt8},
                     {2, PageOp::kDemote, KvPrecision::kInt8}},
                    &st)
                  .ok());
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);
  EXPECT_EQ(t.pages[1].precision, KvPrecision::kInt4);  // int8 arena full
  EXPECT_EQ(t.pages[2].precision, KvPrecision::kFull);  // both full: refused
  EXPECT_EQ(st.demoted_to_int8, 1);
  EXPECT_EQ(st.demoted_to_int4, 1);
  EXPECT_EQ(st.refused_no_space, 1);
  EXPECT_EQ(t.pages[2].original, -1);  // the refused page took no host slot or summary
  EXPECT_EQ(t.pages[2].summary, -1);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 2);
  EXPECT_EQ(f.pool->summary_allocator().num_used(), 2);
  f.pool->release(t);
  f.expect_all_free();
}

// With a split budget (SequenceCut::split_budget) the int8 arena can have more slots than the
// full pool has blocks: a page in such a slot goes down to int4 from its original like any other
// (its slot number is not a full block).
TEST(PageOps, Int8PageInASlotBeyondTheFullPoolGoesDownToInt4) {
  Fixture f(/*host_pages=*/8, /*blocks=*/2, /*int8_blocks=*/8, /*int4_blocks=*/8);
  BlockTable t;
  PageOpStats st;
  std::vector<std::vector<float>> full;  // each page's bytes before it left full precision
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(f.pool->reserve(t, (i + 1) * kBlock));  // the full block page i's demotion freed
    BlockTable one;  // fill page i only: the others' blocks are arena slots now
    one.blocks = {t.blocks[i]};
    f.fill(one, 100 + i);
    full.push_back(f.page(t, i));
    ASSERT_TRUE(
        apply(f, t, (i + 1) * kBlock, {{i, PageOp::kDemote, KvPrecision::kInt8}}, &st).ok());
    ASSERT_EQ(t.pages[i].precision, KvPrecision::kInt8);
  }
  ASSERT_GE(t.blocks[4], 2);  // an int8 slot number past the full pool's blocks
  ASSERT_TRUE(apply(f, t, 5 * kBlock, {{4, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  EXPECT_EQ(t.pages[4].precision, KvPrecision::kInt4);
  EXPECT_EQ(st.demoted_to_int4, 1);
  // Back to full from the original, bit-exact.
  ASSERT_TRUE(apply(f, t, 5 * kBlock, {{0, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  ASSERT_TRUE(apply(f, t, 5 * kBlock, {{4, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_EQ(f.page(t, 4), full[4]);
  f.pool->release(t);
  f.expect_all_free();
}

// A backend error while a page is quantized leaves the page as it was and takes nothing: the new
// arena slot goes back, and so do the host original and summary the demotion wrote.
TEST(PageOps, BackendErrorInADemotionLeavesThePageAndTakesNothing) {
  class FailingQuantize final : public kvsplit::testing::ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;
    bool fail = false;
    Status quantize_kv_page(const void* s, backend::DType t, const kernels::QuantPageLayout& l,
                            KvPrecision to, void* d) override {
      if (fail) return internal_error("injected quantize failure");
      return ForwardingBackend::quantize_kv_page(s, t, l, to, d);
    }
  };
  FailingQuantize* be = nullptr;
  Fixture f(8, 8, 8, 8, {}, [&](std::unique_ptr<backend::Backend> inner) {
    auto w = std::make_unique<FailingQuantize>(std::move(inner));
    be = w.get();
    return std::unique_ptr<backend::Backend>(std::move(w));
  });
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, 2 * kBlock));
  f.fill(t, 9);
  const std::vector<float> before = f.page(t, 0);
  PageOpStats st;
  be->fail = true;
  // From full precision: the original and summary were written, then the quantize failed.
  const Status from_full = apply(f, t, 2 * kBlock, {{0, PageOp::kDemote, KvPrecision::kInt8}}, &st);
  EXPECT_EQ(from_full.code(), StatusCode::kInternal) << from_full.to_string();
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kFull);
  EXPECT_EQ(t.pages[0].original, -1);
  EXPECT_EQ(t.pages[0].summary, -1);
  EXPECT_EQ(f.page(t, 0), before);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 0);
  EXPECT_EQ(f.pool->host_allocator().num_used(), 0);
  EXPECT_EQ(f.pool->summary_allocator().num_used(), 0);
  // From int8 down to int4: the page keeps its int8 slot and its original.
  be->fail = false;
  ASSERT_TRUE(apply(f, t, 2 * kBlock, {{0, PageOp::kDemote, KvPrecision::kInt8}}, &st).ok());
  const int32_t slot = t.blocks[0];
  be->fail = true;
  EXPECT_FALSE(apply(f, t, 2 * kBlock, {{0, PageOp::kDemote, KvPrecision::kInt4}}, &st).ok());
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);
  EXPECT_EQ(t.blocks[0], slot);
  EXPECT_GE(t.pages[0].original, 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt8).num_used(), 1);
  be->fail = false;
  ASSERT_TRUE(apply(f, t, 2 * kBlock, {{0, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_EQ(f.page(t, 0), before);
  // A recall at int4 that fails leaves the page evicted with its original, and takes no slot.
  ASSERT_TRUE(apply(f, t, 2 * kBlock, {{0, PageOp::kEvict, KvPrecision::kEvicted}}, &st).ok());
  be->fail = true;
  EXPECT_FALSE(apply(f, t, 2 * kBlock, {{0, PageOp::kRestore, KvPrecision::kInt4}}, &st).ok());
  EXPECT_FALSE(t.pages[0].resident());
  EXPECT_EQ(t.blocks[0], -1);
  EXPECT_GE(t.pages[0].original, 0);
  EXPECT_EQ(f.pool->arena_allocator(KvPrecision::kInt4).num_used(), 0);
  be->fail = false;
  ASSERT_TRUE(apply(f, t, 2 * kBlock, {{0, PageOp::kRestore, KvPrecision::kFull}}, &st).ok());
  EXPECT_EQ(f.page(t, 0), before);
  f.pool->release(t);
  f.expect_all_free();
}

TEST(PageOps, ReserveKeepsPageEntriesInStep) {
  Fixture f;
  BlockTable t;
  ASSERT_TRUE(f.pool->reserve(t, kBlock));
  f.fill(t, 6);
  PageOpStats st;
  ASSERT_TRUE(apply(f, t, kBlock, {{0, PageOp::kDemote, KvPrecision::kInt8}}, &st).ok());
  ASSERT_TRUE(f.pool->reserve(t, 3 * kBlock));
  ASSERT_EQ(t.pages.size(), t.blocks.size());
  EXPECT_EQ(t.pages[0].precision, KvPrecision::kInt8);
  EXPECT_EQ(t.pages[2].precision, KvPrecision::kFull);
  f.pool->release(t);
  EXPECT_TRUE(t.pages.empty());
  f.expect_all_free();
}

}  // namespace
}  // namespace kvsplit::kv
