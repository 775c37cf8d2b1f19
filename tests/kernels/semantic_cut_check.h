// The semantic cut end to end on any Backend (the emulated kernel backend in tests/kernels, the
// CUDA backend in tests/gpu): stories260K greedy generation through sched::generate_batch with the
// cut acting between decode steps. The model forward uploads the page precisions and scoring flags
// to device memory and downloads the side outputs, so this exercises the device data path.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/batch_generate.h"
#include "sched/sequence_cut.h"
#include "test_util.h"

namespace kvsplit::testing {

struct CutModel {
  model::LoadedModel loaded;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<kv::KvPool> pool;
};

// stories260K on `be` with a 16-token-page pool sized for the semantic cut's tiers.
inline std::unique_ptr<CutModel> load_cut_model(backend::Backend& be, const SemanticCutConfig& sc) {
  auto m = std::make_unique<CutModel>();
  model::LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  auto loaded = model::load_model(model_path("stories260K.bin"), lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return nullptr;
  m->loaded = std::move(loaded).value();
  auto model = model::LlamaModel::create(m->loaded, be);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return nullptr;
  m->model = std::move(model).value();
  kv::KvPoolConfig pc;
  pc.num_blocks = 64;
  pc.block_size = 16;
  sched::SequenceCut::size_tiers(cuts::semantic::KvPolicy::kSemantic, sc, pc.num_blocks,
                                 m->model->kv_shape(), &pc);
  auto pool = kv::KvPool::create(be, pc, m->model->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  m->pool = std::move(pool).value();
  return m;
}

inline void expect_cut_pool_empty(const kv::KvPool& pool) {
  EXPECT_EQ(pool.allocator().num_used(), 0);
  EXPECT_EQ(pool.arena_allocator(kernels::KvPrecision::kInt8).num_used(), 0);
  EXPECT_EQ(pool.arena_allocator(kernels::KvPrecision::kInt4).num_used(), 0);
  EXPECT_EQ(pool.summary_allocator().num_used(), 0);
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
}

// Greedy generations of the first `num_seqs` golden prompts (one batch) with the cut on.
inline std::vector<std::vector<int32_t>> generate_with_cut(CutModel& m, const SemanticCutConfig& sc,
                                                           int max_new, size_t num_seqs,
                                                           sched::SequenceCutStats* stats) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  std::vector<sched::GenerationInput> inputs;
  for (size_t i = 0; i < num_seqs && i < cases.size(); ++i) {
    sched::GenerationInput in;
    in.prompt_ids = cases[i]["prompt_token_ids"].get<std::vector<int32_t>>();
    in.params.temperature = 0.f;
    in.params.max_tokens = max_new;
    in.params.ignore_eos = true;
    inputs.push_back(in);
  }
  sched::BatchOptions bo;
  bo.kv_policy = cuts::semantic::KvPolicy::kSemantic;
  bo.semantic = sc;
  bo.cut_stats = stats;
  auto out = sched::generate_batch(*m.model, *m.pool, m.loaded.tokenizer.get(), inputs, bo);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  std::vector<std::vector<int32_t>> ids;
  if (out.ok())
    for (const auto& o : *out) ids.push_back(o.output_ids);
  return ids;
}

// Thresholds 0: every decode step is scored (side outputs) but no page leaves full precision: the
// greedy tokens are the llama2.c goldens'. Returns the cut's counters.
inline sched::SequenceCutStats expect_never_degrading_cut_keeps_goldens(backend::Backend& be) {
  SemanticCutConfig sc;
  sc.semantic_threshold = 0.f;
  sc.evict_threshold = 0.f;
  sc.score_interval = 1;
  sched::SequenceCutStats stats;
  auto m = load_cut_model(be, sc);
  EXPECT_NE(m, nullptr);
  if (!m) return stats;
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  const int max_new = 20;
  const auto ids = generate_with_cut(*m, sc, max_new, 2, &stats);
  EXPECT_EQ(ids.size(), 2u);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<int32_t> golden = cases[i]["output_token_ids"].get<std::vector<int32_t>>();
    golden.resize(std::min<size_t>(golden.size(), max_new));
    EXPECT_EQ(ids[i], golden) << "golden case " << i;
  }
  EXPECT_GT(stats.scored_steps, 10);
  EXPECT_EQ(stats.ops.demoted_to_int8 + stats.ops.demoted_to_int4 + stats.ops.evicted, 0);
  expect_cut_pool_empty(*m->pool);
  return stats;
}

// Greedy generation of one golden prompt (max_new tokens) with cut `sc` on `be` and on the CPU
// backend: the tokens must be equal. Fills *stats (be's) and *cpu_stats; false if a model failed
// to load.
inline bool generate_against_cpu(backend::Backend& be, const SemanticCutConfig& sc, int max_new,
                                 sched::SequenceCutStats* stats, sched::SequenceCutStats* cpu_stats,
                                 std::unique_ptr<CutModel>* model) {
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  auto cpu_model = load_cut_model(*cpu, sc);
  EXPECT_NE(cpu_model, nullptr);
  if (!cpu_model) return false;
  const auto want = generate_with_cut(*cpu_model, sc, max_new, 1, cpu_stats);
  EXPECT_EQ(want.size(), 1u);
  *model = load_cut_model(be, sc);
  EXPECT_NE(*model, nullptr);
  if (!*model) return false;
  const auto got = generate_with_cut(**model, sc, max_new, 1, stats);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].size(), static_cast<size_t>(max_new));
    EXPECT_EQ(got[i], want[i]) << "sequence " << i;
  }
  return true;
}

// An aggressive ladder: every page outside the sink page and the last 16 tokens goes down after
// one low step, and stays down (int8, then int4).
inline SemanticCutConfig aggressive_ladder() {
  SemanticCutConfig sc;
  sc.semantic_threshold = 0.99f;
  sc.evict_threshold = 0.f;
  sc.demote_after_steps = 1;
  sc.recall_threshold = 1.f;
  sc.score_interval = 1;
  sc.sink_tokens = 4;
  sc.recent_tokens = 16;
  return sc;
}

// The aggressive ladder: pages are quantized by `be`'s page ops and read at int8 / int4 by its
// mixed attention; the tokens equal those of the CPU backend running the same cut (and, with
// same_counts, so do the demotion counts: the relevance the ladder sees must agree too).
inline sched::SequenceCutStats expect_forced_demotion_matches_cpu(backend::Backend& be,
                                                                  bool same_counts) {
  const SemanticCutConfig sc = aggressive_ladder();
  // One sequence of 61 positions (sized for the ASan build): page 1 (tokens 16..31) is outside
  // the sink page and the last 16 tokens from position 48 on, and goes to int8, then int4.
  const int max_new = 56;
  sched::SequenceCutStats cpu_stats, stats;
  std::unique_ptr<CutModel> m;
  if (!generate_against_cpu(be, sc, max_new, &stats, &cpu_stats, &m)) return stats;
  EXPECT_GT(stats.ops.demoted_to_int8, 0);
  EXPECT_GT(stats.ops.demoted_to_int4, 0);
  if (same_counts) {
    EXPECT_EQ(stats.ops.demoted_to_int8, cpu_stats.ops.demoted_to_int8);
    EXPECT_EQ(stats.ops.demoted_to_int4, cpu_stats.ops.demoted_to_int4);
  }
  std::printf("%s cut: %lld to int8, %lld to int4, average resident fraction %.3f\n",
              be.name().c_str(), static_cast<long long>(stats.ops.demoted_to_int8),
              static_cast<long long>(stats.ops.demoted_to_int4),
              stats.resident_fraction_sum / std::max<int64_t>(stats.steps, 1));
  EXPECT_GT(stats.steps, 0);
  EXPECT_LT(stats.resident_fraction_sum / std::max<int64_t>(stats.steps, 1),
            0.99);  // 1: none moved
  expect_cut_pool_empty(*m->pool);
  return stats;
}

// Evictions that the bound calls back at int4 (recall_precision int4, at most one per step): the
// recalls requantize the host original with `be`'s copy and quantize ops, and the recalled pages
// are read by its mixed attention; the tokens equal the CPU backend's (with same_counts, so do
// the evictions and recalls). summary_parts: the pools' key summaries are in that many parts
// (summarized by `be`'s page op, bounded by its mixed attention).
inline sched::SequenceCutStats expect_quantized_recall_matches_cpu(backend::Backend& be,
                                                                   bool same_counts,
                                                                   int summary_parts = 1) {
  SemanticCutConfig sc = aggressive_ladder();
  sc.summary_parts = summary_parts;
  sc.evict_threshold = 0.9f;
  sc.evict_after_steps = 1;
  sc.recall_threshold = 0.9f;
  sc.recall_precision = RecallPrecision::kInt4;
  sc.max_recalls_per_step = 1;
  const int max_new = 56;
  sched::SequenceCutStats cpu_stats, stats;
  std::unique_ptr<CutModel> m;
  if (!generate_against_cpu(be, sc, max_new, &stats, &cpu_stats, &m)) return stats;
  EXPECT_GT(stats.ops.evicted, 0);
  EXPECT_GT(stats.ops.restored_quantized, 0);
  if (same_counts) {
    EXPECT_EQ(stats.ops.evicted, cpu_stats.ops.evicted);
    EXPECT_EQ(stats.ops.restored, cpu_stats.ops.restored);
    EXPECT_EQ(stats.ops.restored_quantized, cpu_stats.ops.restored_quantized);
  }
  EXPECT_EQ(m->pool->config().summary_parts, summary_parts);
  std::printf("%s cut: %lld evictions, %lld recalls (%lld at int4)\n", be.name().c_str(),
              static_cast<long long>(stats.ops.evicted), static_cast<long long>(stats.ops.restored),
              static_cast<long long>(stats.ops.restored_quantized));
  expect_cut_pool_empty(*m->pool);
  return stats;
}

}  // namespace kvsplit::testing
