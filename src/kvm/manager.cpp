#include "kvm/manager.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "kvm/expr.h"

namespace kvsplit::kvm {

KvCacheManager::KvCacheManager(KvmConfig config, ParamTable baseline, Actuator* actuator)
    : config_(std::move(config)),
      configured_(baseline),
      params_(std::move(baseline)),
      actuator_(actuator),
      monitor_(config_.window_ms),
      rules_(config_.rules) {
  open_log();
}

void KvCacheManager::open_log() {
  log_file_.close();
  log_file_.clear();
  log_failed_ = false;
  if (config_.decision_log.empty()) return;
  log_file_.open(config_.decision_log, std::ios::app);
  if (!log_file_) {
    log_failed_ = true;
    KVSPLIT_LOG_ERROR("kvm: cannot open the decision log {}; decisions go to the log only",
                      config_.decision_log);
  }
}

void KvCacheManager::reload(KvmConfig config) {
  const bool was_enforcing = config_.mode == KvmMode::kEnforce;
  config_ = std::move(config);
  rules_.reload(config_.rules);
  // Switched to dry-run, the rules still active entered under enforce: their changes are in
  // place, so their exits are still applied (the values come back) and nothing else is. Back to
  // enforce, every rule acts again.
  if (config_.mode == KvmMode::kEnforce) {
    enforced_active_.clear();
  } else {
    std::set<std::string> still;
    for (size_t i = 0; i < rules_.rules().size(); ++i) {
      const std::string& name = rules_.rules()[i].name;
      if (rules_.state(i).active && (was_enforcing || enforced_active_.count(name)))
        still.insert(name);
    }
    enforced_active_ = std::move(still);
  }
  monitor_.latency().set_window_ms(config_.window_ms);
  // Reopened on every reload, the same path too: SIGHUP after a log rotation moves it to the new
  // file, and a log that failed is tried again.
  open_log();
}

void KvCacheManager::rebase_classes(const ParamTable& classes,
                                    const std::set<std::string>& unchanged) {
  std::vector<std::pair<std::string, std::string>> gone;
  for (const auto& entry : params_.values()) {
    const auto& key = entry.first;
    if (!key.second.empty() && !unchanged.count(key.second) && !classes.has(key.first, key.second))
      gone.push_back(key);
  }
  for (const auto& [param, sla_class] : gone) {
    params_.erase(param, sla_class);
    // A semantic setting cannot follow the engine-wide one again (the rule's exit gives the class
    // a block of its own): its exit restores the configured value, as a first enter's would.
    if (param_is_semantic(param) && configured_.has(param, "")) {
      rules_.rebase(param, sla_class, configured_.get(param, ""), /*inherited=*/false);
    } else {
      rules_.rebase(param, sla_class, params_.get(param, ""), /*inherited=*/true);
    }
  }
  for (const auto& [key, value] : classes.values()) {
    if (key.second.empty() || unchanged.count(key.second)) continue;
    params_.set(key.first, key.second, value);
    rules_.rebase(key.first, key.second, value);
  }
}

// A class's first semantic setting gave it a whole semantic block of its own (the engine copies
// the configured one): from then on engine-wide semantic rules no longer reach it, so the table
// lists every semantic parameter of the class, and later decisions start from what it runs.
void KvCacheManager::adopt_class_settings(const std::string& sla_class) {
  const ParamTable in_force = actuator_->settings();
  for (const auto& [key, value] : in_force.values()) {
    if (key.second == sla_class && param_is_semantic(key.first) &&
        !params_.has(key.first, key.second))
      params_.set(key.first, key.second, value);
  }
}

std::vector<KvmDecision> KvCacheManager::tick(double now_ms, const EngineStats& stats,
                                              const MonitorInputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  double actuate_ms = 0;
  last_ = monitor_.sample(now_ms, stats, in);
  // Each decision is applied as it is made: a later rule of this tick starts from what a refused
  // one left in place, not from its `after`. Dry-run: later rules see the values as if applied
  // (what enforce would do), though nothing moves.
  auto apply = [&](KvmDecision& d) {
    const bool no_op = decision_is_no_op(d);
    const bool exits = d.action == "exit" || d.action == "exit-keep";
    const bool enforce =
        config_.mode == KvmMode::kEnforce || (exits && enforced_active_.count(d.rule) > 0);
    if (enforce && no_op) {
      d.applied = true;
    } else if (enforce && actuator_ != nullptr) {
      const auto a0 = std::chrono::steady_clock::now();
      const Status st = actuator_->apply(d);
      actuate_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a0).count();
      // kDeadlineExceeded: a worker had not replied in time but has the command and applies it
      // at its next step, so the setting moves (the table must say so, or the rule's exit would
      // see nothing to restore).
      d.applied = st.ok() || st.code() == StatusCode::kDeadlineExceeded;
      if (!st.ok()) d.error = st.message();
    }
    if (d.applied && d.inherit) {
      params_.erase(d.param, d.sla_class);
    } else if (d.applied && !param_is_one_shot(d.param)) {
      params_.set(d.param, d.sla_class, d.after);
    }
    if (d.applied && actuator_ != nullptr && !d.sla_class.empty() && param_is_semantic(d.param))
      adopt_class_settings(d.sla_class);
    if (exits && d.applied) enforced_active_.erase(d.rule);
    return d.applied || !enforce;
  };
  std::vector<KvmDecision> decisions = rules_.evaluate(last_, params_, apply, &configured_);
  for (KvmDecision& d : decisions) {
    log_decision(d);
    ++counts_[{d.rule, d.action}];
    ++total_;
    recent_.push_back(d);
    if (recent_.size() > 64) recent_.pop_front();
  }
  tick_ms_total_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() -
      actuate_ms;
  actuate_ms_total_ += actuate_ms;
  ++ticks_;
  return decisions;
}

void KvCacheManager::log_decision(const KvmDecision& d) {
  const std::string line = decision_json(d, last_, config_.mode);
  KVSPLIT_LOG_INFO("kvm decision {}", line);
  if (log_file_.is_open()) {
    log_file_ << line << '\n';
    log_file_.flush();
    if (!log_file_) {  // disk full, I/O error: said once, then the server log only
      log_file_.close();
      log_failed_ = true;
      KVSPLIT_LOG_ERROR(
          "kvm: writing the decision log {} failed; decisions go to the log only until a reload",
          config_.decision_log);
    }
  }
}

std::string decision_json(const KvmDecision& d, const KvmSnapshot& snap, KvmMode mode) {
  nlohmann::json j;
  j["time_ms"] = d.time_ms;
  j["mode"] = mode == KvmMode::kEnforce ? "enforce" : "dry-run";
  j["rule"] = d.rule;
  j["action"] = d.action;
  j["param"] = d.param;
  j["class"] = d.sla_class;
  j["before"] = d.before;
  j["after"] = d.after;
  if (d.inherit) j["inherit"] = true;
  j["trigger"] = d.monitors;
  j["monitors"] = {{"device_kv_use", snap.device_kv_use},
                   {"host_kv_use", snap.host_kv_use},
                   {"disk_kv_use", snap.disk_kv_use},
                   {"link_use", snap.link_use},
                   {"peer_exchange_mb_s", snap.peer_exchange_mb_s},
                   {"storage_latency_ms", snap.storage_latency_ms},
                   {"pages_evicted_fraction", snap.pages_evicted_fraction}};
  j["applied"] = d.applied;
  if (!d.error.empty()) j["error"] = d.error;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvsplit::kvm
