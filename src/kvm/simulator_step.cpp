// The simulator's step model: admission, the Scheduler's step (decode growth, preemption by swap or
// recompute, fair prefill chunks), the KV cuts after a decode step, and the KVM's ticks.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/config_rules.h"
#include "common/fair_prefill.h"
#include "kvm/expr.h"
#include "kvm/simulator_model.h"

namespace kvsplit::kvm::sim_detail {

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
  // As the engine's window: a one-token request has no ITL sample.
  window_.add(c_.sla_classes[r.cls].name, now, ttft,
              r.generated > 1 ? itl : std::numeric_limits<double>::quiet_NaN());
  ttft_[r.cls].push_back(ttft);
  itl_[r.cls].push_back(itl);
  SimClassResult& cr = res_.classes[r.cls];
  cr.finished++;
  if (ttft <= cr.max_ttft_ms && itl <= cr.max_itl_ms) cr.met++;
  res_.end_ms = std::max(res_.end_ms, now);
}

void Sim::fail(int i, double now) {
  const Req& r = reqs_[i];
  // As the engine's window: its TTFT, or without a first token the time it waited until it failed.
  const double ttft = r.generated > 0 ? r.first_ms - r.t->arrival_ms : now - r.t->arrival_ms;
  window_.add(c_.sla_classes[r.cls].name, now, ttft, std::numeric_limits<double>::quiet_NaN());
  reject(i);
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
  r.preemptions++;
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
  // The request's class settings where it has its own (SlaClass::semantic), as the engine's
  // SequenceCut reads them; the rule-set parameters through param().
  const std::optional<SemanticCutConfig>& own = c_.sla_classes[static_cast<size_t>(r.cls)].semantic;
  const SemanticCutConfig& sem = own ? *own : c_.semantic;
  const int64_t keep = sem.sink_tokens + static_cast<int64_t>(param("recent_tokens", r.cls));
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
    // H2O keeps the pages that cover heavy_tokens (rounded up), as cuts::semantic::plan_step.
    if (c_.kv_policy == KvPolicy::kH2O)
      old = std::max<int64_t>(0, old - (std::max(0, sem.heavy_tokens) + bs - 1) / bs);
    evict_to(old);
    return;
  }
  const int64_t interval =
      std::max<int64_t>(1, static_cast<int64_t>(param("score_interval", r.cls)));
  const int64_t demote_after = std::max<int64_t>(1, sem.demote_after_steps * interval);
  const int64_t evict_after = demote_after + std::max<int64_t>(1, sem.evict_after_steps * interval);
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
  // A rule's max_num_seqs reaches the decoding workers only (the engine's SetSchedulerParams goes
  // to decode and colocated workers): a prefill worker keeps the configured value.
  const int max_seqs = std::max(
      1, w.role == Role::kPrefill ? c_.max_num_seqs : static_cast<int>(param("max_num_seqs", -1)));
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
        fail(i, now);
        continue;
      }
      // With its own next token's block, beside the next-token growth of the running requests
      // served before it, as the Scheduler admits handoffs.
      const int64_t own = next_token_blocks(r.kv, need, c_.block_size);
      int64_t room = need + (need + own <= w.total_blocks ? own : 0);
      for (int j : w.running) {
        const Req& a = reqs_[j];
        if (a.st == St::kRunning && serves_before(a, r))
          room += next_token_blocks(a.kv, a.pages(), c_.block_size);
      }
      if (room > w.free_blocks) break;  // no overtaking
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
  const size_t max_prefill_seqs = static_cast<size_t>(common::default_max_prefill_seqs(
      c_.max_batch_tokens, std::min(c_.block_size, c_.max_batch_tokens)));
  std::stable_sort(queue_.begin(), queue_.end(), by_service);
  while (w.waiting.size() < max_prefill_seqs && !queue_.empty()) {
    const int i = queue_.front();
    Req& r = reqs_[i];
    if (static_cast<int>(w.running.size() + w.waiting.size()) >= max_seqs) break;
    const int64_t need = blocks_for(r.target, c_.block_size);
    if (need > w.total_blocks) {  // larger than the whole worker: never fits
      queue_.erase(queue_.begin());
      queued_per_class_[r.cls]--;
      fail(i, now);
      continue;
    }
    const int64_t watermark = w.running.empty() ? 0 : std::max<int64_t>(1, w.total_blocks / 100);
    if (need + watermark > w.free_blocks) break;  // the head waits for room
    queue_.erase(queue_.begin());
    queued_per_class_[r.cls]--;
    w.free_blocks -= need;
    r.held = need;
    r.st = St::kWaiting;
    r.waiting_since = w.steps;
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
        fail(i, now);
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
    const int64_t need = next_token_blocks(r.kv, r.pages(), c_.block_size);
    if (r.held + need > w.total_blocks) {  // its next token needs more than the whole pool
      w.running.erase(std::find(w.running.begin(), w.running.end(), i));
      release(w, r);
      fail(i, now);
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
  // A resumption (swap-in or recompute) also needs its next token's block when its positions
  // fill their last page, unless that exceeds the pool (Scheduler::next_token_room).
  const auto next_token_room = [&](int64_t positions, int64_t blocks) -> int64_t {
    const int64_t extra = next_token_blocks(positions, blocks, c_.block_size);
    return blocks + extra <= w.total_blocks ? extra : 0;
  };
  // The blocks the running requests served before `r` still need to reach their last position
  // (Scheduler::growth_ahead): a resumption leaves them free, or their growth pauses it again.
  const auto growth_ahead = [&](const Req& r) {
    int64_t room = 0;
    for (int j : w.running) {
      const Req& a = reqs_[j];
      if (a.st != St::kRunning || !serves_before(a, r)) continue;
      const int64_t last = blocks_for(a.prompt + std::max<int64_t>(0, a.output - 1), c_.block_size);
      room +=
          std::clamp<int64_t>(last - a.pages(), 0, std::max<int64_t>(0, w.total_blocks - a.held));
    }
    return room;
  };
  // The next tokens' blocks of the resumptions admitted before: a later one fits beside them.
  int64_t promised = 0;
  for (int i : by_service) {
    Req& r = reqs_[i];
    if (r.st == St::kSwapped) {
      if (step_no < r.resume_step && !w.running.empty()) continue;
      const int64_t next = next_token_room(r.kv, r.swapped_pages);
      if (!reserving || r.swapped_pages + next + promised + growth_ahead(r) > w.free_blocks) {
        reserving = false;
        continue;
      }
      w.free_blocks -= r.swapped_pages;
      promised += next;
      swap_ins.push_back(i);
      continue;
    }
    if (r.kv >= r.target) continue;
    if (blocks_for(r.target, c_.block_size) > w.total_blocks) {
      w.waiting.erase(std::find(w.waiting.begin(), w.waiting.end(), i));
      release(w, r);
      fail(i, now);
      continue;
    }
    const int64_t need = std::max<int64_t>(0, blocks_for(r.target, c_.block_size) - r.pages());
    const int64_t next =
        r.generated > 0 ? next_token_room(r.target, blocks_for(r.target, c_.block_size)) : 0;
    if (need > 0) {
      // A restart (recompute) also leaves room for the running requests served before it to
      // reach their last position, as the Scheduler does.
      const int64_t room = need + (r.generated > 0 ? next + promised + growth_ahead(r) : 0);
      if (!reserving || room > w.free_blocks) {
        reserving = false;
        continue;
      }
      w.free_blocks -= need;
    }
    promised += next;
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
    demands[k] = {static_cast<int>(r.target - r.kv), r.priority, r.last_prefill_step,
                  r.waiting_since};
  }
  // The cap holds in every step, as in Scheduler::plan_prefill.
  int max_chunk = std::max(0, static_cast<int>(std::lround(param("max_chunk_tokens", -1))));
  // As a rule has set it (the KV cache manager may move it), like max_chunk_tokens.
  double tightest_itl = 0;     // pools.max_chunk_ms: auto (common::step_time_budget_ms)
  if (c_.max_chunk_ms_auto) {  // the worker's running and waiting requests, as the engine's
    const auto tighten = [&](int i) {
      tightest_itl = common::tighter_itl(
          tightest_itl, c_.sla_classes[static_cast<size_t>(reqs_[i].cls)].max_itl_ms);
    };
    for (int i : w.running) tighten(i);
    for (int i : w.waiting) tighten(i);
  }
  const double max_chunk_ms =
      common::step_time_budget_ms(param("max_chunk_ms", -1), c_.max_chunk_ms_auto, tightest_itl);
  if (max_chunk_ms > 0) {
    // The time-based cap (Worker::step_chunk_cap), from the profile where the engine uses its
    // measured steps: the prompt tokens whose prefill fits in max_chunk_ms beside the step's
    // fixed cost and its decode rows (their attention included), rounded down to a block, at
    // least min_chunk. A chunk's own attention to the tokens before it is left out here.
    double fixed = p_.step_base_ms + p_.step_overhead_ms;
    for (int i : decoding) fixed += p_.decode_ms_per_seq + reqs_[i].kv * p_.decode_ms_per_kv_token;
    const double fit = (max_chunk_ms - fixed) / std::max(p_.prefill_ms_per_token, 1e-12);
    max_chunk = common::time_chunk_cap(fit, budget, c_.block_size, min_chunk, max_chunk);
  }
  const std::vector<int> plan =
      common::plan_fair_prefill(demands, budget, min_chunk, max_chunk, step_no);
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
  // Per class, the oldest queued request's wait since it arrived (submit), in one pass.
  std::vector<double> waited(c_.sla_classes.size(), 0.0);
  for (int i : queue_) {
    double& w = waited[static_cast<size_t>(reqs_[i].cls)];
    w = std::max(w, now - reqs_[i].t->arrival_ms);
  }
  for (size_t k = 0; k < c_.sla_classes.size(); ++k) {
    KvmClassLatency cl;
    cl.name = c_.sla_classes[k].name;
    cl.queue_depth = queued_per_class_[k];
    cl.queue_wait_ms = waited[k];
    window_.fill(now, &cl);
    s.classes.push_back(std::move(cl));
  }
  res_.samples++;
  res_.peak_device_kv_use = std::max(res_.peak_device_kv_use, s.device_kv_use);
  mean_use_sum_ += s.device_kv_use;
  if (!rules_) return;
  // As the engine applies them (KvCacheManager::tick, EngineImpl::apply_kvm_decision): a value
  // the engine refuses is refused here too, and later rules of the tick do not start from it.
  auto apply = [&](KvmDecision& d) {
    if (c_.kvm.mode != KvmMode::kEnforce) return true;
    if (decision_is_no_op(d)) {
      d.applied = true;
      return true;
    }
    const Status st = check_decision(d);
    if (!st.ok()) {
      d.error = st.message();
      return false;
    }
    // As the engine: a class's first semantic setting gives it a whole block of its own, a copy
    // of the configured one, which engine-wide rules no longer reach (KvCacheManager's table
    // lists it the same way).
    const bool own_block = d.sla_class.empty() || !param_is_semantic(d.param) ||
                           params_.has("semantic_threshold", d.sla_class);
    if (!own_block) set_semantic_params(&params_, d.sla_class, c_.semantic);
    if (d.inherit) {
      params_.erase(d.param, d.sla_class);
    } else if (d.param != "migrate_to_shard") {
      params_.set(d.param, d.sla_class, d.after);
    }
    d.applied = true;  // migrate_to_shard: one-shot, no capacity effect in this model
    return true;
  };
  for (KvmDecision& d : rules_->evaluate(s, params_, apply)) res_.decisions.push_back(std::move(d));
}

Status Sim::check_decision(const KvmDecision& d) const {
  // A rule on a cut that is off was refused before the run (validate_rules_for_engine).
  const bool semantic = param_is_semantic(d.param);
  // The engine checks an integer's range before narrowing it, the others' ranges as it applies.
  if (!semantic || param_is_integer(d.param))
    KVSPLIT_RETURN_IF_ERROR(check_setting(d.param, d.after));
  if (!semantic) return ok_status();
  // Then the whole semantic configuration the value lands in (thresholds in order, ranges), built
  // as the engine builds it: the engine-wide settings of the moment, or for a class its own
  // configured block (else the engine's configured settings) with the class's own moves on it.
  SemanticCutConfig sc = c_.semantic;
  const bool cls = !d.sla_class.empty();
  for (const SlaClass& k : c_.sla_classes) {
    if (cls && k.name == d.sla_class && k.semantic) sc = *k.semantic;
  }
  auto get = [&](const char* p, double base) {
    if (p == d.param) return d.after;
    if (!cls) return params_.get(p, "");
    return params_.has(p, d.sla_class) ? params_.get(p, d.sla_class) : base;
  };
  sc.semantic_threshold = static_cast<float>(get("semantic_threshold", sc.semantic_threshold));
  sc.evict_threshold = static_cast<float>(get("evict_threshold", sc.evict_threshold));
  sc.recall_threshold = static_cast<float>(get("recall_threshold", sc.recall_threshold));
  sc.recall_wait_ms = get("recall_wait_ms", sc.recall_wait_ms);
  return validate_semantic_cut(sc, "semantic.");
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

}  // namespace kvsplit::kvm::sim_detail
