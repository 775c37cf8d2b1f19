// The split-K planner under the semantic cut (docs/kv-cache.md "Split-K plan"): stories260K greedy
// generation with pages demoted and evicted between decode steps, and a split config under which
// the planner splits the decode calls. Each sequence's splits are sized on the keys attention
// reads (pages not evicted), and the tokens are those of the same run without split-K.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "forwarding_backend.h"
#include "kernels/common/kv_quant.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/batch_generate.h"
#include "sched/sequence_cut.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

constexpr uint8_t kEvicted = static_cast<uint8_t>(kernels::KvPrecision::kEvicted);

// Records every decode call's plan with its kv_lens and page precisions (host memory: the CPU
// backend's arguments).
class PlanRecorder final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  struct Call {
    backend::SplitPlan plan;
    std::vector<int32_t> kv_lens;
    std::vector<uint8_t> precision;  // [num_seqs, max_blocks]; empty: every page full
    int max_blocks = 0;
  };
  std::vector<Call> calls;

  Status attention_decode(const backend::AttentionArgs& a, const backend::SplitPlan& p) override {
    if (a.score_max == nullptr) {  // a scoring-only call repeats its decode call's plan
      Call c{p, std::vector<int32_t>(a.kv_lens, a.kv_lens + a.num_seqs), {}, a.max_blocks_per_seq};
      if (a.page_precision != nullptr)
        c.precision.assign(a.page_precision, a.page_precision + static_cast<size_t>(a.num_seqs) *
                                                                    a.max_blocks_per_seq);
      calls.push_back(std::move(c));
    }
    return ForwardingBackend::attention_decode(a, p);
  }
};

struct Generated {
  std::vector<std::vector<int32_t>> ids;
  std::vector<PlanRecorder::Call> calls;
  sched::SequenceCutStats stats;
};

// Two 120-token prompts, 16 prefilled and the rest fed one token per decode step, then 24 new
// tokens: the cut demotes and evicts from the first steps (every page out of the sink page and
// the last 16 tokens whose relevance is under 0.5). force_chunk_tokens: ForwardOptions'.
Generated generate(int force_chunk_tokens, backend::SplitPlanConfig::Attended attended =
                                               backend::SplitPlanConfig::Attended::kAuto) {
  Generated run;
  auto be = std::make_unique<PlanRecorder>(backend::make_cpu_backend(2));
  model::LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  auto loaded = model::load_model(model_path("stories260K.bin"), lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return run;
  auto lm = model::LlamaModel::create(*loaded, *be);
  EXPECT_TRUE(lm.ok()) << lm.status().to_string();
  if (!lm.ok()) return run;
  SemanticCutConfig sc;
  sc.semantic_threshold = 0.99f;
  sc.evict_threshold = 0.5f;
  sc.recall_threshold = 0.95f;
  sc.demote_after_steps = 1;
  sc.evict_after_steps = 1;
  sc.score_interval = 1;
  sc.sink_tokens = 4;
  sc.recent_tokens = 16;
  kv::KvPoolConfig pc;
  pc.num_blocks = 64;
  pc.block_size = 8;
  sched::SequenceCut::size_tiers(cuts::semantic::KvPolicy::kSemantic, sc, pc.num_blocks,
                                 (*lm)->kv_shape(), &pc);
  auto pool = kv::KvPool::create(*be, pc, (*lm)->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return run;
  std::vector<sched::GenerationInput> inputs(2);
  for (int i = 0; i < 2; ++i) {
    for (int t = 0; t < 120; ++t) inputs[i].prompt_ids.push_back(3 + (t * (7 + i) + i) % 500);
    inputs[i].params.temperature = 0.f;
    inputs[i].params.max_tokens = 24;
    inputs[i].params.ignore_eos = true;
  }
  sched::BatchOptions bo;
  bo.kv_policy = cuts::semantic::KvPolicy::kSemantic;
  bo.semantic = sc;
  bo.prefill_tokens = 16;
  bo.cut_stats = &run.stats;
  bo.forward.split.min_chunk_tokens = 8;      // one page
  bo.forward.split.work_items_per_unit = 64;  // 2 threads: 128 work items wanted
  bo.forward.force_chunk_tokens = force_chunk_tokens;
  bo.forward.split.attended = attended;
  auto out = sched::generate_batch(**lm, **pool, loaded->tokenizer.get(), inputs, bo);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (out.ok())
    for (const auto& o : *out) run.ids.push_back(o.output_ids);
  run.calls = std::move(be->calls);
  return run;
}

TEST(SemanticSplitPlan, SplitsAreSizedOnAttendedPagesAndTokensMatchNoSplit) {
  KVSPLIT_REQUIRE_MODELS();
  const Generated planned = generate(-1);
  ASSERT_EQ(planned.ids.size(), 2u);
  EXPECT_GT(planned.stats.ops.evicted, 20) << "the cut evicted too little: the test shows nothing";
  int split_calls = 0, evicted_rows = 0;
  for (const PlanRecorder::Call& c : planned.calls) {
    const backend::SplitPlan& p = c.plan;
    if (!p.has_splits()) continue;
    ++split_calls;
    for (size_t s = 0; s < c.kv_lens.size(); ++s) {
      const int keys =
          c.precision.empty()
              ? c.kv_lens[s]
              : backend::attended_keys(c.kv_lens[s], 0, 8, {c.precision.data(), c.max_blocks},
                                       static_cast<int>(s));
      evicted_rows += keys < c.kv_lens[s];
      // One split per chunk of attended keys: a split over evicted pages only would read nothing.
      EXPECT_EQ(p.num_splits[s], std::max(1, (keys + p.chunk_tokens - 1) / p.chunk_tokens))
          << "kv_len " << c.kv_lens[s] << ", attended " << keys << ", chunk " << p.chunk_tokens;
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(split_calls, 100);
  EXPECT_GT(evicted_rows, 100) << "few split decode rows had evicted pages: the test shows nothing";

  const Generated unsplit = generate(0);
  for (const PlanRecorder::Call& c : unsplit.calls) ASSERT_FALSE(c.plan.has_splits());
  EXPECT_EQ(planned.ids, unsplit.ids);

  // Sized on kv_len (SplitPlanConfig::Attended::kOff, CUDA's default): rows with evicted pages
  // get the splits of their whole length, more than their attended keys need; the same tokens.
  const Generated by_len = generate(-1, backend::SplitPlanConfig::Attended::kOff);
  int more_splits = 0;
  for (const PlanRecorder::Call& c : by_len.calls) {
    const backend::SplitPlan& p = c.plan;
    EXPECT_TRUE(p.split_begin.empty());
    if (!p.has_splits() || c.precision.empty()) continue;
    for (size_t s = 0; s < c.kv_lens.size(); ++s) {
      const int keys = backend::attended_keys(
          c.kv_lens[s], 0, 8, {c.precision.data(), c.max_blocks}, static_cast<int>(s));
      more_splits += p.num_splits[s] > (keys + p.chunk_tokens - 1) / p.chunk_tokens;
    }
  }
  EXPECT_GT(more_splits, 100);
  EXPECT_EQ(by_len.ids, unsplit.ids);
}

}  // namespace
}  // namespace kvsplit::testing
