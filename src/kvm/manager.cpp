#include "kvm/manager.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "kvm/expr.h"

namespace kvsplit::kvm {

KvCacheManager::KvCacheManager(KvmConfig config, ParamTable baseline, Actuator* actuator)
    : config_(std::move(config)),
      params_(std::move(baseline)),
      actuator_(actuator),
      monitor_(config_.window_ms),
      rules_(config_.rules) {
  if (!config_.decision_log.empty()) {
    log_file_.open(config_.decision_log, std::ios::app);
    if (!log_file_) {
      KVSPLIT_LOG_ERROR("kvm: cannot open the decision log {}; decisions go to the log only",
                        config_.decision_log);
    }
  }
}

void KvCacheManager::reload(KvmConfig config) {
  const std::string old_log = config_.decision_log;
  config_ = std::move(config);
  rules_.reload(config_.rules);
  monitor_.latency().set_window_ms(config_.window_ms);
  if (config_.decision_log != old_log) {
    log_file_.close();
    if (!config_.decision_log.empty()) log_file_.open(config_.decision_log, std::ios::app);
  }
}

void KvCacheManager::rebase_classes(const ParamTable& classes) {
  for (const auto& [key, value] : classes.values()) {
    if (key.second.empty()) continue;
    params_.set(key.first, key.second, value);
    rules_.rebase(key.first, key.second, value);
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
    // An exit that keeps the value (exit-keep, a one-shot action's exit) changes nothing.
    const bool no_op = d.action == "exit-keep" || (d.before == d.after && d.action == "exit");
    if (config_.mode == KvmMode::kEnforce && no_op) {
      d.applied = true;
    } else if (config_.mode == KvmMode::kEnforce && actuator_ != nullptr) {
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
    if (d.applied && !param_is_one_shot(d.param)) params_.set(d.param, d.sla_class, d.after);
    return d.applied || config_.mode != KvmMode::kEnforce;
  };
  std::vector<KvmDecision> decisions = rules_.evaluate(last_, params_, apply);
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
  j["trigger"] = d.monitors;
  j["monitors"] = {{"device_kv_use", snap.device_kv_use},
                   {"host_kv_use", snap.host_kv_use},
                   {"disk_kv_use", snap.disk_kv_use},
                   {"link_use", snap.link_use},
                   {"storage_latency_ms", snap.storage_latency_ms},
                   {"pages_evicted_fraction", snap.pages_evicted_fraction}};
  j["applied"] = d.applied;
  if (!d.error.empty()) j["error"] = d.error;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvsplit::kvm
