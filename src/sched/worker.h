// Worker: one device (Backend), one LlamaModel, one KvPool and one thread running
//   step() = schedule() -> run() (forward) -> postprocess()
// in one of three roles, all through the same code paths:
//   kPrefill    pulls requests from the Router, chunked prefill under max_batch_tokens, samples
//               the first token, hands the sequence off to the least-loaded decode worker;
//   kDecode     admits handed-off sequences between steps, one token per running sequence per
//               step, preempts by recompute when its pool runs out (recompute runs here too);
//   kColocated  both: pulls from the Router and decodes in the same steps (vLLM style).
// The thread is the only user of the pool and of the sequences it owns; other threads talk to a
// worker through post_offer / post_done / wake (thread-safe) and read load()/snapshot() (atomics).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "common/fair_prefill.h"
#include "common/thread_pool.h"
#include "kv/kv_pool.h"
#include "kv/migrate.h"
#include "kv/swap.h"
#include "model/llama_model.h"
#include "sched/kv_handoff.h"
#include "sched/policy.h"
#include "sched/prefix_routes.h"
#include "sched/router.h"
#include "sched/scheduler.h"
#include "sched/sequence.h"
#include "sched/step_cost.h"
#include "sched/step_model.h"
#include "sched/swap_cost.h"
#include "sched/worker_command.h"

namespace kvsplit::sched {

enum class WorkerRole : uint8_t { kPrefill, kDecode, kColocated };

using common::default_max_prefill_seqs;

struct WorkerOptions {
  std::string name = "worker-0";
  WorkerRole role = WorkerRole::kColocated;
  int max_num_seqs = 256;      // sequences owned (prefilling + running), >= 1
  int max_batch_tokens = 512;  // prefill (chunk) tokens per step, decode tokens included when
                               // colocated; prefill always gets at least min_chunk_tokens
  int min_chunk_tokens = 16;   // smallest prefill chunk a prompt gets in a step
  int max_chunk_tokens = 0;    // most prefill tokens one prompt gets in a step; 0: no cap
  // Time-based cap on a prompt's chunk (EngineConfig::max_chunk_ms): the step is predicted, from
  // step_cost_, to last at most this; 0: off.
  double max_chunk_ms = 0;
  // EngineConfig::max_chunk_ms_auto: the budget is also the tightest max_itl_ms of the classes
  // of the sequences the step serves, running or waiting (common::step_time_budget_ms).
  bool max_chunk_ms_auto = false;
  // A running sequence whose stream holds this many unread events gets no decode row until its
  // consumer reads (EngineConfig::max_unread_events); 0: no bound.
  int max_unread_events = 0;
  int max_prefill_seqs = 16;  // prompts pulled from the router and not yet started (preempted
                              // ones not counted); the rest stay queued for other workers. The
                              // engine sets default_max_prefill_seqs, and SetSchedulerParams sets
                              // it so again for the new budget and chunk (a value set here by
                              // hand is then replaced).
  // Delivery bound of a KV handoff: the destination must receive the offer (at its next step
  // boundary) within this, else the source takes the request back and fails it. Waiting for a
  // free slot / free blocks at the destination is back-pressure and is not bounded by this.
  std::chrono::milliseconds handoff_timeout{5000};
  // Liveness before the deadline (EngineConfig::handoff_stall_ms): an offer a destination has
  // not taken within max(this, kStallStepFactor x its slowest recent step), while it has not
  // drained its inbox since the offer was posted, marks it down (handoff_stall_bound_ns,
  // Worker::stalled_since); 0: only the deadline does.
  std::chrono::milliseconds handoff_stall{1000};
  // A prefill worker with a prefix cache routes its handoffs by the pages it sent each decode
  // worker before (EngineConfig::cache_aware_handoffs); false: by load alone.
  bool cache_aware_handoffs = true;
  // A decode worker passes offers waiting for room here to another decode worker with room
  // (EngineConfig::forward_waiting_handoffs, Worker::forward_offers).
  bool forward_waiting_handoffs = true;
  // A prefill worker routes handoffs to decode workers with a free sequence slot first
  // (DecodeLoad::slots_full); false (benchmarks): by KV load alone.
  bool slot_aware_handoffs = true;
  // Offers in flight to a decode worker marked down are taken back before their deadlines
  // (Worker::up_instead_of_down_dest, reclaim_forwarded); false (benchmarks): at them.
  bool take_back_from_down = true;
  // Tests: asked before each KV handoff copy into this worker (HandoffCopyFaultHook); unset: none.
  HandoffCopyFaultHook handoff_copy_fault_hook;
  std::chrono::milliseconds idle_wait{2};  // sleep when idle (bounds queue-timeout latency)
  // Sampling + token events of a step run on this many threads (the worker's thread included)
  // when the step samples at least parallel_sampling_min_rows rows; 1: always on the worker.
  int sampling_threads = 1;
  int parallel_sampling_min_rows = 32;
  // KV cut of the sequences this worker decodes (kPrefill workers never decode, so their pages
  // stay full precision); `semantic` unless the sequence's class overrides it. kSemantic needs
  // the pool's int8 / int4 arenas, summaries and host tier (SequenceCut::size_tiers).
  KvPolicy kv_policy = KvPolicy::kFull;
  SemanticCutConfig semantic;
  // Temporal cut: swap a preempted sequence to the pool's host tier instead of recomputing it
  // (the cost model of sched/swap_cost.h; needs a host tier: temporal.host_capacity_mb > 0).
  TemporalCutConfig temporal;
  // Speculative decoding of this worker's decode rows (EngineConfig::speculative; off on kPrefill
  // workers): Worker::speculate.
  SpeculativeConfig speculative;
};

// Test hook: holds a worker at its step boundary.
//   kForward  housekeeping goes on (inbox, queue timeouts, cancels, admission) but no forward
//             pass runs, so nothing it owns makes progress;
//   kAll      the worker does nothing at all (a hung or dead worker); only stop ends it;
//   kOneStep  one step that runs a forward pass, then kForward (set by the worker itself, so a
//             test walks a worker a step at a time however slowly its own thread runs).
enum class TestHold : uint8_t { kNone, kForward, kAll, kOneStep };

// Engine-owned state every worker sees; outlives the workers.
struct WorkerShared {
  Router* router = nullptr;             // pulled by kPrefill / kColocated
  std::vector<Worker*> decode_workers;  // handoff destinations of kPrefill workers
  FinishSink* sink = nullptr;
  std::atomic<uint64_t> cancel_epoch{0};  // bumped by every Engine::cancel
  std::atomic<int64_t> preemptions{0};
  // Prompt tokens per second of the workers that prefill (their EWMA, the latest published): the
  // recompute price of a worker that has measured none of its own (a disaggregated decode worker
  // before its first recompute), or swap: auto swapped there whatever recompute cost.
  std::atomic<double> prefill_tokens_per_s{0};
};

struct WorkerSnapshot {
  PoolStats pool;
  int64_t steps = 0;
  double forward_ms = 0;      // time in StepModel::forward
  double sampling_ms = 0;     // sampling, stop checks, detokenization, token events
  double bookkeeping_ms = 0;  // the rest of the steps: scheduling, admission, handoff, stats
  // Pool allocators' used entries as of the last step (tests: all zero once idle).
  int kv_summary_slots_used = 0;
  int kv_host_slots_used = 0;
  int64_t kv_disk_records = 0;      // records in the pool's disk tier (0 without one)
  int kv_prefetch_pending = 0;      // sequences holding a disk prefetch not yet consumed
  int64_t kv_prefetch_dropped = 0;  // disk prefetches dropped unused (their sequence ended)
  // Host-tier prefetch (kv::start_host_prefetch): sequences holding one now, the device blocks
  // they hold, and those dropped unused since start (also PoolStats::kv_host_prefetch_dropped).
  int kv_host_prefetch_pending = 0;
  int kv_host_prefetch_blocks = 0;
};

class Worker {
 public:
  Worker(WorkerOptions options, std::unique_ptr<backend::Backend> backend,
         std::unique_ptr<StepModel> model, std::unique_ptr<kv::KvPool> pool, WorkerShared* shared);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start();
  void request_stop();  // the thread exits after its current step
  void join();
  // After every worker has joined (decode and colocated workers first, prefill workers last):
  // finishes everything this worker still owns or has in its inbox (kCancelled, UNAVAILABLE) and
  // releases every block.
  void finalize_after_stop();

  void post_offer(HandoffOffer offer);
  void post_done(HandoffDone done);
  // Queues `command`; `done` gets the reply after the worker processed it at its next step
  // boundary (worker_command.h). Thread-safe.
  void post_command(WorkerCommand command, CommandDone done);
  void wake();
  // Tests only; returns once the worker's loop has seen it (its step in progress ended).
  void set_test_hold(TestHold hold);

  DecodeLoad load() const;
  // Handoff destinations: a worker that let an offer pass its delivery deadline (handoff_timeout)
  // is marked down by the worker that had sent it, and is down until it next drains its inbox
  // (a live worker does at every step, and every idle_wait when idle). New offers and forwarded
  // ones go to a worker that is not down while one is left. mark_down returns true when it was
  // not down before. Thread-safe.
  bool mark_down();
  bool marked_down() const;
  // This worker has not drained its inbox since `sent_at`, and `now` is past sent_at plus
  // handoff_stall_bound_ns(floor, its slowest recent step): hung, or in a step far longer than
  // its recent ones. False before its loop started (still measuring at start-up). Thread-safe.
  bool stalled_since(Clock::time_point sent_at, Clock::time_point now,
                     std::chrono::milliseconds floor) const;
  WorkerSnapshot snapshot() const;
  const std::string& name() const { return options_.name; }
  WorkerRole role() const { return options_.role; }
  int kv_blocks_total() const { return total_blocks_; }
  // Free blocks as of the last step (exact once the worker is idle or stopped).
  int kv_blocks_free() const { return free_blocks_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint8_t kSampleNone = 0, kSampleRow = 1, kSampleArgmax = 2;
  // A prompt chunk returning every row's logits (Sequence::wants_prompt_logprobs); ...Last: its
  // last row is the prompt's last position, sampled from.
  static constexpr uint8_t kSamplePromptRows = 3, kSamplePromptRowsLast = 4;
  // A decode row with draft tokens (Sequence::spec_row): every row's logits, sample_speculative.
  static constexpr uint8_t kSampleSpec = 5;
  struct Batch {
    std::vector<model::SeqStep> steps;
    std::vector<Sequence*> seqs;
    // kSampleRow: this entry returns one logits row to sample from; kSampleArgmax: its greedy
    // token id (picked by the model, on the device where the backend can).
    std::vector<uint8_t> samples;
    std::vector<uint8_t> decode;  // 1: a decode row (its KV cut runs after the forward)
    void clear() {
      steps.clear();
      seqs.clear();
      samples.clear();
      decode.clear();
    }
  };

  void loop();
  bool step();                              // true when a forward pass ran
  void drain_inbox(Clock::time_point now);  // HandoffDone releases; receives offers; commands
  Status apply(const WorkerCommand& command, Clock::time_point now);
  Status apply_cut_params(const SetCutParams& command);
  WorkerState state() const;
  void expire_queued(Clock::time_point now);
  void reap_cancelled(Clock::time_point now);
  void reclaim_undelivered(Clock::time_point now);  // source side of the delivery bound
  // Marks `dest` down (and logs it once) when it has stalled on an offer posted at sent_at
  // (WorkerOptions::handoff_stall, stalled_since).
  void mark_if_stalled(Worker* dest, Clock::time_point sent_at, Clock::time_point now);
  void admit_offers(Clock::time_point now);
  // Destination side, after an admission pass: each offer it left waiting (marked false in
  // `leaves`, not admitted: `admitted`) that another decode worker has room for now (free -
  // incoming blocks >= its blocks
  // plus the next-token blocks of it and of the other's running sequences; a free slot counting
  // the offers posted to it; not down; not in offer.visited) is posted there with a new ticket,
  // watched in
  // forwarded_, and marked in `leaves`.
  void forward_offers(std::vector<bool>& leaves, const std::vector<bool>& admitted,
                      Clock::time_point now);
  // Offers forwarded and not received by their deadline (or cancelled meanwhile) come back into
  // pending_ (their destination marked down); `all`: every one not received (shutdown).
  void reclaim_forwarded(Clock::time_point now, bool all = false);
  void sort_pending();  // by priority, then age (stable)
  // The most leading pages of `offer` this worker's prefix cache may serve (taken on the device
  // instead of copied, KvPool::share_device_prefix): its cacheable pages (cacheable_tokens);
  // 0 without a cache, with a sliding window, for pages dropped behind one, or on a shard group.
  int handoff_cacheable_pages(const HandoffOffer& offer) const;
  void admit_from_router(Clock::time_point now);
  void schedule(Clock::time_point now);
  // Speculative decoding (options_.speculative), once the step is planned: gives its decode rows
  // n-gram drafts (Sequence::spec_row, kSampleSpec) within the step's token budget left
  // (max_batch_tokens, and with a step time budget the tokens step_cost_ fits in it, less the
  // tokens planned) and the tokens each may still generate, on the blocks its table has room in
  // plus at most `free_blocks` free ones (never evicting a cached page or preempting anyone for
  // a draft); returns the blocks it took. Not under a KV cut that scores or drops pages
  // (kv_policy other than kFull) nor a sliding window.
  int speculate(int free_blocks);
  bool speculating() const;  // drafts apply on this worker (speculate's conditions)
  // seq.spec_draft for its current tokens (propose_ngram_draft), unless it is already. Touches
  // only seq: the sampling threads call it for the sequences they sampled.
  void propose_draft(Sequence& seq) const;
  // Sliding windows: when the step planned nothing, nothing runs, no block is free and two or
  // more waiting sequences hold pages, the one served last lets its pages go (cached for its own
  // restart) so that the others can go on. Each admitted a chunk's pages, and with every table
  // full and nothing behind the window none could advance: the worker hung for good. True when
  // one was released.
  bool release_youngest_waiting(Clock::time_point now);
  // A preemption by recompute's KV part (preempt, release_youngest_waiting): its full pages join
  // the prefix cache when `cache`, its blocks go back, it computes again from 0, and the
  // preemption is counted.
  void drop_kv_for_recompute(Sequence& seq, bool cache, Clock::time_point now);
  // logits [rows, vocab] of the kSampleRow entries, ids of the kSampleArgmax ones, in batch order.
  void postprocess(std::vector<float>& logits, const std::vector<int32_t>& ids,
                   Clock::time_point now);
  void sample_rows(Clock::time_point now);  // sample_jobs_ -> sample_reasons_
  // Records prompt_rows_ (record_prompt_logprobs), on the sampling threads when there are many.
  void record_prompt_rows(int vocab);
  void compact(Clock::time_point now);
  // Scheduler input over the sequences staying in running_ / waiting_ (ids: running index, then
  // kWaitingBase + waiting index, then kHandoffBase + pending_ index).
  SchedulerInput scheduler_input(bool with_handoffs);
  void apply_preemptions(const SchedulerOutput& out, Clock::time_point now);
  void preempt(Sequence& seq, const Preemption& why, Clock::time_point now);
  void handoff(std::unique_ptr<Sequence> seq, Clock::time_point now);
  void finish(Sequence& seq, FinishReason reason, Status status, Clock::time_point now);
  void finish_offer(HandoffOffer& offer, FinishReason reason, Status status, Clock::time_point now);
  void publish_stats();
  // KV cut before / after the forward of a decode row (no-ops without a policy). After: a failed
  // cut finishes the sequence with kError and returns false.
  // Before a decode step reads seq's pages: its recalls in flight that landed by
  // step_start + recall_wait_ms are committed (SequenceCut::settle); `all`: every one, waited for
  // (before its pages move). A failed recall copy is logged: the page stays as it was.
  void settle_cut(Sequence& seq, Clock::time_point step_start, bool all = false);
  void prepare_cut(Sequence& seq, model::SeqStep& step);
  bool finish_cut(Sequence& seq, Clock::time_point now);
  // Sliding windows, after a step of seq: the pages every layer's window has passed go back to
  // the pool (kv::drop_behind_window). On a prefill worker too: the handoff then moves only the
  // pages still inside the window (HandoffOffer::window_dropped).
  void drop_behind_window(Sequence& seq);
  // A preempted sequence waiting for blocks with priority >= `priority`.
  bool has_unreserved_waiting(int32_t priority) const;
  // Prompts pulled from the router and not started yet (never preempted, nothing generated): what
  // WorkerOptions::max_prefill_seqs bounds. Preempted, swapped-out and paused sequences wait here
  // too but do not count: they would otherwise keep a higher-priority prompt in the router.
  int pulled_prompts() const;
  // Fair time slicing: running `seq` has decoded for its class's max_hold_ms since it last
  // (re)started, so waiting work of a higher priority without room may pause it.
  static bool slice_expired(const Sequence& seq, Clock::time_point now);
  // Arrival of the router's head that admit_from_router last found could be served by pausing
  // slice-expired sequences (-1: none); it is taken without pages on the next pass only.
  int64_t slice_head_ = -1;
  // The temporal cut: swaps `seq` out (true) when the cost model and the host tier allow.
  bool try_swap_out(Sequence& seq, const Preemption& why);
  void apply_swap_ins(const SchedulerOutput& out, Clock::time_point now);
  // Starts the disk reads of the swapped-out sequences the predictor expects to resume next
  // (the step after this one), so their swap-in does not wait, and the host-tier prefetches
  // (blocks reserved, copies queued) of those on the host tier, from the blocks free beyond
  // what the next step's growth needs; drops the host prefetches it no longer names. Called
  // once the step's own reservations are made (before its forward pass: the copies run beside
  // it), and again after the step (`after_forward`, host prefetches only, over the blocks its
  // finished sequences freed). `free_blocks_after`: the predictor's bound, the blocks free for
  // the next step; sched_waiting_ must be current.
  void start_prefetches(int free_blocks_after, bool after_forward);
  // Drops `seq`'s prefetches (waiting for its read or copies) and releases its KV; the table is
  // left empty.
  void release_kv(Sequence& seq);
  // Device blocks held by host-tier prefetches: free for every decision (admission, handoffs,
  // the Scheduler), taken back by make_room when a reservation needs them.
  int prefetch_blocks() const;
  int plannable_blocks() const { return pool_->available_blocks() + prefetch_blocks(); }
  // Drops host prefetches, the one served last first, until `blocks` are available in the pool
  // (or none is left). Before every reservation the plan counted those blocks free for.
  void make_room(int blocks);
  // make_room for the blocks `table` lacks to hold `tokens` tokens, then KvPool::reserve.
  bool reserve_kv(kv::BlockTable& table, int tokens);
  // Blocks the running sequences need for their next position: what the next step's decode
  // rows may grow by. Before the forward pass, those of the step being planned (batch_) and
  // those it swaps in; `after_forward` (the lists compacted), those in running_.
  int next_step_growth(bool after_forward) const;
  // Effective-KV accounting point of `seq` (docs/kvm.md): its level from now on.
  void account_kv(Sequence& seq, Clock::time_point now);
  bool swapping() const;      // a host or disk tier to swap to
  void measure_swap_costs();  // copy bandwidths, at start-up (worker thread)
  void note_prefill_speed(int prefill_tokens, double seconds);
  // This step's cap on a prompt's chunk: max_chunk_tokens, and with a time budget
  // (max_chunk_ms, and with max_chunk_ms_auto its sequences' tightest max_itl_ms) the
  // tokens a step may carry within it by step_cost_ (rounded down to a block, at least
  // min_chunk_tokens), less the running sequences' decode rows; the smaller of the two (0: no
  // cap).
  int step_chunk_cap() const;
  // This step's time budget in ms (max_chunk_ms, and with max_chunk_ms_auto its sequences'
  // tightest max_itl_ms; common::step_time_budget_ms); 0: none.
  double step_budget_ms() const;

  WorkerOptions options_;
  std::unique_ptr<backend::Backend> backend_;  // declared first: destroyed last
  std::unique_ptr<StepModel> model_;
  std::unique_ptr<kv::KvPool> pool_;
  WorkerShared* shared_;
  const int total_blocks_;
  Scheduler scheduler_;  // SetSchedulerParams replaces it
  static constexpr int kWaitingBase = 1 << 24, kHandoffBase = 1 << 25;
  std::vector<SchedSeq> sched_running_, sched_waiting_;
  std::vector<SchedHandoff> sched_handoffs_;

  // Inbox (guarded by mu_).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HandoffOffer> inbox_offers_;
  std::vector<HandoffDone> inbox_done_;
  std::vector<std::pair<WorkerCommand, CommandDone>> inbox_commands_;
  bool stop_ = false;
  bool stopped_ = false;  // finalize_after_stop ran: commands are answered at once
  bool wake_ = false;

  // Owned by the worker thread.
  std::vector<std::unique_ptr<Sequence>> waiting_;  // need prefill or recompute
  std::vector<std::unique_ptr<Sequence>> running_;  // decoding
  std::vector<std::unique_ptr<Sequence>> scratch_waiting_, scratch_running_;
  std::deque<HandoffOffer> pending_;  // offers not yet admitted (kDecode/kColocated)
  struct Forwarded {
    std::shared_ptr<HandoffTicket> ticket;
    HandoffOffer offer;  // without the request: the Sequence is in the ticket
    std::shared_ptr<RequestControl> ctl;
    Worker* to = nullptr;
    Clock::time_point sent_at, deliver_by;
  };
  std::vector<Forwarded> forwarded_;  // offers passed on, not yet seen as received
  std::atomic<int64_t> handoffs_forwarded_{0};
  // Offers posted here and not yet in the published waiting count (post_offer adds one; the
  // publication after the inbox drained them takes them off): a slot they will take.
  std::atomic<int> offers_incoming_{0};
  std::atomic<int> max_seqs_{0};  // options_.max_num_seqs, for load() on other threads
  int offers_drained_ = 0;        // drained since the last publish_stats (worker thread)
  // mark_down / marked_down: steady-clock nanoseconds of the last inbox drain (or of the loop's
  // start, after the start-up measurements) and of the latest mark.
  std::atomic<int64_t> drained_ns_{0}, down_since_ns_{0};
  RecentMax step_ns_;                        // the loop's steps (worker thread)
  std::atomic<int64_t> slowest_step_ns_{0};  // step_ns_.max(), for stalled_since
  struct Pinned {
    kv::BlockTable table;  // the handed-off pages
    std::shared_ptr<HandoffTicket> ticket;
    Clock::time_point sent_at;     // posted to dest
    Clock::time_point deliver_by;  // reclaimed if not received by then
    Worker* dest = nullptr;
    std::shared_ptr<RequestControl> ctl;  // the request's cancel flag (the Sequence is not ours)
    // Decode workers offered it so far (dest the last), less those it was taken back from
    // before its deadline (early_moves).
    std::vector<const Worker*> tried;
    // Chained hashes of its cacheable pages (route_hashes; empty without a prefix cache).
    std::vector<uint64_t> hashes;
    int incoming = 0;  // blocks it needs on its destination (HandoffOffer::incoming_blocks)
    // The leading pages of `hashes` routes_ had for `dest` before this offer was sent there.
    int dest_had_pages = 0;
    int early_moves = 0;  // taken back from a worker marked down before the deadline
  };
  // The decode worker not in `tried` that `pin`'s offer loads least (choose_decode_worker; with
  // a prefix cache, cache-aware: the pages routes_ says each worker was sent already count as
  // shared there); null when none is left.
  Worker* pick_decode_worker(const Pinned& pin) const;
  // When `pin`'s destination is marked down: the worker pick_decode_worker finds for it if that
  // one is up (an early move, at most one per decode worker); otherwise null.
  Worker* up_instead_of_down_dest(const Pinned& pin) const;
  // The chained hashes (PrefixCache::next) of the pages of `seq` a decode worker's prefix cache
  // may serve (cacheable_tokens); empty without a prefix cache, with cache_aware_handoffs off,
  // with a sliding window, on a shard group, or with one decode worker.
  std::vector<uint64_t> route_hashes(const Sequence& seq) const;
  int decode_index(const Worker* w) const;  // its index in shared_->decode_workers
  // routes_: `pin`'s pages did not go to pin.dest after all (taken back, or passed on to
  // `now_at`, which took them; null: nowhere yet). Forgets those pin.dest did not have before.
  void routes_moved(const Pinned& pin, const Worker* now_at);
  // Cache-aware routing: which decode worker this (prefill) worker sent which pages to.
  static constexpr size_t kRouteMemoryPages = size_t{1} << 16;
  PrefixRoutes routes_{kRouteMemoryPages};
  std::atomic<int64_t> handoffs_to_cached_{0};  // routed where routes_ expected cached pages
  // Offers pinned handoff `id` (its pages in pin.table) with `seq` to `to`: a new ticket, the
  // delivery deadline from `now`.
  void post_handoff(uint64_t id, Pinned& pin, std::unique_ptr<Sequence> seq, Worker* to,
                    Clock::time_point now);
  std::unordered_map<uint64_t, Pinned> pinned_;  // handed-off pages awaiting HandoffDone
  int undelivered_ = 0;                          // pinned_ entries not yet seen as received
  uint64_t next_handoff_id_ = 1;
  int64_t handoffs_by_route_[3] = {0, 0, 0};  // received, by KvCopyRoute
  // Pages of the handoffs received: copied from the source, and taken from this worker's prefix
  // cache instead (read by snapshots).
  std::atomic<int64_t> handoff_pages_copied_{0}, handoff_pages_cached_{0};
  uint64_t seen_cancel_epoch_ = 0;
  Batch batch_;
  std::vector<float> logits_;
  std::vector<int32_t> argmax_ids_;
  struct SampleJob {
    Sequence* seq;
    float* logits;  // one row [vocab], sampled in place; nullptr: `token` was chosen by the model
    int32_t token;
    int rows = 1;  // kSampleSpec: logits holds this many rows (sample_speculative)
  };
  std::vector<SampleJob> sample_jobs_;
  std::vector<int> spec_accepted_;      // per sample job: draft tokens accepted (kSampleSpec)
  std::vector<uint8_t> spec_rejected_;  // ... and whether a draft token was rejected
  // Speculative decoding counters (PoolStats::spec_*), written by the worker thread.
  std::atomic<int64_t> spec_rows_{0}, spec_draft_tokens_{0}, spec_accepted_tokens_{0};
  // A prompt-logprobs row of this step (Sequence::wants_prompt_logprobs): its logits and position.
  struct PromptRow {
    Sequence* seq;
    const float* logits;
    int pos;
  };
  std::vector<PromptRow> prompt_rows_;
  std::vector<FinishReason> sample_reasons_;
  std::unique_ptr<ThreadPool> sampling_pool_;  // when sampling_threads > 1
  kv::PageOpStats cut_ops_;                    // KV cut transitions on this pool, all sequences
  SwapCosts swap_costs_;                       // the temporal cut's cost model inputs
  StepCostModel step_cost_;                    // forward time against tokens (max_chunk_ms)
  kv::SwapStats swap_stats_;
  kv::MigrateStats migrate_stats_;  // the spatial cut's migrations (MigrateKv)
  int64_t swap_choices_ = 0, recompute_choices_ = 0, swap_fallbacks_ = 0;
  bool disk_fallback_logged_ = false;  // a swap out that met a disk fault, logged once
  // Decode rows skipped for a consumer's unread backlog, in steps that ran (written by the worker
  // thread, read by snapshots).
  std::atomic<int64_t> stalled_decode_rows_{0};
  std::atomic<int64_t> handoffs_rerouted_{0};
  int stalled_this_step_ = 0;  // running sequences held back in the step being planned
  // Its consumer has max_unread_events events unread (WorkerOptions::max_unread_events).
  bool reader_behind(const Sequence& seq) const;
  std::atomic<uint8_t> hold_{0};            // TestHold
  std::atomic<uint64_t> hold_gen_{0};       // set_test_hold calls
  std::atomic<uint64_t> hold_seen_gen_{0};  // the last of them the loop has seen
  std::atomic<bool> loop_exited_{false};    // loop() returned (stopped)

  // Published for other threads.
  std::atomic<int> free_blocks_{0};
  std::atomic<int> running_count_{0};
  std::atomic<int> waiting_count_{0};
  std::atomic<int> incoming_blocks_{0};
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> forward_ns_{0};
  std::atomic<int64_t> bookkeeping_ns_{0};
  std::atomic<int64_t> sampling_ns_{0};
  // The KV page fields of PoolStats and the allocator counts of WorkerSnapshot (written by
  // publish_stats, read by snapshot()).
  mutable std::mutex kv_stats_mu_;
  PoolStats kv_stats_;
  Clock::time_point kv_disk_latency_at_{};  // DiskTierStats::latency_at, under kv_stats_mu_
  int kv_summary_used_ = 0, kv_host_used_ = 0, kv_prefetch_pending_ = 0;
  int kv_host_prefetch_pending_ = 0, kv_host_prefetch_blocks_ = 0;
  int64_t kv_disk_records_ = 0, kv_prefetch_dropped_ = 0;

  std::thread thread_;
};

}  // namespace kvsplit::sched
