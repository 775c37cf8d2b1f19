#include "sched/sequence_cut.h"

#include <algorithm>

#include "common/check.h"

namespace kvsplit::sched {

using cuts::semantic::KvPolicy;

void SequenceCutStats::add(const SequenceCutStats& o) {
  ops.add(o.ops);
  steps += o.steps;
  scored_steps += o.scored_steps;
  resident_fraction_sum += o.resident_fraction_sum;
  peak_resident_fraction = std::max(peak_resident_fraction, o.peak_resident_fraction);
}

SequenceCut::SequenceCut(KvPolicy policy, const cuts::semantic::SemanticConfig& config,
                         std::unique_ptr<cuts::semantic::RelevanceScorer> scorer)
    : policy_(policy),
      config_(config),
      scorer_(scorer ? std::move(scorer) : std::make_unique<cuts::semantic::AttentionScorer>()) {}

void SequenceCut::prepare(model::SeqStep& step, int block_size) {
  scored_ = false;
  if (policy_ != KvPolicy::kSemantic && policy_ != KvPolicy::kH2O) return;
  // The first decode step is scored, then every score_interval-th.
  if (stats_.steps % config_.score_interval != 0) return;
  const int kv_len = step.start_pos + static_cast<int>(step.tokens.size());
  const int pages = kv::BlockTable::blocks_for(kv_len, block_size);
  relevance_.assign(static_cast<size_t>(pages) * block_size, 0.f);
  bound_.assign(static_cast<size_t>(pages), 0.f);
  step.token_relevance = relevance_.data();
  step.page_bound = bound_.data();
  scored_ = true;
}

Status SequenceCut::finish(kv::KvPool& pool, kv::BlockTable& table, int kv_len,
                           kv::PageOpStats* totals) {
  const int bs = pool.block_size();
  ++stats_.steps;
  if (policy_ != KvPolicy::kFull && (scored_ || policy_ == KvPolicy::kStreaming)) {
    if (table.pages.empty()) table.pages.resize(table.blocks.size());
    cuts::semantic::StepObservation obs;
    obs.kv_len = kv_len;
    obs.block_size = bs;
    if (scored_) {
      obs.token_relevance = relevance_;
      obs.page_bound = bound_;
      scorer_->score(obs, config_, table.pages);
      ++stats_.scored_steps;
    }
    const std::vector<kv::PageTransition> plan =
        cuts::semantic::plan_step(policy_, config_, obs, table.pages);
    kv::PageOpStats ops;
    const Status applied = kv::apply_page_transitions(pool, table, kv_len, plan, &ops);
    stats_.ops.add(ops);
    if (totals != nullptr) totals->add(ops);
    KVSPLIT_RETURN_IF_ERROR(applied);
  }
  scored_ = false;
  const int64_t full = static_cast<int64_t>(kv::BlockTable::blocks_for(kv_len, bs)) *
                       pool.page_layer_bytes(kernels::KvPrecision::kFull) * pool.shape().num_layers;
  const double fraction =
      full > 0 ? static_cast<double>(kv::resident_bytes(pool, table)) / static_cast<double>(full)
               : 1.0;
  stats_.resident_fraction_sum += fraction;
  stats_.peak_resident_fraction = std::max(stats_.peak_resident_fraction, fraction);
  return ok_status();
}

void SequenceCut::size_tiers(KvPolicy policy, const cuts::semantic::SemanticConfig& sc,
                             int max_pages, int64_t full_page_bytes, kv::KvPoolConfig* config) {
  KVSPLIT_CHECK(config != nullptr);
  if (policy != KvPolicy::kSemantic) return;  // the baselines drop pages and keep nothing
  config->summary_slots = max_pages;
  const int64_t host =
      std::min<int64_t>(sc.host_capacity_mb << 20, int64_t{max_pages} * full_page_bytes);
  config->host_bytes = host;
  config->int8_blocks = max_pages;
  config->int4_blocks = max_pages;
}

}  // namespace kvsplit::sched
