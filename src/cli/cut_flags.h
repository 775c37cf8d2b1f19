// The KV-cut flags of `kvsplit generate` and `kvsplit perplexity` (names are a contract):
// --kv-policy full|semantic|streaming|h2o, --kv-cache-compression semantic_v2 (= semantic),
// the semantic cut's thresholds and windows, and --prefill N.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cuts/semantic/semantic.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::cli {

struct CutFlags {
  std::string kv_policy = "full";
  std::string kv_cache_compression;  // "" or semantic_v2
  cuts::semantic::SemanticConfig semantic;
  std::string recall_precision = "full";  // CLI-checked: full | int8 | int4
  int prefill = 0;  // > 0: prefill this many tokens, feed the rest one per decode step
};

void add_cut_options(CLI::App* app, CutFlags& flags);
// Warns on stderr about the cut flags given on `app` that `policy` does not read: the ladder's
// (thresholds, recall, summaries) under any policy but semantic, the scoring ones
// (--semantic-window, --score-interval) under full and streaming, the sinks and recent window
// under full, --heavy-tokens under any policy but h2o.
void warn_ignored_cut_flags(const CLI::App& app, cuts::semantic::KvPolicy policy);

struct ResolvedCut {
  cuts::semantic::KvPolicy policy = cuts::semantic::KvPolicy::kFull;
  cuts::semantic::SemanticConfig semantic;
  int prefill = 0;
};

// kInvalidArgument naming the flag for a bad value or a conflicting pair (--summary-parts must
// divide block_size, the command's --block-size).
StatusOr<ResolvedCut> resolve_cut(const CutFlags& flags, int block_size);

}  // namespace kvsplit::cli
