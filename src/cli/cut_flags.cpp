#include "cli/cut_flags.h"

#include <spdlog/spdlog.h>

#include "common/cli_options.h"

namespace kvsplit::cli {

void add_cut_options(CLI::App* app, CutFlags& f) {
  cuts::semantic::SemanticConfig& s = f.semantic;
  app->add_option("--kv-policy", f.kv_policy,
                  "KV policy: full (default), semantic (the precision ladder with recall), "
                  "streaming (StreamingLLM: sinks + recent), h2o (sinks + recent + heavy hitters)")
      ->check(CLI::IsMember({"full", "semantic", "streaming", "h2o"}));
  app->add_option("--kv-cache-compression", f.kv_cache_compression,
                  "semantic_v2: the semantic cut (same as --kv-policy semantic)")
      ->check(CLI::IsMember({"semantic_v2", "none"}));
  app->add_option("--semantic-threshold", s.semantic_threshold,
                  "demote a page one rung after its relevance stays below this, [0, 1]")
      ->capture_default_str();
  app->add_option("--evict-threshold", s.evict_threshold,
                  "evict a page after its relevance stays below this, [0, 1]")
      ->capture_default_str();
  app->add_option("--recall-threshold", s.recall_threshold,
                  "restore a page when its summary bound reaches this, [0, 1]")
      ->capture_default_str();
  app->add_option("--recall-precision", f.recall_precision,
                  "rung an evicted page comes back at when its bound calls it: full, or int8 / "
                  "int4 (requantized from the host original; full once its relevance reaches "
                  "--recall-threshold)")
      ->check(CLI::IsMember({"full", "int8", "int4"}))
      ->capture_default_str();
  app->add_option("--max-recalls-per-step", s.max_recalls_per_step,
                  "evicted pages recalled per sequence and scored step, highest bound first "
                  "(0: no limit)")
      ->capture_default_str();
  app->add_option("--recall-wait-ms", s.recall_wait_ms,
                  "how long a step waits for a recalled page's asynchronous copy before running "
                  "without it (< 0: until it lands)")
      ->capture_default_str();
  app->add_option("--demote-after-steps", s.demote_after_steps,
                  "scored steps below --semantic-threshold before a demotion")
      ->capture_default_str();
  app->add_option("--evict-after-steps", s.evict_after_steps,
                  "scored steps below --evict-threshold before an eviction")
      ->capture_default_str();
  app->add_option("--semantic-window", s.semantic_window, "most recent tokens scored")
      ->capture_default_str();
  app->add_option("--sink-tokens", s.sink_tokens, "first tokens never degraded")
      ->capture_default_str();
  app->add_option("--recent-tokens", s.recent_tokens, "last tokens never degraded")
      ->capture_default_str();
  app->add_option("--score-interval", s.score_interval, "decode steps between scorings")
      ->capture_default_str();
  app->add_option("--host-capacity-mb", s.host_capacity_mb,
                  "host tier for full-precision originals (MiB)")
      ->capture_default_str();
  app->add_option("--summary-parts", s.summary_parts,
                  "parts each page's key summary covers it in (a tighter recall bound for that "
                  "many times the summary bytes); divides --block-size")
      ->capture_default_str();
  app->add_option("--heavy-tokens", s.heavy_tokens,
                  "h2o: tokens kept beyond sinks and recent ones (the most relevant pages)")
      ->capture_default_str();
  app->add_option("--prefill", f.prefill,
                  "prefill the first N tokens, then feed the rest one per decode step (0: all)")
      ->check(kvsplit::kNonNegative);
}

void warn_ignored_cut_flags(const CLI::App& app, cuts::semantic::KvPolicy policy) {
  using cuts::semantic::KvPolicy;
  // The ladder's flags (the semantic cut's alone), the scoring ones (semantic and h2o), the
  // window (every policy but full) and h2o's budget.
  const std::string ladder =
      given_flags(app, {"--semantic-threshold", "--evict-threshold", "--recall-threshold",
                        "--recall-precision", "--max-recalls-per-step", "--recall-wait-ms",
                        "--demote-after-steps", "--evict-after-steps", "--summary-parts"});
  const std::string scoring = given_flags(app, {"--semantic-window", "--score-interval"});
  const std::string window = given_flags(app, {"--sink-tokens", "--recent-tokens"});
  const std::string heavy = given_flags(app, {"--heavy-tokens"});
  std::string ignored;
  auto add = [&](const std::string& flags) {
    if (!flags.empty()) ignored += (ignored.empty() ? "" : ", ") + flags;
  };
  if (policy != KvPolicy::kSemantic) add(ladder);
  if (policy != KvPolicy::kSemantic && policy != KvPolicy::kH2O) add(scoring);
  if (policy == KvPolicy::kFull) add(window);
  if (policy != KvPolicy::kH2O) add(heavy);
  if (!ignored.empty())
    spdlog::warn("{}: no effect with --kv-policy {}", ignored,
                 cuts::semantic::kv_policy_name(policy));
}

StatusOr<ResolvedCut> resolve_cut(const CutFlags& f, int block_size) {
  ResolvedCut r;
  KVSPLIT_ASSIGN_OR_RETURN(r.policy, cuts::semantic::parse_kv_policy(f.kv_policy));
  if (f.kv_cache_compression == "semantic_v2") {
    if (r.policy != cuts::semantic::KvPolicy::kFull &&
        r.policy != cuts::semantic::KvPolicy::kSemantic) {
      return invalid_argument("--kv-cache-compression semantic_v2 conflicts with --kv-policy " +
                              f.kv_policy);
    }
    r.policy = cuts::semantic::KvPolicy::kSemantic;
  }
  // "none" asks for full KV, as kv.kv_cache_compression: none does in the YAML.
  if (f.kv_cache_compression == "none" && r.policy != cuts::semantic::KvPolicy::kFull) {
    return invalid_argument("--kv-cache-compression none conflicts with --kv-policy " +
                            f.kv_policy);
  }
  if (Status st = cuts::semantic::validate(f.semantic, "--"); !st.ok()) {
    // The field as its flag: --semantic_threshold -> --semantic-threshold.
    std::string msg = st.message();
    for (size_t i = 0; i < msg.size() && msg[i] != ':'; ++i)
      if (msg[i] == '_') msg[i] = '-';
    return invalid_argument(msg);
  }
  if (block_size > 0 && block_size % f.semantic.summary_parts != 0) {
    return invalid_argument("--summary-parts " + std::to_string(f.semantic.summary_parts) +
                            " must divide --block-size " + std::to_string(block_size));
  }
  r.semantic = f.semantic;
  const std::optional<RecallPrecision> rung = parse_recall_precision(f.recall_precision);
  if (!rung) return invalid_argument("--recall-precision must be full, int8 or int4");
  r.semantic.recall_precision = *rung;
  r.prefill = f.prefill;
  return r;
}

}  // namespace kvsplit::cli
