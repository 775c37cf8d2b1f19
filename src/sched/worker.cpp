// Worker lifecycle, inbox, router admission, queue timeouts, cancels and finishing.
// The step itself (schedule / preemption) is in worker_step.cpp, what follows its forward pass
// (sampling, prompt logprobs, finishes) in worker_postprocess.cpp, the KV handoff in
// worker_handoff.cpp.
#include "sched/worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "common/check.h"
#include "common/log.h"
#include "sched/prefix_share.h"

namespace kvsplit::sched {
namespace {

double ms_since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
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
      total_blocks_(pool_->total_blocks()),
      scheduler_(SchedulerConfig{pool_->block_size(), options_.max_batch_tokens,
                                 options_.min_chunk_tokens, options_.max_chunk_tokens,
                                 options_.max_num_seqs,
                                 /*decode_in_budget=*/options_.role == WorkerRole::kColocated,
                                 /*kv_window=*/model_->kv_window()}) {
  KVSPLIT_CHECK(shared_ != nullptr && shared_->sink != nullptr);
  KVSPLIT_CHECK(options_.max_num_seqs >= 1 && options_.max_batch_tokens >= 1);
  free_blocks_.store(pool_->available_blocks());
  max_seqs_.store(options_.max_num_seqs);
  if (options_.sampling_threads > 1) {
    // One sampling job per step: a wake-up costs nothing next to a step, and polling after it
    // would take a core from the backend's threads during the next forward pass.
    sampling_pool_ = std::make_unique<ThreadPool>(options_.sampling_threads, /*spin_micros=*/0);
  }
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

void Worker::set_test_hold(TestHold hold) {
  hold_.store(static_cast<uint8_t>(hold), std::memory_order_release);
  const uint64_t gen = hold_gen_.fetch_add(1, std::memory_order_acq_rel) + 1;
  wake();
  // Returns once the worker's loop has seen it (the step in progress, if any, has ended), so a
  // test that holds a worker knows it does nothing more; bounded, for a worker not running.
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (hold_seen_gen_.load(std::memory_order_acquire) < gen &&
         !loop_exited_.load(std::memory_order_acquire)) {
    if (Clock::now() > until) {
      KVSPLIT_LOG_WARN("{}: test hold not seen by the worker loop within 10 s", options_.name);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void Worker::post_offer(HandoffOffer offer) {
  incoming_blocks_.fetch_add(offer.incoming_blocks(pool_->block_size()), std::memory_order_relaxed);
  offers_incoming_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_offers_.push_back(std::move(offer));
  }
  cv_.notify_all();
}

void Worker::post_done(HandoffDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_done_.push_back(done);
  }
  cv_.notify_all();
}

DecodeLoad Worker::load() const {
  DecodeLoad l;
  l.kv_blocks_total = total_blocks_;
  l.kv_blocks_free = free_blocks_.load(std::memory_order_relaxed);
  l.kv_blocks_incoming = incoming_blocks_.load(std::memory_order_relaxed);
  l.running = running_count_.load(std::memory_order_relaxed);
  l.waiting = waiting_count_.load(std::memory_order_relaxed);
  l.offers_incoming = offers_incoming_.load(std::memory_order_relaxed);
  l.max_seqs = max_seqs_.load(std::memory_order_relaxed);
  return l;
}

bool Worker::mark_down() {
  const bool was_down = marked_down();
  const int64_t t = now_ns();
  int64_t prev = down_since_ns_.load(std::memory_order_relaxed);
  while (prev < t && !down_since_ns_.compare_exchange_weak(prev, t, std::memory_order_relaxed)) {
  }
  return !was_down;
}

bool Worker::marked_down() const {
  return down_since_ns_.load(std::memory_order_relaxed) >
         drained_ns_.load(std::memory_order_relaxed);
}

bool Worker::stalled_since(Clock::time_point sent_at, Clock::time_point now,
                           std::chrono::milliseconds floor) const {
  const int64_t drained = drained_ns_.load(std::memory_order_relaxed);
  const int64_t bound =
      handoff_stall_bound_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(floor).count(),
                             slowest_step_ns_.load(std::memory_order_relaxed));
  const int64_t sent =
      std::chrono::duration_cast<std::chrono::nanoseconds>(sent_at.time_since_epoch()).count();
  return bound > 0 && drained > 0 && drained < sent &&
         std::chrono::duration_cast<std::chrono::nanoseconds>(now - sent_at).count() > bound;
}

WorkerSnapshot Worker::snapshot() const {
  WorkerSnapshot s;
  s.pool.name = options_.name;
  s.pool.kv_blocks_total = total_blocks_;
  s.steps = steps_.load(std::memory_order_relaxed);
  s.forward_ms = forward_ns_.load(std::memory_order_relaxed) / 1e6;
  s.bookkeeping_ms = bookkeeping_ns_.load(std::memory_order_relaxed) / 1e6;
  s.sampling_ms = sampling_ns_.load(std::memory_order_relaxed) / 1e6;
  // One publication: the counts are stored under the same lock as the KV stats (publish_stats),
  // so free blocks back to their start never come with the remote pages of before.
  std::lock_guard<std::mutex> lock(kv_stats_mu_);
  s.pool.kv_blocks_free = free_blocks_.load(std::memory_order_relaxed);
  s.pool.running = running_count_.load(std::memory_order_relaxed);
  s.pool.waiting = waiting_count_.load(std::memory_order_relaxed);
  s.pool.kv_pages_full = kv_stats_.kv_pages_full;
  s.pool.kv_pages_int8 = kv_stats_.kv_pages_int8;
  s.pool.kv_pages_int4 = kv_stats_.kv_pages_int4;
  s.pool.kv_pages_evicted = kv_stats_.kv_pages_evicted;
  s.pool.kv_sequence_pages = kv_stats_.kv_sequence_pages;
  s.pool.kv_demotions = kv_stats_.kv_demotions;
  s.pool.kv_evictions = kv_stats_.kv_evictions;
  s.pool.kv_window_dropped_pages = kv_stats_.kv_window_dropped_pages;
  s.pool.kv_recalls = kv_stats_.kv_recalls;
  s.pool.kv_recalls_quantized = kv_stats_.kv_recalls_quantized;
  s.pool.kv_recalls_cold = kv_stats_.kv_recalls_cold;
  s.pool.kv_refused_transitions = kv_stats_.kv_refused_transitions;
  s.pool.kv_recall_ms_mean = kv_stats_.kv_recall_ms_mean;
  s.pool.kv_recalls_late = kv_stats_.kv_recalls_late;
  s.pool.kv_host_bytes_used = kv_stats_.kv_host_bytes_used;
  s.pool.kv_host_bytes_total = kv_stats_.kv_host_bytes_total;
  s.pool.kv_pages_host = kv_stats_.kv_pages_host;
  s.pool.kv_swaps_out = kv_stats_.kv_swaps_out;
  s.pool.kv_swaps_in = kv_stats_.kv_swaps_in;
  s.pool.kv_swap_bytes = kv_stats_.kv_swap_bytes;
  s.pool.kv_swap_choices = kv_stats_.kv_swap_choices;
  s.pool.kv_recompute_choices = kv_stats_.kv_recompute_choices;
  s.pool.kv_swap_fallbacks = kv_stats_.kv_swap_fallbacks;
  s.pool.kv_swaps_to_disk = kv_stats_.kv_swaps_to_disk;
  s.pool.decode_rows_stalled = stalled_decode_rows_.load(std::memory_order_relaxed);
  s.pool.spec_rows = spec_rows_.load(std::memory_order_relaxed);
  s.pool.spec_draft_tokens = spec_draft_tokens_.load(std::memory_order_relaxed);
  s.pool.spec_accepted_tokens = spec_accepted_tokens_.load(std::memory_order_relaxed);
  s.pool.handoffs_rerouted = handoffs_rerouted_.load(std::memory_order_relaxed);
  s.pool.handoffs_forwarded = handoffs_forwarded_.load(std::memory_order_relaxed);
  s.pool.marked_down = marked_down();
  s.pool.handoff_pages_copied = handoff_pages_copied_.load(std::memory_order_relaxed);
  s.pool.handoff_pages_cached = handoff_pages_cached_.load(std::memory_order_relaxed);
  s.pool.handoffs_to_cached = handoffs_to_cached_.load(std::memory_order_relaxed);
  s.pool.kv_prefix_cache_pages = kv_stats_.kv_prefix_cache_pages;
  s.pool.kv_prefix_queries = kv_stats_.kv_prefix_queries;
  s.pool.kv_prefix_hits = kv_stats_.kv_prefix_hits;
  s.pool.kv_prefix_hits_host = kv_stats_.kv_prefix_hits_host;
  s.pool.kv_prefix_hits_disk = kv_stats_.kv_prefix_hits_disk;
  s.pool.kv_prefix_spills_host = kv_stats_.kv_prefix_spills_host;
  s.pool.kv_prefix_spills_disk = kv_stats_.kv_prefix_spills_disk;
  s.pool.kv_prefix_spill_faults = kv_stats_.kv_prefix_spill_faults;
  s.pool.kv_prefix_pages_host = kv_stats_.kv_prefix_pages_host;
  s.pool.kv_prefix_pages_disk = kv_stats_.kv_prefix_pages_disk;
  s.pool.kv_disk_faults = kv_stats_.kv_disk_faults;
  s.pool.kv_shards = kv_stats_.kv_shards;
  s.pool.kv_pages_remote = kv_stats_.kv_pages_remote;
  s.pool.kv_shard_use = kv_stats_.kv_shard_use;
  s.pool.kv_link_bytes_per_s = kv_stats_.kv_link_bytes_per_s;
  s.pool.kv_shard_exchange_bytes = kv_stats_.kv_shard_exchange_bytes;
  s.pool.kv_shard_exchange_host_bytes = kv_stats_.kv_shard_exchange_host_bytes;
  s.pool.kv_shard_exchange_seconds = kv_stats_.kv_shard_exchange_seconds;
  s.pool.kv_shard_communicator = kv_stats_.kv_shard_communicator;
  s.pool.kv_migrated_pages = kv_stats_.kv_migrated_pages;
  s.pool.kv_prefetch_hits = kv_stats_.kv_prefetch_hits;
  s.pool.kv_prefetch_misses = kv_stats_.kv_prefetch_misses;
  s.pool.kv_host_prefetches = kv_stats_.kv_host_prefetches;
  s.pool.kv_host_prefetch_hits = kv_stats_.kv_host_prefetch_hits;
  s.pool.kv_host_prefetch_misses = kv_stats_.kv_host_prefetch_misses;
  s.pool.kv_host_prefetch_dropped = kv_stats_.kv_host_prefetch_dropped;
  s.pool.kv_host_prefetch_deferred = kv_stats_.kv_host_prefetch_deferred;
  s.pool.kv_disk_write_behind = kv_stats_.kv_disk_write_behind;
  s.pool.kv_disk_write_behind_waits = kv_stats_.kv_disk_write_behind_waits;
  s.pool.kv_disk_write_behind_rescues = kv_stats_.kv_disk_write_behind_rescues;
  s.pool.kv_disk_bytes_used = kv_stats_.kv_disk_bytes_used;
  s.pool.kv_disk_bytes_total = kv_stats_.kv_disk_bytes_total;
  s.pool.kv_disk_latency_ms = kv_stats_.kv_disk_latency_ms;
  if (kv_disk_latency_at_ != Clock::time_point{}) {
    s.pool.kv_disk_latency_age_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - kv_disk_latency_at_).count();
  }
  s.kv_summary_slots_used = kv_summary_used_;
  s.kv_host_slots_used = kv_host_used_;
  s.kv_disk_records = kv_disk_records_;
  s.kv_prefetch_pending = kv_prefetch_pending_;
  s.kv_prefetch_dropped = kv_prefetch_dropped_;
  s.kv_host_prefetch_pending = kv_host_prefetch_pending_;
  s.kv_host_prefetch_blocks = kv_host_prefetch_blocks_;
  return s;
}

void Worker::publish_stats() {
  PoolStats k;
  k.kv_pages_full = pool_->used_blocks();
  int summaries_used = 0;  // every shard's arenas and summaries (the spatial cut)
  for (int s = 0; s < pool_->num_shards(); ++s) {
    const kv::KvPool& z = pool_->shard(s);
    k.kv_pages_int8 += z.arena_allocator(kernels::KvPrecision::kInt8).num_used();
    k.kv_pages_int4 += z.arena_allocator(kernels::KvPrecision::kInt4).num_used();
    summaries_used += z.summary_allocator().num_used();
  }
  if (options_.kv_policy != KvPolicy::kFull) {
    for (const auto* list : {&waiting_, &running_}) {
      for (const std::unique_ptr<Sequence>& seq : *list) {
        // The pages dropped behind a sliding window are no cut's (kv_window_dropped_pages).
        const auto& pages = seq->table.pages;
        for (size_t i = std::min<size_t>(seq->table.window_dropped, pages.size()); i < pages.size();
             ++i) {
          k.kv_pages_evicted += pages[i].location == kv::PageLocation::kEvicted;
          ++k.kv_sequence_pages;
        }
      }
    }
  }
  for (const std::unique_ptr<Sequence>& seq : waiting_)
    k.kv_pages_host += kv::swapped_pages(seq->table);
  k.kv_swaps_out = swap_stats_.swaps_out;
  k.kv_swaps_in = swap_stats_.swaps_in;
  k.kv_swap_bytes = swap_stats_.bytes_out + swap_stats_.bytes_in;
  k.kv_swap_choices = swap_choices_;
  k.kv_recompute_choices = recompute_choices_;
  k.kv_swap_fallbacks = swap_fallbacks_;
  k.kv_swaps_to_disk = swap_stats_.to_disk;
  if (pool_->prefix_cache() != nullptr) {  // every shard's cache together
    const kv::PrefixCacheStats st = pool_->prefix_stats();
    const kv::KvPool::PrefixPages pages = pool_->prefix_pages();
    k.kv_prefix_cache_pages = pages.total;
    k.kv_prefix_queries = st.lookup_pages * pool_->block_size();
    k.kv_prefix_hits = st.hit_pages * pool_->block_size();
    k.kv_prefix_hits_host = st.hit_pages_host * pool_->block_size();
    k.kv_prefix_hits_disk = st.hit_pages_disk * pool_->block_size();
    k.kv_prefix_spills_host = st.spilled_host;
    k.kv_prefix_spills_disk = st.spilled_disk;
    k.kv_prefix_spill_faults = st.spill_faults + st.restore_faults;
    k.kv_prefix_pages_host = pages.host;
    k.kv_prefix_pages_disk = pages.disk;
  }
  k.kv_disk_faults = swap_stats_.disk_faults;
  k.kv_shards = pool_->num_shards();
  k.kv_link_bytes_per_s = swap_costs_.h2d_bytes_per_s;
  for (int s = 0; s < k.kv_shards; ++s) {
    const kv::BlockAllocator& a = pool_->shard(s).allocator();
    k.kv_shard_use.push_back(a.num_blocks() > 0 ? static_cast<double>(a.num_used()) / a.num_blocks()
                                                : 0.0);
  }
  if (k.kv_shards > 1) {
    // The sequences' pages resident on a peer shard, at any precision, each once; not the peers'
    // used blocks, which count idle prefix-cache pages and host prefetches and leave out the
    // quantized arenas. Full pages may be shared between sequences (a bitmap of each peer's
    // blocks counts one once); an arena slot belongs to one sequence (a demotion copies).
    std::vector<std::vector<bool>> seen(static_cast<size_t>(k.kv_shards));
    for (int s = 1; s < k.kv_shards; ++s)
      seen[s].assign(static_cast<size_t>(pool_->shard(s).allocator().num_blocks()), false);
    for (const auto* list : {&waiting_, &running_}) {
      for (const std::unique_ptr<Sequence>& seq : *list) {
        const kv::BlockTable& t = seq->table;
        for (size_t i = 0; i < t.pages.size() && i < t.blocks.size(); ++i) {
          const kv::PageEntry& pe = t.pages[i];
          if (!pe.resident() || pe.shard == 0) continue;
          if (pe.precision != kernels::KvPrecision::kFull) {
            ++k.kv_pages_remote;
          } else if (std::vector<bool>& bits = seen[pe.shard];
                     t.blocks[i] >= 0 && static_cast<size_t>(t.blocks[i]) < bits.size() &&
                     !bits[t.blocks[i]]) {
            bits[t.blocks[i]] = true;
            ++k.kv_pages_remote;
          }
        }
      }
    }
    k.kv_shard_exchange_bytes = model_->shard_exchange_bytes();
    k.kv_shard_exchange_host_bytes = model_->shard_exchange_host_bytes();
    k.kv_shard_exchange_seconds = model_->shard_exchange_seconds();
    if (const backend::Communicator* c = pool_->communicator()) k.kv_shard_communicator = c->name();
  }
  k.kv_migrated_pages = migrate_stats_.pages;
  k.kv_prefetch_hits = swap_stats_.prefetch_hits;
  k.kv_prefetch_misses = swap_stats_.prefetch_misses;
  k.kv_host_prefetches = swap_stats_.host_prefetches;
  k.kv_host_prefetch_hits = swap_stats_.host_prefetch_hits;
  k.kv_host_prefetch_misses = swap_stats_.host_prefetch_misses;
  k.kv_host_prefetch_dropped = swap_stats_.host_prefetch_dropped;
  k.kv_host_prefetch_deferred = swap_stats_.host_prefetch_deferred;
  k.kv_disk_write_behind = swap_stats_.write_behind;
  k.kv_disk_write_behind_waits = swap_stats_.write_behind_waits;
  k.kv_disk_write_behind_rescues = swap_stats_.write_behind_rescues;
  k.kv_demotions = cut_ops_.demoted_to_int8 + cut_ops_.demoted_to_int4;
  k.kv_evictions = cut_ops_.evicted;
  k.kv_window_dropped_pages = cut_ops_.window_dropped;
  k.kv_recalls = cut_ops_.restored;
  k.kv_recalls_quantized = cut_ops_.restored_quantized;
  k.kv_recalls_cold = cut_ops_.recalls_cold;
  k.kv_recalls_late = cut_ops_.restores_late;
  k.kv_refused_transitions = cut_ops_.refused();
  k.kv_recall_ms_mean =
      cut_ops_.restored > 0 ? 1e3 * cut_ops_.restore_seconds / cut_ops_.restored : 0.0;
  const int64_t slot_bytes = pool_->bytes_per_block();
  const kv::BlockAllocator& host = pool_->host_allocator();
  k.kv_host_bytes_used = int64_t{host.num_used()} * slot_bytes;
  k.kv_host_bytes_total = int64_t{host.num_blocks()} * slot_bytes;
  std::lock_guard<std::mutex> lock(kv_stats_mu_);
  kv_stats_ = k;
  kv_summary_used_ = summaries_used;
  kv_host_used_ = host.num_used();
  kv_disk_records_ = 0;
  if (pool_->disk() != nullptr) {
    const kv::DiskTierStats d = pool_->disk()->stats();
    kv_disk_records_ = d.records;
    kv_stats_.kv_disk_bytes_used = d.extents_used * d.extent_bytes;
    kv_stats_.kv_disk_bytes_total = d.capacity_bytes;
    kv_stats_.kv_disk_latency_ms = d.latency_ms_ewma;
    kv_disk_latency_at_ = d.latency_at;
  }
  kv_prefetch_pending_ = 0;
  for (const std::unique_ptr<Sequence>& seq : waiting_)
    kv_prefetch_pending_ += seq->prefetch != nullptr && seq->prefetch->record != 0;
  kv_prefetch_dropped_ = swap_stats_.prefetch_dropped;
  kv_host_prefetch_pending_ = 0;
  kv_host_prefetch_blocks_ = 0;
  for (const std::unique_ptr<Sequence>& seq : waiting_) {
    kv_host_prefetch_pending_ += !seq->table.swap_prefetch.empty();
    kv_host_prefetch_blocks_ += kv::host_prefetch_blocks(seq->table);
  }
  // Last, under the lock, with the stats above (snapshot() reads them together; the router's
  // load() reads the atomics alone). Blocks held by host prefetches are free to new work.
  // The offers drained since the last publication leave offers_incoming_ just before they enter
  // the waiting count: between the two a reader may see a slot free that is not (an offer sent
  // there then waits, or is passed on), and once it sees the new counts it sees this too.
  offers_incoming_.fetch_sub(offers_drained_, std::memory_order_relaxed);
  offers_drained_ = 0;
  free_blocks_.store(plannable_blocks(), std::memory_order_relaxed);
  running_count_.store(static_cast<int>(running_.size()), std::memory_order_relaxed);
  waiting_count_.store(static_cast<int>(waiting_.size() + pending_.size()),
                       std::memory_order_relaxed);
}

void Worker::loop() {
  if (Status st = backend_->bind_thread(); !st.ok()) {
    KVSPLIT_LOG_ERROR("{}: cannot use device {}: {}", options_.name, backend_->device(),
                      st.to_string());
  }
  measure_swap_costs();
  // Up from here: an offer that waits on a loop that never drains is judged from now on
  // (stalled_since), not from the first drain.
  drained_ns_.store(now_ns(), std::memory_order_relaxed);
  while (true) {
    // The generation first: a loop that sees a set_test_hold's generation sees its hold.
    const uint64_t gen = hold_gen_.load(std::memory_order_acquire);
    const bool dead = hold_.load(std::memory_order_acquire) == static_cast<uint8_t>(TestHold::kAll);
    hold_seen_gen_.store(gen, std::memory_order_release);
    const Clock::time_point step_start = Clock::now();
    const bool worked = !dead && step();
    if (worked) {
      uint8_t one = static_cast<uint8_t>(TestHold::kOneStep);
      hold_.compare_exchange_strong(one, static_cast<uint8_t>(TestHold::kForward),
                                    std::memory_order_acq_rel);
    }
    if (!dead) {
      // How long this worker may go between drains (stalled_since): every step counts, those
      // without a forward pass too (a large handoff copy while every reader is behind).
      step_ns_.add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - step_start).count());
      slowest_step_ns_.store(step_ns_.max(), std::memory_order_relaxed);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) break;
    if (!worked) {
      cv_.wait_for(lock, options_.idle_wait, [&] {
        return stop_ || wake_ ||
               (!dead &&
                (!inbox_offers_.empty() || !inbox_done_.empty() || !inbox_commands_.empty()));
      });
      if (stop_) break;
    }
    wake_ = false;
  }
  loop_exited_.store(true, std::memory_order_release);
}

void Worker::drain_inbox(Clock::time_point now) {
  std::deque<HandoffOffer> offers;
  std::vector<HandoffDone> done;
  std::vector<std::pair<WorkerCommand, CommandDone>> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    offers.swap(inbox_offers_);
    done.swap(inbox_done_);
    commands.swap(inbox_commands_);
  }
  // Alive: whatever marked this worker down before now is cleared (mark_down).
  if (marked_down()) {
    KVSPLIT_LOG_INFO(
        "{}: draining its inbox again after it was marked down; KV handoffs may "
        "come here again",
        options_.name);
  }
  drained_ns_.store(now_ns(), std::memory_order_relaxed);
  for (auto& [command, reply] : commands) {
    CommandReply r;
    r.status = apply(command, now);
    r.state = state();
    reply(std::move(r));
  }
  for (const HandoffDone& d : done) {
    auto it = pinned_.find(d.handoff_id);
    KVSPLIT_CHECK_MSG(it != pinned_.end(), "HandoffDone for an unknown handoff");
    // Where the pages went: not to the worker it was sent to when another took them (a decode
    // worker passed it on), or when none did (cancelled, timed out or failed while it waited).
    if (d.admitted_by != it->second.dest) routes_moved(it->second, d.admitted_by);
    if (it->second.ticket) --undelivered_;
    pool_->release(it->second.table);
    pinned_.erase(it);
  }
  if (offers.empty()) return;
  offers_drained_ += static_cast<int>(offers.size());
  for (HandoffOffer& o : offers) {
    if (!o.ticket->receive()) {
      // Its sender took it back (the delivery deadline, a cancel, shutdown): not ours.
      incoming_blocks_.fetch_sub(o.incoming_blocks(pool_->block_size()), std::memory_order_relaxed);
      continue;
    }
    o.seq = std::move(o.ticket->seq);
    if (o.wait_deadline == Clock::time_point{}) {  // not set by a decode worker that forwarded it
      o.wait_deadline =
          now + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double, std::milli>(o.seq->sla.queue_timeout_ms));
    }
    pending_.push_back(std::move(o));
  }
  sort_pending();
}

void Worker::sort_pending() {
  // Admitted by priority, then age (stable: ties keep their arrival order).
  std::stable_sort(
      pending_.begin(), pending_.end(), [](const HandoffOffer& a, const HandoffOffer& b) {
        return serves_before({a.seq->priority, a.seq->arrival}, {b.seq->priority, b.seq->arrival});
      });
}

void Worker::finish(Sequence& seq, FinishReason reason, Status status, Clock::time_point now) {
  release_kv(seq);
  seq.next = Sequence::Next::kRemove;
  finish_sequence(seq, reason, std::move(status), now, *shared_->sink);
}

void Worker::finish_offer(HandoffOffer& offer, FinishReason reason, Status status,
                          Clock::time_point now) {
  offer.source->post_done(HandoffDone{offer.handoff_id});
  incoming_blocks_.fetch_sub(offer.incoming_blocks(pool_->block_size()), std::memory_order_relaxed);
  finish(*offer.seq, reason, std::move(status), now);
}

void Worker::expire_queued(Clock::time_point now) {
  if (options_.role == WorkerRole::kDecode || shared_->router == nullptr) return;
  for (std::unique_ptr<Sequence>& seq : shared_->router->take_expired(now)) {
    const double waited = ms_since(seq->submit_time, now);
    finish(*seq, FinishReason::kError,
           deadline_exceeded(fmt::format(
               "request {} waited {:.0f} ms in the queue of SLA class '{}' (queue_timeout_ms {})",
               seq->display_id(), waited, seq->sla.name, seq->sla.queue_timeout_ms)),
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

void Worker::admit_from_router(Clock::time_point now) {
  if (options_.role == WorkerRole::kDecode || shared_->router == nullptr) return;
  // No prompt of no higher priority than a sequence waiting here without its blocks (preempted,
  // swapped out, or taken for a time slice): it would take the room that one waits for, and the
  // sequence would starve. A prompt of higher priority is served first, as it would have been.
  // Scheduler::can_admit_prompt keeps a watermark free for the running sequences' growth.
  while (pulled_prompts() < options_.max_prefill_seqs) {
    const int free_blocks = plannable_blocks();  // host prefetches give way (make_room)
    const int owned = static_cast<int>(running_.size() + waiting_.size());
    std::unique_ptr<Sequence> seq = shared_->router->pop_if([&](const Sequence& s) {
      return !has_unreserved_waiting(s.priority) &&
             scheduler_.can_admit_prompt(s.num_prompt, free_blocks, total_blocks_,
                                         static_cast<int>(running_.size()), owned);
    });
    if (!seq) break;
    seq->enter_phase(SeqPhase::kPrefill, now);
    seq->waiting_since = steps_.load(std::memory_order_relaxed);
    if (seq->cancelled()) {
      finish(*seq, FinishReason::kCancelled, cancelled_error("cancelled"), now);
      continue;
    }
    const SchedulerConfig& sc = scheduler_.config();
    make_room(kv::BlockTable::blocks_for(sc.prefill_reach(0, seq->num_prompt), sc.block_size));
    // Cached prompt pages (never the page of the last prompt token, which is computed to sample);
    // with a sliding window only those the window still reads (docs/models.md). None for a
    // prompt whose logprobs are asked for: every position's logits are needed.
    const int hits = seq->wants_prompt_logprobs()
                         ? 0
                         : share_prompt_pages(*pool_, sc, seq->table, seq->prefix_salt, seq->tokens,
                                              seq->num_prompt, seq->num_prompt);
    seq->num_computed = seq->cached_tokens = hits * pool_->block_size();
    // The whole prompt's pages, or with a sliding window its first chunk's (the rest come chunk
    // by chunk, Scheduler::plan_prefill).
    KVSPLIT_CHECK(reserve_kv(seq->table, sc.prefill_reach(seq->num_computed, seq->num_prompt)));
    account_kv(*seq, now);  // the prompt's pages are held from here
    waiting_.push_back(std::move(seq));
  }
  // Fair time slicing (docs/kv-cuts.md, "Time slices"): a prompt that does not fit in the free
  // blocks is taken without pages when running sequences of a lower priority that have held the
  // pool for their class's max_hold_ms hold enough to make its room. The Scheduler then pauses
  // them for it (make_room_by_slice) and its pages come with its first chunk; left in the router
  // it would wait behind them for as long as they run. Only on the second pass that finds it so
  // at the router's head: another worker of the router with room for it has had a step to take
  // it. It counts as unreserved waiting work: no prompt of no higher priority comes after it.
  if (pulled_prompts() >= options_.max_prefill_seqs) return;
  const int owned = static_cast<int>(running_.size() + waiting_.size());
  if (owned >= scheduler_.config().max_num_seqs) return;
  std::unique_ptr<Sequence> seq = shared_->router->pop_if([&](const Sequence& s) {
    if (has_unreserved_waiting(s.priority)) {
      slice_head_ = -1;
      return false;
    }
    const int need = kv::BlockTable::blocks_for(scheduler_.config().prefill_reach(0, s.num_prompt),
                                                pool_->block_size());
    const int available = plannable_blocks();
    int yielding = 0;
    if (need > available && need <= total_blocks_) {
      for (const std::unique_ptr<Sequence>& r : running_) {
        if (r->next == Sequence::Next::kStay && r->priority < s.priority && slice_expired(*r, now))
          yielding += pool_->releasable_blocks(r->table);
      }
    }
    if (yielding == 0 || need > available + yielding) {
      slice_head_ = -1;
      return false;
    }
    if (slice_head_ != s.arrival) {
      slice_head_ = s.arrival;
      return false;
    }
    return true;
  });
  if (!seq) return;
  slice_head_ = -1;
  seq->enter_phase(SeqPhase::kPrefill, now);
  seq->waiting_since = steps_.load(std::memory_order_relaxed);
  if (seq->cancelled()) {
    finish(*seq, FinishReason::kCancelled, cancelled_error("cancelled"), now);
    return;
  }
  seq->pages_deferred = true;
  waiting_.push_back(std::move(seq));
}

void Worker::finalize_after_stop() {
  KVSPLIT_CHECK(!thread_.joinable());
  const Clock::time_point now = Clock::now();
  std::vector<std::pair<WorkerCommand, CommandDone>> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;  // later commands are answered by post_command itself
    commands.swap(inbox_commands_);
  }
  for (auto& [command, reply] : commands) {
    reply(CommandReply{unavailable(options_.name + " stopped"), state()});
  }
  drain_inbox(now);
  reclaim_forwarded(now, /*all=*/true);  // those their destination did not take before it stopped
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
  drain_inbox(now);
  for (auto& [id, pin] : pinned_) {
    // Offers still undelivered (only when the destination never drained its inbox).
    if (pin.ticket && pin.ticket->reclaim()) {
      std::unique_ptr<Sequence> seq = std::move(pin.ticket->seq);
      finish(*seq, FinishReason::kCancelled, why, now);
    }
    pool_->release(pin.table);
  }
  pinned_.clear();
  undelivered_ = 0;
  publish_stats();
}

bool Worker::release_youngest_waiting(Clock::time_point now) {
  if (scheduler_.config().kv_window <= 0 || !running_.empty() || pool_->available_blocks() > 0)
    return false;
  Sequence* youngest = nullptr;
  int holders = 0;
  for (const std::unique_ptr<Sequence>& s : waiting_) {
    if (s->table.blocks.empty() || kv::swapped_pages(s->table) > 0 ||
        !s->table.swap_prefetch.empty() || s->prefetch || s->cancelled())
      continue;
    ++holders;
    if (youngest == nullptr ||
        serves_before({youngest->priority, youngest->arrival}, {s->priority, s->arrival}))
      youngest = s.get();
  }
  if (holders < 2) return false;
  KVSPLIT_LOG_WARN(
      "{}: sliding-window prompts hold every block and none can go on: request {} lets its "
      "{} pages go ({} tokens computed, recomputed from what the prefix cache keeps)",
      options_.name, youngest->display_id(), youngest->table.blocks.size(), youngest->num_computed);
  drop_kv_for_recompute(*youngest, /*cache=*/true, now);
  return true;
}

void Worker::drop_kv_for_recompute(Sequence& seq, bool cache, Clock::time_point now) {
  if (cache) {
    pool_->cache_prefix(seq.table, seq.prefix_salt, seq.tokens,
                        cacheable_tokens(options_.kv_policy, seq.num_computed, seq.num_prompt) /
                            pool_->block_size());
  }
  release_kv(seq);
  seq.num_computed = 0;
  account_kv(seq, now);
  ++seq.preemptions;
  shared_->preemptions.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvsplit::sched
