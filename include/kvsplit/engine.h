// The kvsplit engine: public API. Thread-safe. No CUDA, gRPC or YAML types here.
//
//   auto engine = kvsplit::Engine::create(config);            // StatusOr<unique_ptr<Engine>>
//   auto handle = (*engine)->submit(request);                  // StatusOr<RequestHandle>
//   kvsplit::TokenEvent ev;
//   while (handle->next(&ev, std::chrono::seconds(30)) && !ev.final) { ... }
//
// Events are pushed by engine threads without blocking (an unbounded per-request queue); a
// consumer either blocks in next() or registers a notifier (e.g. a gRPC reactor) and drains
// with try_next(). Every accepted request gets exactly one final event.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvsplit/kv_cuts.h"
#include "kvsplit/kvm.h"
#include "kvsplit/sampling_params.h"
#include "kvsplit/status.h"

namespace kvsplit {

// A named service class: latency targets and queueing rules.
struct SlaClass {
  std::string name = "default";
  double max_ttft_ms = 2000.0;        // > 0; target time to first token
  double max_itl_ms = 200.0;          // > 0; target inter-token latency
  int32_t priority = 0;               // higher runs first and is preempted last
  int32_t max_queue = 1024;           // >= 1; queued requests beyond this -> RESOURCE_EXHAUSTED
  double queue_timeout_ms = 30000.0;  // (0, 1e9]; still queued after this -> DEADLINE_EXCEEDED
  // The KV cut settings of this class's requests (YAML `sla_classes.<name>.kv`), in place of
  // EngineConfig::semantic; unset: the engine's. Only the policy's thresholds, windows and steps
  // apply per request: the policy itself (EngineConfig::kv_policy) and the host tier's size
  // (host_capacity_mb, per worker) are the engine's.
  std::optional<SemanticCutConfig> semantic;
  // Fair time slicing (the temporal cut): a running request of this class that has been decoding
  // for max_hold_ms may be paused (swapped out, or recomputed later) when waiting work of a
  // higher priority has no room. 0: never paused for that reason. >= 0.
  double max_hold_ms = 0;
  // Temporal cut overrides for this class's requests (YAML `sla_classes.<name>.kv.swap` and
  // `.temporal_step_size`); unset / 0: EngineConfig::temporal's. The tiers stay the engine's.
  std::optional<SwapMode> swap;
  int32_t temporal_step_size = 0;  // >= 0
  // Spatial cut override (YAML `sla_classes.<name>.kv.spread`): true places every request of
  // this class across the worker's shards, false keeps them on the home shard while it has room;
  // unset: by EngineConfig::spatial.min_context. Without shards it changes nothing.
  std::optional<bool> spread;
  bool operator==(const SlaClass&) const = default;
};

// Speculative decoding (docs/serving.md "Speculative decoding"): each decode step of a sequence
// also feeds up to num_speculative_tokens draft tokens, which one forward pass verifies; every
// draft token the sampler would have picked anyway is accepted, so a step may emit several tokens.
// The output is the same as without it: greedy and seeded sampling give the same tokens.
enum class SpeculativeMethod : uint8_t {
  kNone,   // off
  kNgram,  // prompt lookup: the tokens that followed the sequence's last n-gram earlier in it
};

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int32_t num_speculative_tokens = 4;  // draft tokens per step at most, in [1, 16]
  int32_t prompt_lookup_min = 1;       // shortest n-gram looked up, in [1, prompt_lookup_max]
  int32_t prompt_lookup_max = 4;       // longest n-gram looked up (tried first), in [1, 32]
  bool enabled() const { return method != SpeculativeMethod::kNone; }
};

enum class ServingMode : uint8_t {
  kColocated,     // one pool runs prefill and decode in the same steps
  kDisaggregated  // separate prefill and decode worker pools with KV handoff
};

struct EngineConfig {
  std::string model = "synthetic:stories260k";  // path or synthetic:<preset>
  std::string tokenizer;                        // empty: beside the model
  std::string backend = "cpu";                  // "cpu" | "cuda"
  int32_t threads_per_worker = 0;               // CPU threads per worker; 0: hardware / workers
  // CPU backend: the semantic cut's recalls and the prefix cache's spill-ahead copy on a copy
  // thread beside each worker's compute threads, as on a GPU's copy stream (BackendOptions::
  // async_copies; recalls then wait at most semantic.recall_wait_ms). Off: they copy at once.
  bool async_copies = false;
  ServingMode mode = ServingMode::kDisaggregated;
  int32_t num_prefill_workers = 1;  // >= 1 (disaggregated)
  int32_t num_decode_workers = 1;   // >= 1 (colocated: the number of workers)
  // Device of each worker, prefill workers first, round-robin over this list: worker i runs on
  // devices[i % size], its spatial shard s (CUDA) on devices[(i + s) % size]. Empty: CUDA
  // round-robins over the visible devices; the CPU backend uses virtual device 0 (CPU device ids
  // only name workers; they share host memory). Each in [0, 1024); at most 64 entries.
  std::vector<int32_t> devices;
  int32_t block_size = 16;                  // tokens per KV page
  int32_t kv_blocks_per_worker = 0;         // 0: derive from kv_capacity_bytes
  int64_t kv_capacity_bytes = 256ll << 20;  // per worker when kv_blocks_per_worker == 0
  int32_t max_num_seqs = 256;               // running sequences per decode worker
  int32_t max_batch_tokens = 512;           // token budget of one prefill (chunk) step
  // Fair prefill: the most prompt tokens one request computes in a step, so a long prompt is
  // prefilled in chunks that keep every step (and the short requests sharing it) short; 0: no
  // cap but max_batch_tokens. In [0, 2^20] (docs/kv-cuts.md "Fair time slicing").
  int32_t max_chunk_tokens = 0;
  // Time-based fair prefill: a long prompt's chunk is also capped at the tokens that a step of the
  // worker's (with its decode rows) is predicted to carry within this many ms, from its measured
  // step cost (a fit of step time against tokens over its recent steps, sched::StepCostModel), so
  // the cap follows the backend (a GPU step's time hardly grows with a few hundred tokens; a CPU
  // step's is linear). Like max_chunk_tokens it caps each prompt's chunk, not the step: several
  // prompts' chunks (short prompts whole) may share a step up to max_batch_tokens. With
  // max_chunk_tokens too, the smaller cap holds. 0: off. In [0, 1e6].
  double max_chunk_ms = 0;
  // pools.max_chunk_ms: auto. A step's time budget is also the tightest max_itl_ms among the SLA
  // classes of the sequences it serves (decoding, and prompts being prefilled), so a long
  // prompt's chunk keeps every decoding sequence's inter-token latency within its class's target,
  // and no step lasts longer than its own sequences' classes allow a gap between tokens (a
  // prompt arriving during it waits for it). With max_chunk_ms > 0 too (a KV cache manager rule
  // may set it), the smaller budget holds.
  bool max_chunk_ms_auto = false;
  // Speculative decoding on the workers that decode (decode and colocated workers).
  SpeculativeConfig speculative;
  // Back-pressure from a slow reader: a decoding sequence whose stream holds this many events its
  // consumer has not read yet (a gRPC client not reading: flow control holds the writes) gets no
  // decode step until the consumer catches up; its KV stays and it can still be preempted, so a
  // slow client slows only its own request and its buffered events stay bounded (n times this for
  // a request of n completions, Request::n). 0: no bound. In [0, 2^20].
  int32_t max_unread_events = 1024;
  // > 0; bound on the delivery of a KV handoff (a decode worker must take the offer within it,
  // else the prefill side reclaims it and the request fails DEADLINE_EXCEEDED). Waiting for room
  // in a full decode pool is back-pressure, bounded by the class queue timeout instead.
  int32_t handoff_timeout_ms = 5000;
  // Liveness before that deadline: an offer a decode worker has not taken within
  // max(handoff_stall_ms, 4 x its slowest step of the last 64), while it has not drained its
  // inbox since the offer was posted, marks it down (offers in flight to it are taken back when
  // another is up; docs/serving.md "Delivery"). 0: only handoff_timeout_ms marks a worker down.
  // In [0, 3600000].
  int32_t handoff_stall_ms = 1000;
  // With prefix_cache, in disaggregated mode: a prefill worker sends a KV handoff to the decode
  // worker it sent the prompt's pages to before, unless that one is more loaded by more than
  // the pages it would share (docs/serving.md "Cache-aware routing"). false: by load alone.
  bool cache_aware_handoffs = true;
  // Disaggregated mode: a decode worker passes a received KV handoff that waits for room there to
  // another decode worker that has room for it now (docs/serving.md "KV handoff"). false: it
  // waits where it was sent.
  bool forward_waiting_handoffs = true;
  // The KV cut acting on decoding sequences' pages between decode steps (docs/kv-cuts.md). Pages
  // change state only on the workers that decode (decode and colocated workers); a prefill
  // worker hands off full-precision pages. kSemantic sizes each decode pool's int8 / int4 arenas
  // and key summaries for as many pages as the full pool has blocks, and a host tier of
  // min(semantic.host_capacity_mb, one full copy of the pool) for the originals.
  KvPolicy kv_policy = KvPolicy::kFull;
  // Settings of kv_policy (kSemantic: the whole ladder; kStreaming: sink_tokens and
  // recent_tokens; kH2O: those, heavy_tokens and the scoring ones); SLA classes may override
  // them (SlaClass::semantic).
  SemanticCutConfig semantic;
  // kSemantic with pools sized by kv_capacity_bytes: the share of that device budget given to the
  // int8 / int4 arenas and key summaries (the full pool keeps the rest), so demoted pages free
  // full pages inside one budget (sched::SequenceCut::split_budget). 0: the arenas come on top
  // (sized as above). In [0, 0.9].
  double kv_quant_fraction = 0.0;
  // The temporal cut on decoding workers: a host tier of temporal.host_capacity_mb per worker
  // (added to the semantic cut's) lets a sequence preempted under memory pressure be swapped out
  // and resumed without recompute (docs/kv-cuts.md). host_capacity_mb 0: recompute only.
  TemporalCutConfig temporal;
  // The spatial cut: every worker's KV over spatial.shards shards (CPU backend). Not combined with
  // the semantic cut yet (kv_policy must be kFull when shards > 1).
  SpatialCutConfig spatial;
  // Prefix cache on the workers that prefill (prefill and colocated workers): full prompt pages
  // shared across requests of one tenant and cache_salt (docs/kv-cuts.md); Usage::cached_tokens
  // reports the hits. Evicted pages spill to the worker's host tier (temporal.host_capacity_mb)
  // and disk tier (temporal.disk_path), which prefill workers then get too, and come back on a
  // hit.
  bool prefix_cache = false;
  // Prefix cache spill-ahead: at the end of every step (idle ones included), each worker with a
  // prefix cache (decode workers too) keeps this many KV blocks free by copying its cache's least
  // recently used pages to free host-tier slots ahead of need
  // (asynchronously where the backend copies so), so an allocation rarely waits for a spill. 0:
  // off (pages spill when an allocation needs their block). Needs a host tier. In [0, 16777216].
  int32_t prefix_spill_ahead_blocks = 0;
  // The KV cache manager (docs/kvm.md): rules that move the cuts' parameters at run time.
  KvmConfig kvm;
  uint64_t seed = 0;                                 // draws per-request seeds when unset
  std::vector<SlaClass> sla_classes = {SlaClass{}};  // first one is the default class
};

// Request::priority is in [-kMaxRequestPriority, kMaxRequestPriority]: it is added to its class's
// (sched::effective_priority), bounded so that the sum cannot overflow.
inline constexpr int32_t kMaxRequestPriority = 1000;
// Request::n is in [1, kMaxCompletions] (OpenAI's bound on `n`).
inline constexpr int32_t kMaxCompletions = 128;

struct Request {
  // Unique among the tenant's in-flight requests. Empty: the engine assigns "req-" followed by 32
  // random hex digits (128 bits from the kernel's CSPRNG), which nobody can predict.
  std::string request_id;
  // Who submitted the request: request ids are scoped to it, and cancel() and the duplicate check
  // see only the tenant's own requests. The server sets a non-secret id of the caller's API key,
  // or "anonymous" without authentication (docs/server.md); empty is a tenant like any other.
  // Carried on the request for per-tenant accounting.
  std::string tenant;
  std::string prompt;                     // used when prompt_token_ids is empty
  std::vector<int32_t> prompt_token_ids;  // when set, used as is (no BOS added)
  SamplingParams sampling;
  // sampling.max_tokens is a default (the server's default_max_tokens: the client gave none), not
  // the client's own value: lowered to what the model context leaves after the prompt, as
  // vLLM's default is, where an explicit max_tokens that does not fit is refused.
  bool max_tokens_is_default = false;
  std::string sla_class;  // empty: the default class
  // Orders requests within classes of equal priority; [-kMaxRequestPriority, kMaxRequestPriority].
  int32_t priority = 0;
  uint32_t top_logprobs = 0;  // 0..20 alternatives per generated token
  // Prompt log-probabilities (vLLM's prompt_logprobs): -1 off; k in [0, 20]: the log-probability
  // of every prompt token after the first given the ones before it, with its k most likely
  // alternatives, in the first event of completion 0 (TokenEvent::prompt_logprobs). The prompt is
  // then computed whole (a request asking for them takes no cached prompt pages).
  int32_t prompt_logprobs = -1;
  // Prefix cache scope (EngineConfig::prefix_cache): cached prompt pages are shared only between
  // requests of the same tenant and the same cache_salt. At most 256 bytes.
  std::string cache_salt;
  // Parallel sampling (vLLM's and OpenAI's `n`): n completions of the prompt, each its own
  // sequence with its own sampler (seeded sampling.seed + i when a seed is given, so completion i
  // is what the same request with n = 1 and seed + i generates), all on one stream, their events
  // told apart by TokenEvent::index. With EngineConfig::prefix_cache, completions 1..n-1 wait in
  // the queue until completion 0's prompt is computed, then take its cached pages: the prompt is
  // computed once (each completion computes only the page of its last prompt token). Admission
  // is all or nothing (every completion needs its queue slot and its KV fit); cancel() ends them
  // all. [1, kMaxCompletions].
  int32_t n = 1;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  // Effective KV (docs/kvm.md): the integral over the request's lifetime of the bytes its KV
  // pages held at their precision (evicted pages: 0), and of its resident tokens.
  double effective_kv_byte_seconds = 0;
  double kv_token_seconds = 0;
};

// Where a request's time went (milliseconds, monotonic clock).
struct Timings {
  double queue_ms = 0;
  double ttft_ms = 0;  // submit -> first token
  double mean_itl_ms = 0;
  double max_itl_ms = 0;
  double e2e_ms = 0;
  double prefill_ms = 0;
  double handoff_ms = 0;  // disaggregated: the offer posted -> its pages copied in (room waited)
  double decode_ms = 0;
  double preempted_ms = 0;
  int32_t preemptions = 0;
};

struct TokenEvent {
  std::string request_id;
  int32_t index = 0;                   // the completion (Request::n) this event belongs to
  std::vector<int32_t> token_ids;      // new tokens in this event
  std::string text;                    // new text in this event
  std::vector<TokenLogprob> logprobs;  // one per token when top_logprobs was asked (or always 1)
  // Request::prompt_logprobs >= 0, the first event of completion 0 only: entry i is prompt token
  // i + 1 (the first has no context), `top` its Request::prompt_logprobs alternatives.
  std::vector<TokenLogprob> prompt_logprobs;
  std::chrono::steady_clock::time_point time;
  // The last event of completion `index`; `last`: the last event of the stream (the final event
  // of the completion that ended last; with n = 1 every final event is the last one).
  bool final = false;
  bool last = false;
  // Final event only (of its completion):
  FinishReason finish_reason = FinishReason::kNone;
  Status status;  // non-OK when the request failed (kError / deadline)
  Usage usage;
  Timings timings;
};

class RequestStream;  // engine-internal queue of events of one request

// The consumer's end of one request. Copyable (shared).
class RequestHandle {
 public:
  RequestHandle() = default;
  explicit RequestHandle(std::shared_ptr<RequestStream> stream) : stream_(std::move(stream)) {}

  const std::string& request_id() const;
  // Blocks up to `timeout` for the next event; false on timeout.
  bool next(TokenEvent* event, std::chrono::milliseconds timeout);
  // Non-blocking; false when no event is queued.
  bool try_next(TokenEvent* event);
  // Called (from an engine thread, must not block) whenever an event is queued. Events queued
  // before registration trigger one call at registration.
  void set_notifier(std::function<void()> notifier);

 private:
  friend class EngineImpl;  // Engine::cancel(tenant, handle) compares streams
  std::shared_ptr<RequestStream> stream_;
};

struct PoolStats {
  std::string name;  // "prefill-0", "decode-1", "colocated-0"
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;
  int32_t running = 0;
  int32_t waiting = 0;
  // KV pages by rung (EngineConfig::kv_policy) as of the pool's last step: full-precision pages
  // in use (kv_blocks_total - kv_blocks_free, pages pinned for a handoff included), pages in the
  // int8 / int4 arenas, and pages of the pool's sequences with nothing resident (evicted to a
  // summary, or dropped by kStreaming / kH2O).
  int32_t kv_pages_full = 0;
  int32_t kv_pages_int8 = 0;
  int32_t kv_pages_int4 = 0;
  int32_t kv_pages_evicted = 0;
  // Pages of the pool's sequences, running or waiting, whose page entries the KV cut keeps (from
  // a sequence's first scored step; past any sliding window) at any rung, evicted included: the
  // KV cache manager's pages_evicted_fraction is kv_pages_evicted over this (idle prefix-cache
  // pages are no sequence's). Counted only under a KV policy that evicts (0 under kFull).
  int32_t kv_sequence_pages = 0;
  // Page transitions applied on this pool since start (monotonic counters).
  int64_t kv_demotions = 0;  // pages moved down the ladder (to int8 or int4)
  int64_t kv_evictions = 0;  // resident copies dropped (evicted or dropped)
  // Pages freed because every layer's sliding window had passed them (models whose layers all
  // slide, e.g. Mistral-7B-v0.1; every pool, prefill ones included). Not in kv_evictions.
  int64_t kv_window_dropped_pages = 0;
  // Page restores from the host tier (at full precision, or int8 / int4; a page recalled at int8 /
  // int4 and later brought to full precision counts twice).
  int64_t kv_recalls = 0;
  // Of those, evicted pages recalled at int8 / int4 (SemanticCutConfig::recall_precision), and of
  // these the ones evicted again before their relevance took them to full: the bound's cold calls.
  int64_t kv_recalls_quantized = 0;
  int64_t kv_recalls_cold = 0;
  int64_t kv_refused_transitions = 0;  // planned but refused (a tier or the pool full; no
                                       // original to restore from); nothing changed
  double kv_recall_ms_mean = 0;        // mean wall time of one recall, copies included (0: none)
  // Recalls whose asynchronous copy had not landed within SemanticCutConfig::recall_wait_ms of
  // the step that asked for the page: that step ran with the page as it was.
  int64_t kv_recalls_late = 0;
  int64_t kv_host_bytes_used = 0;   // host tier: bytes of full-precision originals held
  int64_t kv_host_bytes_total = 0;  // host tier size (0 without kSemantic)
  // The temporal cut (EngineConfig::temporal): pages of paused sequences swapped out to the host
  // tier as of the last step, and counters since start. A preemption under memory pressure picks
  // swap or recompute (choices counted); a swap that cannot happen (host tier full, a copy
  // error) falls back to recompute and counts as a fallback.
  int32_t kv_pages_host = 0;
  int64_t kv_swaps_out = 0;          // sequences swapped out
  int64_t kv_swaps_in = 0;           // sequences swapped back in (resumed without recompute)
  int64_t kv_swap_bytes = 0;         // bytes copied out and in
  int64_t kv_swap_choices = 0;       // preemptions the cost model (or swap: always) sent to swap
  int64_t kv_recompute_choices = 0;  // preemptions sent to recompute (swap: never, or cheaper)
  int64_t kv_swap_fallbacks = 0;     // swaps that fell back to recompute
  int64_t kv_swaps_to_disk = 0;      // swap-outs that went to the disk tier (host tier full)
  // Decode rows skipped because the sequence's consumer had not read max_unread_events events
  // (back-pressure from a slow reader; EngineConfig::max_unread_events).
  int64_t decode_rows_stalled = 0;
  // Speculative decoding (EngineConfig::speculative): decode rows that carried draft tokens, the
  // draft tokens they fed, and those accepted (each an extra token out of one forward pass).
  int64_t spec_rows = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  // Disaggregated mode, prefill pools: KV handoffs whose decode worker had not taken the offer
  // within handoff_timeout_ms, or was marked down before (handoff_stall_ms, another offer's
  // deadline), offered again to another decode worker (one that had not had it).
  int64_t handoffs_rerouted = 0;
  // Disaggregated mode, decode pools: pages of the KV handoffs received, copied from the prefill
  // worker, and taken from this pool's prefix cache instead, on the device (prefix_cache: a
  // prompt's pages another sequence left here are shared, not copied again; docs/serving.md).
  int64_t handoff_pages_copied = 0;
  int64_t handoff_pages_cached = 0;
  // Disaggregated mode, prefill pools: KV handoffs routed to a decode worker this pool had sent
  // pages of the same prompt before (prefix_cache: cache-aware routing, docs/serving.md).
  int64_t handoffs_to_cached = 0;
  // Disaggregated mode, decode pools: KV handoffs this worker had received and passed on, while
  // they waited for room here, to another decode worker with room for them then (docs/serving.md).
  int64_t handoffs_forwarded = 0;
  // Disaggregated mode, decode pools: a KV handoff sent here was not taken within
  // handoff_timeout_ms, or within the stall bound (handoff_stall_ms), and the worker has not
  // drained its inbox since (hung, or a step far longer than its recent ones): new handoffs go to
  // other decode workers while any is not marked down.
  bool marked_down = false;
  int64_t kv_disk_faults = 0;         // disk tier writes / reads that failed (then recomputed)
  int64_t kv_disk_bytes_used = 0;     // disk tier: bytes of records held, and its capacity
  int64_t kv_disk_bytes_total = 0;    // (0 without a disk tier)
  double kv_disk_latency_ms = 0;      // EWMA of the disk tier's record writes and reads (0: none)
  double kv_disk_latency_age_ms = 0;  // how long ago the last of those finished (0: none yet)
  // Prefetch (docs/kv-tiers.md): swap-ins from the disk tier whose read, started a step ahead,
  // had completed when they ran (hits), and those that read or waited then (misses).
  int64_t kv_prefetch_hits = 0;
  int64_t kv_prefetch_misses = 0;
  // Host-tier prefetch (docs/kv-cuts.md, "Swap predictor and prefetch"): device blocks reserved
  // and the host -> device copy started a step before the swap-in (started); of the swap-ins from
  // the host tier, those whose copy had landed when they ran (hits) and those that waited for it,
  // had none or redid a failed one (misses: hits + misses = host-tier swap-ins); prefetches given
  // up unused (the sequence ended or was not resumed, or other work needed the blocks); swap-ins
  // put off a step because their copy was still in flight while the step had other rows (deferred:
  // the step does not wait for the copy).
  int64_t kv_host_prefetches = 0;
  int64_t kv_host_prefetch_hits = 0;
  int64_t kv_host_prefetch_misses = 0;
  int64_t kv_host_prefetch_dropped = 0;
  int64_t kv_host_prefetch_deferred = 0;
  // Disk swap write-behind (kv.disk.write_behind, docs/kv-tiers.md): disk swap-outs that returned
  // before their record was written (started); swap-ins and read-aheads that had to wait for such
  // a write (waited); swap-ins served from the staging of a write that failed, so the sequence
  // resumed without recompute (rescued; the fault is also in kv_disk_faults).
  int64_t kv_disk_write_behind = 0;
  int64_t kv_disk_write_behind_waits = 0;
  int64_t kv_disk_write_behind_rescues = 0;
  // Prefix cache (EngineConfig::prefix_cache): pages it holds now, and since start the prompt
  // tokens looked up (whole pages) and the tokens served from it (hit rate = hits / queries).
  int32_t kv_prefix_cache_pages = 0;
  int64_t kv_prefix_queries = 0;
  int64_t kv_prefix_hits = 0;
  // Its tiers: of the hits, tokens swapped back in from the host tier and read back from the
  // disk tier; pages spilled to each (instead of being dropped) since start; stores and restores
  // that failed (the page was dropped, the prompt recomputed); pages held on each lower tier now.
  int64_t kv_prefix_hits_host = 0;
  int64_t kv_prefix_hits_disk = 0;
  int64_t kv_prefix_spills_host = 0;
  int64_t kv_prefix_spills_disk = 0;
  int64_t kv_prefix_spill_faults = 0;
  int32_t kv_prefix_pages_host = 0;
  int32_t kv_prefix_pages_disk = 0;
  // The spatial cut (EngineConfig::spatial): shards of the worker's shard group, device pages on
  // shards other than the home one as of the last step, and since start the bytes the shards
  // exchanged (queries, new K/V rows, partials) and pages moved by migrations (MigrateKv).
  int32_t kv_shards = 1;
  int32_t kv_pages_remote = 0;
  int64_t kv_shard_exchange_bytes = 0;
  // Of kv_shard_exchange_bytes, those staged through host memory (backend::ExchangeLink::kHost:
  // shards on GPUs without peer access): they crossed the host link and count in the KVM's
  // link_use. The rest (CPU shards, virtual shards on one GPU, GPU peers, NCCL between peers)
  // never touch it (docs/kvm.md, peer_exchange_mb_s).
  int64_t kv_shard_exchange_host_bytes = 0;
  int64_t kv_migrated_pages = 0;
  // The group's communicator (kv.cuts.spatial.communicator): "in-process" or "nccl"; empty
  // without a shard group. And the wall time spent in its exchanges since start (seconds).
  std::string kv_shard_communicator;
  double kv_shard_exchange_seconds = 0;
  // Per shard of the group (size kv_shards): full-pool blocks in use / total, as of the last step.
  std::vector<double> kv_shard_use;
  // Host-tier copy bandwidth into the device (bytes/s) the worker measured at start-up for the
  // swap cost model: its host link; 0 when it has no host tier to swap to.
  double kv_link_bytes_per_s = 0;
};

struct SlaClassStats {
  std::string name;
  int64_t finished = 0;
  int64_t met_ttft = 0;
  int64_t met_itl = 0;
  int64_t met_both = 0;
  // Ended in an error the engine gave it (timed out in the queue, a failed handoff, KV it could
  // never hold): an SLO miss. Cancelled requests count in neither.
  int64_t failed = 0;
  int32_t queued = 0;
  double oldest_queued_ms = 0;  // how long its oldest queued request has waited (0: none queued)
};

// Effective KV (Usage::effective_kv_byte_seconds, kv_token_seconds) of the finished requests of one
// SLA class and tenant, summed over their final events (docs/kvm.md "Effective-KV accounting").
struct KvAccounting {
  std::string sla_class;
  std::string tenant;
  int64_t requests = 0;  // final events summed (finished, cancelled or failed)
  double effective_kv_byte_seconds = 0;
  double kv_token_seconds = 0;
};

struct EngineStats {
  std::vector<PoolStats> pools;
  std::vector<SlaClassStats> classes;
  // One entry per (SLA class, tenant) that finished a request, ordered by class then tenant.
  std::vector<KvAccounting> kv_accounting;
  // The request counters (and the class counters, prompt_tokens) count completions: a request of
  // n completions (Request::n) counts n, so submitted - finished - cancelled - failed is what is
  // in flight.
  int64_t requests_submitted = 0;
  int64_t requests_finished = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_failed = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  // The KV cache manager (EngineConfig::kvm): its latest monitor sample and decisions (newest
  // last, at most 64); empty when it is off.
  bool kvm_enabled = false;
  KvmSnapshot kvm;
  std::vector<KvmDecision> kvm_decisions;
  int64_t kvm_decisions_total = 0;
  struct KvmDecisionCount {
    std::string rule, action;
    int64_t count = 0;
  };
  std::vector<KvmDecisionCount> kvm_decision_counts;  // per (rule, action) since start
  struct KvmParam {
    std::string param, sla_class;  // class "": the engine-wide value
    double value = 0;
  };
  std::vector<KvmParam> kvm_params;  // the current value of every parameter the rules move
  // Mean per KVM sample: computing (monitors, rules, decision log) and waiting for the workers
  // to apply a decision's commands (the KVM thread sleeps meanwhile).
  double kvm_tick_ms_mean = 0;
  double kvm_actuate_ms_mean = 0;
};

struct ModelInfo {
  std::string source;
  std::string architecture;
  int32_t vocab_size = 0;
  int32_t max_context = 0;
  int32_t num_layers = 0;
  int32_t dim = 0;
};

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> create(const EngineConfig& config);
  virtual ~Engine() = default;

  // Admission: kInvalidArgument (bad fields, unknown class, prompt + max_tokens beyond the
  // context or the KV pool, with the numbers), kResourceExhausted (class queue full),
  // kUnavailable (shutting down). Accepted requests end with exactly one final event per
  // completion (Request::n), the last of them marked `last`.
  virtual StatusOr<RequestHandle> submit(Request request) = 0;
  // Aborts the request `request_id` of `tenant` at any stage; its KV blocks are freed. False when
  // the tenant has no such request in flight (unknown, finished, or another tenant's).
  virtual bool cancel(const std::string& tenant, const std::string& request_id) = 0;
  // Aborts the request `handle` was returned for, as above, and never another: once it has
  // ended, a later request of the tenant may reuse its id, and a cancel from the first one's
  // consumer (a stream cancelled after its final event was queued) must not reach it. False
  // when that request is no longer in flight.
  virtual bool cancel(const std::string& tenant, const RequestHandle& handle) = 0;
  virtual EngineStats stats() const = 0;
  virtual ModelInfo model_info() const = 0;
  // Replaces the SLA classes (names may change; queued requests keep their class settings).
  virtual Status update_sla_classes(std::vector<SlaClass> classes) = 0;
  // Replaces the KV cache manager's policy (rules, mode, interval); a bad policy is
  // kInvalidArgument naming the rule and field, and the old one stays. Enabling a manager that
  // was off starts it; rules unchanged by name keep their state.
  virtual Status update_kvm_policy(KvmConfig policy) = 0;
  // What update_kvm_policy would say of `policy` once `classes` are the SLA classes, without
  // applying anything: a reload checks both before it swaps either.
  virtual Status check_kvm_policy(const KvmConfig& policy,
                                  const std::vector<SlaClass>& classes) const = 0;
  // Stops admitting; waits up to `drain` for running requests, then cancels the rest (their final
  // event: kCancelled with a kUnavailable status).
  virtual void shutdown(std::chrono::milliseconds drain) = 0;
  // Cuts the drain wait of shutdown() short, now or when shutdown() starts: the requests still in
  // flight are cancelled at once as when `drain` runs out (operator's second SIGTERM). Any thread.
  virtual void end_drain() = 0;
};

}  // namespace kvsplit
