// EngineImpl: the KV cache manager's thread and its actuator (docs/kvm.md). The manager decides;
// this file turns each decision into worker inbox commands (applied between steps) and class
// settings, and never touches KV itself.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/config_rules.h"
#include "common/log.h"
#include "cuts/semantic/semantic.h"
#include "engine/engine_impl.h"
#include "kvm/expr.h"
#include "kvm/rule_engine.h"

namespace kvsplit {
namespace {

constexpr auto kCommandWait = std::chrono::seconds(5);

SwapMode swap_of(double v) {
  const long i = std::lround(v);
  return i == 1 ? SwapMode::kAlways : (i == 2 ? SwapMode::kNever : SwapMode::kAuto);
}

// Host memory copy bandwidth (the CPU backend's link between tiers and shards), bytes/s.
double measure_copy_bandwidth() {
  constexpr size_t kBytes = 16u << 20;
  std::vector<char> a(kBytes, 1), b(kBytes);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), kBytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(kBytes) / s);
    a[static_cast<size_t>(r)] = b[kBytes - 1 - static_cast<size_t>(r)];
  }
  return best;
}

}  // namespace

// The actuator: called by the manager on the KVM thread, with kvm_mu_ held.
class EngineImpl::KvmActuator final : public kvm::Actuator {
 public:
  explicit KvmActuator(EngineImpl* e) : e_(e) {}
  Status apply(const KvmDecision& d) override { return e_->apply_kvm_decision(d); }
  kvm::ParamTable settings() override { return e_->kvm_baseline(); }

 private:
  EngineImpl* e_;
};

kvm::ParamTable EngineImpl::kvm_baseline() const {
  kvm::ParamTable t;
  kvm::set_semantic_params(&t, "", kvm_semantic_);
  t.set("swap", "", static_cast<double>(kvm_temporal_.swap));
  t.set("temporal_step_size", "", kvm_temporal_.temporal_step_size);
  t.set("spatial_min_context", "", spatial_min_context_.load());
  t.set("max_num_seqs", "", config_.max_num_seqs);
  t.set("max_chunk_tokens", "", config_.max_chunk_tokens);
  t.set("max_chunk_ms", "", config_.max_chunk_ms);
  for (const SlaClass& c : router_->classes()) {
    if (c.semantic) kvm::set_semantic_params(&t, c.name, *c.semantic);
    if (c.swap) t.set("swap", c.name, static_cast<double>(*c.swap));
    if (c.temporal_step_size > 0) t.set("temporal_step_size", c.name, c.temporal_step_size);
    t.set("max_queue", c.name, c.max_queue);
  }
  return t;
}

Status EngineImpl::broadcast_command(const sched::WorkerCommand& command, bool decoders_only) {
  std::vector<std::future<sched::CommandReply>> replies;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (decoders_only && workers_[i]->role() == sched::WorkerRole::kPrefill) continue;
    replies.push_back(send_command(i, command));
  }
  Status refused = ok_status();
  Status late = ok_status();
  // One deadline for the whole broadcast: N stalled workers cost kCommandWait, not N times it
  // (the tick holds kvm_mu_, which shutdown and a reload wait for).
  const auto deadline = std::chrono::steady_clock::now() + kCommandWait;
  for (auto& r : replies) {
    if (r.wait_until(deadline) != std::future_status::ready) {
      // Still in its inbox: it applies the command when it reaches it (the promise outlives us).
      if (late.ok())
        late = deadline_exceeded(
            "a worker did not apply the command in time; it applies it at its next step");
      continue;
    }
    const sched::CommandReply reply = r.get();
    if (!reply.status.ok() && refused.ok()) refused = reply.status;
  }
  return refused.ok() ? late : refused;
}

namespace {

// broadcast_command's result when every worker applied the command or will (kDeadlineExceeded:
// one had not replied in time, and applies it at its next step): the engine's view follows.
bool applies_late(const Status& s) { return s.ok() || s.code() == StatusCode::kDeadlineExceeded; }

}  // namespace

Status EngineImpl::apply_kvm_decision(const KvmDecision& d) {
  const std::string& p = d.param;
  std::vector<SlaClass> classes = router_->classes();
  const std::vector<SlaClass> configured = classes;
  SlaClass* cls = nullptr;
  if (!d.sla_class.empty()) {
    for (SlaClass& c : classes) {
      if (c.name == d.sla_class) cls = &c;
    }
    if (cls == nullptr) return not_found("no SLA class '" + d.sla_class + "'");
  }
  // A class's new cut settings reach the router before the workers: a request pulled after this
  // carries them (Router::set_classes gives them to the queued ones, and a decode worker takes
  // them when it admits a handoff), and one pulled before is on a worker the command reaches. A
  // command refused puts the router's classes back.
  auto send_class_command = [&](const sched::WorkerCommand& cmd) {
    router_->set_classes(classes);
    const Status sent = broadcast_command(cmd);
    if (!applies_late(sent)) router_->set_classes(configured);
    return sent;
  };
  // Every setting's own range (kvm::check_setting, shared with `kvsplit policy simulate`); the
  // semantic ones are checked with the configuration they land in, below.
  if (!kvm::param_is_semantic(p)) KVSPLIT_RETURN_IF_ERROR(kvm::check_setting(p, d.after));
  if (kvm::param_is_semantic(p)) {
    if (!kvm::semantic_param_acts(p, config_.kv_policy)) {
      return failed_precondition(p + ": not read under the engine's kv_policy (" +
                                 cuts::semantic::kv_policy_name(config_.kv_policy) + ")");
    }
    // A class's first override starts from the configured settings, not the engine-wide ones of
    // the moment: those may hold another rule's transient value, which the class would keep
    // after that rule restored the engine-wide setting.
    SemanticCutConfig sc = cls ? cls->semantic.value_or(config_.semantic) : kvm_semantic_;
    KVSPLIT_RETURN_IF_ERROR(kvm::set_semantic_param(&sc, p, d.after));
    KVSPLIT_RETURN_IF_ERROR(cuts::semantic::validate(sc, "semantic."));
    sched::SetCutParams cmd;
    cmd.sla_class = d.sla_class;
    cmd.semantic = sc;
    if (cls) {
      cls->semantic = sc;
      return send_class_command(cmd);
    }
    const Status sent = broadcast_command(cmd);
    if (applies_late(sent)) kvm_semantic_ = sc;
    return sent;
  }
  if (p == "swap" || p == "temporal_step_size") {
    sched::SetCutParams cmd;
    cmd.sla_class = d.sla_class;
    if (p == "swap") {
      cmd.swap = swap_of(d.after);
    } else {
      KVSPLIT_ASSIGN_OR_RETURN(
          cmd.temporal_step_size,
          kvm::int_setting(p, d.after, 1, std::numeric_limits<int32_t>::max()));
    }
    if (cls) {
      cmd.inherit = d.inherit;  // the class follows the engine-wide value again
      if (cmd.swap) cls->swap = d.inherit ? std::nullopt : std::optional<SwapMode>(*cmd.swap);
      if (cmd.temporal_step_size) cls->temporal_step_size = d.inherit ? 0 : *cmd.temporal_step_size;
      return send_class_command(cmd);
    }
    const Status sent = broadcast_command(cmd);
    if (!applies_late(sent)) return sent;
    if (cmd.swap) kvm_temporal_.swap = *cmd.swap;
    if (cmd.temporal_step_size) kvm_temporal_.temporal_step_size = *cmd.temporal_step_size;
    return sent;
  }
  if (p == "spatial_min_context") {
    if (config_.spatial.shards <= 1) return failed_precondition("no spatial shards (shards 1)");
    KVSPLIT_ASSIGN_OR_RETURN(const int32_t v,
                             kvm::int_setting(p, d.after, 0, std::numeric_limits<int32_t>::max()));
    spatial_min_context_.store(v);
    return ok_status();
  }
  if (p == "max_num_seqs") {
    sched::SetSchedulerParams cmd;
    KVSPLIT_ASSIGN_OR_RETURN(cmd.max_num_seqs, kvm::int_setting(p, d.after, 1, 65536));
    return broadcast_command(cmd);
  }
  if (p == "max_chunk_tokens") {
    // Every worker that prefills: prefill and colocated workers, and decode workers (recomputes).
    sched::SetSchedulerParams cmd;
    KVSPLIT_ASSIGN_OR_RETURN(cmd.max_chunk_tokens, kvm::int_setting(p, d.after, 0, 1 << 20));
    return broadcast_command(cmd, /*decoders_only=*/false);
  }
  if (p == "max_chunk_ms") {  // the same workers as max_chunk_tokens
    if (!(d.after >= 0 && d.after <= 1e6))
      return invalid_argument(fmt::format("max_chunk_ms: must be in [0, 1e6], got {}", d.after));
    sched::SetSchedulerParams cmd;
    cmd.max_chunk_ms = d.after;
    return broadcast_command(cmd, /*decoders_only=*/false);
  }
  if (p == "max_queue") {
    if (!cls) return invalid_argument("max_queue needs a class");
    KVSPLIT_ASSIGN_OR_RETURN(cls->max_queue, kvm::int_setting(p, d.after, 1, 1000000));
    router_->set_classes(std::move(classes));
    return ok_status();
  }
  if (p == "migrate_to_shard") {
    KVSPLIT_ASSIGN_OR_RETURN(const int32_t pages,
                             kvm::int_setting(p, d.after, 1, std::numeric_limits<int32_t>::max()));
    return migrate_to_emptiest_shard(pages);
  }
  return invalid_argument("unknown parameter '" + p + "'");
}

// One-shot: on each decoding worker with shards, moves up to `max_pages` pages to the shard with
// the most room (free blocks and idle prefix-cache pages), from the sequence with the most pages
// that can move there (full precision on another shard, or in the host tier), else the next.
Status EngineImpl::migrate_to_emptiest_shard(int max_pages) {
  if (config_.spatial.shards <= 1) return failed_precondition("no spatial shards (shards 1)");
  if (max_pages < 1) return invalid_argument("migrate_to_shard: needs a page count >= 1");
  int moved_any = 0;
  std::string why =
      "no decoding worker holds a sequence with pages that can move to its emptiest "
      "shard (full precision elsewhere, or in the host tier)";
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->role() == sched::WorkerRole::kPrefill) continue;
    auto f = send_command(i, sched::SnapshotState{});
    if (f.wait_for(kCommandWait) != std::future_status::ready) continue;
    const sched::WorkerState st = f.get().state;
    if (st.num_shards < 2 || st.shard_available.size() < 2) continue;
    const int to =
        static_cast<int>(std::max_element(st.shard_available.begin(), st.shard_available.end()) -
                         st.shard_available.begin());
    // Up to the value, and no more than the target has room for: a move asked for more than
    // that is refused whole (kv::migrate_pages), so nothing moved while some pages could.
    const int room = st.shard_available[static_cast<size_t>(to)];
    if (room < 1) {
      why = "the emptiest shard of " + st.worker + " has no free block";
      continue;
    }
    auto movable = [&](const sched::SequenceState& s) {
      int n = s.host_pages;
      for (size_t k = 0; k < s.full_pages_per_shard.size(); ++k)
        if (static_cast<int>(k) != to) n += s.full_pages_per_shard[k];
      return n;
    };
    std::vector<const sched::SequenceState*> order;
    for (const sched::SequenceState& s : st.sequences)
      if (movable(s) > 0) order.push_back(&s);
    std::stable_sort(order.begin(), order.end(),
                     [&](const auto* a, const auto* b) { return movable(*a) > movable(*b); });
    // The first max_pages of its pages that can move, wherever they are in the table (its first
    // pages may be on the target). The decision is done only when pages moved.
    for (const sched::SequenceState* cand : order) {
      sched::MigrateKv m;
      m.key = cand->key;
      m.to_shard = to;
      m.max_pages = std::min(max_pages, room);
      m.up_to_room = true;  // the worker may have used some of that room since the snapshot
      const int on_target_before = cand->pages_per_shard[static_cast<size_t>(to)];
      auto r = send_command(i, m);
      if (r.wait_for(kCommandWait) != std::future_status::ready) break;
      const sched::CommandReply reply = r.get();
      if (!reply.status.ok()) {
        why = reply.status.message();
        continue;
      }
      int on_target_after = on_target_before;
      for (const sched::SequenceState& s : reply.state.sequences)
        if (s.key == m.key) on_target_after = s.pages_per_shard[static_cast<size_t>(to)];
      if (on_target_after > on_target_before) {
        ++moved_any;
        break;
      }
      why = "no page of the candidates could move to shard " + std::to_string(to);
    }
  }
  if (moved_any == 0) return failed_precondition("migrate_to_shard: " + why);
  return ok_status();
}

void EngineImpl::start_kvm_locked() {
  kvm_stop_ = false;
  kvm_thread_ = std::thread([this] { kvm_loop(); });
}

void EngineImpl::kvm_loop() {
  const auto start = std::chrono::steady_clock::now();
  // Each worker's link is the host-tier bandwidth it measured for its swap cost model (the real
  // device link on CUDA; PoolStats::kv_link_bytes_per_s, read by the monitor); a worker that
  // measured none is taken to move over a host memory copy, measured here once (what CPU shards
  // and tiers move over).
  kvm::MonitorInputs in;
  in.link_bytes_per_s = measure_copy_bandwidth();
  std::unique_lock<std::mutex> lock(kvm_mu_);
  while (!kvm_stop_) {
    const auto interval = std::chrono::milliseconds(kvm_->config().interval_ms);
    kvm_cv_.wait_for(lock, interval, [&] { return kvm_stop_; });
    if (kvm_stop_) break;
    lock.unlock();
    const EngineStats stats = stats_without_kvm();
    std::vector<KvmLatency> lat;
    {
      std::lock_guard<std::mutex> l(kvm_lat_mu_);
      lat.swap(kvm_latencies_);
    }
    lock.lock();
    if (kvm_stop_) break;
    const double now_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    for (const KvmLatency& l : lat) {
      const double at_ms = std::chrono::duration<double, std::milli>(l.at - start).count();
      kvm_->monitor().latency().add(l.sla_class, at_ms, l.ttft_ms, l.mean_itl_ms);
    }
    kvm_->tick(now_ms, stats, in);
    publish_kvm_stats_locked();
  }
}

void EngineImpl::stop_kvm() {
  {
    std::lock_guard<std::mutex> lock(kvm_mu_);
    kvm_stop_ = true;
    kvm_shut_down_ = true;
  }
  kvm_cv_.notify_all();
  if (kvm_thread_.joinable()) kvm_thread_.join();
}

void EngineImpl::kvm_record_latency(const std::string& sla_class, double ttft_ms,
                                    double mean_itl_ms) {
  std::lock_guard<std::mutex> l(kvm_lat_mu_);
  if (!kvm_enabled_.load(std::memory_order_relaxed)) return;
  kvm_latencies_.push_back({sla_class, ttft_ms, mean_itl_ms, std::chrono::steady_clock::now()});
}

void EngineImpl::publish_kvm_stats_locked() {
  EngineStats p;
  if (kvm_) {
    p.kvm_enabled = true;
    p.kvm = kvm_->last_snapshot();
    p.kvm_decisions.assign(kvm_->recent().begin(), kvm_->recent().end());
    p.kvm_decisions_total = kvm_->decisions_total();
    for (const auto& [key, n] : kvm_->counts()) {
      p.kvm_decision_counts.push_back({key.first, key.second, n});
    }
    for (const auto& [key, v] : kvm_->params().values()) {
      p.kvm_params.push_back({key.first, key.second, v});
    }
    p.kvm_tick_ms_mean = kvm_->ticks() > 0 ? kvm_->tick_ms_total() / kvm_->ticks() : 0;
    p.kvm_actuate_ms_mean = kvm_->ticks() > 0 ? kvm_->actuate_ms_total() / kvm_->ticks() : 0;
  }
  std::lock_guard<std::mutex> lock(kvm_pub_mu_);
  kvm_published_ = std::move(p);
}

void EngineImpl::fill_kvm_stats(EngineStats* s) const {
  // Not kvm_mu_: a tick holds it while its actuator waits (up to kCommandWait) on the workers.
  std::lock_guard<std::mutex> lock(kvm_pub_mu_);
  const EngineStats& p = kvm_published_;
  if (!p.kvm_enabled) return;
  s->kvm_enabled = true;
  s->kvm = p.kvm;
  s->kvm_decisions = p.kvm_decisions;
  s->kvm_decisions_total = p.kvm_decisions_total;
  s->kvm_decision_counts = p.kvm_decision_counts;
  s->kvm_params = p.kvm_params;
  s->kvm_tick_ms_mean = p.kvm_tick_ms_mean;
  s->kvm_actuate_ms_mean = p.kvm_actuate_ms_mean;
}

Status EngineImpl::check_kvm_policy(const KvmConfig& policy,
                                    const std::vector<SlaClass>& classes) const {
  std::vector<std::string> names;
  for (const SlaClass& c : classes) names.push_back(c.name);
  KVSPLIT_RETURN_IF_ERROR(kvm::validate_rules(policy, names));
  // Against the classes it will run with (a reload's new ones), not the start-up config's: a
  // semantic '=' value is checked beside its class's own block.
  EngineConfig with_classes = config_;
  with_classes.sla_classes = classes;
  KVSPLIT_RETURN_IF_ERROR(kvm::validate_rules_for_engine(policy, with_classes));
  if (policy.interval_ms < 10 || policy.interval_ms > 60000) {
    return invalid_argument(
        fmt::format("kvm.interval_ms: must be in [10, 60000], got {}", policy.interval_ms));
  }
  KVSPLIT_RETURN_IF_ERROR(validate_kvm_window(policy));
  return ok_status();
}

Status EngineImpl::update_kvm_policy(KvmConfig policy) {
  std::lock_guard<std::mutex> lock(kvm_mu_);
  // The operator's classes (given_classes_, under kvm_mu_), not the router's, which hold the
  // values the KVM moved.
  KVSPLIT_RETURN_IF_ERROR(check_kvm_policy(policy, given_classes_));
  if (kvm_) {
    kvm_->reload(std::move(policy));
    publish_kvm_stats_locked();
    KVSPLIT_LOG_INFO("kvm: policy reloaded ({} rules, {})", kvm_->config().rules.size(),
                     kvm_->config().mode == KvmMode::kEnforce ? "enforce" : "dry-run");
    return ok_status();
  }
  if (policy.rules.empty()) return ok_status();
  // After shutdown() a manager thread would drive stopped workers, and nothing would join it.
  if (kvm_shut_down_) return unavailable("engine shut down: the KV cache manager cannot start");
  kvm_actuator_ = std::make_unique<KvmActuator>(this);
  kvm_ =
      std::make_unique<kvm::KvCacheManager>(std::move(policy), kvm_baseline(), kvm_actuator_.get());
  {
    std::lock_guard<std::mutex> l(kvm_lat_mu_);
    kvm_enabled_.store(true);
  }
  publish_kvm_stats_locked();
  start_kvm_locked();
  KVSPLIT_LOG_INFO("kvm: started ({} rules, every {} ms)", kvm_->config().rules.size(),
                   kvm_->config().interval_ms);
  return ok_status();
}

}  // namespace kvsplit
