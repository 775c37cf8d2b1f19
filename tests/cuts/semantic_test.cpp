#include "cuts/semantic/semantic.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvsplit::cuts::semantic {
namespace {

using kernels::KvPrecision;
using kv::PageEntry;
using kv::PageOp;
using kv::PageTransition;

SemanticConfig small_config() {
  SemanticConfig c;
  c.sink_tokens = 4;
  c.recent_tokens = 8;
  c.semantic_threshold = 0.15f;
  c.evict_threshold = 0.05f;
  c.demote_after_steps = 2;
  c.evict_after_steps = 3;
  c.recall_threshold = 0.5f;
  c.smoothing = 1.f;  // relevance = this step's score
  c.semantic_window = 1 << 20;
  return c;
}

// One observation over kv_len tokens where every token has relevance `r` except the ones listed.
struct Obs {
  std::vector<float> rel, bound;
  StepObservation get(int kv_len, int bs) const {
    StepObservation o;
    o.token_relevance = rel;
    o.page_bound = bound;
    o.kv_len = kv_len;
    o.block_size = bs;
    return o;
  }
};

Obs uniform(int kv_len, int bs, float r) {
  Obs o;
  o.rel.assign(static_cast<size_t>((kv_len + bs - 1) / bs) * bs, r);
  o.bound.assign(static_cast<size_t>((kv_len + bs - 1) / bs), 0.f);
  return o;
}

TEST(SemanticConfig, ValidationNamesTheField) {
  EXPECT_TRUE(validate(SemanticConfig{}).ok());
  auto expect_field = [](SemanticConfig c, const std::string& field) {
    Status st = validate(c, "cuts.semantic.");
    ASSERT_FALSE(st.ok()) << field;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("cuts.semantic." + field), std::string::npos) << st.message();
  };
  SemanticConfig c;
  c.semantic_threshold = 1.5f;
  expect_field(c, "semantic_threshold");
  c = {};
  c.evict_threshold = -0.1f;
  expect_field(c, "evict_threshold");
  c = {};
  c.evict_threshold = 0.2f;  // above semantic_threshold 0.15
  expect_field(c, "evict_threshold");
  c = {};
  c.semantic_window = -1;
  expect_field(c, "semantic_window");
  c = {};
  c.recent_tokens = -1;
  expect_field(c, "recent_tokens");
  c = {};
  c.score_interval = 0;
  expect_field(c, "score_interval");
  c = {};
  c.evict_after_steps = 0;
  expect_field(c, "evict_after_steps");
  c = {};
  c.smoothing = 0.f;
  expect_field(c, "smoothing");
  c = {};
  c.recall_threshold = std::nanf("");
  expect_field(c, "recall_threshold");
  c = {};
  c.max_recalls_per_step = -1;
  expect_field(c, "max_recalls_per_step");
  c = {};
  c.semantic_threshold = 0.f;  // thresholds at 0: the cut is on but never acts
  c.evict_threshold = 0.f;
  EXPECT_TRUE(validate(c).ok());
}

TEST(SemanticPolicy, ParsesTheNamesOfTheCommandLine) {
  for (const char* n : {"full", "semantic", "streaming", "h2o"}) {
    auto p = parse_kv_policy(n);
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_STREQ(kv_policy_name(*p), n);
  }
  EXPECT_FALSE(parse_kv_policy("quest").ok());
  for (const char* n : {"full", "int8", "int4"}) {
    auto p = parse_recall_precision(n);
    ASSERT_TRUE(p.has_value()) << n;
    EXPECT_STREQ(recall_precision_name(*p), n);
  }
  EXPECT_FALSE(parse_recall_precision("int2").has_value());
  EXPECT_FALSE(parse_recall_precision("").has_value());
}

TEST(SemanticPlanner, SinksRecentAndThePartialPageAreProtected) {
  const SemanticConfig c = small_config();  // 4 sinks, 8 recent
  // bs 4, kv_len 30: pages 0..7 (page 7 partial: tokens 28, 29).
  EXPECT_TRUE(protected_page(0, 30, 4, c));   // sinks
  EXPECT_FALSE(protected_page(1, 30, 4, c));  // tokens 4..7
  EXPECT_FALSE(protected_page(4, 30, 4, c));  // tokens 16..19 (recent starts at 22)
  EXPECT_TRUE(protected_page(5, 30, 4, c));   // tokens 20..23 overlap the recent 22..29
  EXPECT_TRUE(protected_page(7, 30, 4, c));   // partial
}

TEST(SemanticScorer, PageIsTheMaxOfItsTokensSmoothedOverSteps) {
  SemanticConfig c = small_config();
  c.smoothing = 0.5f;
  std::vector<PageEntry> pages(3);
  Obs o = uniform(12, 4, 0.f);
  o.rel[5] = 0.8f;  // page 1
  AttentionScorer scorer;
  scorer.score(o.get(12, 4), c, pages);
  EXPECT_FLOAT_EQ(pages[0].relevance, 0.5f);  // 0.5 * 0 + 0.5 * 1
  EXPECT_FLOAT_EQ(pages[1].relevance, 0.9f);  // 0.5 * 0.8 + 0.5 * 1
  scorer.score(o.get(12, 4), c, pages);
  EXPECT_FLOAT_EQ(pages[0].relevance, 0.25f);
  EXPECT_FLOAT_EQ(pages[1].relevance, 0.85f);
  // Evicted pages are not scored; tokens before the window are not looked at.
  pages[2].location = kv::PageLocation::kEvicted;
  c.semantic_window = 6;  // tokens 6..11: page 0 is out of the window
  const float before0 = pages[0].relevance, before2 = pages[2].relevance;
  o.rel[0] = 1.f;
  scorer.score(o.get(12, 4), c, pages);
  EXPECT_FLOAT_EQ(pages[0].relevance, before0);
  EXPECT_FLOAT_EQ(pages[2].relevance, before2);
}

// A page recalled at int8 / int4 (PageEntry::rescore) takes its next score as it is: averaged
// with the 0.02 it had when it was evicted, an attended page (0.9) scored 0.46 and went down
// again under an evict_threshold of 0.5. Later scores are smoothed again.
TEST(SemanticScorer, ThePageRecalledAtAQuantizedRungTakesItsNextScoreWhole) {
  SemanticConfig c = small_config();
  c.smoothing = 0.5f;
  std::vector<PageEntry> pages(3);
  for (PageEntry& p : pages) p.relevance = 0.02f;
  pages[1].rescore = true;
  Obs o = uniform(12, 4, 0.f);
  o.rel[5] = 0.9f;  // page 1
  o.rel[1] = 0.9f;  // page 0: no recall, smoothed
  AttentionScorer scorer;
  scorer.score(o.get(12, 4), c, pages);
  EXPECT_FLOAT_EQ(pages[1].relevance, 0.9f);
  EXPECT_FALSE(pages[1].rescore);
  EXPECT_FLOAT_EQ(pages[0].relevance, 0.46f);
  o.rel[5] = 0.1f;
  scorer.score(o.get(12, 4), c, pages);
  EXPECT_FLOAT_EQ(pages[1].relevance, 0.5f);  // 0.5 * 0.1 + 0.5 * 0.9
}

TEST(SemanticPlanner, LadderDemotesThenEvictsAfterTheStepCounts) {
  const SemanticConfig c = small_config();
  const int bs = 4, kv_len = 40;  // pages 0..9; 0 sink, 8..9 recent
  std::vector<PageEntry> pages(10);
  for (PageEntry& p : pages) p.relevance = 0.1f;  // below semantic, above evict
  Obs o = uniform(kv_len, bs, 0.1f);
  auto plan1 = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  EXPECT_TRUE(plan1.empty());  // one low step of the two needed
  auto plan2 = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  ASSERT_EQ(plan2.size(), 7u);  // pages 1..7
  for (const PageTransition& t : plan2) {
    EXPECT_EQ(t.op, PageOp::kDemote);
    EXPECT_EQ(t.to, KvPrecision::kInt8);
    EXPECT_GE(t.page, 1);
    EXPECT_LE(t.page, 7);
  }
  // Relevance collapses: after 3 very-low steps the pages are evicted (the evict path wins over
  // a further demotion).
  for (PageEntry& p : pages) p.relevance = 0.01f;
  plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  auto plan5 = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  ASSERT_EQ(plan5.size(), 7u);
  for (const PageTransition& t : plan5) EXPECT_EQ(t.op, PageOp::kEvict);
}

// "Reaches" is inclusive: an evicted page whose bound, or a quantized page whose relevance, is
// exactly recall_threshold comes back.
TEST(SemanticPlanner, ABoundOrRelevanceExactlyAtTheRecallThresholdRecalls) {
  const SemanticConfig c = small_config();  // recall_threshold 0.5
  const int bs = 4, kv_len = 40;
  std::vector<PageEntry> pages(10);
  pages[2].location = kv::PageLocation::kEvicted;
  pages[2].precision = KvPrecision::kEvicted;
  pages[2].summary = 0;
  pages[3].precision = KvPrecision::kInt8;
  pages[3].summary = 1;
  pages[3].relevance = c.recall_threshold;
  Obs o = uniform(kv_len, bs, 1.f);
  o.bound[2] = c.recall_threshold;
  auto plan = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].page, 3);
  EXPECT_EQ(plan[0].op, PageOp::kRestore);
  EXPECT_EQ(plan[1].page, 2);
  EXPECT_EQ(plan[1].op, PageOp::kRestore);
}

// Each rung waits its own demote_after_steps (the count starts again after a demotion), and int4
// is the last rung: a page there goes on only by eviction, never by another demotion.
TEST(SemanticPlanner, EachRungWaitsItsStepsAndInt4IsTheLast) {
  const SemanticConfig c = small_config();  // demote after 2 low steps
  const int bs = 4, kv_len = 40;
  std::vector<PageEntry> pages(10);
  for (PageEntry& p : pages) p.relevance = 0.1f;  // below semantic, above evict
  const Obs o = uniform(kv_len, bs, 0.1f);
  // The plan of each step applied to the pages, as the cut does.
  auto step = [&] {
    auto plan = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
    for (const PageTransition& t : plan) {
      EXPECT_EQ(t.op, PageOp::kDemote) << "page " << t.page;
      EXPECT_NE(t.to, pages[t.page].precision) << "page " << t.page << " demoted to its own rung";
      pages[t.page].precision = t.to;
    }
    return plan.size();
  };
  EXPECT_EQ(step(), 0u);
  EXPECT_EQ(step(), 7u);  // pages 1..7 to int8
  EXPECT_EQ(pages[1].precision, KvPrecision::kInt8);
  EXPECT_EQ(step(), 0u);  // one low step at int8 of the two needed
  EXPECT_EQ(step(), 7u);  // to int4
  EXPECT_EQ(pages[1].precision, KvPrecision::kInt4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(step(), 0u) << "step " << i << " at int4";
}

TEST(SemanticPlanner, RecallByTheBoundForEvictedAndByRelevanceForQuantizedPages) {
  const SemanticConfig c = small_config();  // recall_threshold 0.5
  const int bs = 4, kv_len = 40;
  std::vector<PageEntry> pages(10);
  pages[2].location = kv::PageLocation::kEvicted;
  pages[2].precision = KvPrecision::kEvicted;
  pages[2].summary = 0;
  pages[3].precision = KvPrecision::kInt4;  // resident, scored: relevance 0.7
  pages[3].summary = 1;
  pages[3].relevance = 0.7f;
  pages[4].location = kv::PageLocation::kEvicted;  // evicted but no summary: cannot be judged
  pages[4].precision = KvPrecision::kEvicted;
  pages[5].precision = KvPrecision::kInt8;  // a high bound alone does not bring it back
  pages[5].summary = 2;
  pages[5].relevance = 0.2f;
  Obs o = uniform(kv_len, bs, 1.f);
  o.bound[2] = 0.6f;
  o.bound[4] = 0.9f;
  o.bound[5] = 0.9f;
  auto plan = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  ASSERT_EQ(plan.size(), 2u);
  // The quantized page in the pass over the pages, the evicted ones after it.
  EXPECT_EQ(plan[0].page, 3);
  EXPECT_EQ(plan[0].op, PageOp::kRestore);
  EXPECT_EQ(plan[0].to, KvPrecision::kFull);
  EXPECT_EQ(plan[1].page, 2);
  EXPECT_EQ(plan[1].op, PageOp::kRestore);
  EXPECT_EQ(plan[1].to, KvPrecision::kFull);
  o.bound[2] = 0.4f;  // below recall_threshold
  pages[3].relevance = 0.3f;
  EXPECT_TRUE(plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages).empty());
}

// A page a restore brought back (PageEntry::recalled) is scored and planned behind the scoring
// window too, so it goes down the ladder again when it stays cold; before, a recall of an old
// page pinned it at full precision until the sequence ended. Other pages behind the window keep
// their state.
TEST(SemanticPlanner, ARecalledPageBehindTheWindowGoesDownAgain) {
  SemanticConfig c = small_config();
  c.semantic_window = 16;  // tokens 24..39 of 40: pages 6..9
  const int bs = 4, kv_len = 40;
  std::vector<PageEntry> pages(10);
  pages[2].recalled = true;  // recalled, now full again
  Obs o = uniform(kv_len, bs, 0.f);
  AttentionScorer scorer;
  for (int step = 0; step < 3; ++step) scorer.score(o.get(kv_len, bs), c, pages);
  EXPECT_FLOAT_EQ(pages[2].relevance, 0.f);  // scored although behind the window
  EXPECT_FLOAT_EQ(pages[1].relevance, 1.f);  // not scored
  std::vector<PageTransition> plan;
  for (int step = 0; step < 3 && plan.empty(); ++step)
    plan = plan_step(KvPolicy::kSemantic, c, o.get(kv_len, bs), pages);
  ASSERT_FALSE(plan.empty());
  for (const PageTransition& t : plan) {
    EXPECT_TRUE(t.page == 2 || t.page >= 6) << t.page;  // pages 1, 3..5 are left as they are
  }
  bool page2 = false;
  for (const PageTransition& t : plan) page2 = page2 || t.page == 2;
  EXPECT_TRUE(page2) << "the recalled page stayed at full precision behind the window";
}

// Evicted pages whose bound reaches the threshold: recalled at recall_precision (a quantized
// page's recall by relevance still goes to full), and with max_recalls_per_step only the highest
// bounds, newer pages first among equals, planned in page order.
TEST(SemanticPlanner, EvictedPagesAreRecalledAtTheirRungAndTheHighestBoundsFirst) {
  SemanticConfig c = small_config();  // recall_threshold 0.5
  const int bs = 4, kv_len = 40;
  std::vector<PageEntry> pages(10);
  const float bounds[] = {0.6f, 2.f, 1.5f, 2.f, 0.3f};  // pages 1..5
  Obs o = uniform(kv_len, bs, 1.f);
  for (int i = 1; i <= 5; ++i) {
    pages[i].location = kv::PageLocation::kEvicted;
    pages[i].precision = KvPrecision::kEvicted;
    pages[i].summary = i;
    o.bound[i] = bounds[i - 1];
  }
  pages[6].precision = KvPrecision::kInt8;  // recalled by relevance: to full whatever the rung
  pages[6].summary = 6;
  pages[6].relevance = 0.9f;
  auto recalled = [&](const SemanticConfig& cfg, KvPrecision evicted_to) {
    std::vector<int> out;
    for (const PageTransition& t : plan_step(KvPolicy::kSemantic, cfg, o.get(kv_len, bs), pages)) {
      EXPECT_EQ(t.op, PageOp::kRestore);
      EXPECT_EQ(t.to, t.page == 6 ? KvPrecision::kFull : evicted_to) << "page " << t.page;
      out.push_back(t.page);
    }
    return out;
  };
  EXPECT_EQ(recalled(c, KvPrecision::kFull), (std::vector<int>{6, 1, 2, 3, 4}));
  c.recall_precision = RecallPrecision::kInt4;
  EXPECT_EQ(recalled(c, KvPrecision::kInt4), (std::vector<int>{6, 1, 2, 3, 4}));
  c.recall_precision = RecallPrecision::kInt8;
  c.max_recalls_per_step = 2;  // bounds 2.0 (pages 2 and 4) beat 1.5 and 0.6
  EXPECT_EQ(recalled(c, KvPrecision::kInt8), (std::vector<int>{6, 2, 4}));
  c.max_recalls_per_step = 1;  // a tie: the newer page
  EXPECT_EQ(recalled(c, KvPrecision::kInt8), (std::vector<int>{6, 4}));
  c.max_recalls_per_step = 3;
  EXPECT_EQ(recalled(c, KvPrecision::kInt8), (std::vector<int>{6, 2, 3, 4}));
  c.max_recalls_per_step = 9;  // more than are called: all of them
  EXPECT_EQ(recalled(c, KvPrecision::kInt8), (std::vector<int>{6, 1, 2, 3, 4}));
  // A page whose recall is in flight (an asynchronous restore) is not called again, and takes
  // no place under the cap: page 3 (bound 1.5) comes in after page 2's.
  pages[4].restoring = true;
  EXPECT_EQ(recalled(c, KvPrecision::kInt8), (std::vector<int>{6, 1, 2, 3}));
  c.max_recalls_per_step = 2;
  EXPECT_EQ(recalled(c, KvPrecision::kInt8), (std::vector<int>{6, 2, 3}));
}

TEST(SemanticPlanner, StreamingKeepsOnlySinksAndRecent) {
  const SemanticConfig c = small_config();
  std::vector<PageEntry> pages(10);
  Obs o = uniform(40, 4, 1.f);
  auto plan = plan_step(KvPolicy::kStreaming, c, o.get(40, 4), pages);
  ASSERT_EQ(plan.size(), 7u);
  for (const PageTransition& t : plan) {
    EXPECT_EQ(t.op, PageOp::kDrop);
    EXPECT_FALSE(protected_page(t.page, 40, 4, c));
  }
  EXPECT_TRUE(plan_step(KvPolicy::kFull, c, o.get(40, 4), pages).empty());
}

TEST(SemanticPlanner, H2OKeepsTheMostRelevantPagesWithinItsBudget) {
  const SemanticConfig c = small_config();
  std::vector<PageEntry> pages(10);
  for (int i = 0; i < 10; ++i) pages[i].relevance = 0.1f * i;
  pages[3].relevance = 0.95f;
  Obs o = uniform(40, 4, 1.f);
  // Budget of 8 tokens = 2 pages among the candidates 1..7: pages 3 (0.95) and 7 (0.7).
  SemanticConfig h = c;
  h.heavy_tokens = 8;
  auto plan = plan_step(KvPolicy::kH2O, h, o.get(40, 4), pages);
  std::vector<int> dropped;
  for (const PageTransition& t : plan) {
    EXPECT_EQ(t.op, PageOp::kDrop);
    dropped.push_back(t.page);
  }
  std::sort(dropped.begin(), dropped.end());
  EXPECT_EQ(dropped, (std::vector<int>{1, 2, 4, 5, 6}));
  // A budget that is not a whole number of pages keeps the pages that cover it (rounded up):
  // 5 tokens keep 2 pages, 1 token keeps 1 (before, 1 page and none: H2O became streaming).
  for (const auto& [tokens, kept] : {std::pair{5, 2}, std::pair{1, 1}, std::pair{0, 0}}) {
    h.heavy_tokens = tokens;
    EXPECT_EQ(plan_step(KvPolicy::kH2O, h, o.get(40, 4), pages).size(), 7u - kept) << tokens;
  }
}

}  // namespace
}  // namespace kvsplit::cuts::semantic
