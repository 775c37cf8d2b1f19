// The KVM's rule engine (docs/kvm.md): pure, no threads, no clock of its own. Fed one monitor
// snapshot at a time, it returns the decisions each rule makes under hysteresis (enter / exit
// levels), cooldown and bounds. The caller applies them to its ParamTable (dry-run: it does not,
// so nothing moves and an active rule repeats the same decision every cooldown).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/kvm.h"
#include "kvsplit/status.h"

namespace kvsplit::kvm {

// The current value of every parameter the rules move, per (param, class); class "" is the
// engine-wide setting. A class without its own value reads the global one.
class ParamTable {
 public:
  void set(const std::string& param, const std::string& sla_class, double value);
  double get(const std::string& param, const std::string& sla_class) const;
  bool has(const std::string& param, const std::string& sla_class) const;
  void erase(const std::string& param, const std::string& sla_class);
  const std::map<std::pair<std::string, std::string>, double>& values() const { return values_; }

 private:
  std::map<std::pair<std::string, std::string>, double> values_;
};

// The semantic cut's parameters the rules move (kvm::param_is_semantic), read from `c`.
double semantic_param(const SemanticCutConfig& c, const std::string& param);
// Sets every one of them at (param, sla_class) from `c`.
void set_semantic_params(ParamTable* t, const std::string& sla_class, const SemanticCutConfig& c);
// A rule's value for an integer setting, rounded and checked against [lo, hi] before it is
// narrowed ("name: must be in [lo, hi], got v"): an unbounded "max_queue *= 2" must not wrap.
StatusOr<int32_t> int_setting(const std::string& name, double v, int64_t lo, int64_t hi);
// Sets one semantic parameter of `c` to `v`; an integer one out of its range is an error (a cast
// would wrap it to a value that then passes validation).
Status set_semantic_param(SemanticCutConfig* c, const std::string& param, double v);

// Checks rules: non-empty unique names, `when` and `exit` present with known metrics (a class
// only on a per-class metric, and one of `classes`), `exit` on the same metric as `when` compares
// the other way and does not overlap it (the hysteresis band), known parameters with a class where
// the parameter needs one and none where it is global only, a rule class among `classes`,
// min <= max, cooldown >= 0, and for a parameter with a range of its own (param_range:
// max_chunk_tokens) min, max and an `=` value inside it and min >= 1 on a rule that can lower a
// setting whose 0 means off. Errors (kInvalidArgument) name the rule and the field, e.g.
// "kvm.rules[2] (hot): then: unknown parameter 'semantic_treshold' (known: ...)".
Status validate_rules(const std::vector<KvmRule>& rules, const std::vector<std::string>& classes);
// The same for a policy's rules, naming those read from its rules_file by the file and their index
// there: "kvm.rules_file r.yaml: rules[0] (hot): ...".
Status validate_rules(const KvmConfig& policy, const std::vector<std::string>& classes);
// How errors name rule i of `policy`: "kvm.rules[i] (name)", or for a rule of its rules_file
// "kvm.rules_file <path>: rules[j] (name)".
std::string rule_where(const KvmConfig& policy, size_t i);
// Whether the KV policy reads the semantic parameter `param` (param_is_semantic): semantic reads
// all; h2o its scoring and window (semantic_window, score_interval, recent_tokens); streaming
// recent_tokens; full none. A rule on one the policy does not read would be logged as applied
// and change nothing.
bool semantic_param_acts(std::string_view param, KvPolicy policy);
// Checks that the rules' actions have a cut to act on in `config` (a semantic parameter one the
// policy reads, semantic_param_acts; spatial_min_context and migrate_to_shard need spatial
// shards > 1);
// kInvalidArgument naming the rule. The engine checks this at start and on a policy reload, and
// `kvsplit policy simulate` before it runs.
Status validate_rules_for_engine(const KvmConfig& policy, const EngineConfig& config);

// An exit that keeps the value (exit-keep, a one-shot action's exit, an exit to the value in
// place): it changes nothing, so the engine and the simulator count it applied without acting.
// An exit back to inheriting is never one: the class's own value goes, whatever it was.
inline bool decision_is_no_op(const KvmDecision& d) {
  return d.action == "exit-keep" || (d.action == "exit" && d.before == d.after && !d.inherit);
}

class RuleEngine {
 public:
  explicit RuleEngine(std::vector<KvmRule> rules);

  // Replaces the rules (a policy reload). A rule whose name and text are unchanged keeps its
  // state (active, cooldown); others start inactive.
  void reload(std::vector<KvmRule> rules);
  // The setting (param, sla_class) was replaced from outside (a config reload): active rules on
  // it restore `value` at their exit, or with `inherited` (the class lost its own value and reads
  // the engine-wide one again) the engine-wide value of their exit's moment.
  void rebase(const std::string& param, const std::string& sla_class, double value,
              bool inherited = false);

  // Evaluates every rule in order on `snap` (at snap.time_ms) against `params` and returns the
  // decisions, before/after filled; rule states advance (a rule that enters is active whether or
  // not the caller applies its decision, so a refused action is not retried faster than its
  // cooldown; a rule whose exit is refused stays active and tries the exit again once its cooldown
  // has passed, while `exit` holds). `apply`, when given, is called with each decision as it is
  // made, before the later rules are evaluated, and returns whether the setting now holds d.after:
  // later rules see earlier rules' `after` values of this call only for those (a refused decision's
  // value never took effect). `apply` may add entries to `params` (a class's adopted semantic
  // block): later rules of this call see those too. Without it every decision counts as holding and
  // applied stays false. `configured`, when given, holds the configured engine-wide settings: a
  // class rule on a semantic setting of a class without a semantic block of its own starts from
  // the configured value (the class's new block is built from the configured settings, not from
  // the engine-wide values of the moment) and its exit restores that value.
  std::vector<KvmDecision> evaluate(const KvmSnapshot& snap, const ParamTable& params,
                                    const std::function<bool(KvmDecision&)>& apply = nullptr,
                                    const ParamTable* configured = nullptr);

  struct RuleState {
    bool active = false;
    double last_applied_ms = -1e300;
    double value_at_enter = 0;  // restored on exit
    // A class rule that entered while its class had no value of its own (it read the engine-wide
    // one): its exit restores the engine-wide value of that moment, not the one it read, which
    // may have been another rule's transient change since undone.
    bool inherited = false;
    double exit_since_ms = -1;  // first sample of the current run where `exit` held; -1: none
    bool exit_refused = false;  // its last exit was refused: it stays active and tries again
    int64_t entered = 0;        // order of its enter among all rules' (0: never entered)
    // Its change is in place: its enter or a repeat since was applied (KvmDecision::applied), not
    // only logged in dry-run.
    bool took_effect = false;
  };
  const std::vector<KvmRule>& rules() const { return rules_; }
  const RuleState& state(size_t i) const { return states_[i]; }

 private:
  std::vector<KvmRule> rules_;
  std::vector<RuleState> states_;
  int64_t enters_ = 0;  // enters so far (RuleState::entered)
};

}  // namespace kvsplit::kvm
