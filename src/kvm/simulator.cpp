#include "kvm/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "kvm/simulator_model.h"

namespace kvsplit::kvm {

namespace sim_detail {

// The most KVM samples a trace's arrivals may span (simulate's bound).
constexpr double kMaxTicks = 1e7;

StatusOr<SimResult> Sim::run() {
  const size_t nc = c_.sla_classes.size();
  if (nc == 0) return invalid_argument("sla_classes: at least one class is needed");
  std::map<std::string, int> class_index;
  std::vector<std::string> names;
  for (size_t k = 0; k < nc; ++k) {
    const SlaClass& sc = c_.sla_classes[k];
    class_index[sc.name] = static_cast<int>(k);
    names.push_back(sc.name);
    SimClassResult cr;
    cr.name = sc.name;
    cr.max_ttft_ms = sc.max_ttft_ms;
    cr.max_itl_ms = sc.max_itl_ms;
    res_.classes.push_back(cr);
  }
  if (c_.block_size < 1) return invalid_argument("block_size: must be >= 1");
  ttft_.resize(nc);
  itl_.resize(nc);
  queued_per_class_.assign(nc, 0);
  reqs_.resize(trace_.size());
  for (size_t i = 0; i < trace_.size(); ++i) {
    const TraceRequest& t = trace_[i];
    const std::string where = "trace" + (t.line > 0 ? " line " + std::to_string(t.line)
                                                    : " request " + std::to_string(i + 1));
    int cls = 0;
    if (!t.sla_class.empty()) {
      auto it = class_index.find(t.sla_class);
      if (it == class_index.end()) {
        std::string known;
        for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
        return invalid_argument(where + ": class: unknown SLA class '" + t.sla_class +
                                "' (the config has: " + known + ")");
      }
      cls = it->second;
    }
    if (t.prompt_tokens < 1 || t.output_tokens < 1 || !(t.arrival_ms >= 0))
      return invalid_argument(where +
                              ": prompt_tokens, output_tokens must be >= 1, arrival_ms >= 0");
    Req& r = reqs_[i];
    r.t = &t;
    r.cls = cls;
    r.priority = c_.sla_classes[cls].priority;
    r.prompt = t.prompt_tokens;
    r.output = t.output_tokens;
    if (p_.max_context > 1) {  // as bench_serving_offline fits a trace to the model's context
      res_.over_context += r.prompt + r.output - 1 > p_.max_context;
      r.prompt = std::clamp<int64_t>(r.prompt, 1, p_.max_context - 1);
      r.output = std::clamp<int64_t>(r.output, 1, std::max<int64_t>(1, p_.max_context - r.prompt));
    }
    r.target = r.prompt;
    res_.classes[cls].requests++;
  }
  order_.resize(trace_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int>(i);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int a, int b) { return trace_[a].arrival_ms < trace_[b].arrival_ms; });
  remaining_ = static_cast<int64_t>(trace_.size());

  // The parameters the rules move, at their configured values.
  set_semantic_params(&params_, "", c_.semantic);
  params_.set("temporal_step_size", "", c_.temporal.temporal_step_size);
  params_.set("swap", "",
              static_cast<double>(c_.temporal.swap == SwapMode::kAuto     ? 0
                                  : c_.temporal.swap == SwapMode::kAlways ? 1
                                                                          : 2));
  params_.set("spatial_min_context", "", c_.spatial.min_context);
  params_.set("max_num_seqs", "", c_.max_num_seqs);
  params_.set("max_chunk_tokens", "", c_.max_chunk_tokens);
  params_.set("max_chunk_ms", "", c_.max_chunk_ms);
  params_.set("migrate_to_shard", "", 0);
  for (const SlaClass& sc : c_.sla_classes) {
    params_.set("max_queue", sc.name, sc.max_queue);
    if (sc.semantic) set_semantic_params(&params_, sc.name, *sc.semantic);
    if (sc.swap) {
      params_.set("swap", sc.name,
                  *sc.swap == SwapMode::kAuto     ? 0
                  : *sc.swap == SwapMode::kAlways ? 1
                                                  : 2);
    }
    if (sc.temporal_step_size > 0)
      params_.set("temporal_step_size", sc.name, sc.temporal_step_size);
  }
  const bool kvm_on = c_.kvm.enabled && !c_.kvm.rules.empty();
  if (kvm_on) {
    KVSPLIT_RETURN_IF_ERROR(validate_rules(c_.kvm, names));
    KVSPLIT_RETURN_IF_ERROR(validate_rules_for_engine(c_.kvm, c_));
    rules_ = std::make_unique<RuleEngine>(c_.kvm.rules);
  }

  // Workers' KV (as the engine sizes its pools): kv_blocks_per_worker full-precision blocks, or
  // kv_capacity_bytes / block bytes; with the semantic cut and kv_quant_fraction, that budget split
  // between the full pool and the int8 / int4 arenas with their key summaries
  // (SequenceCut::split_budget); without it, the arenas come on top, one page per block. The
  // spatial cut's shards multiply it all.
  const double bb = block_bytes();
  const auto cap_bytes = static_cast<double>(c_.kv_capacity_bytes);
  int64_t blocks = c_.kv_blocks_per_worker > 0 ? c_.kv_blocks_per_worker
                                               : static_cast<int64_t>(std::floor(cap_bytes / bb));
  int64_t arena8 = 0, arena4 = 0;
  if (c_.kv_policy == KvPolicy::kSemantic) {
    arena8 = arena4 = blocks;
    if (c_.kv_quant_fraction > 0 && c_.kv_blocks_per_worker <= 0) {
      // A key summary: min and max, f16, per kv head and dim and layer and summary part = full
      // bytes per token x 2 / the KV dtype's bytes (f32 on every backend: KvPoolConfig::dtype;
      // bench_engine --write-profile writes the pool's real page bytes) x parts.
      const double dtype_bytes = 4;
      const double summary =
          p_.kv_bytes_per_token_full * 2 / dtype_bytes * c_.semantic.summary_parts;
      const double b8 = c_.block_size * p_.kv_bytes_per_token_int8;
      const double b4 = c_.block_size * p_.kv_bytes_per_token_int4;
      const double quant = std::floor(cap_bytes * c_.kv_quant_fraction);
      blocks = static_cast<int64_t>(std::floor((cap_bytes - quant) / bb));
      arena8 = static_cast<int64_t>(std::floor(quant / 3 / (b8 + summary)));
      arena4 = static_cast<int64_t>(
          std::floor((quant - static_cast<double>(arena8) * (b8 + summary)) / (b4 + 2 * summary)));
    }
  }
  if (blocks < 1)
    return invalid_argument("kv_capacity_bytes: gives no KV block of " +
                            std::to_string(static_cast<int64_t>(bb)) + " bytes");
  if (c_.spatial.shards > 1) {
    blocks *= c_.spatial.shards;
    arena8 *= c_.spatial.shards;
    arena4 *= c_.spatial.shards;
  }
  res_.kv_blocks_per_worker = blocks;
  res_.int8_pages_per_worker = arena8;
  res_.int4_pages_per_worker = arena4;
  const double host = static_cast<double>(c_.temporal.host_capacity_mb) * (1 << 20);
  auto add = [&](Role role, const std::string& name) {
    Worker w;
    w.role = role;
    w.name = name;
    w.total_blocks = w.free_blocks = blocks;
    const bool decodes = role != Role::kPrefill;
    w.free8 = decodes ? arena8 : 0;
    w.free4 = decodes ? arena4 : 0;
    w.host_cap = decodes ? host : 0;
    workers_.push_back(std::move(w));
  };
  if (c_.mode == ServingMode::kColocated) {
    for (int k = 0; k < std::max(1, c_.num_decode_workers); ++k)
      add(Role::kColocated, "colocated-" + std::to_string(k));
  } else {
    for (int k = 0; k < std::max(1, c_.num_prefill_workers); ++k)
      add(Role::kPrefill, "prefill-" + std::to_string(k));
    for (int k = 0; k < std::max(1, c_.num_decode_workers); ++k)
      add(Role::kDecode, "decode-" + std::to_string(k));
  }
  for (Worker& w : workers_) w.now = trace_.empty() ? 0 : trace_[order_[0]].arrival_ms;

  const double interval = std::max(1, c_.kvm.interval_ms);
  // The manager samples from time 0 on, as the engine's does from its start, idle or not: the
  // samples up to the last arrival are bounded, so that a trace with a far-off arrival is a
  // clear error rather than hours of idle samples.
  const double last = trace_.empty() ? 0 : trace_[order_.back()].arrival_ms;
  if (last / interval > kMaxTicks) {
    return invalid_argument("trace: its last arrival at " + std::to_string(last) + " ms is " +
                            std::to_string(last / interval) + " samples of kvm.interval_ms " +
                            std::to_string(c_.kvm.interval_ms) + ", more than " +
                            std::to_string(kMaxTicks) +
                            " (raise interval_ms or shorten the trace)");
  }
  double next_tick = interval;
  int64_t guard = 0;
  double ticks = 0;
  while (remaining_ > 0) {
    if (++guard > 500000000 || res_.steps - progress_step_ > 2000000)
      return internal_error(
          "simulator: no progress (2,000,000 steps without a request finishing; sequences that "
          "preempt each other in a pool too small for them?)");
    size_t wi = 0;
    for (size_t k = 1; k < workers_.size(); ++k) {
      const Worker& a = workers_[k];
      const Worker& b = workers_[wi];
      if (a.now < b.now || (a.now == b.now && !a.idle && b.idle)) wi = k;
    }
    Worker& w = workers_[wi];
    const double t = w.now;
    while (next_arrival_ < static_cast<int64_t>(order_.size()) &&
           trace_[order_[next_arrival_]].arrival_ms <= t) {
      const int i = order_[next_arrival_++];
      Req& r = reqs_[i];
      if (queued_per_class_[r.cls] >= std::max(1.0, param("max_queue", r.cls))) {
        reject(i);
      } else {
        enqueue(i, r.t->arrival_ms);
      }
    }
    while (next_tick <= t && remaining_ > 0) {
      // Steps the profile prices in hours (or an infinite clock) would sample without end. The
      // samples up to the last arrival are bounded above; these are the ones after it.
      if (next_tick > last && ++ticks > kMaxTicks) {
        return invalid_argument(
            "simulator: the simulated run went on for " + std::to_string(kMaxTicks) +
            " samples of kvm.interval_ms after the last arrival, " +
            std::to_string(c_.kvm.interval_ms) + " (its clock at " + std::to_string(t) +
            " ms: a profile's costs too large for the trace? raise interval_ms or check the "
            "profile)");
      }
      tick(next_tick);
      next_tick += interval;
    }
    if (remaining_ == 0) break;
    if (step(w)) {
      w.idle = false;
      continue;
    }
    // Idle: sleep until the next arrival, a handoff landing, or another worker's next step end;
    // with none of those, until new work is queued (wake_sleepers). All asleep: what remains
    // cannot run.
    w.idle = true;
    w.now = std::max(next_wake(w), t);
    bool all_asleep = true;
    for (const Worker& o : workers_) all_asleep &= o.now == kInf;
    if (all_asleep) break;
  }
  // Whatever could not run (nothing left to free room for it) counts as rejected.
  for (Req& r : reqs_) {
    if (r.st != St::kDone && r.st != St::kRejected) r.st = St::kRejected;
  }
  for (size_t k = 0; k < nc; ++k) {
    SimClassResult& cr = res_.classes[k];
    cr.rejected = cr.requests - cr.finished;
    cr.ttft_p50_ms = percentile(ttft_[k], 50);
    cr.ttft_p99_ms = percentile(ttft_[k], 99);
    cr.itl_p50_ms = percentile(itl_[k], 50);
    cr.itl_p99_ms = percentile(itl_[k], 99);
    cr.attainment =
        cr.requests > 0 ? static_cast<double>(cr.met) / static_cast<double>(cr.requests) : 0;
  }
  res_.requests.reserve(reqs_.size());
  for (size_t k = 0; k < order_.size(); ++k) {  // arrival order, as bench_serving_offline's
    const Req& r = reqs_[order_[k]];
    RequestOutcome o;
    o.index = static_cast<int64_t>(k);
    o.arrival_ms = r.t->arrival_ms;
    o.sla_class = c_.sla_classes[r.cls].name;
    o.prompt_tokens = static_cast<int>(r.prompt);
    o.output_tokens = static_cast<int>(r.output);
    o.ok = r.st == St::kDone;
    if (o.ok) {
      o.ttft_ms = r.first_ms - r.t->arrival_ms;
      o.mean_itl_ms =
          r.generated > 1 ? (r.last_ms - r.first_ms) / static_cast<double>(r.generated - 1) : 0;
      o.e2e_ms = r.last_ms - r.t->arrival_ms;
    }
    o.preemptions = r.preemptions;
    res_.requests.push_back(std::move(o));
  }
  res_.mean_device_kv_use =
      res_.samples > 0 ? mean_use_sum_ / static_cast<double>(res_.samples) : 0;
  double busy = 0;
  for (const Worker& w : workers_) busy += w.busy_ms;
  res_.mean_step_ms = res_.steps > 0 ? busy / static_cast<double>(res_.steps) : 0;
  return std::move(res_);
}

}  // namespace sim_detail

StatusOr<SimResult> simulate(const EngineConfig& config, const EngineProfile& profile,
                             const std::vector<TraceRequest>& trace) {
  KVSPLIT_RETURN_IF_ERROR(validate(profile));
  sim_detail::Sim sim(config, profile, trace);
  StatusOr<SimResult> res = sim.run();
  if (!res.ok() || !config.kvm.enabled) return res;
  // The monitors the step model never sets (Sim::sample): a rule on one reads 0 all run long.
  static constexpr std::string_view kUnmodelled[] = {"disk_kv_use",        "link_use",
                                                     "peer_exchange_mb_s", "storage_latency_ms",
                                                     "prefix_hit_rate",    "recall_rate"};
  for (const KvmRule& r : config.kvm.rules) {
    for (const KvmCondition* c : {&r.when, &r.exit}) {
      if (std::find(std::begin(kUnmodelled), std::end(kUnmodelled), c->metric) ==
          std::end(kUnmodelled))
        continue;
      std::string line = "rule '" + r.name + "' reads " + c->metric +
                         ", which the simulator does not model (it reads 0)";
      if (std::find(res->unmodelled.begin(), res->unmodelled.end(), line) == res->unmodelled.end())
        res->unmodelled.push_back(std::move(line));
    }
  }
  return res;
}

std::string sim_result_json(const SimResult& r) {
  nlohmann::json j;
  nlohmann::json classes = nlohmann::json::object();
  for (const SimClassResult& c : r.classes) {
    classes[c.name] = {{"requests", c.requests},       {"finished", c.finished},
                       {"rejected", c.rejected},       {"ttft_p50_ms", c.ttft_p50_ms},
                       {"ttft_p99_ms", c.ttft_p99_ms}, {"itl_p50_ms", c.itl_p50_ms},
                       {"itl_p99_ms", c.itl_p99_ms},   {"attainment", c.attainment},
                       {"max_ttft_ms", c.max_ttft_ms}, {"max_itl_ms", c.max_itl_ms}};
  }
  j["classes"] = std::move(classes);
  nlohmann::json ds = nlohmann::json::array();
  for (const KvmDecision& d : r.decisions) {
    ds.push_back({{"time_ms", d.time_ms},
                  {"rule", d.rule},
                  {"action", d.action},
                  {"param", d.param},
                  {"class", d.sla_class},
                  {"before", d.before},
                  {"after", d.after},
                  {"monitors", d.monitors},
                  {"applied", d.applied}});
  }
  j["decisions"] = std::move(ds);
  j["steps"] = r.steps;
  j["mean_step_ms"] = r.mean_step_ms;
  j["preemptions"] = r.preemptions;
  j["thrashed"] = r.thrashed;
  j["over_context"] = r.over_context;
  j["unmodelled"] = r.unmodelled;
  j["kv_blocks_per_worker"] = r.kv_blocks_per_worker;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvsplit::kvm
