#include "kvm/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "kvm/monitor.h"
#include "kvm/rule_engine.h"

namespace kvsplit::kvm {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Nearest-rank percentile (as the monitors compute theirs).
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

enum class Role : uint8_t { kColocated, kPrefill, kDecode };
enum class St : uint8_t { kPending, kQueued, kRunning, kHandoff, kSwapped, kDone, kRejected };

struct Req {
  const TraceRequest* t = nullptr;
  int cls = 0;
  int priority = 0;
  St st = St::kPending;
  int64_t kv = 0;      // tokens whose KV is held
  int64_t target = 0;  // tokens to prefill before the next token (prompt; prompt + generated
                       // after a recompute)
  int64_t generated = 0;
  double first_ms = -1, last_ms = 0;
  bool started = false;      // admitted at least once (the queue timeout no longer applies)
  int64_t decode_steps = 0;  // decode steps since its KV was (re)built: the demotion age
  double share = 0;          // share of its old pages demoted (the highest threshold seen)
  double evict_share = 0;    // share evicted
  double host_bytes = 0;     // swapped out: bytes in the host tier
  int64_t swapped_step = 0;  // the worker's step count at swap-out
  double ready_ms = 0;       // handoff: when the KV has arrived
  int worker = -1;
};

struct Worker {
  Role role = Role::kColocated;
  std::string name;
  double now = 0;
  bool idle = false;
  int64_t steps = 0;
  std::vector<int> running;  // request indices, in admission order
  std::vector<int> swapped;
  double cap_bytes = 0, host_cap = 0, host_used = 0;
};

class Sim {
 public:
  Sim(const EngineConfig& c, const EngineProfile& p, const std::vector<TraceRequest>& trace)
      : c_(c), p_(p), trace_(trace), window_(c.kvm.window_ms) {}

  StatusOr<SimResult> run();

 private:
  double param(const char* name, int cls) const {
    return params_.get(name, cls < 0 ? std::string() : c_.sla_classes[cls].name);
  }
  double seq_bytes(Req& r, bool update_share);
  double used_bytes(Worker& w) {
    double u = 0;
    for (int i : w.running) u += seq_bytes(reqs_[i], false);
    return u;
  }
  double block_bytes() const { return c_.block_size * p_.kv_bytes_per_token_full; }
  double bytes_for_tokens(int64_t tokens) const {
    const int64_t blocks = (tokens + c_.block_size - 1) / c_.block_size;
    return static_cast<double>(blocks) * block_bytes();
  }
  void enqueue(int i, double now);
  void wake_sleepers(double now);  // workers asleep for want of work look again at `now`
  void reject(int i) {
    reqs_[i].st = St::kRejected;
    remaining_--;
  }
  void finish(int i, double now);
  // Preempts the lowest-priority, latest request running on `w`; returns its freed bytes.
  double preempt_one(Worker& w, double* cost_ms);
  bool step(Worker& w);  // false: nothing to do at w.now
  void tick(double now);
  double next_wake(const Worker& w) const;

  const EngineConfig& c_;
  const EngineProfile& p_;
  const std::vector<TraceRequest>& trace_;
  std::vector<Req> reqs_;
  std::vector<Worker> workers_;
  std::vector<int> queue_;    // queued (not admitted) request indices
  std::vector<int> handoff_;  // disaggregated: prefilled, waiting for a decode worker
  std::vector<int> queued_per_class_;
  ParamTable params_;
  std::unique_ptr<RuleEngine> rules_;
  LatencyWindow window_;
  SimResult res_;
  int64_t remaining_ = 0;
  std::vector<int> order_;  // trace indices by arrival
  int64_t next_arrival_ = 0;
  int64_t swaps_since_tick_ = 0;
  double last_tick_ = 0;
  double mean_use_sum_ = 0;
  std::vector<std::vector<double>> ttft_, itl_;
};

double Sim::seq_bytes(Req& r, bool update_share) {
  // A prompt's pages are reserved whole when it is admitted (as the workers do).
  if (r.kv < r.target) return bytes_for_tokens(r.target);
  const double full = bytes_for_tokens(r.kv);
  if (c_.kv_policy == KvPolicy::kFull || r.generated == 0 || r.kv < r.target) return full;
  const int bs = c_.block_size;
  const int64_t keep =
      c_.semantic.sink_tokens + static_cast<int64_t>(param("recent_tokens", r.cls));
  int64_t eligible = std::max<int64_t>(0, r.kv - keep) / bs * bs;
  const double bf = p_.kv_bytes_per_token_full;
  if (c_.kv_policy == KvPolicy::kStreaming || c_.kv_policy == KvPolicy::kH2O) {
    if (c_.kv_policy == KvPolicy::kH2O)
      eligible = std::max<int64_t>(0, eligible - c_.semantic.heavy_tokens) / bs * bs;
    return full - static_cast<double>(eligible) * bf;
  }
  const int64_t interval =
      std::max<int64_t>(1, static_cast<int64_t>(param("score_interval", r.cls)));
  const int64_t demote_after = std::max<int64_t>(1, c_.semantic.demote_after_steps * interval);
  const int64_t evict_after =
      demote_after + std::max<int64_t>(1, c_.semantic.evict_after_steps * interval);
  if (r.decode_steps < demote_after) return full;
  if (update_share) {
    r.share = std::max(r.share, std::clamp(param("semantic_threshold", r.cls), 0.0, 1.0));
    if (r.decode_steps >= evict_after) {
      r.evict_share =
          std::max(r.evict_share, std::clamp(param("evict_threshold", r.cls), 0.0, r.share));
    }
  }
  const double rung =
      r.decode_steps >= 2 * demote_after ? p_.kv_bytes_per_token_int4 : p_.kv_bytes_per_token_int8;
  const double e = std::min(r.evict_share, r.share);
  return full - static_cast<double>(eligible) * ((r.share - e) * (bf - rung) + e * bf);
}

void Sim::wake_sleepers(double now) {
  for (Worker& w : workers_) {
    if (w.now == kInf) w.now = now;
  }
}

void Sim::enqueue(int i, double now) {
  wake_sleepers(now);
  Req& r = reqs_[i];
  r.st = St::kQueued;
  r.worker = -1;
  if (!r.started) {
    r.ready_ms = now;
  }
  queue_.push_back(i);
  queued_per_class_[r.cls]++;
}

void Sim::finish(int i, double now) {
  Req& r = reqs_[i];
  r.st = St::kDone;
  remaining_--;
  const double ttft = r.first_ms - r.t->arrival_ms;
  const double itl =
      r.generated > 1 ? (r.last_ms - r.first_ms) / static_cast<double>(r.generated - 1) : 0;
  window_.add(c_.sla_classes[r.cls].name, now, ttft, itl);
  ttft_[r.cls].push_back(ttft);
  itl_[r.cls].push_back(itl);
  SimClassResult& cr = res_.classes[r.cls];
  cr.finished++;
  if (ttft <= cr.max_ttft_ms && itl <= cr.max_itl_ms) cr.met++;
  res_.end_ms = std::max(res_.end_ms, now);
}

double Sim::preempt_one(Worker& w, double* cost_ms) {
  // Victim: lowest priority, then the latest arrival.
  size_t vi = 0;
  for (size_t k = 1; k < w.running.size(); ++k) {
    const Req& a = reqs_[w.running[k]];
    const Req& b = reqs_[w.running[vi]];
    if (a.priority < b.priority || (a.priority == b.priority && a.t->arrival_ms >= b.t->arrival_ms))
      vi = k;
  }
  const int i = w.running[vi];
  w.running.erase(w.running.begin() + static_cast<std::ptrdiff_t>(vi));
  Req& r = reqs_[i];
  const double bytes = seq_bytes(r, false);
  res_.preemptions++;
  const int mode = static_cast<int>(param("swap", r.cls));  // 0 auto, 1 always, 2 never
  bool swap = w.host_cap > 0 && mode != 2 && r.generated > 0 && r.kv >= r.target &&
              w.host_used + bytes <= w.host_cap;
  if (swap && mode == 0) {
    const double swap_ms = 2 * bytes / p_.copy_bytes_per_ms;
    const double n = static_cast<double>(r.kv + 1);
    const double recompute_ms =
        n * p_.prefill_ms_per_token + n * n / 2 * p_.prefill_ms_per_kv_token;
    swap = swap_ms < recompute_ms;
  }
  if (swap) {
    r.st = St::kSwapped;
    r.host_bytes = bytes;
    r.swapped_step = w.steps;
    w.host_used += bytes;
    w.swapped.push_back(i);
    *cost_ms += bytes / p_.copy_bytes_per_ms;
    res_.swaps_out++;
    swaps_since_tick_++;
  } else {
    res_.recomputes++;
    r.kv = 0;
    r.target = r.t->prompt_tokens + r.generated;
    r.decode_steps = 0;
    r.share = r.evict_share = 0;
    enqueue(i, w.now);
  }
  return bytes;
}

bool Sim::step(Worker& w) {
  const double now = w.now;
  double cap = w.cap_bytes;
  double used = used_bytes(w);
  double copy_ms = 0;
  const int max_seqs = std::max(1, static_cast<int>(param("max_num_seqs", -1)));
  const bool prefills = w.role != Role::kDecode;
  const bool decodes = w.role != Role::kPrefill;

  // Swapped sequences come back first, after temporal_step_size of this worker's steps.
  for (size_t k = 0; k < w.swapped.size();) {
    Req& r = reqs_[w.swapped[k]];
    const int64_t wait =
        std::max<int64_t>(1, static_cast<int64_t>(param("temporal_step_size", r.cls)));
    if (static_cast<int>(w.running.size()) < max_seqs && w.steps - r.swapped_step >= wait &&
        used + r.host_bytes <= cap) {
      used += r.host_bytes;
      w.host_used -= r.host_bytes;
      copy_ms += r.host_bytes / p_.copy_bytes_per_ms;
      r.st = St::kRunning;
      w.running.push_back(w.swapped[k]);
      w.swapped.erase(w.swapped.begin() + static_cast<std::ptrdiff_t>(k));
      res_.swaps_in++;
      swaps_since_tick_++;
    } else {
      ++k;
    }
  }
  // Admission by class priority, then arrival.
  auto by_priority = [&](int a, int b) {
    const Req& x = reqs_[a];
    const Req& y = reqs_[b];
    if (x.priority != y.priority) return x.priority > y.priority;
    return x.t->arrival_ms < y.t->arrival_ms;
  };
  std::vector<int>& source = prefills ? queue_ : handoff_;
  std::stable_sort(source.begin(), source.end(), by_priority);
  for (size_t k = 0; k < source.size() && static_cast<int>(w.running.size()) < max_seqs;) {
    const int i = source[k];
    Req& r = reqs_[i];
    if (prefills && !r.started && now - r.t->arrival_ms > c_.sla_classes[r.cls].queue_timeout_ms) {
      source.erase(source.begin() + static_cast<std::ptrdiff_t>(k));
      queued_per_class_[r.cls]--;
      reject(i);
      continue;
    }
    if (!prefills && r.ready_ms > now) {
      ++k;
      continue;
    }
    // The prompt's pages, and a watermark of 1% of the pool kept free for the running
    // sequences' growth (Scheduler::can_admit_prompt); a handoff brings its pages.
    const double watermark =
        w.running.empty() ? 0
                          : std::max(1.0, std::floor(cap / block_bytes() / 100)) * block_bytes();
    const double own = prefills ? bytes_for_tokens(r.target) : seq_bytes(r, false);
    const double need = own + watermark;
    if (own > cap) {  // larger than the whole worker: never fits
      source.erase(source.begin() + static_cast<std::ptrdiff_t>(k));
      if (prefills) queued_per_class_[r.cls]--;
      reject(i);
      continue;
    }
    if (used + need > cap) break;  // head-of-line: wait for room
    source.erase(source.begin() + static_cast<std::ptrdiff_t>(k));
    if (prefills) queued_per_class_[r.cls]--;
    used += own;
    r.st = St::kRunning;
    r.started = true;
    r.worker = static_cast<int>(&w - workers_.data());
    w.running.push_back(i);
  }
  if (w.running.empty() && copy_ms == 0) return false;

  // Decode growth: a sequence that starts a new page needs a free one; preempt until it fits
  // (highest priority grows first).
  std::vector<int> order = w.running;
  std::stable_sort(order.begin(), order.end(), by_priority);
  for (int i : order) {
    Req& r = reqs_[i];
    if (r.st != St::kRunning) continue;  // preempted meanwhile
    if (r.kv < r.target || r.kv % c_.block_size != 0) continue;
    if (!decodes) continue;
    while (used + block_bytes() > cap && !w.running.empty()) {
      used -= preempt_one(w, &copy_ms);
      if (r.st != St::kRunning) break;
    }
    if (r.st == St::kRunning) used += block_bytes();
  }
  // The step: prefill chunks under max_batch_tokens, one token per decoding sequence.
  int64_t budget = c_.max_batch_tokens;
  int64_t prefill_tokens = 0, decode_seqs = 0, kv_tokens = 0;
  double prefill_attended = 0;
  std::vector<std::pair<int, int64_t>> chunks;
  std::vector<int> decoding;
  for (int i : w.running) {
    Req& r = reqs_[i];
    if (r.kv < r.target) {
      if (!prefills || budget <= 0) continue;
      const int64_t n = std::min(budget, r.target - r.kv);
      budget -= n;
      prefill_tokens += n;
      prefill_attended += static_cast<double>(n) * (static_cast<double>(r.kv) + n / 2.0);
      chunks.emplace_back(i, n);
    } else if (decodes) {
      decode_seqs++;
      kv_tokens += r.kv;
      decoding.push_back(i);
    }
  }
  if (chunks.empty() && decoding.empty() && copy_ms == 0) return false;
  const double dur = p_.step_ms(static_cast<double>(prefill_tokens), prefill_attended,
                                static_cast<double>(decode_seqs), static_cast<double>(kv_tokens)) +
                     copy_ms;
  const double end = now + dur;
  w.now = end;
  w.steps++;
  res_.steps++;
  auto emit = [&](Req& r) {
    r.generated++;
    if (r.first_ms < 0) r.first_ms = end;
    r.last_ms = end;
  };
  std::vector<int> done;
  for (auto [i, n] : chunks) {
    Req& r = reqs_[i];
    r.kv += n;
    if (r.kv < r.target) continue;
    emit(r);
    if (r.generated >= r.t->output_tokens) {
      done.push_back(i);
    } else if (w.role == Role::kPrefill) {  // hand off to a decode worker
      w.running.erase(std::find(w.running.begin(), w.running.end(), i));
      r.st = St::kHandoff;
      r.ready_ms = end + bytes_for_tokens(r.kv) / p_.copy_bytes_per_ms;
      handoff_.push_back(i);
      wake_sleepers(end);
    }
  }
  for (int i : decoding) {
    Req& r = reqs_[i];
    r.kv++;
    r.decode_steps++;
    emit(r);
    seq_bytes(r, true);  // the cut acts between steps
    if (r.generated >= r.t->output_tokens) done.push_back(i);
  }
  for (int i : done) {
    w.running.erase(std::find(w.running.begin(), w.running.end(), i));
    finish(i, end);
  }
  return true;
}

void Sim::tick(double now) {
  KvmSnapshot s;
  s.time_ms = now;
  int64_t full = 0, q8 = 0, q4 = 0, ev = 0;
  for (Worker& w : workers_) {
    KvmWorkerUse u;
    u.name = w.name;
    u.device_kv_use = w.cap_bytes > 0 ? used_bytes(w) / w.cap_bytes : 0;
    u.host_kv_use = w.host_cap > 0 ? w.host_used / w.host_cap : 0;
    u.shard_use = {u.device_kv_use};
    if (w.role != Role::kPrefill) {
      s.device_kv_use = std::max(s.device_kv_use, u.device_kv_use);
      s.host_kv_use = std::max(s.host_kv_use, u.host_kv_use);
    }
    for (int i : w.running) {
      const Req& r = reqs_[i];
      const int64_t pages = (r.kv + c_.block_size - 1) / c_.block_size;
      const int64_t keep =
          c_.semantic.sink_tokens + static_cast<int64_t>(param("recent_tokens", r.cls));
      const int64_t old = std::max<int64_t>(0, r.kv - keep) / c_.block_size;
      const int64_t e = static_cast<int64_t>(
          std::llround(static_cast<double>(old) * std::min(r.evict_share, r.share)));
      const int64_t d = static_cast<int64_t>(std::llround(static_cast<double>(old) * r.share)) - e;
      full += pages - d - e;
      ev += e;
      const int64_t interval =
          std::max<int64_t>(1, static_cast<int64_t>(param("score_interval", r.cls)));
      (r.decode_steps >= 2 * std::max<int64_t>(1, c_.semantic.demote_after_steps * interval)
           ? q4
           : q8) += d;
    }
    s.workers.push_back(std::move(u));
  }
  s.pages_full = full;
  s.pages_int8 = q8;
  s.pages_int4 = q4;
  s.pages_evicted = ev;
  const int64_t all = full + q8 + q4 + ev;
  s.pages_evicted_fraction = all > 0 ? static_cast<double>(ev) / static_cast<double>(all) : 0;
  const double dt = now - last_tick_;
  s.swap_rate = dt > 0 ? static_cast<double>(swaps_since_tick_) * 1000.0 / dt : 0;
  swaps_since_tick_ = 0;
  last_tick_ = now;
  for (size_t k = 0; k < c_.sla_classes.size(); ++k) {
    KvmClassLatency cl;
    cl.name = c_.sla_classes[k].name;
    cl.queue_depth = queued_per_class_[k];
    window_.fill(now, &cl);
    s.classes.push_back(std::move(cl));
  }
  res_.samples++;
  res_.peak_device_kv_use = std::max(res_.peak_device_kv_use, s.device_kv_use);
  mean_use_sum_ += s.device_kv_use;
  if (!rules_) return;
  for (KvmDecision& d : rules_->evaluate(s, params_)) {
    if (c_.kvm.mode == KvmMode::kEnforce && d.param != "migrate_to_shard") {
      params_.set(d.param, d.sla_class, d.after);
      d.applied = true;
    } else if (c_.kvm.mode == KvmMode::kEnforce) {
      d.applied = true;  // one-shot: no capacity effect in this model
    }
    res_.decisions.push_back(std::move(d));
  }
}

double Sim::next_wake(const Worker& w) const {
  double t = kInf;
  const size_t next = static_cast<size_t>(next_arrival_);
  if (next < order_.size()) t = std::min(t, trace_[order_[next]].arrival_ms);
  if (w.role == Role::kDecode) {
    for (int i : handoff_) {
      if (reqs_[i].ready_ms > w.now) t = std::min(t, reqs_[i].ready_ms);
    }
  }
  for (const Worker& o : workers_) {
    if (&o != &w && !o.idle && o.now > w.now) t = std::min(t, o.now);
  }
  return t;
}

}  // namespace

namespace {

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
    r.target = t.prompt_tokens;
    res_.classes[cls].requests++;
  }
  order_.resize(trace_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int>(i);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int a, int b) { return trace_[a].arrival_ms < trace_[b].arrival_ms; });
  remaining_ = static_cast<int64_t>(trace_.size());

  // The parameters the rules move, at their configured values.
  const SemanticCutConfig& sem = c_.semantic;
  params_.set("semantic_threshold", "", sem.semantic_threshold);
  params_.set("evict_threshold", "", sem.evict_threshold);
  params_.set("recall_threshold", "", sem.recall_threshold);
  params_.set("semantic_window", "", sem.semantic_window);
  params_.set("recent_tokens", "", sem.recent_tokens);
  params_.set("score_interval", "", sem.score_interval);
  params_.set("temporal_step_size", "", c_.temporal.temporal_step_size);
  params_.set("swap", "",
              static_cast<double>(c_.temporal.swap == SwapMode::kAuto     ? 0
                                  : c_.temporal.swap == SwapMode::kAlways ? 1
                                                                          : 2));
  params_.set("spatial_min_context", "", c_.spatial.min_context);
  params_.set("max_num_seqs", "", c_.max_num_seqs);
  params_.set("migrate_to_shard", "", 0);
  for (const SlaClass& sc : c_.sla_classes) {
    params_.set("max_queue", sc.name, sc.max_queue);
    if (sc.semantic) {
      params_.set("semantic_threshold", sc.name, sc.semantic->semantic_threshold);
      params_.set("evict_threshold", sc.name, sc.semantic->evict_threshold);
      params_.set("recall_threshold", sc.name, sc.semantic->recall_threshold);
      params_.set("semantic_window", sc.name, sc.semantic->semantic_window);
      params_.set("recent_tokens", sc.name, sc.semantic->recent_tokens);
      params_.set("score_interval", sc.name, sc.semantic->score_interval);
    }
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
    KVSPLIT_RETURN_IF_ERROR(validate_rules(c_.kvm.rules, names));
    rules_ = std::make_unique<RuleEngine>(c_.kvm.rules);
  }

  // Workers: KV capacity per worker in bytes (kv_blocks_per_worker pages of full precision, or
  // kv_capacity_bytes), times the spatial cut's shards.
  const double bb = block_bytes();
  double cap = c_.kv_blocks_per_worker > 0
                   ? c_.kv_blocks_per_worker * bb
                   : std::floor(static_cast<double>(c_.kv_capacity_bytes) / bb) * bb;
  if (c_.spatial.shards > 1) cap *= c_.spatial.shards;
  const double host = static_cast<double>(c_.temporal.host_capacity_mb) * (1 << 20);
  auto add = [&](Role role, const std::string& name) {
    Worker w;
    w.role = role;
    w.name = name;
    w.cap_bytes = cap;
    w.host_cap = role == Role::kPrefill ? 0 : host;
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
  double next_tick = interval;
  int64_t guard = 0;
  while (remaining_ > 0) {
    if (++guard > 500000000) return internal_error("simulator: no progress");
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
  res_.mean_device_kv_use =
      res_.samples > 0 ? mean_use_sum_ / static_cast<double>(res_.samples) : 0;
  return std::move(res_);
}

}  // namespace

StatusOr<SimResult> simulate(const EngineConfig& config, const EngineProfile& profile,
                             const std::vector<TraceRequest>& trace) {
  KVSPLIT_RETURN_IF_ERROR(validate(profile));
  Sim sim(config, profile, trace);
  return sim.run();
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
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvsplit::kvm
