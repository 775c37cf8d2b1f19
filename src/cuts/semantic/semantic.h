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
#include "kvsplit/status.h"

namespace kvsplit::cuts::semantic {

struct SemanticConfig {
  // Relevance below semantic_threshold for demote_after_steps consecutive scored steps: one rung
  // down (full -> int8 -> int4). Below evict_threshold for evict_after_steps: evicted.
  float semantic_threshold = 0.15f;
  float evict_threshold = 0.05f;
  int demote_after_steps = 3;
  int evict_after_steps = 3;
  // Recall to full precision: an evicted page when the upper bound of its relative attention
  // (from its key summary, each scored step) reaches recall_threshold; a quantized page, which is
  // still read and scored, when its relevance does.
  float recall_threshold = 0.5f;
  int semantic_window = 4096;       // tokens scored: the most recent ones (older pages keep state)
  int sink_tokens = 4;              // never degraded: the first tokens ...
  int recent_tokens = 256;          // ... and the last ones
  int score_interval = 4;           // decode steps between scorings (1: every step)
  float smoothing = 0.5f;           // weight of a new score in a page's relevance (EMA), (0, 1]
  int64_t host_capacity_mb = 1024;  // host tier for full-precision originals
};

// kInvalidArgument naming the field (prefixed by `path`, e.g. "cuts.semantic.") for: thresholds
// outside [0, 1], evict_threshold >= semantic_threshold (when both > 0), negative windows or step
// counts, score_interval < 1, smoothing outside (0, 1], host_capacity_mb < 0.
Status validate(const SemanticConfig& config, const std::string& path = "");

// Which policy acts on the pages.
enum class KvPolicy : uint8_t {
  kFull,       // nothing changes
  kSemantic,   // the ladder with recall
  kStreaming,  // StreamingLLM: sinks + recent tokens only, the rest evicted (no recall)
  kH2O,        // H2O: sinks + recent + the heavy_tokens most relevant, rest evicted (no quant)
};
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
class AttentionScorer final : public RelevanceScorer {
 public:
  void score(const StepObservation& obs, const SemanticConfig& config,
             std::span<kv::PageEntry> pages) override;
};

// Plans one scored step of `policy` over a sequence's pages (kv_len tokens written, pages of
// block_size tokens; `pages` has one entry per block, as after scoring). Updates the low-step
// counters of the pages it looks at. heavy_tokens: H2O's budget beyond sinks and recent tokens.
std::vector<kv::PageTransition> plan_step(KvPolicy policy, const SemanticConfig& config,
                                          const StepObservation& obs,
                                          std::span<kv::PageEntry> pages, int heavy_tokens = 0);

// True when page i (of block_size tokens, kv_len written) overlaps the sinks or recent tokens, or
// is not full: it is never degraded.
bool protected_page(int page, int kv_len, int block_size, const SemanticConfig& config);

}  // namespace kvsplit::cuts::semantic
