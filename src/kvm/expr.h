// The KVM policy's small expression forms (docs/kvm.md): conditions `metric[class] op number`
// and actions `param op value`. Not a language: one comparison, one assignment.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kvsplit/kvm.h"
#include "kvsplit/status.h"

namespace kvsplit::kvm {

// "device_kv_use > 0.9", "ttft_p99_ms[voice] >= 250". kInvalidArgument naming what is wrong
// (unknown metric, a class on a global metric, a bad number or operator).
StatusOr<KvmCondition> parse_condition(std::string_view text);
// "semantic_threshold += 0.05", "swap = never", "max_num_seqs *= 0.5".
StatusOr<KvmAction> parse_action(std::string_view text);

std::string to_string(const KvmCondition& c);
std::string to_string(const KvmAction& a);

bool is_metric(std::string_view name);
bool is_class_metric(std::string_view name);  // queue_depth, queue_wait_ms, ttft_*, itl_*
bool is_param(std::string_view name);
// Parameters that only make sense per class (max_queue) or only globally (max_num_seqs,
// max_chunk_tokens, max_chunk_ms, spatial_min_context, migrate_to_shard).
bool param_needs_class(std::string_view name);
bool param_is_global_only(std::string_view name);
// The values a parameter can take whatever the rule's bounds (its setting's own range), for the
// parameters that have one: max_chunk_tokens [0, 2^20] and max_chunk_ms [0, 1e6] (0: no cap),
// max_recalls_per_step (0: no limit), recall_wait_ms [0, 60000]. validate_rules checks a rule's
// min, max and `=` value against it, and every action's result is clamped into it.
// zero_is_off: 0 turns the setting off (the opposite of a small value), so a rule that can lower
// it needs min >= 1.
struct ParamRange {
  double lo = 0, hi = 0;
  bool zero_is_off = false;
};
std::optional<ParamRange> param_range(std::string_view name);
// The values the engine accepts for a setting, whatever the rule (the worker's and the config's
// own ranges): semantic thresholds [0, 1], recall_wait_ms [0, 60000] (what a rule may set:
// param_range; the config's "< 0: until it lands" is not a rule's), max_num_seqs [1, 65536],
// max_chunk_tokens [0, 2^20], max_chunk_ms [0, 1e6], max_queue [1, 1e6], swap {0, 1, 2}, the
// other integers [0 or 1,
// 2^31 - 1]. A decision outside it is refused ("<param>: must be in [lo, hi], got v"), by the
// engine (apply_kvm_decision) and by `kvsplit policy simulate` alike.
Status check_setting(std::string_view param, double value);
// The semantic cut's settings (semantic_threshold, evict_threshold, recall_threshold,
// recall_wait_ms, semantic_window, recent_tokens, score_interval, max_recalls_per_step,
// recall_precision).
// The semantic cut's parameters the rules move.
inline constexpr std::string_view kSemanticParams[] = {
    "semantic_threshold", "evict_threshold",      "recall_threshold",
    "recall_wait_ms",     "semantic_window",      "recent_tokens",
    "score_interval",     "max_recalls_per_step", "recall_precision"};
bool param_is_semantic(std::string_view name);
// Integer parameters are rounded after every action (semantic_window, recent_tokens, ...).
bool param_is_integer(std::string_view name);
// migrate_to_shard: an action, not a setting (no value to restore).
bool param_is_one_shot(std::string_view name);
// swap: 0 auto, 1 always, 2 never.
std::optional<double> swap_value(std::string_view name);
// Parameters set by name, value i being the i-th name: swap (auto, always, never) and
// recall_precision (full, int8, int4). param_names_text: "auto, always or never";
// param_name_count: how many names (values 0 .. count - 1), 0 for a numeric parameter.
bool param_is_named(std::string_view name);
int param_name_count(std::string_view name);
std::optional<double> named_value(std::string_view param, std::string_view name);
std::string param_names_text(std::string_view name);

// The value of `c.metric` in `snap` (a class-scoped metric without a class: the worst class, the
// largest value; with a class the snapshot lacks, or no class at all: nullopt, so the condition
// is false). *class_out: the class read ("" for an engine-wide metric).
std::optional<double> read_metric(const KvmSnapshot& snap, const KvmCondition& c,
                                  std::string* class_out = nullptr);
bool holds(const KvmSnapshot& snap, const KvmCondition& c, double* value_out = nullptr);

}  // namespace kvsplit::kvm
