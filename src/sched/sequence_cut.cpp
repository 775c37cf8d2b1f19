#include "sched/sequence_cut.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace kvsplit::sched {

using cuts::semantic::KvPolicy;

void SequenceCutStats::add(const SequenceCutStats& o) {
  ops.add(o.ops);
  steps += o.steps;
  scored_steps += o.scored_steps;
  resident_fraction_sum += o.resident_fraction_sum;
  peak_resident_fraction = std::max(peak_resident_fraction, o.peak_resident_fraction);
  for (int r = 0; r < 4; ++r) page_steps[r] += o.page_steps[r];
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
  level_ = kv_level(pool, table, kv_len);
  const double fraction =
      full > 0 ? static_cast<double>(level_.bytes) / static_cast<double>(full) : 1.0;
  stats_.resident_fraction_sum += fraction;
  stats_.page_steps[0] += level_.pages_full;
  stats_.page_steps[1] += level_.pages_int8;
  stats_.page_steps[2] += level_.pages_int4;
  stats_.page_steps[3] += level_.pages_evicted;
  stats_.peak_resident_fraction = std::max(stats_.peak_resident_fraction, fraction);
  return ok_status();
}

Status SequenceCut::settle(kv::KvPool& pool, kv::BlockTable& table,
                           std::chrono::steady_clock::time_point step_start,
                           kv::PageOpStats* totals) {
  if (table.restoring.empty()) return ok_status();
  int64_t wait_us = -1;
  if (config_.recall_wait_ms >= 0) {
    const auto deadline =
        step_start + std::chrono::microseconds(static_cast<int64_t>(config_.recall_wait_ms * 1e3));
    wait_us = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(
                                       deadline - std::chrono::steady_clock::now())
                                       .count());
  }
  kv::PageOpStats ops;
  const Status st = kv::complete_restores(pool, table, wait_us, &ops);
  stats_.ops.add(ops);
  if (totals != nullptr) totals->add(ops);
  return st;
}

Status SequenceCut::settle_all(kv::KvPool& pool, kv::BlockTable& table, kv::PageOpStats* totals) {
  if (table.restoring.empty()) return ok_status();
  kv::PageOpStats ops;
  const Status st = kv::complete_restores(pool, table, -1, &ops);
  stats_.ops.add(ops);
  if (totals != nullptr) totals->add(ops);
  return st;
}

Status SequenceCut::split_budget(const cuts::semantic::SemanticConfig& sc, int64_t capacity_bytes,
                                 double quant_fraction, const kv::KvShape& shape,
                                 kv::KvPoolConfig* config) {
  KVSPLIT_CHECK(config != nullptr);
  if (!(quant_fraction > 0.0 && quant_fraction < 1.0))
    return invalid_argument("kv_quant_fraction must be in (0, 1)");
  const int64_t full = kv::KvPool::block_bytes(*config, shape);
  const kernels::QuantPageLayout ql{shape.num_kv_heads, config->block_size, shape.head_dim,
                                    sc.summary_parts};
  const int64_t layers = shape.num_layers;
  const int64_t summary =
      ql.summary_elems() * static_cast<int64_t>(sizeof(kernels::KvSummaryElem)) * layers;
  const int64_t b8 = ql.bytes(kernels::KvPrecision::kInt8) * layers;
  const int64_t b4 = ql.bytes(kernels::KvPrecision::kInt4) * layers;
  const auto quant = static_cast<int64_t>(static_cast<double>(capacity_bytes) * quant_fraction);
  const int64_t n_full = (capacity_bytes - quant) / full;
  const int64_t n8 = quant / 3 / (b8 + summary);
  // int4 pages and, for each, a summary slot for a page evicted later.
  const int64_t n4 = (quant - n8 * (b8 + summary)) / (b4 + 2 * summary);
  if (n_full < 1 || n8 < 1 || n4 < 1 || n_full + n8 + 2 * n4 > (int64_t{1} << 26)) {
    return invalid_argument("kv_capacity_bytes " + std::to_string(capacity_bytes) +
                            " split by kv_quant_fraction " + std::to_string(quant_fraction) +
                            " gives " + std::to_string(n_full) + " full, " + std::to_string(n8) +
                            " int8 and " + std::to_string(n4) + " int4 pages");
  }
  config->num_blocks = static_cast<int>(n_full);
  config->int8_blocks = static_cast<int>(n8);
  config->int4_blocks = static_cast<int>(n4);
  config->summary_slots = static_cast<int>(n8 + 2 * n4);
  config->summary_parts = sc.summary_parts;
  // Host memory is not the device budget: originals for every page that can leave full.
  config->host_bytes = std::min<int64_t>(sc.host_capacity_mb << 20, (n8 + 2 * n4) * full);
  return ok_status();
}

void SequenceCut::size_tiers(KvPolicy policy, const cuts::semantic::SemanticConfig& sc,
                             int max_pages, const kv::KvShape& shape, kv::KvPoolConfig* config) {
  KVSPLIT_CHECK(config != nullptr);
  const int64_t full_page_bytes = kv::KvPool::block_bytes(*config, shape);
  if (policy != KvPolicy::kSemantic) return;  // the baselines drop pages and keep nothing
  config->summary_slots = max_pages;
  config->summary_parts = sc.summary_parts;
  const int64_t host =
      std::min<int64_t>(sc.host_capacity_mb << 20, int64_t{max_pages} * full_page_bytes);
  config->host_bytes = host;
  config->int8_blocks = max_pages;
  config->int4_blocks = max_pages;
}

}  // namespace kvsplit::sched
