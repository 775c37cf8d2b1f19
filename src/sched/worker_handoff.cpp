// Worker: the KV handoff in disaggregated mode. Source side: handoff() posts an offer and pins
// the pages, reclaim_undelivered() takes back offers a destination did not receive in time (or
// that were cancelled in flight). Destination side: admit_offers() applies the Scheduler's
// admissions (a slot and blocks free; back-pressure, not an error, otherwise) and its preemptions
// for a higher priority. The protocol is described in kv_handoff.h.
#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "sched/prefix_share.h"
#include "sched/worker.h"

namespace kvsplit::sched {
namespace {

double ms_since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

void Worker::handoff(std::unique_ptr<Sequence> seq, Clock::time_point now) {
  if (Status st = check_handoff_table(seq->table); !st.ok()) {
    KVSPLIT_LOG_ERROR("{}: request {}: {}", options_.name, seq->display_id(), st.to_string());
    finish(*seq, FinishReason::kError, std::move(st), now);
    return;
  }
  Pinned pin;
  pin.hashes = route_hashes(*seq);
  pin.incoming = HandoffOffer::incoming_blocks_for(seq->num_computed, seq->table.window_dropped,
                                                   pool_->block_size());
  Worker* to = pick_decode_worker(pin);
  KVSPLIT_CHECK(to != nullptr);
  pin.table = std::move(seq->table);
  pin.ctl = seq->ctl;
  seq->table = {};
  seq->table.spread = pin.table.spread;  // the destination places its pages the same way
  seq->enter_phase(SeqPhase::kHandoff, now);
  const uint64_t id = next_handoff_id_++;
  Pinned& pinned = pinned_.emplace(id, std::move(pin)).first->second;
  ++undelivered_;
  post_handoff(id, pinned, std::move(seq), to, now);
}

Worker* Worker::pick_decode_worker(const Pinned& pin) const {
  const std::vector<Worker*>& all = shared_->decode_workers;
  const std::vector<int> sent =
      pin.hashes.empty() ? std::vector<int>{}
                         : routes_.leading_pages(pin.hashes, static_cast<int>(all.size()));
  std::vector<DecodeLoad> loads;
  std::vector<int> cached;
  std::vector<Worker*> candidates;
  // Workers marked down only when no other is left.
  for (const bool down_too : {false, true}) {
    for (size_t k = 0; k < all.size(); ++k) {
      if (std::find(pin.tried.begin(), pin.tried.end(), all[k]) != pin.tried.end()) continue;
      if (!down_too && all[k]->marked_down()) continue;
      loads.push_back(all[k]->load());
      if (!options_.slot_aware_handoffs) loads.back().max_seqs = 0;
      if (!sent.empty()) cached.push_back(sent[k]);
      candidates.push_back(all[k]);
    }
    if (!candidates.empty()) break;
  }
  const int i = choose_decode_worker(loads, cached, pin.incoming);
  return i < 0 ? nullptr : candidates[static_cast<size_t>(i)];
}

Worker* Worker::up_instead_of_down_dest(const Pinned& pin) const {
  // Bounded: each early move gives its worker back its try (below), so workers that keep being
  // marked down and coming back could otherwise pass an offer between them for ever.
  if (!options_.take_back_from_down || !pin.dest->marked_down() ||
      pin.early_moves >= static_cast<int>(shared_->decode_workers.size()))
    return nullptr;
  Worker* next = pick_decode_worker(pin);
  return next != nullptr && !next->marked_down() ? next : nullptr;
}

void Worker::routes_moved(const Pinned& pin, const Worker* now_at) {
  if (pin.hashes.empty()) return;
  const std::span<const uint64_t> hashes(pin.hashes);
  routes_.forget(hashes.subspan(std::min(hashes.size(), static_cast<size_t>(pin.dest_had_pages))),
                 decode_index(pin.dest));
  if (now_at != nullptr) routes_.record(hashes, decode_index(now_at));
}

int Worker::decode_index(const Worker* w) const {
  const std::vector<Worker*>& all = shared_->decode_workers;
  return static_cast<int>(std::find(all.begin(), all.end(), w) - all.begin());
}

std::vector<uint64_t> Worker::route_hashes(const Sequence& seq) const {
  const kv::PrefixCache* pc = pool_->prefix_cache();
  // Not where decode workers take no cached pages (a sliding window; shard groups, which every
  // worker has alike), nor with one decode worker (no choice to make).
  if (pc == nullptr || !options_.cache_aware_handoffs || scheduler_.config().kv_window > 0 ||
      pool_->num_shards() > 1 || shared_->decode_workers.size() < 2)
    return {};
  const int pages = std::min<int>(
      cacheable_tokens(options_.kv_policy, seq.num_computed, seq.num_prompt) / pool_->block_size(),
      static_cast<int>(seq.tokens.size()) / pool_->block_size());
  std::vector<uint64_t> out;
  out.reserve(static_cast<size_t>(std::max(0, pages)));
  kv::PrefixCache::ChainPos pos;
  for (int k = 0; k < pages; ++k) {
    pos = pc->next(seq.prefix_salt, seq.tokens, pos);
    out.push_back(pos.parent);  // the hash of page k
  }
  return out;
}

void Worker::post_handoff(uint64_t id, Pinned& pin, std::unique_ptr<Sequence> seq, Worker* to,
                          Clock::time_point now) {
  HandoffOffer offer;
  offer.handoff_id = id;
  offer.source = this;
  offer.source_pool = pool_.get();
  offer.source_blocks = pin.table.blocks;
  for (const kv::PageEntry& p : pin.table.pages) offer.source_shards.push_back(p.shard);
  offer.num_tokens = seq->num_computed;
  offer.window_dropped = pin.table.window_dropped;
  offer.ticket = std::make_shared<HandoffTicket>();
  pin.ticket = offer.ticket;
  pin.sent_at = Clock::now();  // as it is posted: `now` began the step, a drain since is not one
  pin.deliver_by = now + options_.handoff_timeout;
  pin.dest = to;
  pin.tried.push_back(to);
  if (!pin.hashes.empty()) {
    const int k = decode_index(to);
    pin.dest_had_pages = routes_.leading_pages(pin.hashes, k + 1)[static_cast<size_t>(k)];
    if (pin.tried.size() == 1 && pin.early_moves == 0 && pin.dest_had_pages > 0)
      handoffs_to_cached_.fetch_add(1, std::memory_order_relaxed);
    routes_.record(pin.hashes, k);
  }
  offer.ticket->seq = std::move(seq);
  to->post_offer(std::move(offer));
}

void Worker::mark_if_stalled(Worker* dest, Clock::time_point sent_at, Clock::time_point now) {
  if (options_.handoff_stall.count() <= 0 || dest->marked_down() ||
      !dest->stalled_since(sent_at, now, options_.handoff_stall) || !dest->mark_down())
    return;
  KVSPLIT_LOG_WARN(
      "{}: {} marked down: it has not taken a KV handoff posted {:.0f} ms ago, nor drained its "
      "inbox since (handoff_stall_ms {}, or {}x its slowest recent step); new handoffs go to "
      "other decode workers until it drains its inbox again",
      options_.name, dest->name(), ms_since(sent_at, now), options_.handoff_stall.count(),
      kStallStepFactor);
}

void Worker::reclaim_undelivered(Clock::time_point now) {
  if (undelivered_ == 0) return;
  for (auto it = pinned_.begin(); it != pinned_.end();) {
    Pinned& p = it->second;
    if (!p.ticket) {
      ++it;
      continue;
    }
    if (p.ticket->state.load(std::memory_order_acquire) == HandoffTicket::kReceived) {
      p.ticket.reset();  // the destination owns the request; HandoffDone will come
      --undelivered_;
      ++it;
      continue;
    }
    const bool cancelled = p.ctl->cancel_requested.load(std::memory_order_relaxed);
    // Before its deadline, an offer is also taken back when its destination has been marked down
    // (another offer to it missed its deadline, here or on another prefill worker) and a decode
    // worker that is up has not had it: a hung worker costs the offers in flight to it one
    // handoff_timeout_ms in all, not one each.
    const bool late = now >= p.deliver_by;
    if (!late && !cancelled) mark_if_stalled(p.dest, p.sent_at, now);
    Worker* instead = late || cancelled ? nullptr : up_instead_of_down_dest(p);
    if ((!late && !cancelled && instead == nullptr) || !p.ticket->reclaim()) {
      ++it;
      continue;
    }
    std::unique_ptr<Sequence> seq = std::move(p.ticket->seq);
    if (cancelled) {  // cancelled in flight: finished here, without waiting for the destination
      pool_->release(p.table);
      --undelivered_;
      finish(*seq, FinishReason::kCancelled, cancelled_error("cancelled"), now);
      it = pinned_.erase(it);
      continue;
    }
    // The destination did not take the offer in time (hung or dead): the request is ours again,
    // and the destination is marked down until it drains its inbox again. A decode worker that
    // has not had it yet is offered it, under the same id (the dead offer is dropped by its
    // destination without a HandoffDone) and the same pinned pages.
    Worker* dest = p.dest;
    if (late && dest->mark_down()) {
      KVSPLIT_LOG_WARN(
          "{}: {} marked down: it did not take a KV handoff within {} ms; new handoffs go to "
          "other decode workers until it drains its inbox again",
          options_.name, dest->name(), options_.handoff_timeout.count());
    }
    if (Worker* next = late ? pick_decode_worker(p) : instead) {
      if (late) {
        KVSPLIT_LOG_WARN(
            "{}: KV handoff of request {} to {} not received within {} ms; offered to {}",
            options_.name, seq->display_id(), p.dest->name(), options_.handoff_timeout.count(),
            next->name());
      } else {
        KVSPLIT_LOG_WARN(
            "{}: KV handoff of request {} taken back from {}, which is marked down; "
            "offered to {}",
            options_.name, seq->display_id(), p.dest->name(), next->name());
      }
      handoffs_rerouted_.fetch_add(1, std::memory_order_relaxed);
      routes_moved(p, nullptr);  // it never got the pages
      if (!late) {
        // Left before its deadline, the worker keeps its try: once it drains its inbox again
        // it may still be offered this one if the others miss it.
        ++p.early_moves;
        p.tried.erase(std::find(p.tried.begin(), p.tried.end(), dest));
      }
      post_handoff(it->first, p, std::move(seq), next, now);
      ++it;
      continue;
    }
    KVSPLIT_LOG_ERROR(
        "{}: KV handoff of request {} to {} not received within {} ms (no other "
        "decode worker left to offer it to)",
        options_.name, seq->display_id(), p.dest->name(), options_.handoff_timeout.count());
    pool_->release(p.table);
    --undelivered_;
    finish(*seq, FinishReason::kError,
           deadline_exceeded(fmt::format(
               "KV handoff of request {} to {} was not received within {} ms (handoff_timeout_ms; "
               "the destination is not responding)",
               seq->display_id(), p.dest->name(), options_.handoff_timeout.count())),
           now);
    it = pinned_.erase(it);
  }
}

void Worker::admit_offers(Clock::time_point now) {
  if (pending_.empty()) return;
  // Cancelled or expired offers leave from anywhere in the queue.
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->seq->cancelled()) {
      finish_offer(*it, FinishReason::kCancelled, cancelled_error("cancelled"), now);
    } else if (now >= it->wait_deadline) {
      const int need = it->blocks(pool_->block_size());
      finish_offer(*it, FinishReason::kError,
                   deadline_exceeded(fmt::format(
                       "request {} waited {:.0f} ms for room on {} (queue_timeout_ms {} of SLA "
                       "class '{}'): {} blocks needed, {} free, {} running, max_num_seqs {}",
                       it->seq->display_id(), ms_since(it->seq->phase_start, now), options_.name,
                       it->seq->sla.queue_timeout_ms, it->seq->sla.name, need, plannable_blocks(),
                       running_.size(), options_.max_num_seqs)),
                   now);
    } else {
      ++it;
      continue;
    }
    it = pending_.erase(it);
  }
  // The Scheduler admits in arrival order and stops at the first that does not fit (no
  // overtaking); not fitting is back-pressure: the offer waits (the source keeps its pages
  // pinned) until room frees. It may preempt strictly lower priorities for an offer.
  const SchedulerOutput out = scheduler_.admit_handoffs(scheduler_input(/*with_handoffs=*/true));
  apply_preemptions(out, now);
  std::vector<bool> leaves(pending_.size(), false);
  for (int id : out.never_fit) {  // admission checks every pool's size; a smaller pool is a bug
    HandoffOffer& o = pending_[id - kHandoffBase];
    leaves[id - kHandoffBase] = true;
    finish_offer(o, FinishReason::kError,
                 internal_error(fmt::format("KV handoff of {} tokens exceeds the {} blocks of {}",
                                            o.num_tokens, total_blocks_, options_.name)),
                 now);
  }
  std::vector<bool> admitted(pending_.size(), false);
  for (const HandoffAdmission& a : out.admitted) admitted[a.id - kHandoffBase] = true;
  for (const HandoffAdmission& a : out.admitted) {
    HandoffOffer& o = pending_[a.id - kHandoffBase];
    kv::BlockTable table;
    table.spread = o.seq->table.spread;
    if (o.window_dropped > 0) {
      // The pages the source dropped behind the window stay dropped here (never read again).
      table.blocks.assign(static_cast<size_t>(o.window_dropped), -1);
      table.pages.resize(table.blocks.size());
      for (kv::PageEntry& p : table.pages) {
        p.location = kv::PageLocation::kEvicted;
        p.precision = kernels::KvPrecision::kEvicted;
      }
      table.window_dropped = o.window_dropped;
    }
    // Leading pages this worker's prefix cache holds on the device are shared, not copied.
    const int cacheable = handoff_cacheable_pages(o);
    const int cached = cacheable > 0 ? pool_->share_device_prefix(table, o.seq->prefix_salt,
                                                                  o.seq->tokens, cacheable)
                                     : 0;
    if (!reserve_kv(table, o.num_tokens)) {
      // The plan counted on blocks the pool does not have (never expected: a page it counted
      // as shared was not). This offer and those after it wait for the next pass, whose plan
      // counts the shares again; nothing was copied or posted.
      pool_->release(table);
      KVSPLIT_LOG_WARN(
          "{}: KV handoff of request {} ({} tokens) admitted without the room: "
          "{} pages from the cache, {} blocks available; it waits a step",
          options_.name, o.seq->display_id(), o.num_tokens, cached, pool_->available_blocks());
      break;
    }
    leaves[a.id - kHandoffBase] = true;
    Status fault = options_.handoff_copy_fault_hook ? options_.handoff_copy_fault_hook(o.seq->id())
                                                    : ok_status();
    StatusOr<KvCopyRoute> route = fault.ok() ? copy_kv_pages(*o.source_pool, o.source_blocks,
                                                             o.source_shards, *pool_, table, cached)
                                             : StatusOr<KvCopyRoute>(std::move(fault));
    const Status st = route.status();
    if (route.ok()) {
      ++handoffs_by_route_[static_cast<int>(*route)];
      const int copied = static_cast<int>(table.blocks.size()) - table.window_dropped - cached;
      handoff_pages_copied_.fetch_add(copied, std::memory_order_relaxed);
      handoff_pages_cached_.fetch_add(cached, std::memory_order_relaxed);
      KVSPLIT_LOG_DEBUG("{}: KV handoff of {} tokens ({}; {} pages copied, {} from the cache)",
                        options_.name, o.num_tokens, kv_copy_route_name(*route), copied, cached);
      // Its pages serve the next handoff of the same prefix (and a restart here).
      pool_->cache_prefix(table, o.seq->prefix_salt, o.seq->tokens, cacheable);
    }
    std::unique_ptr<Sequence> seq = std::move(o.seq);
    o.source->post_done(HandoffDone{o.handoff_id, route.ok() ? this : nullptr});
    incoming_blocks_.fetch_sub(o.incoming_blocks(pool_->block_size()), std::memory_order_relaxed);
    if (!st.ok()) {  // not retried: the request fails with the copy's error
      Status err = st.with_prefix(
          fmt::format("KV handoff of request {} to {}", seq->display_id(), options_.name));
      KVSPLIT_LOG_ERROR("{}", err.to_string());  // it names this worker
      pool_->release(table);
      finish(*seq, FinishReason::kError, std::move(err), now);
      continue;
    }
    seq->table = std::move(table);
    seq->num_computed = o.num_tokens;
    // Its class's cut settings of now: a class-scoped change (the KV cache manager's) made while
    // it was queued, prefilling or in flight reached only the workers' own sequences.
    if (shared_->router != nullptr) shared_->router->refresh_cut_settings(&seq->sla);
    account_kv(*seq, now);  // until now: the source's pinned copy, at the same level
    // The copy is part of the handoff (Timings::handoff_ms), not of decode. Like every phase
    // time, a later transition at this step's `now` takes back what it overlaps: the phases
    // still sum to the request's time.
    seq->enter_phase(SeqPhase::kDecode, Clock::now());
    running_.push_back(std::move(seq));
  }
  forward_offers(leaves, admitted, now);
  size_t k = 0;
  for (auto it = pending_.begin(); it != pending_.end(); ++k) {
    it = leaves[k] ? pending_.erase(it) : std::next(it);
  }
}

void Worker::forward_offers(std::vector<bool>& leaves, const std::vector<bool>& admitted,
                            Clock::time_point now) {
  const std::vector<Worker*>& all = shared_->decode_workers;
  if (options_.role != WorkerRole::kDecode || !options_.forward_waiting_handoffs || all.size() < 2)
    return;
  const int bs = pool_->block_size();
  for (size_t k = 0; k < pending_.size(); ++k) {
    HandoffOffer& o = pending_[k];
    // Admitted with preemptions but not taken (a reservation short of its plan) stays: its
    // victims made room for it here. A cancel is finished on the next pass.
    if (leaves[k] || admitted[k] || o.seq->cancelled()) continue;
    const int need = o.incoming_blocks(bs);
    std::vector<DecodeLoad> loads;
    std::vector<Worker*> candidates;
    for (Worker* w : all) {
      if (w == this || w->marked_down() ||
          std::find(o.visited.begin(), o.visited.end(), w) != o.visited.end())
        continue;
      // Its incoming blocks and offers include those posted to it a moment ago (this pass's
      // too). Room as the Scheduler admits a handoff: its blocks, the block its first decode
      // may need, and one for each running sequence's next token (at most).
      const DecodeLoad l = w->load();
      if (l.kv_blocks_free - l.kv_blocks_incoming < need + 1 + l.running || l.slots_full())
        continue;
      loads.push_back(l);
      candidates.push_back(w);
    }
    const int i = choose_decode_worker(loads);
    if (i < 0) continue;
    Worker* to = candidates[static_cast<size_t>(i)];
    KVSPLIT_LOG_DEBUG(
        "{}: KV handoff of request {} ({} blocks) waits for room here; passed on to "
        "{}, which has room for it",
        options_.name, o.seq->display_id(), need, to->name());
    o.visited.push_back(this);
    Forwarded f;
    f.ticket = std::make_shared<HandoffTicket>();
    f.offer = o.without_request();
    f.ctl = o.seq->ctl;
    f.to = to;
    f.sent_at = Clock::now();  // as it is posted (see post_handoff)
    f.deliver_by = now + options_.handoff_timeout;
    f.ticket->seq = std::move(o.seq);
    HandoffOffer sent = f.offer.without_request();
    sent.ticket = f.ticket;
    incoming_blocks_.fetch_sub(need, std::memory_order_relaxed);
    forwarded_.push_back(std::move(f));
    handoffs_forwarded_.fetch_add(1, std::memory_order_relaxed);
    leaves[k] = true;
    to->post_offer(std::move(sent));
  }
}

void Worker::reclaim_forwarded(Clock::time_point now, bool all) {
  bool back = false;
  for (auto it = forwarded_.begin(); it != forwarded_.end();) {
    if (it->ticket->state.load(std::memory_order_acquire) == HandoffTicket::kReceived) {
      it = forwarded_.erase(it);  // its new destination owns it (and posts the HandoffDone)
      continue;
    }
    const bool cancelled = it->ctl->cancel_requested.load(std::memory_order_relaxed);
    // Before its deadline too once its target has been marked down (by another offer's missed
    // deadline): it waits here again, and may be passed on to a worker that is up.
    const bool late = now >= it->deliver_by;
    if (!all && !cancelled && !late) mark_if_stalled(it->to, it->sent_at, now);
    const bool down = options_.take_back_from_down && it->to->marked_down();
    if ((!all && !cancelled && !late && !down) || !it->ticket->reclaim()) {
      ++it;
      continue;
    }
    if (!all && !cancelled && late && it->to->mark_down()) {
      KVSPLIT_LOG_WARN(
          "{}: {} marked down: it did not take a KV handoff passed on to it within {} ms; the "
          "handoff waits here again",
          options_.name, it->to->name(), options_.handoff_timeout.count());
    } else if (!all && !cancelled && !late) {
      KVSPLIT_LOG_INFO("{}: {} is marked down; the KV handoff passed on to it waits here again",
                       options_.name, it->to->name());
    }
    // Back in the queue (a cancel is finished by the next admission pass), as it was.
    HandoffOffer o = std::move(it->offer);
    o.seq = std::move(it->ticket->seq);
    incoming_blocks_.fetch_add(o.incoming_blocks(pool_->block_size()), std::memory_order_relaxed);
    pending_.push_back(std::move(o));
    back = true;
    it = forwarded_.erase(it);
  }
  if (back) sort_pending();
}

int Worker::handoff_cacheable_pages(const HandoffOffer& offer) const {
  if (pool_->prefix_cache() == nullptr || offer.window_dropped > 0 ||
      scheduler_.config().kv_window > 0 || pool_->num_shards() > 1)
    return 0;
  return cacheable_tokens(options_.kv_policy, offer.num_tokens, offer.seq->num_prompt) /
         pool_->block_size();
}

bool Worker::has_unreserved_waiting(int32_t priority) const {
  for (const auto& seq : waiting_) {
    if (seq->num_output() > 0 && reader_behind(*seq)) continue;  // not resumed while behind
    // Preempted without blocks, swapped out, or paused with all its KV resident (MigrateKv
    // brought it back): each resumes before new work of no higher priority takes the room.
    const bool resident_paused =
        seq->num_output() > 0 && seq->num_computed >= seq->prefill_target();
    if ((seq->table.blocks.empty() || kv::swapped_pages(seq->table) > 0 || resident_paused) &&
        seq->priority >= priority)
      return true;
  }
  return false;
}

int Worker::pulled_prompts() const {
  int n = 0;
  for (const auto& seq : waiting_) n += seq->preemptions == 0 && seq->num_output() == 0;
  return n;
}

}  // namespace kvsplit::sched
