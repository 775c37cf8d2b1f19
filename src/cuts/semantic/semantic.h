// The semantic cut (kv-cuts.md §2): pages are scored for relevance from the attention of decode
// steps; cold pages go down a precision ladder (full -> int8 -> int4 -> evicted, the
// full-precision original kept on the host) and come back when a query needs them again.
//
// Host-side and pure: scoring updates plain page entries, planning returns page transitions that
// the worker owning the pages applies (kv::apply_page_transitions). The two baselines users would
// pick instead (StreamingLLM, H2O) are planners over the same page entries.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/page_entry.h"
#include "kv/page_ops.h"
#include "kvsplit/kv_cuts.h"
#include "kvsplit/status.h"

namespace kvsplit::cuts::semantic {

using SemanticConfig = kvsplit::SemanticCutConfig;
using kvsplit::KvPolicy;

// kInvalidArgument naming the field (prefixed by `path`, e.g. "cuts.semantic.") for: thresholds
// outside [0, 1], evict_threshold >= semantic_threshold (when both > 0), negative windows or step
// counts, score_interval < 1, smoothing outside (0, 1], host_capacity_mb, heavy_tokens or
// max_recalls_per_step < 0, summary_parts outside [1, 1024].
Status validate(const SemanticConfig& config, const std::string& path = "");

StatusOr<KvPolicy> parse_kv_policy(const std::string& name);  // full|semantic|streaming|h2o
const char* kv_policy_name(KvPolicy policy);

// What one scored decode step observed for one sequence (from the attention side outputs).
struct StepObservation {
  // [>= kv_len] max over layers and query heads of exp(z(t) - max_t' z(t')): a token's attention
  // relative to the most attended token (1 = as attended); 0 where the page is evicted.
  std::span<const float> token_relevance;
  // [pages] upper bound of that quantity over a page's tokens from its key summary (pages
  // without a summary: unused).
  std::span<const float> page_bound;
  int kv_len = 0;
  int block_size = 16;
};

// Turns a step's observation into page relevance. The default (AttentionScorer) is attention
// mass; a learned scorer can implement the same interface.
class RelevanceScorer {
 public:
  virtual ~RelevanceScorer() = default;
  // Updates pages[i].relevance of the resident pages that have tokens in the scoring window.
  virtual void score(const StepObservation& obs, const SemanticConfig& config,
                     std::span<kv::PageEntry> pages) = 0;
};

// relevance(page) <- smoothing * max_{t in page, t in window} token_relevance[t]
//                    + (1 - smoothing) * relevance(page)
// except the first score of a page recalled at int8 / int4 (PageEntry::rescore), which replaces
// relevance(page) with max_{t in page} token_relevance[t].
class AttentionScorer final : public RelevanceScorer {
 public:
  void score(const StepObservation& obs, const SemanticConfig& config,
             std::span<kv::PageEntry> pages) override;
};

// Plans one scored step of `policy` over a sequence's pages (kv_len tokens written, pages of
// block_size tokens; `pages` has one entry per block, as after scoring). Updates the low-step
// counters of the pages it looks at. H2O keeps config.heavy_tokens beyond sinks and recent ones.
std::vector<kv::PageTransition> plan_step(KvPolicy policy, const SemanticConfig& config,
                                          const StepObservation& obs,
                                          std::span<kv::PageEntry> pages);

// True when page i (of block_size tokens, kv_len written) overlaps the sinks or recent tokens, or
// is not full: it is never degraded.
bool protected_page(int page, int kv_len, int block_size, const SemanticConfig& config);

}  // namespace kvsplit::cuts::semantic
