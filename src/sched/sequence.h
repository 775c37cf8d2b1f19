// Sequence: the scheduler's record of one request. Exactly one owner at any instant (the router
// queue, one worker, or a handoff message in flight); only RequestControl is shared.
//
// Lifecycle (monotonic timestamps at each transition, accumulated into Timings):
//   kQueued -> kPrefill -> [kHandoff -> kDecode] ... -> finished | cancelled | failed
//   kDecode -> kPreempted (blocks released; recompute of prompt + output[:-1]) -> kDecode
//   kDecode -> kPreempted (pages swapped out to the host tier; swap-in, no recompute) -> kDecode
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/escape.h"
#include "kv/block_allocator.h"
#include "kv/prefix_cache.h"
#include "kv/swap.h"
#include "kvsplit/engine.h"
#include "model/tokenizer.h"
#include "sampling/ngram_draft.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"
#include "sched/kv_account.h"
#include "sched/request_stream.h"
#include "sched/sequence_cut.h"

namespace kvsplit::sched {

using Clock = std::chrono::steady_clock;

// A sequence's identity: request ids are unique per tenant only, and a request of n completions
// (Request::n) has n sequences, completion `index` each.
struct RequestKey {
  std::string tenant;
  std::string request_id;
  int32_t index = 0;
  bool operator==(const RequestKey& o) const = default;
};
struct RequestKeyHash {
  size_t operator()(const RequestKey& k) const noexcept {
    const size_t h = std::hash<std::string>{}(k.tenant);
    return ((h ^ (h >> 29)) * 0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(k.request_id)) +
           static_cast<size_t>(k.index) * 0xC2B2AE3D27D4EB4Full;
  }
};

// Shared between the engine (cancel) and whoever owns the Sequence. The completions of one
// request share its stream.
struct RequestControl {
  explicit RequestControl(std::string id, std::string tenant_id = {})
      : RequestControl(std::move(id), std::move(tenant_id), 0, nullptr) {}
  // Completion `index` of a request whose completions share `shared_stream` (null: a new stream
  // for one completion).
  RequestControl(std::string id, std::string tenant_id, int32_t completion,
                 std::shared_ptr<RequestStream> shared_stream)
      : request_id(std::move(id)),
        tenant(std::move(tenant_id)),
        index(completion),
        display_id(escape_for_message(request_id, 2 * kMaxEchoBytes)),
        stream(shared_stream ? std::move(shared_stream)
                             : std::make_shared<RequestStream>(request_id)) {}
  RequestKey key() const { return {tenant, request_id, index}; }
  const std::string request_id;
  const std::string tenant;
  const int32_t index;           // the completion (Request::n)
  const std::string display_id;  // request_id escaped for messages and logs (may be user bytes)
  std::shared_ptr<RequestStream> stream;
  std::atomic<bool> cancel_requested{false};
  // Completions 1..n-1 of a request under a prefix cache: 0 until completion 0's prompt is
  // computed (or it ended), then the time of that (Clock ticks since its epoch, > 0), so that
  // they take its cached pages (Router::pop_if passes over them meanwhile, and their queue wait
  // counts from then: Router::take_expired). Shared by the request's completions; null: never
  // held.
  std::shared_ptr<std::atomic<int64_t>> prompt_ready;
};

enum class SeqPhase : uint8_t { kQueued, kPrefill, kHandoff, kDecode, kPreempted, kDone };

struct Sequence {
  std::shared_ptr<RequestControl> ctl;
  int64_t arrival = 0;   // submission order (age: larger = younger)
  int32_t priority = 0;  // sched::effective_priority: class priority, then request priority
  int class_index = 0;
  SlaClass sla;  // the class settings at submit
  SamplingParams params;
  uint32_t top_logprobs = 0;
  // Request::prompt_logprobs of completion 0 (-1: off), and their entries as the prompt's chunks
  // compute them (prompt_lp[p]: token p + 1), sent with the first token.
  int32_t prompt_logprobs = -1;
  std::vector<TokenLogprob> prompt_lp;

  // tokens = prompt followed by the generated tokens. KV holds tokens[0, num_computed).
  std::vector<int32_t> tokens;
  int num_prompt = 0;
  int num_computed = 0;
  kv::BlockTable table;  // blocks in the current owner's KvPool
  // The KV cut of this sequence's pages (EngineConfig::kv_policy with the class's settings):
  // created by the worker that decodes it, at its first decode step there; null before and
  // without a policy. Pages change state only between that worker's decode steps.
  std::unique_ptr<SequenceCut> cut;

  std::unique_ptr<sampling::Sampler> sampler;
  std::unique_ptr<sampling::StopChecker> stop;
  std::unique_ptr<model::StreamDecoder> decoder;
  std::vector<int32_t> eos_ids;  // the model's EOS ids (empty with ignore_eos)

  // Timing.
  SeqPhase phase = SeqPhase::kQueued;
  Clock::time_point submit_time;
  Clock::time_point queue_deadline;
  Clock::time_point phase_start;
  Clock::time_point first_token_time;
  Clock::time_point last_token_time;
  double phase_ms[5] = {0, 0, 0, 0, 0};  // indexed by SeqPhase (queued..preempted)
  double itl_sum_ms = 0;
  double itl_max_ms = 0;
  // EWMA (weight kStepIntervalAlpha) of the gaps between its tokens in ms, less the time spent
  // preempted (a pause is not how often it is served; counted, it made a sequence just resumed
  // the SwapPredictor's first victim again); 0 before the second token. The SwapPredictor's
  // "served least often". interval_from: the last token's time, moved later by each pause since.
  double step_interval_ewma_ms = 0;
  static constexpr double kStepIntervalAlpha = 0.2;
  Clock::time_point interval_from;
  // A token other than the first at `now`: folds its gap since interval_from into the EWMA.
  void note_step_interval(Clock::time_point now);
  int32_t preemptions = 0;
  // The temporal cut: a sequence swapped out (pages on the host, kv/swap.h) is not resumed before
  // its worker's step resume_step.
  int64_t resume_step = 0;
  // The disk read of its swapped-out pages started ahead of its resume (kv::SwapPrefetch); null
  // or unused (record 0) otherwise. Dropped (the read waited for) before the table is released.
  std::unique_ptr<kv::SwapPrefetch> prefetch;
  // Prefix cache: the tenant's (and cache_salt's) salt, and the prompt tokens served from it.
  uint64_t prefix_salt = 0;
  int32_t cached_tokens = 0;
  // Where its prefill's chunks have walked its prompt's chain in the prefix cache (each chunk's
  // insert resumes there); settled and reset when the prefill or recompute completes and when
  // its KV is released (kv::KvPool::settle_prefix).
  kv::PrefixCache::Cursor prefix_cursor;
  // Taken from the router without pages (a time slice, Worker::admit_from_router): its cached
  // prompt pages are looked up when its pages come (its first chunk), and cached_tokens then.
  bool pages_deferred = false;
  // Effective-KV accounting (sched/kv_account.h): updated by the owner at its accounting points
  // (docs/kvm.md), carried with the sequence through a handoff, closed by finish_sequence.
  KvAccount kv_account;

  // Owner-private scratch: what the owning worker does with the sequence after this step.
  enum class Next : uint8_t { kStay, kToRunning, kToWaiting, kHandoff, kRemove } next = Next::kStay;
  int64_t last_prefill_step = -1;  // the owner's step that last ran a chunk of this sequence
  // Speculative decoding: the tokens its decode row feeds this step, the last sampled token and
  // the draft after it (Worker::speculate); empty for a plain decode row.
  std::vector<int32_t> spec_row;
  sampling::DraftAcceptance spec_acceptance;  // its drafts' acceptance: their length
  // The draft proposed for its next row by the sampling thread that sampled its last token (so
  // the lookups of a step's rows run in parallel), valid while tokens.size() == spec_draft_for.
  std::vector<int32_t> spec_draft;
  size_t spec_draft_for = 0;
  int64_t waiting_since = -1;  // the owner's step that pulled it (SchedSeq::waiting_since)

  const std::string& id() const { return ctl->request_id; }
  const std::string& display_id() const { return ctl->display_id; }
  int num_output() const { return static_cast<int>(tokens.size()) - num_prompt; }
  // Tokens whose KV must exist before the next decode step: prompt + output[:-1].
  int prefill_target() const {
    return num_output() == 0 ? num_prompt : static_cast<int>(tokens.size()) - 1;
  }
  bool cancelled() const { return ctl->cancel_requested.load(std::memory_order_relaxed); }
  // Completion 0 of a request whose other completions wait for its prompt (prompt_ready): lets
  // them go (at its first token, or when it ends without one).
  void release_siblings() const {
    if (ctl->index != 0 || !ctl->prompt_ready) return;
    int64_t held = 0;
    ctl->prompt_ready->compare_exchange_strong(
        held, std::max<int64_t>(1, Clock::now().time_since_epoch().count()),
        std::memory_order_acq_rel);
  }
  // Completions 1..n-1 held until completion 0's prompt is computed (RequestControl).
  bool held_for_prompt() const {
    return ctl->index > 0 && ctl->prompt_ready &&
           ctl->prompt_ready->load(std::memory_order_acquire) == 0;
  }
  // When a completion held for the prompt was let go (none: the epoch).
  Clock::time_point released_at() const {
    if (ctl->index == 0 || !ctl->prompt_ready) return Clock::time_point{};
    return Clock::time_point(Clock::duration(ctl->prompt_ready->load(std::memory_order_acquire)));
  }
  // Its prompt's chunks return every row's logits (Request::prompt_logprobs), until its first
  // token; it takes no cached prompt pages until then.
  bool wants_prompt_logprobs() const { return prompt_logprobs >= 0 && num_output() == 0; }
  // Closes the current phase's clock and opens `next`.
  void enter_phase(SeqPhase next, Clock::time_point now);
};

// Receives every final event (engine bookkeeping: counters, SLO attainment, the active map).
// Called from whichever thread finishes the request; must be thread-safe and must not block long.
class FinishSink {
 public:
  virtual ~FinishSink() = default;
  virtual void on_final(const Sequence& seq, const TokenEvent& final_event) = 0;
};

// Samples the next token from `logits` ([vocab] f32, modified in place by the sampler), appends it
// Prompt logprobs (Sequence::wants_prompt_logprobs): `rows` logits rows [n, vocab] of positions
// start .. start + n - 1; records each whose next token is a prompt token. seq.prompt_lp must hold
// num_prompt - 1 entries (size_prompt_logprobs); calls on disjoint rows may run at once.
void size_prompt_logprobs(Sequence& seq);
void record_prompt_logprobs(Sequence& seq, const float* rows, int start, int n, int vocab);

// to `seq`, pushes one non-final event (id, text delta, logprobs when top_logprobs > 0) and returns
// the finish reason (kNone while generation continues). kError, with nothing appended, when the
// logits have no usable value (sampling::logits_usable): the caller fails the sequence
// (unusable_logits_error). Guided decoding: kStop with nothing appended when the text is
// complete and no end id can be sampled, kError when the constraint allows no token.
FinishReason sample_and_append(Sequence& seq, float* logits, int vocab, Clock::time_point now);
// Speculative decoding: a decode row that fed seq.spec_row (its last sampled token, then
// seq.spec_row.size() - 1 draft tokens) returned one logits row per fed token in `rows`
// ([spec_row.size(), vocab], sampled in place). Samples from row 0, and from row j + 1 only while
// the token sampled from row j is draft token j + 1 and generation goes on, each with
// sample_and_append: the sampler draws once per token emitted, as without a draft, so greedy and
// seeded sampling give the same tokens. seq.num_computed (which must count the fed last token)
// grows by the draft tokens accepted, returned in *accepted; *rejected: a draft token was not
// the one sampled (not when generation ended or a row was unusable first). kError only when row 0
// is unusable (a later unusable row ends the acceptance there).
FinishReason sample_speculative(Sequence& seq, float* rows, int vocab, Clock::time_point now,
                                int* accepted, bool* rejected);

// True when the next token is the plain argmax of the logits (greedy, no penalties, no
// logprobs), so the model may pick it on the device (SeqStep::Logits::kArgmax).
bool greedy_without_logits(const Sequence& seq);

// Appends a token chosen by the model (kArgmax) as sample_and_append would have chosen it; the
// model's -1 (no usable logit) is kError with nothing appended, as there.
FinishReason append_token(Sequence& seq, int32_t token, Clock::time_point now);

// The error of a sequence whose logits had no usable value at its current position.
Status unusable_logits_error(const Sequence& seq);

// Pushes the final event (after any text still held back) and calls sink.on_final. The caller
// must have released the sequence's KV blocks.
void finish_sequence(Sequence& seq, FinishReason reason, Status status, Clock::time_point now,
                     FinishSink& sink);

}  // namespace kvsplit::sched
