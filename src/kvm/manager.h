// The KV cache manager (docs/kvm.md): each tick samples the monitors, runs the rule engine and
// hands every decision to an Actuator (the engine, which turns it into worker inbox commands and
// class settings; the KVM never touches KV itself). It keeps the parameter table, the decision
// log (one JSON line per decision: the log, and a file when configured), counters per (rule,
// action) and the latest decisions. Not thread-safe: one thread ticks it; the engine guards it.
#pragma once

#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvm/monitor.h"
#include "kvm/rule_engine.h"
#include "kvsplit/engine.h"
#include "kvsplit/kvm.h"
#include "kvsplit/status.h"

namespace kvsplit::kvm {

// Applies one decision (enforce mode only); an error leaves the parameter unchanged and is
// recorded in the decision.
class Actuator {
 public:
  virtual ~Actuator() = default;
  virtual Status apply(const KvmDecision& decision) = 0;
  // The settings in force (the baseline's shape: engine-wide and each class's own values). Read
  // after a class's first semantic setting, which gives the class a whole semantic block of its
  // own.
  virtual ParamTable settings() { return {}; }
};

class KvCacheManager {
 public:
  // `baseline`: the current value of every parameter the rules may move (the engine's settings).
  KvCacheManager(KvmConfig config, ParamTable baseline, Actuator* actuator);

  // One sample at `now_ms`: the snapshot, then the decisions (applied in enforce mode).
  std::vector<KvmDecision> tick(double now_ms, const EngineStats& stats, const MonitorInputs& in);
  // A new policy (validated by the caller): rules with unchanged names and text keep their state;
  // the parameter table keeps its values.
  void reload(KvmConfig config);
  // The operator replaced the SLA classes (a config reload): their settings in `classes` (the
  // table's entries with a class) become the current values, and the value an active rule on one
  // of them restores at its exit. A class setting the table has and `classes` lacks (the KVM had
  // given the class its own value; the file gives it none) goes: the class reads the engine-wide
  // value again, as its requests do, and an active rule on it restores the engine-wide value at
  // its exit. Rules keep their state; a repeat starts from the new value. The classes named in
  // `unchanged` (given exactly as before: their entries in `classes` are what the KVM moved) are
  // left alone, so an active rule on one still restores the value from before its enter.
  void rebase_classes(const ParamTable& classes, const std::set<std::string>& unchanged = {});

  Monitor& monitor() { return monitor_; }
  const KvmConfig& config() const { return config_; }
  const ParamTable& params() const { return params_; }
  const KvmSnapshot& last_snapshot() const { return last_; }
  const std::deque<KvmDecision>& recent() const { return recent_; }  // newest last, <= 64
  int64_t decisions_total() const { return total_; }
  // (rule, action) -> decisions, for kvsplit:kvm_decisions_total.
  const std::map<std::pair<std::string, std::string>, int64_t>& counts() const { return counts_; }
  // Time spent in tick() computing (monitors, rules, the decision log), for the overhead figure,
  // and waiting in the actuator (the workers apply commands at their next step boundary; the KVM
  // thread sleeps meanwhile).
  double tick_ms_total() const { return tick_ms_total_; }
  double actuate_ms_total() const { return actuate_ms_total_; }
  int64_t ticks() const { return ticks_; }
  // The decision log cannot be opened, or a write to it failed (disk full, I/O error): decisions
  // go to the server log only until the next reload opens it again. Said once in the log.
  bool decision_log_failed() const { return log_failed_; }

 private:
  void log_decision(const KvmDecision& d);
  void open_log();
  void adopt_class_settings(const std::string& sla_class);

  KvmConfig config_;
  // The settings at construction (the configured ones: nothing had moved them). Its engine-wide
  // semantic values are what a class's first semantic rule starts from (RuleEngine::evaluate).
  const ParamTable configured_;
  ParamTable params_;
  Actuator* actuator_;
  Monitor monitor_;
  RuleEngine rules_;
  KvmSnapshot last_;
  std::deque<KvmDecision> recent_;
  std::map<std::pair<std::string, std::string>, int64_t> counts_;
  int64_t total_ = 0;
  std::ofstream log_file_;
  bool log_failed_ = false;
  double tick_ms_total_ = 0;
  double actuate_ms_total_ = 0;
  int64_t ticks_ = 0;
  // Rules active when the policy was switched from enforce to dry-run: their exits are applied.
  std::set<std::string> enforced_active_;
};

// The decision as one JSON object (the decision log's line), with the key monitors of `snap`.
std::string decision_json(const KvmDecision& d, const KvmSnapshot& snap, KvmMode mode);

}  // namespace kvsplit::kvm
