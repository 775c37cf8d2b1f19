#include "cuts/semantic/semantic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/config_rules.h"

namespace kvsplit::cuts::semantic {
namespace {

using kernels::KvPrecision;
using kv::PageOp;
using kv::PageTransition;
using kvsplit::RecallPrecision;

float bound_of(const StepObservation& obs, int page) {
  return static_cast<size_t>(page) < obs.page_bound.size() ? obs.page_bound[page] : 0.f;
}

KvPrecision rung_of(RecallPrecision p) {
  switch (p) {
    case RecallPrecision::kFull:
      return KvPrecision::kFull;
    case RecallPrecision::kInt8:
      return KvPrecision::kInt8;
    case RecallPrecision::kInt4:
      return KvPrecision::kInt4;
  }
  return KvPrecision::kFull;
}

// Recalls the evicted pages `called` (ascending) at config.recall_precision; with
// max_recalls_per_step, only that many: the highest bounds, newer pages first among equals.
void recall_called(const SemanticConfig& c, const StepObservation& obs, std::vector<int> called,
                   std::vector<PageTransition>* out) {
  const size_t cap = static_cast<size_t>(c.max_recalls_per_step);
  if (cap > 0 && called.size() > cap) {
    std::stable_sort(called.begin(), called.end(), [&](int a, int b) {
      const float ba = bound_of(obs, a), bb = bound_of(obs, b);
      return ba != bb ? ba > bb : a > b;
    });
    called.resize(cap);
    std::sort(called.begin(), called.end());
  }
  for (int i : called) out->push_back({i, PageOp::kRestore, rung_of(c.recall_precision)});
}

}  // namespace

Status validate(const SemanticConfig& c, const std::string& path) {
  return validate_semantic_cut(c, path);
}

StatusOr<KvPolicy> parse_kv_policy(const std::string& name) {
  return kvsplit::parse_kv_policy(name);
}

const char* kv_policy_name(KvPolicy policy) { return kvsplit::kv_policy_name(policy); }

bool protected_page(int page, int kv_len, int block_size, const SemanticConfig& config) {
  const int64_t begin = int64_t{page} * block_size, end = begin + block_size;
  if (end > kv_len) return true;                                  // partial (the one being written)
  if (begin < config.sink_tokens) return true;                    // attention sinks
  if (end > int64_t{kv_len} - config.recent_tokens) return true;  // recent window
  return false;
}

void AttentionScorer::score(const StepObservation& obs, const SemanticConfig& config,
                            std::span<kv::PageEntry> pages) {
  const int bs = obs.block_size;
  const int window_begin = std::max(0, obs.kv_len - config.semantic_window);
  for (size_t i = 0; i < pages.size(); ++i) {
    kv::PageEntry& p = pages[i];
    // A recalled page is scored wherever it is (PageEntry::recalled).
    const int begin = std::max(static_cast<int>(i) * bs, p.recalled ? 0 : window_begin);
    const int end = std::min(static_cast<int>(i + 1) * bs, obs.kv_len);
    if (!p.resident() || begin >= end) continue;
    float raw = 0.f;
    for (int t = begin; t < end; ++t) raw = std::max(raw, obs.token_relevance[t]);
    p.relevance = p.rescore ? raw : config.smoothing * raw + (1.f - config.smoothing) * p.relevance;
    p.rescore = false;
  }
}

std::vector<PageTransition> plan_step(KvPolicy policy, const SemanticConfig& c,
                                      const StepObservation& obs, std::span<kv::PageEntry> pages) {
  std::vector<PageTransition> out;
  const int bs = obs.block_size;
  const int n = static_cast<int>(pages.size());
  auto evict = [&](int i) { out.push_back({i, PageOp::kEvict, KvPrecision::kEvicted}); };
  auto drop = [&](int i) { out.push_back({i, PageOp::kDrop, KvPrecision::kEvicted}); };
  switch (policy) {
    case KvPolicy::kFull:
      break;
    case KvPolicy::kStreaming:
      for (int i = 0; i < n; ++i)
        if (pages[i].resident() && !protected_page(i, obs.kv_len, bs, c)) drop(i);
      break;
    case KvPolicy::kH2O: {
      std::vector<int> candidates;
      for (int i = 0; i < n; ++i)
        if (pages[i].resident() && !protected_page(i, obs.kv_len, bs, c)) candidates.push_back(i);
      // The pages that cover heavy_tokens (rounded up: a budget under a page keeps one).
      const size_t keep = static_cast<size_t>((std::max(0, c.heavy_tokens) + bs - 1) / bs);
      if (candidates.size() <= keep) break;
      // Most relevant first; newer pages first among equals.
      std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
        if (pages[a].relevance != pages[b].relevance)
          return pages[a].relevance > pages[b].relevance;
        return a > b;
      });
      for (size_t k = keep; k < candidates.size(); ++k) drop(candidates[k]);
      break;
    }
    case KvPolicy::kSemantic: {
      const int window_begin = std::max(0, obs.kv_len - c.semantic_window);
      std::vector<int> called;  // evicted pages whose bound reaches the recall threshold
      for (int i = 0; i < n; ++i) {
        kv::PageEntry& p = pages[i];
        if (!p.resident()) {
          // An evicted page: its summary's bound says a query could attend to it. One whose
          // recall is in flight is on its way: it takes none of max_recalls_per_step's places.
          if (p.summary >= 0 && !p.restoring && bound_of(obs, i) >= c.recall_threshold)
            called.push_back(i);
          continue;
        }
        if (p.precision != KvPrecision::kFull && p.relevance >= c.recall_threshold) {
          // A quantized page is still read, so its measured relevance (not the looser bound)
          // brings it back to full precision.
          out.push_back({i, PageOp::kRestore, KvPrecision::kFull});
          continue;
        }
        if (protected_page(i, obs.kv_len, bs, c)) continue;
        if ((i + 1) * bs <= window_begin && !p.recalled) continue;  // not scored this step
        p.very_low_steps = p.relevance < c.evict_threshold ? p.very_low_steps + 1 : 0;
        p.low_steps = p.relevance < c.semantic_threshold ? p.low_steps + 1 : 0;
        if (p.very_low_steps >= c.evict_after_steps) {
          evict(i);
        } else if (p.low_steps >= c.demote_after_steps && p.precision != KvPrecision::kInt4) {
          const KvPrecision to =
              p.precision == KvPrecision::kFull ? KvPrecision::kInt8 : KvPrecision::kInt4;
          out.push_back({i, PageOp::kDemote, to});
          p.low_steps = 0;
        }
      }
      recall_called(c, obs, std::move(called), &out);
      break;
    }
  }
  return out;
}

}  // namespace kvsplit::cuts::semantic
