// One sequence's KV cut between decode steps: attaches the scoring outputs to the steps that are
// scored, then scores, plans (src/cuts/semantic) and applies the page transitions
// (kv::apply_page_transitions) on the pool that owns the pages. The same object drives
// `kvsplit perplexity`, `kvsplit generate` and a serving worker's sequences.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuts/semantic/semantic.h"
#include "kv/block_allocator.h"
#include "kv/kv_pool.h"
#include "kv/page_ops.h"
#include "model/llama_model.h"
#include "sched/kv_account.h"

namespace kvsplit::sched {

struct SequenceCutStats {
  kv::PageOpStats ops;
  int64_t steps = 0;         // decode steps seen
  int64_t scored_steps = 0;  // of which scored
  // Resident KV bytes over the bytes the same tokens take at full precision, after each step.
  double resident_fraction_sum = 0;
  double peak_resident_fraction = 0;
  // Pages at each rung after each step, summed over the steps (full, int8, int4, evicted): over
  // `steps`, the average number of pages per rung.
  int64_t page_steps[4] = {};
  void add(const SequenceCutStats& o);
};

class SequenceCut {
 public:
  // policy kFull changes nothing (but still counts the resident fraction). The scorer defaults to
  // cuts::semantic::AttentionScorer.
  SequenceCut(cuts::semantic::KvPolicy policy, const cuts::semantic::SemanticConfig& config,
              std::unique_ptr<cuts::semantic::RelevanceScorer> scorer = {});

  // Before a decode step of the sequence: sets step.token_relevance / page_bound when this step is
  // scored (every config.score_interval decode steps). `step` must outlive finish().
  void prepare(model::SeqStep& step, int block_size);
  // After that step (kv_len tokens now written): scores, plans and applies on `table`. The
  // transitions applied (and refused) are counted in stats() and, when given, added to *totals
  // (e.g. a worker's counters over all its sequences).
  Status finish(kv::KvPool& pool, kv::BlockTable& table, int kv_len,
                kv::PageOpStats* totals = nullptr);

  // Before the step that reads `table`: commits the recalls queued by earlier finish() calls
  // whose copies have landed, waiting for them until `step_start` + config.recall_wait_ms (< 0:
  // until they land; kv::complete_restores). Late ones stay queued for a later step. Counted like
  // finish()'s transitions.
  Status settle(kv::KvPool& pool, kv::BlockTable& table,
                std::chrono::steady_clock::time_point step_start,
                kv::PageOpStats* totals = nullptr);
  // Every queued recall lands and is committed (before the table's pages move or are freed).
  Status settle_all(kv::KvPool& pool, kv::BlockTable& table, kv::PageOpStats* totals = nullptr);

  const SequenceCutStats& stats() const { return stats_; }
  // The table's KV level (sched/kv_account.h) after the last finish(), from the same pass over
  // its pages as the resident fraction: the owner's accounting point needs no second pass.
  const KvLevel& level() const { return level_; }
  cuts::semantic::KvPolicy policy() const { return policy_; }
  const cuts::semantic::SemanticConfig& config() const { return config_; }
  // New thresholds / windows from the next step on (the KV cache manager's SetCutParams); pages
  // keep their rung and relevance. The host tier's size is the pool's and does not change.
  void set_config(const cuts::semantic::SemanticConfig& config) { config_ = config; }

  // KvPool tiers the policy needs for `max_pages` pages of one sequence (full pool excluded):
  // fills int8_blocks, int4_blocks, summary_slots and host_bytes of `config`.
  static void size_tiers(cuts::semantic::KvPolicy policy, const cuts::semantic::SemanticConfig& sc,
                         int max_pages, const kv::KvShape& shape, kv::KvPoolConfig* config);

  // One device budget of `capacity_bytes` split between the rungs (kSemantic only): the full pool
  // gets (1 - quant_fraction) of it, the rest holds int8 pages (a third of it) and int4 pages (two
  // thirds), each with its key summary, plus summaries for as many evicted pages as int4 pages.
  // Sets num_blocks, int8_blocks, int4_blocks, summary_slots and host_bytes. kInvalidArgument when
  // a part cannot hold one page.
  static Status split_budget(const cuts::semantic::SemanticConfig& sc, int64_t capacity_bytes,
                             double quant_fraction, const kv::KvShape& shape,
                             kv::KvPoolConfig* config);

 private:
  cuts::semantic::KvPolicy policy_;
  cuts::semantic::SemanticConfig config_;
  std::unique_ptr<cuts::semantic::RelevanceScorer> scorer_;
  bool scored_ = false;
  std::vector<float> relevance_, bound_;
  SequenceCutStats stats_;
  KvLevel level_;
};

}  // namespace kvsplit::sched
