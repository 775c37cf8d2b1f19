#include "kvm/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/fair_prefill.h"
#include "kvm/monitor.h"
#include "kvm/rule_engine.h"

namespace kvsplit::kvm {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Preemptions of one request in a row, with no token between them, beyond which it is taken to
// thrash (see Sim::preempt).
constexpr int64_t kMaxPreemptions = 20;

// Nearest-rank percentile (as the monitors compute theirs).
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

enum class Role : uint8_t { kColocated, kPrefill, kDecode };
enum class St : uint8_t {
  kPending,  // not arrived yet
  kQueued,   // in the router's queue
  kWaiting,  // on a worker: prefilling (its prompt's blocks reserved) or waiting to recompute
  kRunning,  // on a worker: decoding
  kHandoff,  // disaggregated: prefilled, waiting for a decode worker
  kSwapped,  // on a worker's waiting list, its pages in the host tier
  kDone,
  kRejected
};

int64_t blocks_for(int64_t tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

struct Req {
  const TraceRequest* t = nullptr;
  int cls = 0;
  int priority = 0;
  St st = St::kPending;
  // Its lengths, clamped to the model's context as bench_serving_offline clamps a trace's.
  int64_t prompt = 0, output = 0;
  int64_t kv = 0;      // tokens whose KV is computed
  int64_t target = 0;  // tokens to compute before it decodes: the prompt, or prompt + output[:-1]
                       // after a recompute (the last token is then decoded, as the engine does)
  int64_t generated = 0;
  double first_ms = -1, last_ms = 0;
  bool started = false;      // admitted at least once (the queue timeout no longer applies)
  int64_t decode_steps = 0;  // decode steps since its KV was (re)built: the demotion age
  double share = 0;          // share of its old pages to demote (the highest threshold seen)
  double evict_share = 0;    // share to evict
  // Its pages: `held` full-pool blocks, q8 / q4 pages in the int8 / int4 arenas, ev evicted.
  int64_t held = 0, q8 = 0, q4 = 0, ev = 0;
  int64_t last_prefill_step = -1;  // the worker step that last gave it a chunk (fair prefill)
  int64_t stuck = 0;               // preemptions in a row without a token between them
  int64_t generated_at_preemption = -1;
  int64_t swapped_pages = 0;  // swapped out: pages in the host tier
  int64_t resume_step = 0;    // swapped out: not back before this worker step
  double host_bytes = 0;
  double ready_ms = 0;  // handoff: when the KV has arrived
  int worker = -1;
  int64_t pages() const { return held + q8 + q4 + ev; }
};

struct Worker {
  Role role = Role::kColocated;
  std::string name;
  double now = 0;
  bool idle = false;
  int64_t steps = 0;
  std::vector<int> running;                   // decoding, request indices
  std::vector<int> waiting;                   // prefilling, waiting to recompute, swapped out
  int64_t total_blocks = 0, free_blocks = 0;  // the full pool
  int64_t free8 = 0, free4 = 0;               // the quantized arenas' free pages
  double host_cap = 0, host_used = 0;
  double busy_ms = 0;
};

// Service order: higher priority first, then older.
bool serves_before(const Req& a, const Req& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  return a.t->arrival_ms < b.t->arrival_ms;
}

class Sim {
 public:
  Sim(const EngineConfig& c, const EngineProfile& p, const std::vector<TraceRequest>& trace)
      : c_(c), p_(p), trace_(trace), window_(c.kvm.window_ms) {}

  StatusOr<SimResult> run();

 private:
  double param(const char* name, int cls) const {
    return params_.get(name, cls < 0 ? std::string() : c_.sla_classes[cls].name);
  }
  double block_bytes() const { return c_.block_size * p_.kv_bytes_per_token_full; }
  void enqueue(int i, double now);
  void wake_sleepers(double now);  // workers asleep for want of work look again at `now`
  void reject(int i) {
    reqs_[i].st = St::kRejected;
    remaining_--;
    progress_step_ = res_.steps;
  }
  void finish(int i, double now);
  void release(Worker& w, Req& r);  // frees every page it holds on w
  // Preempts `i`, running on `w`: swapped out or dropped for a recompute; onto w's waiting list.
  void preempt(Worker& w, int i, double* cost_ms);
  // The KV cuts after a decode step: pages demoted into the arenas (room permitting) or evicted.
  void apply_cut(Worker& w, Req& r);
  void admit(Worker& w, double now);
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
  int64_t progress_step_ = 0;  // res_.steps when a request last finished or was rejected
  std::vector<int> order_;     // trace indices by arrival
  int64_t next_arrival_ = 0;
  int64_t swaps_since_tick_ = 0;
  double last_tick_ = 0;
  double mean_use_sum_ = 0;
  std::vector<std::vector<double>> ttft_, itl_;
};

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
  if (!r.started) r.ready_ms = now;
  queue_.push_back(i);
  queued_per_class_[r.cls]++;
}

void Sim::finish(int i, double now) {
  Req& r = reqs_[i];
  r.st = St::kDone;
  remaining_--;
  progress_step_ = res_.steps;
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

void Sim::release(Worker& w, Req& r) {
  w.free_blocks += r.held;
  w.free8 += r.q8;
  w.free4 += r.q4;
  r.held = r.q8 = r.q4 = r.ev = 0;
}

void Sim::preempt(Worker& w, int i, double* cost_ms) {
  w.running.erase(std::find(w.running.begin(), w.running.end(), i));
  Req& r = reqs_[i];
  res_.preemptions++;
  // The pages on the device (full and quantized) go to the host tier as full blocks.
  const int64_t pages = r.held + r.q8 + r.q4;
  const double bytes = static_cast<double>(pages) * block_bytes();
  const int mode = static_cast<int>(param("swap", r.cls));  // 0 auto, 1 always, 2 never
  bool swap = w.host_cap > 0 && mode != 2 && pages > 0 && w.host_used + bytes <= w.host_cap;
  if (swap && mode == 0) {  // auto: when two copies cost less than the recompute
    const double swap_ms = 2 * bytes / p_.copy_bytes_per_ms;
    const double n = static_cast<double>(r.prompt + r.generated - 1);
    const double recompute_ms =
        n * p_.prefill_ms_per_token + n * n / 2 * p_.prefill_ms_per_kv_token;
    swap = swap_ms < recompute_ms;
  }
  const int64_t evicted = r.ev;
  release(w, r);
  r.stuck = r.generated == r.generated_at_preemption ? r.stuck + 1 : 0;
  r.generated_at_preemption = r.generated;
  if (r.stuck > kMaxPreemptions) {
    // Thrashing: two sequences that fill the pool between them and preempt themselves at a block
    // boundary after each recompute (a prefilling one is never a victim), which the engine's
    // rules allow too. Counted as rejected so that the run ends.
    res_.thrashed++;
    reject(i);
    return;
  }
  w.waiting.push_back(i);
  if (swap) {
    r.st = St::kSwapped;
    r.swapped_pages = pages;
    r.ev = evicted;  // evicted pages stay evicted
    r.host_bytes = bytes;
    const int64_t wait =
        std::max<int64_t>(1, static_cast<int64_t>(param("temporal_step_size", r.cls)));
    r.resume_step = w.steps + wait;
    w.host_used += bytes;
    *cost_ms += bytes / p_.copy_bytes_per_ms;
    res_.swaps_out++;
    swaps_since_tick_++;
  } else {
    // Recompute on this worker: prompt + output[:-1], then it decodes its last token again.
    res_.recomputes++;
    r.st = St::kWaiting;
    r.kv = 0;
    r.target = r.prompt + std::max<int64_t>(0, r.generated - 1);
    r.decode_steps = 0;
    r.share = r.evict_share = 0;
    r.last_prefill_step = -1;
  }
}

void Sim::apply_cut(Worker& w, Req& r) {
  if (c_.kv_policy == KvPolicy::kFull) return;
  const int bs = c_.block_size;
  const int64_t keep =
      c_.semantic.sink_tokens + static_cast<int64_t>(param("recent_tokens", r.cls));
  // Whole pages outside the sinks and the recent window.
  int64_t old = std::max<int64_t>(0, r.kv - keep) / bs;
  auto evict_to = [&](int64_t want) {
    while (r.ev < want) {
      if (r.q4 > 0) {
        r.q4--;
        w.free4++;
      } else if (r.q8 > 0) {
        r.q8--;
        w.free8++;
      } else if (r.held > 0) {
        r.held--;
        w.free_blocks++;
      } else {
        break;
      }
      r.ev++;
    }
  };
  if (c_.kv_policy == KvPolicy::kStreaming || c_.kv_policy == KvPolicy::kH2O) {
    if (c_.kv_policy == KvPolicy::kH2O)
      old = std::max<int64_t>(0, old - c_.semantic.heavy_tokens / bs);
    evict_to(old);
    return;
  }
  const int64_t interval =
      std::max<int64_t>(1, static_cast<int64_t>(param("score_interval", r.cls)));
  const int64_t demote_after = std::max<int64_t>(1, c_.semantic.demote_after_steps * interval);
  const int64_t evict_after =
      demote_after + std::max<int64_t>(1, c_.semantic.evict_after_steps * interval);
  if (r.decode_steps < demote_after) return;
  r.share = std::max(r.share, std::clamp(param("semantic_threshold", r.cls), 0.0, 1.0));
  if (r.decode_steps >= evict_after) {
    r.evict_share =
        std::max(r.evict_share, std::clamp(param("evict_threshold", r.cls), 0.0, r.share));
  }
  const double d_old = static_cast<double>(old);
  const int64_t want_ev = std::llround(d_old * std::min(r.evict_share, r.share));
  const int64_t want_q = std::llround(d_old * r.share) - want_ev;
  evict_to(want_ev);
  const bool int4_phase = r.decode_steps >= 2 * demote_after;
  // Demotions: a full page into the int8 arena (the int4 one in the second phase, or when the
  // int8 arena is full); refused when the arenas are full (the page stays full).
  while (r.q8 + r.q4 < want_q && r.held > 0) {
    if (!int4_phase && w.free8 > 0) {
      w.free8--;
      r.q8++;
    } else if (w.free4 > 0) {
      w.free4--;
      r.q4++;
    } else {
      break;
    }
    r.held--;
    w.free_blocks++;
  }
  while (int4_phase && r.q8 > 0 && w.free4 > 0) {  // int8 pages go down to int4
    r.q8--;
    w.free8++;
    r.q4++;
    w.free4--;
  }
}

// The worker's admission (Worker::admit_from_router, Scheduler::can_admit_prompt): nothing new
// while a sequence it owns waits for blocks (a recompute or a swapped-out one); else the queue's
// head (priority, then arrival) while max_num_seqs allows, fewer than max_prefill_seqs prompts
// are in progress, and its prompt's blocks plus a watermark (1% of the pool, when sequences run)
// are free. Its prompt's blocks are reserved at once. A decode worker takes handoffs instead.
void Sim::admit(Worker& w, double now) {
  const int max_seqs = std::max(1, static_cast<int>(param("max_num_seqs", -1)));
  auto by_service = [&](int a, int b) { return serves_before(reqs_[a], reqs_[b]); };
  if (w.role == Role::kDecode) {
    std::stable_sort(handoff_.begin(), handoff_.end(), by_service);
    for (size_t k = 0; k < handoff_.size();) {
      const int i = handoff_[k];
      Req& r = reqs_[i];
      if (static_cast<int>(w.running.size() + w.waiting.size()) >= max_seqs) break;
      if (r.ready_ms > now) {
        ++k;
        continue;
      }
      const int64_t need = blocks_for(r.kv, c_.block_size);
      if (need > w.total_blocks) {
        handoff_.erase(handoff_.begin() + static_cast<std::ptrdiff_t>(k));
        reject(i);
        continue;
      }
      if (need > w.free_blocks) break;  // no overtaking
      handoff_.erase(handoff_.begin() + static_cast<std::ptrdiff_t>(k));
      w.free_blocks -= need;
      r.held = need;
      r.st = St::kRunning;
      r.worker = static_cast<int>(&w - workers_.data());
      w.running.push_back(i);
    }
    return;
  }
  for (int i : w.waiting) {
    const Req& r = reqs_[i];
    if (r.st == St::kSwapped || (r.held == 0 && r.kv < r.target)) return;
  }
  const int min_chunk = std::max(1, std::min(c_.block_size, c_.max_batch_tokens));
  const size_t max_prefill_seqs =
      static_cast<size_t>(std::max(16, c_.max_batch_tokens / min_chunk));
  std::stable_sort(queue_.begin(), queue_.end(), by_service);
  while (w.waiting.size() < max_prefill_seqs && !queue_.empty()) {
    const int i = queue_.front();
    Req& r = reqs_[i];
    if (static_cast<int>(w.running.size() + w.waiting.size()) >= max_seqs) break;
    const int64_t need = blocks_for(r.target, c_.block_size);
    if (need > w.total_blocks) {  // larger than the whole worker: never fits
      queue_.erase(queue_.begin());
      queued_per_class_[r.cls]--;
      reject(i);
      continue;
    }
    const int64_t watermark = w.running.empty() ? 0 : std::max<int64_t>(1, w.total_blocks / 100);
    if (need + watermark > w.free_blocks) break;  // the head waits for room
    queue_.erase(queue_.begin());
    queued_per_class_[r.cls]--;
    w.free_blocks -= need;
    r.held = need;
    r.st = St::kWaiting;
    r.started = true;
    r.worker = static_cast<int>(&w - workers_.data());
    w.waiting.push_back(i);
  }
}

// One worker step, as the Worker and its Scheduler make it (src/sched/scheduler.h): admission,
// then one token for every decoding sequence (preempting the sequence served last when the pool
// cannot grow one), then swap-ins and prefill chunks shared by common::plan_fair_prefill, the
// Scheduler's own function.
bool Sim::step(Worker& w) {
  const double now = w.now;
  const int64_t step_no = w.steps;
  double copy_ms = 0;
  // Queue timeouts (the router's): a request never admitted, queued longer than its class allows.
  if (w.role != Role::kDecode) {
    for (size_t k = 0; k < queue_.size();) {
      const int i = queue_[k];
      Req& r = reqs_[i];
      if (!r.started && now - r.t->arrival_ms > c_.sla_classes[r.cls].queue_timeout_ms) {
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(k));
        queued_per_class_[r.cls]--;
        reject(i);
      } else {
        ++k;
      }
    }
  }
  admit(w, now);

  // Decode: one token each, best served first; a sequence that needs a new block when none is
  // free preempts the running sequence served last among those not yet grown (maybe itself).
  std::vector<int> order = w.running;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return serves_before(reqs_[a], reqs_[b]); });
  std::vector<int> decoding, preempted_now;
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    Req& r = reqs_[i];
    if (r.st != St::kRunning) continue;  // preempted meanwhile
    const int64_t need = std::max<int64_t>(0, blocks_for(r.kv + 1, c_.block_size) - r.pages());
    if (r.held + need > w.total_blocks) {  // its next token needs more than the whole pool
      w.running.erase(std::find(w.running.begin(), w.running.end(), i));
      release(w, r);
      reject(i);
      continue;
    }
    while (need > w.free_blocks && r.st == St::kRunning) {
      // Victim: among r and those served after it, the lowest priority, then the youngest.
      int victim = -1;
      for (size_t j = k; j < order.size(); ++j) {
        const Req& c = reqs_[order[j]];
        if (c.st != St::kRunning) continue;
        if (victim < 0 || serves_before(reqs_[victim], c)) victim = order[j];
      }
      if (victim < 0) break;
      preempt(w, victim, &copy_ms);
      preempted_now.push_back(victim);
    }
    if (r.st != St::kRunning || need > w.free_blocks) continue;
    w.free_blocks -= need;
    r.held += need;
    decoding.push_back(i);
  }

  // Prefill: waiting sequences in service order. A swapped-out one comes back from its resume
  // step (or when nothing runs) if its pages fit; a recompute reserves its blocks; the first that
  // does not fit stops the later ones from reserving. Then the token budget (colocated: less the
  // decode rows) is shared by the fair prefill rule.
  const int min_chunk = std::max(1, std::min(c_.block_size, c_.max_batch_tokens));
  int budget = c_.max_batch_tokens;
  if (w.role == Role::kColocated)
    budget = std::max(c_.max_batch_tokens - static_cast<int>(decoding.size()), min_chunk);
  // The Scheduler plans from the step's input: this step's victims wait for the next one.
  std::vector<int> by_service;
  for (int i : w.waiting) {
    if (std::find(preempted_now.begin(), preempted_now.end(), i) == preempted_now.end())
      by_service.push_back(i);
  }
  std::stable_sort(by_service.begin(), by_service.end(),
                   [&](int a, int b) { return serves_before(reqs_[a], reqs_[b]); });
  struct Cand {
    int i;
    int64_t new_blocks;
  };
  std::vector<Cand> cands;
  std::vector<int> swap_ins;
  bool reserving = true;
  for (int i : by_service) {
    Req& r = reqs_[i];
    if (r.st == St::kSwapped) {
      if (step_no < r.resume_step && !w.running.empty()) continue;
      if (!reserving || r.swapped_pages > w.free_blocks) {
        reserving = false;
        continue;
      }
      w.free_blocks -= r.swapped_pages;
      swap_ins.push_back(i);
      continue;
    }
    if (r.kv >= r.target) continue;
    if (blocks_for(r.target, c_.block_size) > w.total_blocks) {
      w.waiting.erase(std::find(w.waiting.begin(), w.waiting.end(), i));
      release(w, r);
      reject(i);
      continue;
    }
    const int64_t need = std::max<int64_t>(0, blocks_for(r.target, c_.block_size) - r.pages());
    if (need > 0) {
      if (!reserving || need > w.free_blocks) {
        reserving = false;
        continue;
      }
      w.free_blocks -= need;
    }
    cands.push_back({i, need});
  }
  std::stable_sort(cands.begin(), cands.end(), [&](const Cand& a, const Cand& b) {
    const Req& x = reqs_[a.i];
    const Req& y = reqs_[b.i];
    if (x.priority != y.priority) return x.priority > y.priority;
    const int64_t rx = x.target - x.kv, ry = y.target - y.kv;
    if (rx != ry) return rx < ry;
    return x.last_prefill_step < y.last_prefill_step;
  });
  std::vector<common::PrefillDemand> demands(cands.size());
  for (size_t k = 0; k < cands.size(); ++k) {
    const Req& r = reqs_[cands[k].i];
    demands[k] = {static_cast<int>(r.target - r.kv), r.priority, r.last_prefill_step};
  }
  // The cap applies only while other work shares the step (Scheduler::plan_prefill).
  const bool shared = cands.size() > 1 || !decoding.empty() || !swap_ins.empty();
  const int max_chunk =
      shared ? std::max(0, static_cast<int>(std::lround(param("max_chunk_tokens", -1)))) : 0;
  const std::vector<int> plan = common::plan_fair_prefill(demands, budget, min_chunk, max_chunk);
  int64_t prefill_tokens = 0, kv_tokens = 0;
  double prefill_attended = 0;
  std::vector<std::pair<int, int64_t>> chunks;
  for (size_t k = 0; k < cands.size(); ++k) {
    Req& r = reqs_[cands[k].i];
    if (plan[k] == 0) {
      w.free_blocks += cands[k].new_blocks;  // not started this step: no reservation
      continue;
    }
    r.held += cands[k].new_blocks;
    r.last_prefill_step = step_no;
    const int64_t n = plan[k];
    prefill_tokens += n;
    prefill_attended += static_cast<double>(n) * (static_cast<double>(r.kv) + n / 2.0);
    chunks.emplace_back(cands[k].i, n);
  }
  for (int i : swap_ins) {
    Req& r = reqs_[i];
    r.held = r.swapped_pages;
    r.swapped_pages = 0;
    w.host_used -= r.host_bytes;
    copy_ms += r.host_bytes / p_.copy_bytes_per_ms;
    r.host_bytes = 0;
    r.st = St::kRunning;  // decodes from the next step
    w.waiting.erase(std::find(w.waiting.begin(), w.waiting.end(), i));
    w.running.push_back(i);
    res_.swaps_in++;
    swaps_since_tick_++;
  }
  for (int i : decoding) kv_tokens += reqs_[i].kv;
  res_.peak_running = std::max<int64_t>(res_.peak_running, static_cast<int64_t>(decoding.size()));
  if (chunks.empty() && decoding.empty() && copy_ms == 0) return false;
  const double dur =
      (chunks.empty() && decoding.empty()
           ? 0
           : p_.step_ms(static_cast<double>(prefill_tokens), prefill_attended,
                        static_cast<double>(decoding.size()), static_cast<double>(kv_tokens))) +
      copy_ms;
  const double end = now + dur;
  w.now = end;
  w.busy_ms += dur;
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
    w.waiting.erase(std::find(w.waiting.begin(), w.waiting.end(), i));
    if (r.generated > 0) {  // a recompute samples nothing: it decodes from the next step
      r.st = St::kRunning;
      w.running.push_back(i);
      continue;
    }
    emit(r);
    if (r.generated >= r.output) {
      release(w, r);
      finish(i, end);
    } else if (w.role == Role::kPrefill) {  // hand off to a decode worker
      release(w, r);
      r.st = St::kHandoff;
      r.ready_ms = end + static_cast<double>(blocks_for(r.kv, c_.block_size)) * block_bytes() /
                             p_.copy_bytes_per_ms;
      handoff_.push_back(i);
      wake_sleepers(end);
    } else {
      r.st = St::kRunning;
      w.running.push_back(i);
    }
  }
  for (int i : decoding) {
    Req& r = reqs_[i];
    r.kv++;
    r.decode_steps++;
    emit(r);
    apply_cut(w, r);  // the cut acts between steps
    if (r.generated >= r.output) done.push_back(i);
  }
  for (int i : done) {
    w.running.erase(std::find(w.running.begin(), w.running.end(), i));
    release(w, reqs_[i]);
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
    // As the engine's monitor: full-pool blocks used (reserved included) / total.
    u.device_kv_use = w.total_blocks > 0 ? static_cast<double>(w.total_blocks - w.free_blocks) /
                                               static_cast<double>(w.total_blocks)
                                         : 0;
    u.host_kv_use = w.host_cap > 0 ? w.host_used / w.host_cap : 0;
    u.shard_use = {u.device_kv_use};
    if (w.role != Role::kPrefill) {
      s.device_kv_use = std::max(s.device_kv_use, u.device_kv_use);
      s.host_kv_use = std::max(s.host_kv_use, u.host_kv_use);
    }
    for (const std::vector<int>* list : {&w.running, &w.waiting}) {
      for (int i : *list) {
        const Req& r = reqs_[i];
        full += r.held;
        q8 += r.q8;
        q4 += r.q4;
        ev += r.ev;
      }
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
    r.prompt = t.prompt_tokens;
    r.output = t.output_tokens;
    if (p_.max_context > 1) {  // as bench_serving_offline fits a trace to the model's context
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
  params_.set("max_chunk_tokens", "", c_.max_chunk_tokens);
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
      // A key summary: K and V, f32, per kv head and dim and layer = full bytes per token x
      // 4 / the KV dtype's bytes (f32 on the CPU backend, f16 on CUDA).
      const double dtype_bytes = p_.backend == "cpu" ? 4 : 2;
      const double summary = p_.kv_bytes_per_token_full * 4 / dtype_bytes;
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
  double next_tick = interval;
  int64_t guard = 0;
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
  double busy = 0;
  for (const Worker& w : workers_) busy += w.busy_ms;
  res_.mean_step_ms = res_.steps > 0 ? busy / static_cast<double>(res_.steps) : 0;
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
  j["steps"] = r.steps;
  j["mean_step_ms"] = r.mean_step_ms;
  j["preemptions"] = r.preemptions;
  j["thrashed"] = r.thrashed;
  j["kv_blocks_per_worker"] = r.kv_blocks_per_worker;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvsplit::kvm
