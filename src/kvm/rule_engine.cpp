#include "kvm/rule_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "common/config_rules.h"
#include "common/escape.h"
#include "kvm/expr.h"

namespace kvsplit::kvm {
namespace {

std::string q(std::string_view s) {
  std::string out(1, '\'');
  out += escape_for_message(s, 64);
  out += '\'';
  return out;
}

bool is_up(KvmCmp c) { return c == KvmCmp::kGreater || c == KvmCmp::kGreaterEqual; }
bool inclusive(KvmCmp c) { return c == KvmCmp::kGreaterEqual || c == KvmCmp::kLessEqual; }

// A condition's own checks: a known metric, a class only on a per-class metric, a known class.
Status check_condition(const KvmCondition& c, const std::vector<std::string>& classes) {
  if (!is_metric(c.metric)) return invalid_argument("unknown metric " + q(c.metric));
  if (!c.sla_class.empty()) {
    if (!is_class_metric(c.metric))
      return invalid_argument("metric " + q(c.metric) + " is engine-wide and takes no class");
    if (std::find(classes.begin(), classes.end(), c.sla_class) == classes.end())
      return invalid_argument("unknown class " + q(c.sla_class) + " (not in sla_classes)");
  }
  // Fractions: a level outside [0, 1] (a percentage, "device_kv_use > 90") would never fire, or
  // always.
  static constexpr std::string_view kFractions[] = {"device_kv_use",   "host_kv_use",
                                                    "disk_kv_use",     "link_use",
                                                    "prefix_hit_rate", "pages_evicted_fraction"};
  const bool fraction =
      std::find(std::begin(kFractions), std::end(kFractions), c.metric) != std::end(kFractions);
  if (fraction && !(c.value >= 0 && c.value <= 1)) {
    return invalid_argument(
        fmt::format("{} is a fraction in [0, 1], compared with {}", c.metric, c.value));
  }
  // Every metric is >= 0: a negative level is a mistake ("storage_latency_ms < -5" as an exit
  // kept the rule's change for good; write "< 0" for a rule that is meant never to exit).
  if (c.value < 0)
    return invalid_argument(
        fmt::format("{} is never negative, compared with {}", c.metric, c.value));
  return ok_status();
}

// `exit` on the metric of `when` must leave a band between the two levels: both holding at
// once would enter and exit on alternate samples. An exit on another metric (or class) can hold
// together with `when`, which no level check can rule out: such a rule needs a cooldown or a hold
// to pace it.
Status check_hysteresis(const KvmRule& r) {
  const KvmCondition& when = r.when;
  const KvmCondition& exit = r.exit;
  if (when.metric != exit.metric || when.sla_class != exit.sla_class) {
    if (r.cooldown_ms > 0 || r.hold_ms > 0) return ok_status();
    return invalid_argument(fmt::format(
        "'{}' reads another metric than when '{}', so both can hold at once: give cooldown_ms or "
        "hold_ms > 0, or it enters and exits on alternate samples",
        to_string(exit), to_string(when)));
  }
  if (is_up(when.cmp) == is_up(exit.cmp))
    return invalid_argument(fmt::format(
        "'{}' compares the same way as when '{}'; the exit level must be on the other side "
        "(hysteresis)",
        to_string(exit), to_string(when)));
  const bool both_inclusive = inclusive(when.cmp) && inclusive(exit.cmp);
  // Up: when v > a, exit v < b overlap for a < v < b. Down: mirrored.
  const double lo = is_up(when.cmp) ? when.value : exit.value;
  const double hi = is_up(when.cmp) ? exit.value : when.value;
  if (lo < hi || (lo == hi && both_inclusive))
    return invalid_argument(fmt::format(
        "'{}' overlaps when '{}' (both hold at once); the exit level must lie beyond the enter "
        "level (hysteresis)",
        to_string(exit), to_string(when)));
  // Touching levels ("> 0.9" and "<= 0.9") leave no band: a reading that hovers at the level
  // enters and exits on alternate samples unless something paces the rule.
  if (lo == hi && r.cooldown_ms <= 0 && r.hold_ms <= 0)
    return invalid_argument(fmt::format(
        "'{}' meets when '{}' at one level (no band between them): give cooldown_ms or hold_ms "
        "> 0, or move the exit level, or it enters and exits on alternate samples",
        to_string(exit), to_string(when)));
  return ok_status();
}

// Bounds that are set (not the unbounded defaults): the rule's min / max.
bool has_min(const KvmRule& r) { return r.min > -1e299; }
bool has_max(const KvmRule& r) { return r.max < 1e299; }

// Whether a relative action moves its setting down / up (`=` does neither).
bool lowers(const KvmAction& a) {
  return (a.op == KvmActionOp::kSub && a.value > 0) || (a.op == KvmActionOp::kAdd && a.value < 0) ||
         (a.op == KvmActionOp::kMul && a.value < 1);
}
bool raises(const KvmAction& a) {
  return (a.op == KvmActionOp::kSub && a.value < 0) || (a.op == KvmActionOp::kAdd && a.value > 0) ||
         (a.op == KvmActionOp::kMul && a.value > 1);
}

// A parameter with a range of its own (param_range): the rule's min, max and `=` value lie in it,
// and a rule that can lower a setting whose 0 means off keeps min >= 1.
Status check_range(const KvmRule& r) {
  const std::string& p = r.then.param;
  const std::optional<ParamRange> range = param_range(p);
  if (!range) return ok_status();
  auto outside = [&](const char* field, double v) {
    return invalid_argument(
        fmt::format("{}: {} must be in [{}, {}], got {}", field, p, range->lo, range->hi, v));
  };
  if (has_min(r) && (r.min < range->lo || r.min > range->hi)) return outside("min", r.min);
  if (has_max(r) && (r.max < range->lo || r.max > range->hi)) return outside("max", r.max);
  if (r.then.op == KvmActionOp::kSet && (r.then.value < range->lo || r.then.value > range->hi))
    return outside("then", r.then.value);
  if (range->zero_is_off && lowers(r.then) && r.min < 1)
    return invalid_argument(fmt::format(
        "min: '{}' can take {} down to 0, which turns it off; give min >= 1 (turn it off with "
        "'{} = 0')",
        to_string(r.then), p, p));
  return ok_status();
}

Status check_rule(const KvmRule& r, const std::vector<std::string>& classes) {
  auto field = [](const char* f, const Status& s) -> Status {
    return s.ok() ? s : invalid_argument(std::string(f) + ": " + s.message());
  };
  if (r.when.metric.empty()) return invalid_argument("when: required");
  KVSPLIT_RETURN_IF_ERROR(field("when", check_condition(r.when, classes)));
  if (r.exit.metric.empty())
    return invalid_argument("exit: required (the level at which the rule stops: hysteresis)");
  KVSPLIT_RETURN_IF_ERROR(field("exit", check_condition(r.exit, classes)));
  KVSPLIT_RETURN_IF_ERROR(field("exit", check_hysteresis(r)));
  const std::string& p = r.then.param;
  if (p.empty()) return invalid_argument("then: required");
  if (!is_param(p)) return invalid_argument("then: unknown parameter " + q(p));
  if (param_is_named(p) &&
      (r.then.op != KvmActionOp::kSet || !(r.then.value >= 0) ||
       r.then.value > param_name_count(p) - 1 || r.then.value != std::floor(r.then.value)))
    return invalid_argument("then: " + p + " must be set to " + param_names_text(p));
  if (!std::isfinite(r.then.value)) return invalid_argument("then: value must be finite");
  if (r.sla_class.empty() && param_needs_class(p))
    return invalid_argument("class: required: " + p + " is a per-class setting");
  if (!r.sla_class.empty()) {
    if (param_is_global_only(p))
      return invalid_argument("class: " + p + " is engine-wide and takes no class, got " +
                              q(r.sla_class));
    if (std::find(classes.begin(), classes.end(), r.sla_class) == classes.end())
      return invalid_argument("class: unknown class " + q(r.sla_class) + " (not in sla_classes)");
  }
  if (std::isnan(r.min) || std::isnan(r.max) || r.min > r.max)
    return invalid_argument("min: must be <= max, got min " + fmt::format("{}", r.min) +
                            " and max " + fmt::format("{}", r.max));
  // An integer setting is rounded within [min, max] (apply_action): there must be one to land on.
  if (param_is_integer(p) && std::ceil(r.min) > std::floor(r.max))
    return invalid_argument("min: " + p + " is an integer and no integer lies in [" +
                            fmt::format("{}", r.min) + ", " + fmt::format("{}", r.max) + "]");
  KVSPLIT_RETURN_IF_ERROR(check_range(r));
  // What the engine accepts (check_setting), checked here so that `--check-config` refuses a rule
  // the engine would refuse at every application ("max_num_seqs = 0", "migrate_to_shard = 0") or
  // that could only ever be clamped back ("swap = never" with max 0). A bound is checked only on
  // the side the action moves towards: "max_num_seqs += 8" with min 0 never reaches its min.
  auto accepted = [&](const char* f, double v) -> Status {
    const Status st = check_setting(p, v);
    return st.ok() ? st : invalid_argument(std::string(f) + ": " + st.message());
  };
  if (r.then.op == KvmActionOp::kSet) {
    KVSPLIT_RETURN_IF_ERROR(accepted("then", r.then.value));
    if (!param_is_one_shot(p) && (r.then.value < r.min || r.then.value > r.max))
      return invalid_argument(fmt::format(
          "then: '{}' lies {} {}: it would be clamped back at every application", to_string(r.then),
          r.then.value < r.min ? "below min" : "above max", r.then.value < r.min ? r.min : r.max));
  } else if (!param_is_one_shot(p)) {
    if (lowers(r.then) && has_min(r)) KVSPLIT_RETURN_IF_ERROR(accepted("min", r.min));
    if (raises(r.then) && has_max(r)) KVSPLIT_RETURN_IF_ERROR(accepted("max", r.max));
  }
  // An integer setting moved by a fraction: "= 0.3" would round to 0 (for max_recalls_per_step:
  // no limit, the opposite of what the rule means) and "+= 0.4" would never move it.
  if (param_is_integer(p) && r.then.op != KvmActionOp::kMul &&
      r.then.value != std::floor(r.then.value))
    return invalid_argument(
        fmt::format("then: {} is an integer; '{}' needs a whole number", p, to_string(r.then)));
  if (!(r.hold_ms >= 0) || !std::isfinite(r.hold_ms))
    return invalid_argument("hold_ms: must be a finite number >= 0, got " +
                            fmt::format("{}", r.hold_ms));
  if (!(r.cooldown_ms >= 0) || !std::isfinite(r.cooldown_ms))
    return invalid_argument("cooldown_ms: must be a finite number >= 0, got " +
                            fmt::format("{}", r.cooldown_ms));
  return ok_status();
}

bool same(const KvmCondition& a, const KvmCondition& b) {
  return a.metric == b.metric && a.sla_class == b.sla_class && a.cmp == b.cmp && a.value == b.value;
}
bool same(const KvmRule& a, const KvmRule& b) {
  return a.name == b.name && same(a.when, b.when) && same(a.exit, b.exit) &&
         a.then.param == b.then.param && a.then.op == b.then.op && a.then.value == b.then.value &&
         a.sla_class == b.sla_class && a.min == b.min && a.max == b.max &&
         a.cooldown_ms == b.cooldown_ms && a.restore_on_exit == b.restore_on_exit &&
         a.hold_ms == b.hold_ms;
}

// op(before), clamped to [min, max] and to the parameter's own range (param_range); integer
// parameters rounded (staying within the bounds).
double apply_action(const KvmRule& r, double before) {
  // A setting that 0 turns off (max_chunk_tokens: no cap) stays off under +=, -= and *=: no cap
  // is above every value, so a relative step from it is still no cap. Only `=` turns it on.
  if (const std::optional<ParamRange> range = param_range(r.then.param);
      range && range->zero_is_off && before == 0 && r.then.op != KvmActionOp::kSet)
    return 0;
  // Likewise recall_wait_ms < 0 (wait until the copy lands) is above every bounded wait: `*= 2`
  // from it was clamped to 0 (no wait at all) and `+= 5` gave 5 ms. Only `=` bounds it.
  if (r.then.param == "recall_wait_ms" && before < 0 && r.then.op != KvmActionOp::kSet)
    return before;
  double v = before;
  switch (r.then.op) {
    case KvmActionOp::kSet:
      v = r.then.value;
      break;
    case KvmActionOp::kAdd:
      v = before + r.then.value;
      break;
    case KvmActionOp::kSub:
      v = before - r.then.value;
      break;
    case KvmActionOp::kMul:
      v = before * r.then.value;
      break;
  }
  v = std::clamp(v, r.min, r.max);
  if (const std::optional<ParamRange> range = param_range(r.then.param))
    v = std::clamp(v, range->lo, range->hi);  // validate_rules keeps min, max inside it
  if (param_is_integer(r.then.param)) {
    // "*= 0.8" on a small integer (2 -> 1.6) must not round back to where it was, or the rule
    // never moves it: a factor moves an integer by at least one, within the bounds.
    const double rounded = std::round(v);
    if (r.then.op == KvmActionOp::kMul && rounded == before && v != before) {
      const double step = v < before ? before - 1 : before + 1;
      if (check_setting(r.then.param, step).ok()) v = step;
    }
    v = std::round(v);
    if (v > r.max) v = std::floor(r.max);
    if (v < r.min) v = std::ceil(r.min);
  }
  return v;
}

// Whether `c` holds; *monitors: "metric[class]=value" of what it read.
bool fired(const KvmSnapshot& snap, const KvmCondition& c, std::string* monitors) {
  std::string cls;
  const std::optional<double> v = read_metric(snap, c, &cls);
  if (!v) return false;
  double unused = 0;
  if (!holds(snap, c, &unused)) return false;
  *monitors = c.metric + (cls.empty() ? "" : "[" + cls + "]") + "=" + fmt::format("{:.6g}", *v);
  return true;
}

}  // namespace

void ParamTable::set(const std::string& param, const std::string& sla_class, double value) {
  values_[{param, sla_class}] = value;
}

double ParamTable::get(const std::string& param, const std::string& sla_class) const {
  auto it = values_.find({param, sla_class});
  if (it != values_.end()) return it->second;
  if (!sla_class.empty()) {
    it = values_.find({param, std::string()});
    if (it != values_.end()) return it->second;
  }
  return 0;
}

bool ParamTable::has(const std::string& param, const std::string& sla_class) const {
  return values_.count({param, sla_class}) > 0;
}

void ParamTable::erase(const std::string& param, const std::string& sla_class) {
  values_.erase({param, sla_class});
}

double semantic_param(const SemanticCutConfig& c, const std::string& p) {
  if (p == "semantic_threshold") return c.semantic_threshold;
  if (p == "evict_threshold") return c.evict_threshold;
  if (p == "recall_threshold") return c.recall_threshold;
  if (p == "recall_wait_ms") return c.recall_wait_ms;
  if (p == "semantic_window") return c.semantic_window;
  if (p == "recent_tokens") return c.recent_tokens;
  if (p == "max_recalls_per_step") return c.max_recalls_per_step;
  if (p == "recall_precision") return static_cast<double>(c.recall_precision);
  return c.score_interval;  // score_interval
}

void set_semantic_params(ParamTable* t, const std::string& sla_class, const SemanticCutConfig& c) {
  for (std::string_view p : kSemanticParams) {
    const std::string name(p);
    t->set(name, sla_class, semantic_param(c, name));
  }
}

StatusOr<int32_t> int_setting(const std::string& name, double v, int64_t lo, int64_t hi) {
  const double r = std::round(v);
  if (!std::isfinite(r) || r < static_cast<double>(lo) || r > static_cast<double>(hi))
    return invalid_argument(fmt::format("{}: must be in [{}, {}], got {}", name, lo, hi, v));
  return static_cast<int32_t>(r);
}

Status set_semantic_param(SemanticCutConfig* c, const std::string& p, double v) {
  if (p == "semantic_threshold") c->semantic_threshold = static_cast<float>(v);
  if (p == "evict_threshold") c->evict_threshold = static_cast<float>(v);
  if (p == "recall_threshold") c->recall_threshold = static_cast<float>(v);
  if (p == "recall_wait_ms") c->recall_wait_ms = v;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (p == "semantic_window") {
    KVSPLIT_ASSIGN_OR_RETURN(c->semantic_window, int_setting(p, v, 0, kMax));
  }
  if (p == "recent_tokens") {
    KVSPLIT_ASSIGN_OR_RETURN(c->recent_tokens, int_setting(p, v, 0, kMax));
  }
  if (p == "recall_precision") {
    int32_t rung = 0;
    KVSPLIT_ASSIGN_OR_RETURN(rung, int_setting(p, v, 0, param_name_count(p) - 1));
    c->recall_precision = static_cast<RecallPrecision>(rung);
  }
  if (p == "max_recalls_per_step") {
    KVSPLIT_ASSIGN_OR_RETURN(c->max_recalls_per_step, int_setting(p, v, 0, kMax));
  }
  if (p == "score_interval") {
    KVSPLIT_ASSIGN_OR_RETURN(c->score_interval, int_setting(p, v, 1, kMax));
  }
  return ok_status();
}

std::string rule_where(const KvmConfig& policy, size_t i) {
  const std::string name = " (" + escape_for_message(policy.rules[i].name, 64) + ")";
  if (!policy.rules_file.empty() && i >= policy.file_rules_begin) {
    return "kvm.rules_file " + escape_for_message(policy.rules_file) + ": rules[" +
           std::to_string(i - policy.file_rules_begin) + "]" + name;
  }
  return "kvm.rules[" + std::to_string(i) + "]" + name;
}

Status validate_rules(const std::vector<KvmRule>& rules, const std::vector<std::string>& classes) {
  KvmConfig policy;
  policy.rules = rules;
  return validate_rules(policy, classes);
}

Status validate_rules(const KvmConfig& policy, const std::vector<std::string>& classes) {
  const std::vector<KvmRule>& rules = policy.rules;
  std::set<std::string> names;
  for (size_t i = 0; i < rules.size(); ++i) {
    const KvmRule& r = rules[i];
    const std::string where = rule_where(policy, i) + ": ";
    if (r.name.empty()) return invalid_argument(where + "name: must not be empty");
    if (!valid_config_name(r.name))
      return invalid_argument(where + "name: must be 1..64 characters of [A-Za-z0-9_.-]");
    if (!names.insert(r.name).second)
      return invalid_argument(where + "name: duplicate rule name " + q(r.name));
    const Status s = check_rule(r, classes);
    if (!s.ok()) return invalid_argument(where + s.message());
  }
  return ok_status();
}

RuleEngine::RuleEngine(std::vector<KvmRule> rules)
    : rules_(std::move(rules)), states_(rules_.size()) {}

void RuleEngine::reload(std::vector<KvmRule> rules) {
  std::vector<RuleState> states(rules.size());
  for (size_t j = 0; j < rules.size(); ++j) {
    for (size_t i = 0; i < rules_.size(); ++i) {
      if (same(rules_[i], rules[j])) {
        states[j] = states_[i];
        break;
      }
    }
  }
  rules_ = std::move(rules);
  states_ = std::move(states);
}

void RuleEngine::rebase(const std::string& param, const std::string& sla_class, double value,
                        bool inherited) {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (states_[i].active && rules_[i].then.param == param && rules_[i].sla_class == sla_class) {
      states_[i].value_at_enter = value;
      states_[i].inherited = inherited;
    }
  }
}

std::vector<KvmDecision> RuleEngine::evaluate(const KvmSnapshot& snap, const ParamTable& params,
                                              const std::function<bool(KvmDecision&)>& apply,
                                              const ParamTable* configured) {
  ParamTable local = params;  // later rules see earlier rules' `after` (when it holds)
  std::vector<KvmDecision> out;
  const double now = snap.time_ms;
  for (size_t i = 0; i < rules_.size(); ++i) {
    const KvmRule& r = rules_[i];
    RuleState& st = states_[i];
    const bool one_shot = param_is_one_shot(r.then.param);
    // A one-shot action has no setting: it starts from 0 each time and nothing is stored.
    double current = one_shot ? 0 : local.get(r.then.param, r.sla_class);
    // Returns whether the setting now holds `after` (see `apply`).
    auto emit = [&](const char* action, double after, std::string monitors, bool inherit = false) {
      KvmDecision d;
      d.time_ms = now;
      d.rule = r.name;
      d.action = action;
      d.param = r.then.param;
      d.sla_class = r.sla_class;
      d.before = current;
      d.after = after;
      d.inherit = inherit;
      d.monitors = std::move(monitors);
      out.push_back(std::move(d));
      const bool holds = !apply || apply(out.back());
      if (!one_shot && holds) {
        if (inherit) {
          local.erase(r.then.param, r.sla_class);
        } else {
          local.set(r.then.param, r.sla_class, after);
        }
      }
      // Settings `apply` added to `params` (a class's first semantic setting lists the class's
      // whole block) are what later rules start from.
      if (apply && holds) {
        for (const auto& [key, value] : params.values()) {
          if (!local.has(key.first, key.second)) local.set(key.first, key.second, value);
        }
      }
      return holds;
    };
    std::string monitors;
    if (!st.active) {
      // The cooldown counts from the last application, an enter before an exit included: a
      // monitor swinging across both levels must not enter and exit at every sample.
      if (now - st.last_applied_ms < r.cooldown_ms) continue;
      if (!fired(snap, r.when, &monitors)) continue;
      st.active = true;
      st.exit_since_ms = -1;
      st.exit_refused = false;
      st.inherited = !one_shot && !r.sla_class.empty() && !local.has(r.then.param, r.sla_class);
      // A class's first semantic setting gives it a whole block built from the configured
      // settings: the rule starts from the configured value and its exit restores it. Read from
      // the engine-wide value of the moment (another rule's transient change, maybe), the class
      // kept that value for good after both rules exited.
      if (st.inherited && configured != nullptr && param_is_semantic(r.then.param) &&
          configured->has(r.then.param, std::string())) {
        current = configured->get(r.then.param, std::string());
        st.inherited = false;
      }
      st.value_at_enter = current;
      st.last_applied_ms = now;
      st.entered = ++enters_;
      emit("enter", apply_action(r, current), std::move(monitors));
      st.took_effect = out.back().applied;
      continue;
    }
    if (fired(snap, r.exit, &monitors)) {
      if (st.exit_since_ms < 0) st.exit_since_ms = now;
      if (now - st.exit_since_ms < r.hold_ms) continue;  // dwell: not long enough yet
      // A refused exit is tried again, no faster than the cooldown.
      if (st.exit_refused && now - st.last_applied_ms < r.cooldown_ms) continue;
      st.active = false;
      st.exit_since_ms = -1;
      bool restore = r.restore_on_exit && !one_shot;
      // Rules on one setting stack: a rule that entered after this one and is still active
      // started from this one's value. It takes over this one's value at enter, and the setting
      // keeps its value now; the last of them to exit restores the value before them all.
      // Restoring here would undo its change too, and its own exit would then put back ours.
      if (restore) {
        RuleState* later = nullptr;
        for (size_t k = 0; k < rules_.size(); ++k) {
          RuleState& o = states_[k];
          if (k == i || !o.active || !rules_[k].restore_on_exit || o.entered < st.entered) continue;
          if (rules_[k].then.param != r.then.param || rules_[k].sla_class != r.sla_class) continue;
          if (later == nullptr || o.entered < later->entered) later = &o;
        }
        if (later != nullptr) {
          later->value_at_enter = st.value_at_enter;
          later->inherited = st.inherited;
          // Unless this one's change is in place and the later one's is not (it entered in
          // dry-run after a switch from enforce, or its enter was refused): its exit may never
          // be applied, so this one restores now (it used to keep the setting, and the change
          // stayed for good).
          restore = !later->took_effect && st.took_effect;
        }
      }
      const double restored =
          st.inherited ? local.get(r.then.param, std::string()) : st.value_at_enter;
      const bool restored_holds =
          emit(restore ? "exit" : "exit-keep", restore ? restored : current, std::move(monitors),
               restore && st.inherited && !param_is_semantic(r.then.param));
      // Refused (another rule's value makes the restore invalid, a worker refused it): the rule
      // stays active with its change in place, else nothing would ever restore it and its next
      // enter would stack on it. exit-keep changes nothing, so it always holds.
      if (!restored_holds) {
        st.active = true;
        st.exit_since_ms = now - r.hold_ms;  // the dwell is served
        st.exit_refused = true;
        st.last_applied_ms = now;
      }
      continue;
    }
    st.exit_since_ms = -1;  // the exit run is broken
    st.exit_refused = false;
    if (now - st.last_applied_ms < r.cooldown_ms) continue;
    if (!fired(snap, r.when, &monitors)) continue;  // in the band: hold
    const double after = apply_action(r, current);
    if (after == current) continue;  // at a bound
    st.last_applied_ms = now;
    emit("repeat", after, std::move(monitors));
    st.took_effect = st.took_effect || out.back().applied;
  }
  return out;
}

bool semantic_param_acts(std::string_view param, KvPolicy policy) {
  switch (policy) {
    case KvPolicy::kSemantic:
      return true;
    case KvPolicy::kH2O:
      return param == "semantic_window" || param == "score_interval" || param == "recent_tokens";
    case KvPolicy::kStreaming:
      return param == "recent_tokens";
    default:
      return false;
  }
}

Status validate_rules_for_engine(const KvmConfig& policy, const EngineConfig& config) {
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    const KvmRule& r = policy.rules[i];
    const std::string where = rule_where(policy, i) + ": then";
    if (param_is_semantic(r.then.param) && !semantic_param_acts(r.then.param, config.kv_policy)) {
      return invalid_argument(
          where + ": " + r.then.param + " is not read under kv.policy " +
          kv_policy_name(config.kv_policy) +
          (config.kv_policy == KvPolicy::kFull
               ? " (the semantic cut is off: kv.kv_cache_compression semantic_v2, or kv.policy "
                 "semantic)"
               : " (semantic reads every semantic parameter; h2o semantic_window, "
                 "score_interval and recent_tokens; streaming recent_tokens)"));
    }
    if (param_is_semantic(r.then.param)) {
      // The value it sets, or the bound it moves towards, in the semantic block it lands in as
      // configured (the class's own, else the engine-wide one): "evict_threshold = 0.9" beside a
      // semantic_threshold of 0.15 passed --check-config and was refused at every swing.
      SemanticCutConfig sc = config.semantic;
      for (const SlaClass& c : config.sla_classes) {
        if (!r.sla_class.empty() && c.name == r.sla_class && c.semantic) sc = *c.semantic;
      }
      std::vector<std::pair<const char*, double>> values;
      if (r.then.op == KvmActionOp::kSet) values.emplace_back("then", r.then.value);
      if (r.then.op != KvmActionOp::kSet && lowers(r.then) && has_min(r))
        values.emplace_back("min", r.min);
      if (r.then.op != KvmActionOp::kSet && raises(r.then) && has_max(r))
        values.emplace_back("max", r.max);
      for (const auto& [field, v] : values) {
        SemanticCutConfig moved = sc;
        Status st = set_semantic_param(&moved, r.then.param, v);
        if (st.ok()) st = validate_semantic_cut(moved, "kv.cuts.semantic.");
        if (!st.ok())
          return invalid_argument(rule_where(policy, i) + ": " + field + ": " + r.then.param + " " +
                                  fmt::format("{}", v) +
                                  " is refused beside the configured settings: " + st.message());
      }
    }
    if ((r.then.param == "spatial_min_context" || r.then.param == "migrate_to_shard") &&
        config.spatial.shards <= 1) {
      return invalid_argument(where + ": " + r.then.param + " needs kv.cuts.spatial.shards > 1");
    }
  }
  return ok_status();
}

}  // namespace kvsplit::kvm
