// Scheduler: decides what one step of one worker runs, and nothing else. Thread-free and
// backend-free: plain structs in, plain structs out, so every rule is unit-tested without a
// model (tests/sched/scheduler_test.cpp), as nano-vllm's scheduler is. The Worker (thread,
// inbox, KvPool, model runner) and sched::generate_batch (the CLI path) both apply its output.
//
// One step, in order:
//   1. handoffs: received KV handoffs are admitted in the order given (the worker keeps them in
//      service order) while a sequence slot and
//      their blocks are free (no overtaking); a handoff may preempt running sequences of
//      strictly lower priority when that frees enough, never equal ones (no preemption storms);
//      it waits while a preempted sequence of at least its priority still waits for blocks;
//   2. decode: every running sequence gets one token, best served first; when the pool cannot
//      grow one, a running sequence not served before it gives its blocks back (swapped out or
//      recomputed later), possibly the one being grown;
//   3. prefill: waiting sequences (new prompts and recomputes) in service order reserve the KV
//      of their whole target when they start (the first that does not fit stops the rest), then
//      share the token budget by plan_fair_prefill (policy.h): a min_chunk_tokens chunk each
//      first (least recently served first within a priority: round robin; a long prompt only
//      when starving), then the rest by priority, the least remaining prefill first, no prompt
//      above max_chunk_tokens in any step, and a long prompt none while a shorter one of at
//      least its priority is prefilled (for up to kMaxPrefillYieldSteps). Swapped-out sequences
//      (the temporal cut) take their place in the same service order from their resume step on:
//      they reserve the blocks of their swapped pages and are swapped in, using no token budget. A
//      waiting sequence that does not fit may pause running sequences of strictly lower priority
//      whose time slice expired (SchedSeq::slice_expired) when that frees enough, and a prompt
//      only when the budget then gives it a chunk.
// Whenever a rule above allows several victims, the SwapPredictor (sched/swap_predictor.h) says
// which goes first: by default the one needed last (lowest priority, most deadline slack, longest
// step interval, youngest).
// Block arithmetic is the KvPool's: a sequence holding b blocks needs
// max(0, blocks_for(tokens) - b) more to hold `tokens` positions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sched/policy.h"

namespace kvsplit::sched {

struct SchedulerConfig {
  int block_size = 16;            // tokens per KV block, >= 1
  int max_batch_tokens = 512;     // prefill tokens per step (decode tokens too when colocated)
  int min_chunk_tokens = 16;      // smallest prefill chunk a prompt gets in a step
  int max_chunk_tokens = 0;       // most prefill tokens one prompt gets in a step; 0: no cap
  int max_num_seqs = 256;         // sequences a worker owns (running + waiting), >= 1
  bool decode_in_budget = false;  // colocated: decode tokens count against max_batch_tokens
  // Sliding windows (model::ModelConfig::kv_window): > 0 when every layer reads at most this many
  // keys back and the worker frees the pages behind the window after each step
  // (kv::drop_behind_window). A prompt's pages are then reserved chunk by chunk, as far as
  // prefill_reach, rather than for the whole prompt at once, so a prompt or a recompute longer
  // than the pool runs while its window's pages fit.
  int kv_window = 0;

  // The most prompt tokens one sequence computes in a step.
  int chunk_cap() const {
    return max_chunk_tokens > 0 ? std::min(max_chunk_tokens, max_batch_tokens) : max_batch_tokens;
  }
  // The positions a waiting sequence's table must hold before its next chunk: its whole target,
  // or with a window only what this step's chunk can reach.
  int prefill_reach(int num_computed, int target) const {
    return chunk_reach(num_computed, chunk_cap(), target);
  }
  // The same for a chunk of `chunk` tokens.
  int chunk_reach(int num_computed, int chunk, int target) const {
    return kv_window > 0 ? std::min(target, num_computed + chunk) : target;
  }
  // Whether a restart (a recompute, or a prompt taken without pages) of `target` positions may
  // take cached prompt pages (KvPool::share_prefix) inside the step's plan: not when a window makes
  // it reserve chunk by chunk, since the window's cached pages it would pin were counted free for
  // others. At admission a windowed prompt takes them anyway (sched::share_prompt_pages).
  bool shares_prefix(int target) const { return prefill_reach(0, target) >= target; }
};

// One sequence the worker owns. `id` is the caller's handle, echoed in the output; ids are unique
// across running, waiting and handoffs.
struct SchedSeq {
  int id = 0;
  int32_t priority = 0;  // higher is served first
  int64_t arrival = 0;   // older (smaller) is served first within a priority
  int num_computed = 0;  // positions whose KV exists
  int target = 0;        // waiting only: positions whose KV must exist before it decodes
                         // (the prompt, or prompt + output[:-1] after a preemption)
  int num_blocks = 0;    // KV pages its block table holds now
  // Running only: the most positions its KV can reach (prompt + max_tokens - 1); 0: unknown. A
  // restart waits for the growth of the running sequences served before it (Scheduler, step 3).
  int final_positions = 0;
  // Waiting only: preempted by recompute before (its output is recomputed, not its prompt).
  bool restart = false;
  // Full-pool blocks a release frees: num_blocks (-1) unless a KV cut moved pages out of the pool
  // (quantized into an arena, or evicted).
  int held_blocks = -1;
  int64_t last_prefill_step = -1;  // the step that last gave it a chunk (round robin)
  // Waiting only, never given a chunk: the step it started waiting (pulled); the round robin ranks
  // it by this, not ahead of every prompt served before (PrefillDemand::waiting_since). -1:
  // unknown.
  int64_t waiting_since = -1;
  // Waiting only, the temporal cut: pages swapped out to the host tier (kv/swap.h). Such a
  // sequence has its KV (num_computed == target) and resumes by a swap-in of this many blocks,
  // not before step resume_step while other sequences decode (any running one not stalled).
  int swapped_pages = 0;
  int64_t resume_step = 0;
  // Waiting only: paused with all its KV on the device (MigrateKv brought its swapped pages
  // back); it resumes like a swap-in of no pages.
  bool resident_paused() const { return swapped_pages == 0 && restart && num_computed >= target; }
  // Running only, fair time slicing: it has held the pool for its class's slice, so waiting work
  // of a higher priority without room may pause it.
  bool slice_expired = false;
  // Running only: its consumer has not read its events (WorkerOptions::max_unread_events). It
  // gets no decode row and so no growth this step (nobody is preempted for it), and it is the
  // first victim of any growth, handoff or waiting work that needs blocks, whatever its priority
  // or age: it holds blocks and will not decode.
  bool stalled = false;
  // Running only, for the SwapPredictor: ms until its class's latency target is missed (max_itl_ms
  // since its last token; may be negative), infinite without a deadline; and the EWMA of the
  // interval between its tokens in ms (0: none yet).
  double slack_ms = std::numeric_limits<double>::infinity();
  double step_interval_ewma_ms = 0;
};

// A received KV handoff waiting for admission (destination side).
struct SchedHandoff {
  int id = 0;
  int32_t priority = 0;
  int64_t arrival = 0;
  int num_tokens = 0;  // positions of KV it brings
  // Its first pages, dropped behind a sliding window on the source: no blocks here.
  int dropped_pages = 0;
  // Of the rest, pages this worker's prefix cache holds on the device that a running sequence
  // holds too: the handoff shares them (KvPool::share_device_prefix) and needs no block for them.
  int shared_pages = 0;
};

struct SchedulerInput {
  std::span<const SchedSeq> running;       // decoding
  std::span<const SchedSeq> waiting;       // prefill or recompute
  std::span<const SchedHandoff> handoffs;  // admitted in this order (no overtaking)
  int free_blocks = 0;                     // free blocks of the worker's pool
  int total_blocks = 0;                    // blocks of the whole pool
  int64_t step = 0;                        // the worker's step number
  // Sequences the worker owns that are not listed above (waiting ones left out this step, e.g.
  // behind their reader): they count against max_num_seqs.
  int unlisted = 0;
};

enum class PreemptReason : uint8_t {
  kDecodeGrowth,  // a running sequence needed a block and none was free
  kHandoff,       // a higher-priority handoff needed the blocks
  kCommand,       // a worker command released its KV (ReleaseKv)
  kTimeSlice,     // its class's time slice expired and higher-priority work was waiting
};
const char* preempt_reason_name(PreemptReason reason);

struct Preemption {
  int id = 0;
  PreemptReason reason = PreemptReason::kDecodeGrowth;
  int freed_blocks = 0;
  int for_id = 0;  // the sequence (kDecodeGrowth) or handoff (kHandoff) it made room for
  int32_t for_priority = 0;
};

struct HandoffAdmission {
  int id = 0;
  int blocks = 0;  // blocks to reserve for its KV
};

struct DecodeRow {
  int id = 0;
  int new_blocks = 0;  // blocks to add so it holds num_computed + 1 positions
};

// A swapped-out sequence brought back: reserve `blocks` and swap its pages in; it decodes from
// the next step. `blocks` 0: a paused sequence whose KV is all on the device already (MigrateKv
// brought its pages back) simply resumes.
struct SwapIn {
  int id = 0;
  int blocks = 0;
};

struct PrefillChunk {
  int id = 0;
  int start = 0;       // == num_computed
  int tokens = 0;      // chunk length, >= 1
  int new_blocks = 0;  // blocks to add (its whole target, when it starts)
  bool last = false;   // the chunk completes the target
};

// Why the first handoff that was not admitted waits (back-pressure, not an error).
enum class HandoffWait : uint8_t { kNone, kNoSlot, kNoBlocks, kPreemptedFirst };

struct SchedulerOutput {
  // Apply in this order: release the preempted (running sequences, all their blocks), admit the
  // handoffs, grow the decode rows, start / continue the prefill chunks. Every reservation fits
  // the free blocks by construction.
  std::vector<Preemption> preempted;
  std::vector<HandoffAdmission> admitted;
  std::vector<DecodeRow> decode;
  std::vector<PrefillChunk> prefill;
  std::vector<SwapIn> swap_in;  // applied with the prefill chunks (they share its service order)
  HandoffWait handoff_wait = HandoffWait::kNone;
  // Sequences (running, waiting or handoffs) whose KV needs more blocks than the whole pool has:
  // they can never run here and block nothing; the caller fails them.
  std::vector<int> never_fit;
  int free_blocks_after = 0;  // free blocks once everything above is applied
  int num_tokens() const;     // tokens in the step's batch
};

class SwapPredictor;

class Scheduler {
 public:
  // `predictor` ranks victims; null: default_swap_predictor().
  explicit Scheduler(SchedulerConfig config,
                     std::shared_ptr<const SwapPredictor> predictor = nullptr);

  // The whole step: handoffs, decode rows, prefill chunks (in.handoffs may be empty).
  SchedulerOutput schedule(const SchedulerInput& in) const;
  // Step 1 alone (admitted, preempted, handoff_wait, never_fit): a worker admits handoffs at its
  // step boundary even when no forward pass follows, then calls schedule() without handoffs.
  SchedulerOutput admit_handoffs(const SchedulerInput& in) const;

  // Whether a new prompt of `num_prompt` tokens may be admitted now (pulled from the router):
  // a slot is free, and its blocks fit with a watermark of 1% of the pool (at least one block)
  // kept for the running sequences' growth when any is running.
  bool can_admit_prompt(int num_prompt, int free_blocks, int total_blocks, int num_running,
                        int num_owned) const;

  const SchedulerConfig& config() const { return config_; }
  const SwapPredictor& predictor() const { return *predictor_; }
  // The per-step chunk cap (the worker's time-based cap, max_chunk_ms), from the next plan on.
  void set_max_chunk_tokens(int tokens) { config_.max_chunk_tokens = tokens; }

 private:
  struct StepState;
  void admit(StepState& st, SchedulerOutput& out) const;
  void grow_decodes(StepState& st, SchedulerOutput& out) const;
  void plan_prefill(StepState& st, SchedulerOutput& out) const;
  // Pauses slice-expired running sequences of lower priority than `w` until `need` blocks are
  // free; false (nothing done) when they cannot free enough.
  bool make_room_by_slice(StepState& st, const SchedSeq& w, int need, SchedulerOutput& out) const;
  // Blocks the running sequences served before `w` still need to reach their final_positions
  // (each at most what the pool can give it). O(log running) per call.
  int growth_ahead(StepState& st, const SchedSeq& w) const;
  // The block a resuming sequence (swapped in, or restarted by recompute) of `positions` needs
  // beyond its `blocks` for the token it decodes next: 1 when its positions fill their last page
  // (a sequence paused for its own growth always does), else 0; 0 too when that would exceed the
  // pool (its growth is refused as never_fit instead). Without it the sequence came back into a
  // full pool, needed a block at its first decode and paused itself again, round after round.
  int next_token_room(int positions, int blocks, int total_blocks) const;

  SchedulerConfig config_;
  std::shared_ptr<const SwapPredictor> predictor_;
};

}  // namespace kvsplit::sched
