// One worker step: schedule() -> run() (StepModel::forward) -> postprocess()
// (worker_postprocess.cpp), plus preemption.
#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "sampling/ngram_draft.h"
#include "sched/prefix_share.h"
#include "sched/swap_predictor.h"
#include "sched/worker.h"

namespace kvsplit::sched {
namespace {

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

}  // namespace

bool Worker::step() {
  const Clock::time_point t0 = Clock::now();
  pool_->poll_prefix_spills();  // prefix-cache disk writes that completed since the last step
  if (pool_->disk() != nullptr) kv::poll_swap_writes(*pool_, &swap_stats_);  // write-behind
  drain_inbox(t0);
  // The chunk cap of this step's admissions and plan (time-based with max_chunk_ms); after the
  // commands, since SetSchedulerParams rebuilds the Scheduler with the configured cap.
  scheduler_.set_max_chunk_tokens(step_chunk_cap());
  reclaim_undelivered(t0);
  reclaim_forwarded(t0);
  expire_queued(t0);
  reap_cancelled(t0);
  compact(t0);
  admit_offers(t0);
  admit_from_router(t0);
  // max_chunk_ms: auto counts the classes of the prompts just admitted too (a long prompt's
  // first chunk is capped like the others).
  if (options_.max_chunk_ms_auto) scheduler_.set_max_chunk_tokens(step_chunk_cap());
  if (hold_.load(std::memory_order_acquire) == static_cast<uint8_t>(TestHold::kForward)) {
    compact(t0);  // preemptions by admission
    publish_stats();
    return false;
  }
  schedule(t0);
  if (batch_.steps.empty() && release_youngest_waiting(t0)) schedule(t0);
  if (batch_.steps.empty()) {
    compact(t0);  // preemptions of a step that ends up empty
    // An idle step keeps blocks free ahead of need too (kv.prefix_spill_ahead): the pages a
    // handoff gave back to a disaggregated prefill worker's cache spill while nothing else runs.
    pool_->spill_prefix_ahead();
    publish_stats();
    return false;
  }
  // Counted in steps that run (an idle worker polling a stalled sequence skips nothing).
  stalled_decode_rows_.fetch_add(stalled_this_step_, std::memory_order_relaxed);
  const Clock::time_point t1 = Clock::now();
  logits_.clear();
  argmax_ids_.clear();
  Status st = model_->forward(batch_.steps, *pool_, &logits_, &argmax_ids_);
  const Clock::time_point t2 = Clock::now();
  int prefill_tokens = 0, tokens = 0;
  for (size_t i = 0; i < batch_.steps.size(); ++i) {
    const int n = static_cast<int>(batch_.steps[i].tokens.size());
    tokens += n;
    if (!batch_.decode[i]) prefill_tokens += n;
  }
  if (st.ok()) {
    note_prefill_speed(prefill_tokens, std::chrono::duration<double>(t2 - t1).count());
    step_cost_.observe(tokens, std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  if (!st.ok()) {
    KVSPLIT_LOG_ERROR("{}: forward failed: {}", options_.name, st.to_string());
    for (Sequence* seq : batch_.seqs) {
      finish(*seq, FinishReason::kError, st.with_prefix("forward pass"), t2);
    }
  } else {
    postprocess(logits_, argmax_ids_, t2);
  }
  const Clock::time_point t3 = Clock::now();
  compact(t2);
  // Blocks the step's finished sequences freed: host prefetches for the next step may take them
  // now (the copies run while the next step is planned).
  if (options_.temporal.host_prefetch && pool_->host_allocator().num_blocks() > 0 &&
      !waiting_.empty()) {
    scheduler_input(/*with_handoffs=*/false);
    start_prefetches(plannable_blocks(), /*after_forward=*/true);
  }
  pool_->spill_prefix_ahead();  // the next allocations find free blocks (kv.prefix_spill_ahead)
  publish_stats();
  const Clock::time_point t4 = Clock::now();
  steps_.fetch_add(1, std::memory_order_relaxed);
  forward_ns_.fetch_add(ns_between(t1, t2), std::memory_order_relaxed);
  sampling_ns_.fetch_add(ns_between(t2, t3), std::memory_order_relaxed);
  bookkeeping_ns_.fetch_add(ns_between(t0, t1) + ns_between(t3, t4), std::memory_order_relaxed);
  return true;
}

void Worker::preempt(Sequence& seq, const Preemption& why, Clock::time_point now) {
  if (try_swap_out(seq, why)) {
    ++seq.preemptions;
    const int step_size = seq.sla.temporal_step_size > 0 ? seq.sla.temporal_step_size
                                                         : options_.temporal.temporal_step_size;
    seq.resume_step = steps_.load(std::memory_order_relaxed) + std::max(1, step_size);
    seq.enter_phase(SeqPhase::kPreempted, now);
    seq.next = Sequence::Next::kToWaiting;
    shared_->preemptions.fetch_add(1, std::memory_order_relaxed);
    account_kv(seq, now);  // swapped-out pages hold no device bytes
    return;
  }
  KVSPLIT_LOG_WARN(
      "{}: preempting request {} (priority {}) by recompute ({} of a request of "
      "priority {}): {} tokens of KV dropped",
      options_.name, seq.display_id(), seq.priority, preempt_reason_name(why.reason),
      why.for_priority, seq.num_computed);
  // Its full pages join the prefix cache (evictable, so they free the room the preemption is
  // for): the restart takes back those still cached instead of computing them again. Not for a
  // ReleaseKv command, which asks for the KV to be dropped (the prompt pages its prefill cached
  // may still serve the restart).
  drop_kv_for_recompute(seq, /*cache=*/why.reason != PreemptReason::kCommand, now);
  seq.enter_phase(SeqPhase::kPreempted, now);
  seq.next = Sequence::Next::kToWaiting;
}

bool Worker::swapping() const {
  return pool_->host_allocator().num_blocks() > 0 || pool_->disk() != nullptr;
}

bool Worker::try_swap_out(Sequence& seq, const Preemption& why) {
  // A worker command (ReleaseKv) asks for the blocks to be released, not kept.
  const SwapMode mode = seq.sla.swap.value_or(options_.temporal.swap);
  if (!swapping() || mode == SwapMode::kNever || why.reason == PreemptReason::kCommand)
    return false;
  settle_cut(seq, Clock::now(), /*all=*/true);  // recalls land first (counted here)
  const int pages = kv::swappable_pages(seq.table);
  if (pages == 0) return false;
  const int64_t bytes = int64_t{pages} * pool_->bytes_per_block();
  SwapCosts costs = swap_costs_;
  if (costs.prefill_tokens_per_s <= 0)  // none of its own yet: the prefilling workers' speed
    costs.prefill_tokens_per_s = shared_->prefill_tokens_per_s.load(std::memory_order_relaxed);
  // What a recompute redoes: the positions computed so far (a prompt preempted partway through its
  // prefill has the rest to compute either way), not the whole target.
  const int redo = std::min(seq.prefill_target(), seq.num_computed);
  const SwapChoice c = choose_swap(mode, costs, bytes, redo, swap_tier(*pool_, pages));
  KVSPLIT_LOG_INFO(
      "{}: preempting request {} ({} of a request of priority {}): {} ({} pages, {:.1f} KiB; "
      "predicted swap via the {} tier {:.3f} ms, recompute of {} tokens {:.3f} ms{}; swap: {})",
      options_.name, seq.display_id(), preempt_reason_name(why.reason), why.for_priority,
      c.swap ? "swap out" : "recompute", pages, bytes / 1024.0,
      c.tier == SwapTier::kDisk ? "disk" : "host", c.swap_ms, redo, c.recompute_ms,
      c.priced ? "" : " (a cost not measured yet: 0)", swap_mode_name(mode));
  if (!c.swap) {
    ++recompute_choices_;
    return false;
  }
  ++swap_choices_;
  const int64_t disk_faults = swap_stats_.disk_faults;
  auto done = kv::swap_out(*pool_, seq.table, &swap_stats_);
  if (done.ok() && *done) return true;
  ++swap_fallbacks_;
  if (!done.ok()) {
    KVSPLIT_LOG_WARN("{}: swap out of request {} failed, recomputing instead: {}", options_.name,
                     seq.display_id(), done.status().to_string());
  } else if (swap_stats_.disk_faults > disk_faults) {
    // The disk tier logs the first fault of each cause and counts them all (kv_disk_faults);
    // the fallback is logged once too, not once per request a failing disk sends to recompute.
    if (!disk_fallback_logged_) {
      disk_fallback_logged_ = true;
      KVSPLIT_LOG_WARN(
          "{}: the swap out of request {} to the disk tier failed (see the disk tier's log): "
          "recomputing it instead; later such fallbacks are only counted (kv_swap_fallbacks)",
          options_.name, seq.display_id());
    }
  } else {
    KVSPLIT_LOG_WARN(
        "{}: host tier full ({} of {} slots free, {} pages needed): recomputing "
        "request {} instead",
        options_.name, pool_->host_allocator().num_free(), pool_->host_allocator().num_blocks(),
        pages, seq.display_id());
  }
  return false;
}

void Worker::apply_swap_ins(const SchedulerOutput& out, Clock::time_point now) {
  // Those with a host prefetch first: they hold their blocks already, and the plan counted the
  // blocks of the other prefetches free, which the others' swap-ins may then take (make_room).
  std::vector<const SwapIn*> order;
  order.reserve(out.swap_in.size());
  for (int pass = 0; pass < 2; ++pass)
    for (const SwapIn& r : out.swap_in)
      if (waiting_[r.id - kWaitingBase]->table.swap_prefetch.empty() == (pass == 1))
        order.push_back(&r);
  // A prefetch whose copy is still in flight is not waited for when the step has rows to run: its
  // sequence would decode only from the next step anyway, so it resumes a step later and the rows
  // (and their inter-token latency) never wait for another sequence's copy. Its blocks stay with
  // the prefetch, which the next step uses (or drops, as any prefetch).
  const bool other_rows = !out.decode.empty() || !out.prefill.empty();
  for (const SwapIn* r : order) {
    Sequence& seq = *waiting_[r->id - kWaitingBase];
    if (other_rows && !seq.table.swap_prefetch.empty() &&
        !kv::host_prefetch_landed(*pool_, seq.table)) {
      ++swap_stats_.host_prefetch_deferred;
      continue;
    }
    if (seq.table.swap_prefetch.empty()) make_room(kv::swapped_pages(seq.table));
    auto done = kv::swap_in(*pool_, seq.table, &swap_stats_, seq.prefetch.get());
    if (done.ok() && *done) {
      seq.enter_phase(SeqPhase::kDecode, now);
      seq.next = Sequence::Next::kToRunning;  // decodes from the next step
      account_kv(seq, now);
      continue;
    }
    // The scheduler reserved the blocks, so only a copy error gets here: recompute instead.
    ++swap_fallbacks_;
    KVSPLIT_LOG_WARN("{}: swap in of request {} failed, recomputing instead: {}", options_.name,
                     seq.display_id(),
                     done.ok() ? std::string("no free blocks") : done.status().to_string());
    release_kv(seq);
    seq.num_computed = 0;
    account_kv(seq, now);
  }
}

void Worker::start_prefetches(int free_blocks_after, bool after_forward) {
  const bool host = options_.temporal.host_prefetch && pool_->host_allocator().num_blocks() > 0;
  if ((pool_->disk() == nullptr && !host) || sched_waiting_.empty()) {
    for (const std::unique_ptr<Sequence>& w : waiting_)
      kv::drop_host_prefetch(*pool_, w->table, &swap_stats_);
    return;
  }
  const int64_t next_step = steps_.load(std::memory_order_relaxed) + 1;
  // The list was made before this step's swap-ins: those swapped in (or finished) are no longer
  // waiting, and their pages are in free_blocks_after already. Counted again, they crowded out a
  // deferred swap-in's prefetch (dropped, waited for, and copied again).
  std::vector<SchedSeq> still = sched_waiting_;
  for (SchedSeq& w : still)
    if (waiting_[w.id - kWaitingBase]->next != Sequence::Next::kStay) w.swapped_pages = 0;
  const std::vector<int> due = scheduler_.predictor().prefetch(still, next_step, free_blocks_after);
  // A host prefetch lasts while the predictor names its sequence; the others give their blocks
  // back now.
  std::vector<uint8_t> named(waiting_.size(), 0);
  for (int k : due) named[sched_waiting_[k].id - kWaitingBase] = 1;
  for (size_t i = 0; i < waiting_.size(); ++i)
    if (!named[i] || waiting_[i]->next != Sequence::Next::kStay)
      kv::drop_host_prefetch(*pool_, waiting_[i]->table, &swap_stats_);
  // Host prefetches take only blocks free now (the step's own reservations are made; no
  // prefix-cache page is evicted for them) beyond the next step's growth, in service order;
  // one that does not fit ends them (nothing overtakes it).
  int budget = -next_step_growth(after_forward);
  for (int s = 0; s < pool_->num_shards(); ++s) budget += pool_->shard(s).allocator().num_free();
  bool host_open = host;
  for (int k : due) {
    Sequence& seq = *waiting_[sched_waiting_[k].id - kWaitingBase];
    // Swapped in (or finished) by this step, or already being read or copied.
    if (seq.next != Sequence::Next::kStay || !seq.table.swap_prefetch.empty()) continue;
    if (seq.table.disk_record == 0) {
      if (!host_open) continue;
      auto started = kv::start_host_prefetch(*pool_, seq.table, budget, &swap_stats_);
      if (!started.ok()) {  // the swap-in copies the pages itself (and meets the error there)
        KVSPLIT_LOG_WARN("{}: host prefetch of request {} not started: {}", options_.name,
                         seq.display_id(), started.status().to_string());
      }
      if (started.ok() && *started)
        budget -= kv::host_prefetch_blocks(seq.table);
      else
        host_open = false;
      continue;
    }
    if (pool_->disk() == nullptr || (seq.prefetch && seq.prefetch->record != 0) || after_forward)
      continue;
    if (!seq.prefetch) seq.prefetch = std::make_unique<kv::SwapPrefetch>();
    auto started = kv::start_prefetch(*pool_, seq.table, seq.prefetch.get(), &swap_stats_);
    if (!started.ok()) {  // the swap-in reads the record itself (and meets the fault there)
      KVSPLIT_LOG_WARN("{}: prefetch of request {} not started: {}", options_.name,
                       seq.display_id(), started.status().to_string());
    }
  }
}

int Worker::prefetch_blocks() const {
  int n = 0;
  for (const std::unique_ptr<Sequence>& w : waiting_) n += kv::host_prefetch_blocks(w->table);
  return n;
}

void Worker::make_room(int blocks) {
  while (pool_->available_blocks() < blocks) {
    Sequence* last = nullptr;
    for (const std::unique_ptr<Sequence>& w : waiting_) {
      if (w->table.swap_prefetch.empty()) continue;
      if (last == nullptr ||
          serves_before({last->priority, last->arrival}, {w->priority, w->arrival}))
        last = w.get();
    }
    if (last == nullptr) return;
    kv::drop_host_prefetch(*pool_, last->table, &swap_stats_);
  }
}

bool Worker::reserve_kv(kv::BlockTable& table, int tokens) {
  const int need = kv::BlockTable::blocks_for(tokens, pool_->block_size()) -
                   static_cast<int>(table.blocks.size());
  if (need > 0) make_room(need);
  return pool_->reserve(table, tokens);
}

int Worker::next_step_growth(bool after_forward) const {
  int n = 0;
  auto grow = [&](const kv::BlockTable& t, int positions) {
    n += std::max(0, kv::BlockTable::blocks_for(positions, pool_->block_size()) -
                         static_cast<int>(t.blocks.size()));
  };
  if (after_forward) {
    // The step is done and its sequences in their lists: each running one decodes position
    // num_computed next.
    for (const std::unique_ptr<Sequence>& r : running_) grow(r->table, r->num_computed + 1);
    return n;
  }
  // Planned, not run: each row of the batch computes its tokens, then decodes the next position.
  for (const model::SeqStep& s : batch_.steps)
    grow(*s.table, s.start_pos + static_cast<int>(s.tokens.size()) + 1);
  for (const std::unique_ptr<Sequence>& w : waiting_)
    if (w->next == Sequence::Next::kToRunning) grow(w->table, w->num_computed + 1);
  return n;
}

void Worker::release_kv(Sequence& seq) {
  pool_->settle_prefix(seq.prefix_cursor);  // between chunks: before its pages go
  if (seq.prefetch) {
    if (seq.prefetch->record != 0) ++swap_stats_.prefetch_dropped;
    seq.prefetch.reset();  // waits for its read: the record can be freed below
  }
  kv::drop_host_prefetch(*pool_, seq.table, &swap_stats_);  // its copies land first
  if (!seq.table.blocks.empty()) pool_->release(seq.table);
  const bool spread = seq.table.spread;  // a property of the sequence (the spatial cut)
  seq.table = {};
  seq.table.spread = spread;
}

void Worker::account_kv(Sequence& seq, Clock::time_point now) {
  seq.kv_account.update(now, kv_level(*pool_, seq.table, seq.num_computed));
}

void Worker::note_prefill_speed(int prefill_tokens, double seconds) {
  // Steps of at least a block of prompt tokens: smaller ones measure overhead, not prefill.
  if (prefill_tokens < pool_->block_size() || seconds <= 0) return;
  swap_costs_.prefill_tokens_per_s =
      ewma(swap_costs_.prefill_tokens_per_s, prefill_tokens / seconds, 0.2);
  if (options_.role != WorkerRole::kDecode)
    shared_->prefill_tokens_per_s.store(swap_costs_.prefill_tokens_per_s,
                                        std::memory_order_relaxed);
}

void Worker::measure_swap_costs() {
  if (!swapping()) return;
  if (measure_copy_bandwidth(*pool_, &swap_costs_)) {
    KVSPLIT_LOG_INFO("{}: host tier copies measured at {:.2f} GB/s out, {:.2f} GB/s in (swap: {})",
                     options_.name, swap_costs_.d2h_bytes_per_s / 1e9,
                     swap_costs_.h2d_bytes_per_s / 1e9, swap_mode_name(options_.temporal.swap));
  }
  if (measure_disk_swap_bandwidth(*pool_, &swap_costs_)) {
    KVSPLIT_LOG_INFO("{}: disk tier records measured at {:.2f} GB/s written, {:.2f} GB/s read",
                     options_.name, swap_costs_.disk_write_bytes_per_s / 1e9,
                     swap_costs_.disk_read_bytes_per_s / 1e9);
  } else if (pool_->disk() != nullptr) {
    KVSPLIT_LOG_WARN(
        "{}: the disk tier's bandwidth could not be measured: a swap to disk is chosen as if it "
        "cost nothing",
        options_.name);
  }
}

bool Worker::slice_expired(const Sequence& seq, Clock::time_point now) {
  return seq.sla.max_hold_ms > 0 &&
         std::chrono::duration<double, std::milli>(now - seq.phase_start).count() >=
             seq.sla.max_hold_ms;
}

SchedulerInput Worker::scheduler_input(bool with_handoffs) {
  sched_running_.clear();
  sched_waiting_.clear();
  sched_handoffs_.clear();
  auto view = [this](const Sequence& seq, int id) {
    SchedSeq s;
    s.id = id;
    s.priority = seq.priority;
    s.arrival = seq.arrival;
    s.num_computed = seq.num_computed;
    s.num_blocks = static_cast<int>(seq.table.blocks.size());
    s.held_blocks = pool_->releasable_blocks(seq.table);
    s.last_prefill_step = seq.last_prefill_step;
    s.waiting_since = seq.waiting_since;
    return s;
  };
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence& seq = *running_[i];
    if (seq.next != Sequence::Next::kStay) continue;
    SchedSeq s = view(seq, static_cast<int>(i));
    // Back-pressure: a consumer that has not read its events holds its own sequence back (no
    // decode row, no growth; the first victim of others' needs; it decodes again once the
    // backlog is read).
    s.stalled = reader_behind(seq);
    // Fair time slicing: decoding for the class's max_hold_ms since it last (re)started.
    s.slice_expired = slice_expired(seq, now);
    // The SwapPredictor's view: time left before the class's latency target is missed (ITL
    // since its last token; TTFT since submission before its first), and its token interval.
    const bool started = seq.num_output() > 0;
    const double target = started ? seq.sla.max_itl_ms : seq.sla.max_ttft_ms;
    if (target > 0) {
      const Clock::time_point since = started ? seq.last_token_time : seq.submit_time;
      s.slack_ms = target - std::chrono::duration<double, std::milli>(now - since).count();
    }
    s.step_interval_ewma_ms = seq.step_interval_ewma_ms;
    s.final_positions = seq.num_prompt + std::max(0, seq.params.max_tokens - 1);
    sched_running_.push_back(s);
  }
  int unlisted = 0;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i]->next != Sequence::Next::kStay) continue;
    // A preempted sequence whose reader is still behind is not resumed: it would only stall
    // again holding blocks. It is still the worker's (max_num_seqs).
    if (waiting_[i]->num_output() > 0 && reader_behind(*waiting_[i])) {
      ++unlisted;
      continue;
    }
    SchedSeq s = view(*waiting_[i], kWaitingBase + static_cast<int>(i));
    s.target = waiting_[i]->prefill_target();
    s.swapped_pages = kv::swapped_pages(waiting_[i]->table);
    s.resume_step = waiting_[i]->resume_step;
    s.restart = waiting_[i]->num_output() > 0 && s.swapped_pages == 0;
    sched_waiting_.push_back(s);
  }
  if (with_handoffs) {
    // The shared pages of the offers the free blocks can admit without a preemption (a pass that
    // preempts takes no discount: Scheduler::admit), each a walk of its cached chain.
    int budget = plannable_blocks();
    for (size_t i = 0; i < pending_.size(); ++i) {
      const Sequence& seq = *pending_[i].seq;
      const int shared =
          budget < 0 ? 0
                     : pool_->shared_device_prefix_pages(seq.prefix_salt, seq.tokens,
                                                         handoff_cacheable_pages(pending_[i]));
      budget -= pending_[i].blocks(pool_->block_size()) - shared;
      sched_handoffs_.push_back({kHandoffBase + static_cast<int>(i), seq.priority, seq.arrival,
                                 pending_[i].num_tokens, pending_[i].window_dropped, shared});
    }
  }
  SchedulerInput in;
  in.running = sched_running_;
  in.waiting = sched_waiting_;
  in.handoffs = sched_handoffs_;
  in.free_blocks = plannable_blocks();  // host prefetches give their blocks back on demand
  in.total_blocks = total_blocks_;
  in.step = steps_.load(std::memory_order_relaxed);
  in.unlisted = unlisted;
  return in;
}

void Worker::apply_preemptions(const SchedulerOutput& out, Clock::time_point now) {
  for (const Preemption& p : out.preempted) {
    KVSPLIT_CHECK(p.id < kWaitingBase);
    preempt(*running_[p.id], p, now);
  }
}

double Worker::step_budget_ms() const {
  // max_chunk_ms: auto: the sequences this step may serve, decoding (running) or prefilling
  // (waiting: prompts, restarts).
  double tightest_itl = 0;
  if (options_.max_chunk_ms_auto) {
    for (const auto* list : {&running_, &waiting_}) {
      for (const std::unique_ptr<Sequence>& seq : *list)
        tightest_itl = common::tighter_itl(tightest_itl, seq->sla.max_itl_ms);
    }
  }
  return common::step_time_budget_ms(options_.max_chunk_ms, options_.max_chunk_ms_auto,
                                     tightest_itl);
}

int Worker::step_chunk_cap() const {
  const double budget_ms = step_budget_ms();
  if (budget_ms <= 0) return options_.max_chunk_tokens;
  // Until kMinSteps steps are timed, 4 min chunks; then what fits, the step's decode rows
  // (colocated) coming first and taking their share of the time.
  const double fit = step_cost_.ready() ? static_cast<double>(step_cost_.tokens_within(budget_ms)) -
                                              static_cast<double>(running_.size())
                                        : 4.0 * options_.min_chunk_tokens;
  return common::time_chunk_cap(fit, options_.max_batch_tokens, pool_->block_size(),
                                options_.min_chunk_tokens, options_.max_chunk_tokens);
}

void Worker::schedule(Clock::time_point now) {
  batch_.clear();
  const SchedulerOutput out = scheduler_.schedule(scheduler_input(/*with_handoffs=*/false));
  stalled_this_step_ = 0;
  for (const SchedSeq& s : sched_running_) stalled_this_step_ += s.stalled;
  apply_preemptions(out, now);
  apply_swap_ins(out, now);
  for (int id : out.never_fit) {  // admission checks the pool size; a smaller pool is a bug
    Sequence& seq = id < kWaitingBase ? *running_[id] : *waiting_[id - kWaitingBase];
    finish(seq, FinishReason::kError,
           internal_error(fmt::format("request {} needs KV for {} tokens, more than the {} "
                                      "blocks of {} tokens of {}",
                                      seq.display_id(),
                                      std::max(seq.prefill_target(), seq.num_computed + 1),
                                      total_blocks_, pool_->block_size(), options_.name)),
           now);
  }
  for (const DecodeRow& d : out.decode) {
    Sequence& seq = *running_[d.id];
    KVSPLIT_CHECK(reserve_kv(seq.table, seq.num_computed + 1));
    settle_cut(seq, now);
    model::SeqStep s;
    s.tokens = std::span<const int32_t>(seq.tokens.data() + seq.num_computed, 1);
    s.start_pos = seq.num_computed;
    s.table = &seq.table;
    const bool argmax = greedy_without_logits(seq);
    s.logits = argmax ? model::SeqStep::Logits::kArgmax : model::SeqStep::Logits::kLast;
    prepare_cut(seq, s);
    batch_.steps.push_back(s);
    batch_.seqs.push_back(&seq);
    batch_.samples.push_back(argmax ? kSampleArgmax : kSampleRow);
    batch_.decode.push_back(1);
  }
  const int64_t step_no = steps_.load(std::memory_order_relaxed);
  for (const PrefillChunk& c : out.prefill) {
    Sequence& seq = *waiting_[c.id - kWaitingBase];
    if (c.new_blocks > 0) {
      // A recompute (or a prompt whose KV a command released) starts from an empty table: its
      // prompt pages may still be cached, and the chunk then starts after them.
      const SchedulerConfig& sc = scheduler_.config();
      if (seq.table.blocks.empty() && seq.num_computed == 0) {
        // Its spilled cached pages come back into blocks the plan counted free.
        make_room(kv::BlockTable::blocks_for(sc.prefill_reach(0, seq.prefill_target()),
                                             pool_->block_size()));
        const int hits = pool_->share_prefix(
            seq.table, seq.prefix_salt, seq.tokens,
            sc.shares_prefix(seq.prefill_target()) && !seq.wants_prompt_logprobs()
                ? pool_->shareable_prefix_pages(
                      seq.prefill_target(),
                      cacheable_tokens(options_.kv_policy, seq.prefill_target(), seq.num_prompt))
                : 0);
        seq.num_computed = hits * pool_->block_size();
        // A prompt taken without pages (a time slice) looks its cached pages up only now.
        if (seq.pages_deferred) seq.cached_tokens = seq.num_computed;
        seq.pages_deferred = false;
      }
      // The whole target, or with a sliding window as far as this chunk reaches.
      KVSPLIT_CHECK(
          reserve_kv(seq.table, sc.chunk_reach(seq.num_computed, c.tokens, seq.prefill_target())));
    }
    seq.last_prefill_step = step_no;
    if (seq.phase == SeqPhase::kQueued) seq.enter_phase(SeqPhase::kPrefill, now);
    const int tokens = std::min(c.tokens, seq.prefill_target() - seq.num_computed);
    model::SeqStep s;
    s.tokens = std::span<const int32_t>(seq.tokens.data() + seq.num_computed, tokens);
    s.start_pos = seq.num_computed;
    s.table = &seq.table;
    // The first token is sampled after the prompt's last chunk; a recompute samples nothing.
    const bool sample = seq.num_computed + tokens == seq.prefill_target() && seq.num_output() == 0;
    const bool argmax = sample && greedy_without_logits(seq);
    s.logits = !sample ? model::SeqStep::Logits::kNone
                       : (argmax ? model::SeqStep::Logits::kArgmax : model::SeqStep::Logits::kLast);
    // Prompt logprobs: every row's logits (the last one, when it samples, is sampled from).
    if (seq.wants_prompt_logprobs()) s.logits = model::SeqStep::Logits::kAll;
    batch_.steps.push_back(s);
    batch_.seqs.push_back(&seq);
    batch_.samples.push_back(seq.wants_prompt_logprobs()
                                 ? (sample ? kSamplePromptRowsLast : kSamplePromptRows)
                                 : (!sample ? kSampleNone : (argmax ? kSampleArgmax : kSampleRow)));
    batch_.decode.push_back(0);
  }
  const int spec_blocks = speculate(out.free_blocks_after);
  // After the step's reservations, before its forward pass: the copies run beside it.
  start_prefetches(out.free_blocks_after - spec_blocks, /*after_forward=*/false);
}

bool Worker::speculating() const {
  return options_.speculative.enabled() && options_.kv_policy == KvPolicy::kFull &&
         scheduler_.config().kv_window == 0;
}

void Worker::propose_draft(Sequence& seq) const {
  if (seq.spec_draft_for == seq.tokens.size()) return;
  const SpeculativeConfig& sc = options_.speculative;
  sampling::propose_ngram_draft(
      seq.tokens,
      sampling::NgramDraftConfig{sc.num_speculative_tokens, sc.prompt_lookup_min,
                                 sc.prompt_lookup_max},
      &seq.spec_draft);
  seq.spec_draft_for = seq.tokens.size();
}

int Worker::speculate(int free_blocks) {
  const SpeculativeConfig& sc = options_.speculative;
  if (!speculating()) return 0;
  int budget = options_.max_batch_tokens;
  // With a step time budget (max_chunk_ms), the tokens a step fits within it by the measured
  // step cost (none until it is measured): drafts never stretch a step past it.
  if (const double ms = step_budget_ms(); ms > 0)
    budget = std::min(budget, step_cost_.ready() ? step_cost_.tokens_within(ms) : 0);
  for (const model::SeqStep& s : batch_.steps) budget -= static_cast<int>(s.tokens.size());
  // Draft pages come from blocks nobody holds (not the prefix cache's, which reserve would
  // evict) and, on a shard group, only from room the table has already.
  int spare = pool_->num_shards() > 1 ? 0 : std::min(free_blocks, pool_->allocator().num_free());
  const int taken_before = spare;
  const int bs = pool_->block_size();
  for (size_t i = 0; i < batch_.steps.size() && budget > 0; ++i) {
    if (!batch_.decode[i]) continue;
    Sequence& seq = *batch_.seqs[i];
    // Tokens this step may emit after the first one (max_tokens and the context both bound it).
    const int left = seq.stop->max_new_tokens() - seq.stop->num_generated() - 1;
    const int want =
        std::min({seq.spec_acceptance.length(sc.num_speculative_tokens), budget, left});
    if (want <= 0) continue;
    propose_draft(seq);  // unless the sampling threads did already
    const std::vector<int32_t>& draft = seq.spec_draft;
    int k = std::min(want, static_cast<int>(draft.size()));
    if (k <= 0) continue;
    const int pos = seq.num_computed;  // the fed last token's position
    const int room = static_cast<int>(seq.table.blocks.size()) * bs - (pos + 1);
    if (k > room) {
      const int need =
          kv::BlockTable::blocks_for(pos + 1 + k, bs) - static_cast<int>(seq.table.blocks.size());
      if (need <= spare && pool_->reserve(seq.table, pos + 1 + k)) {
        spare -= need;
      } else {
        k = room;
      }
    }
    if (k <= 0) continue;
    seq.spec_row.assign(1, seq.tokens[static_cast<size_t>(pos)]);
    seq.spec_row.insert(seq.spec_row.end(), draft.begin(), draft.begin() + k);
    model::SeqStep& s = batch_.steps[i];
    s.tokens = std::span<const int32_t>(seq.spec_row);
    s.logits = model::SeqStep::Logits::kAll;
    batch_.samples[i] = kSampleSpec;
    budget -= k;
  }
  return taken_before - spare;
}

bool Worker::reader_behind(const Sequence& seq) const {
  // The completions of a request share its stream: each has max_unread_events of it.
  return options_.max_unread_events > 0 &&
         seq.ctl->stream->unread() >= static_cast<size_t>(options_.max_unread_events) *
                                          static_cast<size_t>(seq.ctl->stream->completions());
}

void Worker::settle_cut(Sequence& seq, Clock::time_point step_start, bool all) {
  if (!seq.cut || seq.table.restoring.empty()) return;
  const Status st = all ? seq.cut->settle_all(*pool_, seq.table, &cut_ops_)
                        : seq.cut->settle(*pool_, seq.table, step_start, &cut_ops_);
  if (!st.ok()) {
    KVSPLIT_LOG_WARN("{}: a recall of request {} failed, its page stays as it was: {}",
                     options_.name, seq.display_id(), st.to_string());
  }
}

void Worker::prepare_cut(Sequence& seq, model::SeqStep& step) {
  if (options_.kv_policy == KvPolicy::kFull) return;
  if (!seq.cut) {
    seq.cut = std::make_unique<SequenceCut>(options_.kv_policy,
                                            seq.sla.semantic.value_or(options_.semantic));
  }
  seq.cut->prepare(step, pool_->block_size());
}

void Worker::drop_behind_window(Sequence& seq) {
  const int window = scheduler_.config().kv_window;
  if (window <= 0) return;
  kv::drop_behind_window(*pool_, seq.table, seq.num_computed, window, &cut_ops_);
}

bool Worker::finish_cut(Sequence& seq, Clock::time_point now) {
  if (!seq.cut) return true;
  const Status st = seq.cut->finish(*pool_, seq.table, seq.num_computed, &cut_ops_);
  if (st.ok()) return true;
  KVSPLIT_LOG_ERROR("{}: KV cut of request {} failed: {}", options_.name, seq.display_id(),
                    st.to_string());
  finish(seq, FinishReason::kError, st.with_prefix("KV cut"), now);
  return false;
}

void Worker::compact(Clock::time_point now) {
  scratch_waiting_.clear();
  scratch_running_.clear();
  for (std::unique_ptr<Sequence>& p : waiting_) {
    const Sequence::Next next = p->next;
    p->next = Sequence::Next::kStay;
    switch (next) {
      case Sequence::Next::kStay:
        scratch_waiting_.push_back(std::move(p));
        break;
      case Sequence::Next::kToRunning:
        scratch_running_.push_back(std::move(p));
        break;
      case Sequence::Next::kHandoff:
        handoff(std::move(p), now);
        break;
      case Sequence::Next::kToWaiting:
        scratch_waiting_.push_back(std::move(p));
        break;
      case Sequence::Next::kRemove:
        break;
    }
  }
  for (std::unique_ptr<Sequence>& p : running_) {
    const Sequence::Next next = p->next;
    p->next = Sequence::Next::kStay;
    switch (next) {
      case Sequence::Next::kStay:
      case Sequence::Next::kToRunning:
        scratch_running_.push_back(std::move(p));
        break;
      case Sequence::Next::kToWaiting:
        scratch_waiting_.push_back(std::move(p));
        break;
      case Sequence::Next::kHandoff:
        KVSPLIT_CHECK_MSG(false, "handoff from running");
        break;
      case Sequence::Next::kRemove:
        break;
    }
  }
  waiting_.swap(scratch_waiting_);
  running_.swap(scratch_running_);
}

}  // namespace kvsplit::sched
