// Worker lifecycle, inbox, admission (router pull, handoff offers), handoff and finishing.
// The step itself (schedule / postprocess / preemption) is in worker_step.cpp.
#include "sched/worker.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/check.h"
#include "common/log.h"

namespace kvsplit::sched {
namespace {

double ms_since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

Worker::Worker(WorkerOptions options, std::unique_ptr<backend::Backend> backend,
               std::unique_ptr<StepModel> model, std::unique_ptr<kv::KvPool> pool,
               WorkerShared* shared)
    : options_(std::move(options)),
      backend_(std::move(backend)),
      model_(std::move(model)),
      pool_(std::move(pool)),
      shared_(shared),
      total_blocks_(pool_->allocator().num_blocks()) {
  KVSPLIT_CHECK(shared_ != nullptr && shared_->sink != nullptr);
  KVSPLIT_CHECK(options_.max_num_seqs >= 1 && options_.max_batch_tokens >= 1);
  free_blocks_.store(pool_->allocator().num_free());
}

Worker::~Worker() {
  request_stop();
  join();
}

void Worker::start() {
  KVSPLIT_CHECK(!thread_.joinable());
  thread_ = std::thread([this] { loop(); });
}

void Worker::request_stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void Worker::post_offer(HandoffOffer offer) {
  incoming_blocks_.fetch_add(kv::BlockTable::blocks_for(offer.num_tokens + 1, pool_->block_size()),
                             std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_offers_.push_back(std::move(offer));
  }
  cv_.notify_all();
}

void Worker::post_done(HandoffDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_done_.push_back(done.handoff_id);
  }
  cv_.notify_all();
}

DecodeLoad Worker::load() const {
  DecodeLoad l;
  l.kv_blocks_total = total_blocks_;
  l.kv_blocks_free = free_blocks_.load(std::memory_order_relaxed);
  l.kv_blocks_incoming = incoming_blocks_.load(std::memory_order_relaxed);
  l.running = running_count_.load(std::memory_order_relaxed);
  l.max_running = options_.max_num_seqs;
  return l;
}

WorkerSnapshot Worker::snapshot() const {
  WorkerSnapshot s;
  s.pool.name = options_.name;
  s.pool.kv_blocks_total = total_blocks_;
  s.pool.kv_blocks_free = free_blocks_.load(std::memory_order_relaxed);
  s.pool.running = running_count_.load(std::memory_order_relaxed);
  s.pool.waiting = waiting_count_.load(std::memory_order_relaxed);
  s.steps = steps_.load(std::memory_order_relaxed);
  s.forward_ms = forward_ns_.load(std::memory_order_relaxed) / 1e6;
  s.bookkeeping_ms = bookkeeping_ns_.load(std::memory_order_relaxed) / 1e6;
  s.sampling_ms = sampling_ns_.load(std::memory_order_relaxed) / 1e6;
  return s;
}

void Worker::publish_stats() {
  free_blocks_.store(pool_->allocator().num_free(), std::memory_order_relaxed);
  running_count_.store(static_cast<int>(running_.size()), std::memory_order_relaxed);
  waiting_count_.store(static_cast<int>(waiting_.size() + pending_.size()),
                       std::memory_order_relaxed);
}

void Worker::loop() {
  while (true) {
    const bool worked = step();
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) break;
    if (!worked) {
      cv_.wait_for(lock, options_.idle_wait, [&] {
        return stop_ || wake_ || !inbox_offers_.empty() || !inbox_done_.empty();
      });
      if (stop_) break;
    }
    wake_ = false;
  }
}

void Worker::drain_inbox() {
  std::deque<HandoffOffer> offers;
  std::vector<uint64_t> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    offers.swap(inbox_offers_);
    done.swap(inbox_done_);
  }
  for (uint64_t id : done) {
    auto it = pinned_.find(id);
    KVSPLIT_CHECK_MSG(it != pinned_.end(), "HandoffDone for an unknown handoff");
    pool_->release(it->second);
    pinned_.erase(it);
  }
  for (HandoffOffer& o : offers) pending_.push_back(std::move(o));
}

void Worker::finish(Sequence& seq, FinishReason reason, Status status, Clock::time_point now) {
  if (!seq.table.blocks.empty()) pool_->release(seq.table);
  seq.table = {};
  seq.next = Sequence::Next::kRemove;
  finish_sequence(seq, reason, std::move(status), now, *shared_->sink);
}

void Worker::finish_offer(HandoffOffer& offer, FinishReason reason, Status status,
                          Clock::time_point now) {
  offer.source->post_done(HandoffDone{offer.handoff_id});
  incoming_blocks_.fetch_sub(kv::BlockTable::blocks_for(offer.num_tokens + 1, pool_->block_size()),
                             std::memory_order_relaxed);
  finish(*offer.seq, reason, std::move(status), now);
}

void Worker::expire_queued(Clock::time_point now) {
  if (options_.role == WorkerRole::kDecode || shared_->router == nullptr) return;
  for (std::unique_ptr<Sequence>& seq : shared_->router->take_expired(now)) {
    const double waited = ms_since(seq->submit_time, now);
    finish(*seq, FinishReason::kError,
           deadline_exceeded(fmt::format(
               "request {} waited {:.0f} ms in the queue of SLA class '{}' (queue_timeout_ms {})",
               seq->id(), waited, seq->sla.name, seq->sla.queue_timeout_ms)),
           now);
  }
}

void Worker::reap_cancelled(Clock::time_point now) {
  const uint64_t epoch = shared_->cancel_epoch.load(std::memory_order_acquire);
  if (epoch == seen_cancel_epoch_) return;
  seen_cancel_epoch_ = epoch;
  for (auto* list : {&waiting_, &running_}) {
    for (std::unique_ptr<Sequence>& seq : *list) {
      if (seq->cancelled()) {
        finish(*seq, FinishReason::kCancelled, cancelled_error("cancelled"), now);
      }
    }
  }
  // Offers are checked on every admit_offers pass.
}

void Worker::admit_offers(Clock::time_point now) {
  if (pending_.empty()) return;
  // Cancelled or expired offers leave from anywhere in the queue.
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->seq->cancelled()) {
      finish_offer(*it, FinishReason::kCancelled, cancelled_error("cancelled"), now);
    } else if (now >= it->deadline) {
      const int need = kv::BlockTable::blocks_for(it->num_tokens, pool_->block_size());
      finish_offer(*it, FinishReason::kError,
                   deadline_exceeded(fmt::format(
                       "KV handoff of request {} to {} timed out after {} ms: {} blocks needed, "
                       "{} free, {} running",
                       it->seq->id(), options_.name, options_.handoff_timeout.count(), need,
                       pool_->allocator().num_free(), running_.size())),
                   now);
    } else {
      ++it;
      continue;
    }
    it = pending_.erase(it);
  }
  // Admit in arrival order; stop at the first that does not fit (no overtaking).
  while (!pending_.empty()) {
    if (running_.size() + waiting_.size() >= static_cast<size_t>(options_.max_num_seqs)) break;
    if (has_unreserved_waiting()) break;  // preempted sequences get blocks first
    HandoffOffer& o = pending_.front();
    kv::BlockTable table;
    if (!pool_->reserve(table, o.num_tokens)) break;
    Status st = copy_kv_blocks(*o.source_pool, o.source_blocks, *pool_, table.blocks);
    std::unique_ptr<Sequence> seq = std::move(o.seq);
    o.seq = nullptr;
    o.source->post_done(HandoffDone{o.handoff_id});
    incoming_blocks_.fetch_sub(kv::BlockTable::blocks_for(o.num_tokens + 1, pool_->block_size()),
                               std::memory_order_relaxed);
    const int num_tokens = o.num_tokens;
    pending_.pop_front();
    if (!st.ok()) {
      pool_->release(table);
      finish(*seq, FinishReason::kError, st.with_prefix("KV handoff"), now);
      continue;
    }
    seq->table = std::move(table);
    seq->num_computed = num_tokens;
    seq->enter_phase(SeqPhase::kDecode, now);
    running_.push_back(std::move(seq));
  }
}

bool Worker::has_unreserved_waiting() const {
  for (const auto& seq : waiting_) {
    if (seq->table.blocks.empty()) return true;
  }
  return false;
}

void Worker::admit_from_router(Clock::time_point now) {
  if (options_.role == WorkerRole::kDecode || shared_->router == nullptr) return;
  if (has_unreserved_waiting()) return;
  // Colocated pools keep a small watermark free for the running sequences' growth.
  const int watermark =
      running_.empty() ? 0 : std::max(1, total_blocks_ / 100);
  while (running_.size() + waiting_.size() < static_cast<size_t>(options_.max_num_seqs) &&
         waiting_.size() < static_cast<size_t>(options_.max_prefill_seqs)) {
    const int free_blocks = pool_->allocator().num_free();
    std::unique_ptr<Sequence> seq = shared_->router->pop_if([&](const Sequence& s) {
      return kv::BlockTable::blocks_for(s.num_prompt, pool_->block_size()) + watermark <= free_blocks;
    });
    if (!seq) break;
    seq->enter_phase(SeqPhase::kPrefill, now);
    if (seq->cancelled()) {
      finish(*seq, FinishReason::kCancelled, cancelled_error("cancelled"), now);
      continue;
    }
    KVSPLIT_CHECK(pool_->reserve(seq->table, seq->num_prompt));
    waiting_.push_back(std::move(seq));
  }
}

void Worker::handoff(std::unique_ptr<Sequence> seq, Clock::time_point now) {
  std::vector<DecodeLoad> loads;
  loads.reserve(shared_->decode_workers.size());
  for (const Worker* w : shared_->decode_workers) loads.push_back(w->load());
  const int dest = choose_decode_worker(loads);
  KVSPLIT_CHECK(dest >= 0);
  HandoffOffer offer;
  offer.handoff_id = next_handoff_id_++;
  offer.source = this;
  offer.source_pool = pool_.get();
  offer.source_blocks = seq->table.blocks;
  offer.num_tokens = seq->num_computed;
  offer.deadline = now + options_.handoff_timeout;
  pinned_.emplace(offer.handoff_id, std::move(seq->table));
  seq->table = {};
  seq->enter_phase(SeqPhase::kHandoff, now);
  offer.seq = std::move(seq);
  shared_->decode_workers[dest]->post_offer(std::move(offer));
}

void Worker::finalize_after_stop() {
  KVSPLIT_CHECK(!thread_.joinable());
  const Clock::time_point now = Clock::now();
  drain_inbox();
  const Status why = unavailable("engine shut down");
  for (HandoffOffer& o : pending_) finish_offer(o, FinishReason::kCancelled, why, now);
  pending_.clear();
  for (auto* list : {&waiting_, &running_}) {
    for (std::unique_ptr<Sequence>& seq : *list) {
      if (seq->next != Sequence::Next::kRemove) finish(*seq, FinishReason::kCancelled, why, now);
    }
    list->clear();
  }
  // HandoffDone messages from decode workers finalized before us.
  drain_inbox();
  for (auto& [id, table] : pinned_) pool_->release(table);
  pinned_.clear();
  publish_stats();
}

}  // namespace kvsplit::sched
