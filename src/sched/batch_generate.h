// Offline batched generation over one LlamaModel and one KvPool, in the calling thread: the CLI
// (`kvsplit generate`) and the golden / batch-invariance tests. Each step is planned by the same
// Scheduler the serving workers run (src/sched/scheduler.h): the decode tokens of running
// sequences, then prefill chunks of waiting prompts under the token budget; when the pool
// cannot grow a running sequence, the one served last is preempted: swapped out to the host tier
// (BatchOptions::swap) or recomputed later.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cuts/semantic/semantic.h"
#include "kv/kv_pool.h"
#include "kv/swap.h"
#include "kvsplit/engine.h"
#include "kvsplit/sampling_params.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "sched/sequence_cut.h"

namespace kvsplit::sched {

struct GenerationInput {
  std::vector<int32_t> prompt_ids;  // non-empty
  SamplingParams params;            // validated by generate_batch
  uint64_t seed = 0;                // used when params.seed is unset
};

struct GenerationOutput {
  std::vector<int32_t> output_ids;  // ends with the stop token when the model produced one
  std::string text;                 // generated text (stop strings cut)
  // kStop or kLength; kCancelled when BatchOptions::cancel ended it first.
  FinishReason finish_reason = FinishReason::kNone;
  int preemptions = 0;        // times it was preempted (swapped out or recomputed)
  int swapped_out_pages = 0;  // pages swapped out to the host tier (temporal cut), all swaps
  int recomputed_tokens = 0;  // KV positions dropped by preemptions and computed again
  int cached_tokens = 0;      // prompt tokens served from the pool's prefix cache
  // Effective-KV accounting (docs/kvm.md): device bytes of its KV pages at their precision, and
  // its resident tokens, integrated over its time in the batch (Usage's fields of the same names).
  double effective_kv_byte_seconds = 0;
  double kv_token_seconds = 0;
  int shards = 0;  // shards of the pool's shard group its KV used (spatial cut)
  // Pages freed as every layer's sliding window passed them (kv::drop_behind_window).
  int window_dropped_pages = 0;
  // Speculative decoding (BatchOptions::speculative): draft tokens fed and accepted.
  int spec_draft_tokens = 0;
  int spec_accepted_tokens = 0;
};

struct BatchOptions {
  int max_batch_tokens = 512;              // token budget per step (decode tokens + chunks)
  int min_chunk_tokens = 16;               // smallest prefill chunk a prompt gets in a step
  int max_new_prompts_per_step = 1 << 30;  // admit at most this many new prompts per step
  model::ForwardOptions forward;
  // Called with (input index, new text) as text becomes final; may be empty.
  std::function<void(int, std::string_view)> on_text;
  // Called once for each input that finishes (kStop or kLength), in the order they finish, with
  // its whole output (what generate_batch returns for it); may be empty. Not called for inputs
  // the cancel ends.
  std::function<void(int, const GenerationOutput&)> on_finish;
  // The batch's cancel flag (a RequestControl::cancel_requested for every input at once), read at
  // the start of every step; may be null. Once it is true, every input not finished ends with
  // FinishReason::kCancelled, its blocks (device, host tier, disk) go back to the pool, and
  // generate_batch returns what was generated so far with no further forward pass. The callbacks
  // above may set it (they run in the calling thread), as may another thread.
  const std::atomic<bool>* cancel = nullptr;
  // The KV cut acting on each sequence between its decode steps (sched::SequenceCut); the pool
  // needs the tiers of SequenceCut::size_tiers. kFull: none.
  cuts::semantic::KvPolicy kv_policy = cuts::semantic::KvPolicy::kFull;
  cuts::semantic::SemanticConfig semantic;
  // > 0: only a prompt's first prefill_tokens tokens are prefilled; the rest is fed one token per
  // decode step, so a cut acts on a long prompt as it does on generated text.
  int prefill_tokens = 0;
  // When set, receives the cuts' counters summed over the sequences.
  SequenceCutStats* cut_stats = nullptr;
  // The temporal cut: a preempted sequence is swapped out to the pool's host tier (when it has
  // one) instead of recomputed, per `swap` (kAuto: the cost model of sched/swap_cost.h, with copy
  // bandwidths measured at the start and prefill speed measured on the way), and considered
  // again every temporal_step_size steps.
  SwapMode swap = SwapMode::kNever;
  int temporal_step_size = 1;
  // When set, receives the swap counters.
  kv::SwapStats* swap_stats = nullptr;
  // With the pool's prefix cache enabled (KvPool::enable_prefix_cache): the scope of the pages
  // this batch shares (kv::PrefixCache::salt_of of a tenant). Prompts are then admitted one per
  // step, so a prompt can hit the pages an earlier one just computed.
  uint64_t prefix_salt = 0;
  // The spatial cut, when the pool has a shard group (KvPool::add_shards): a sequence whose
  // prompt + max_tokens exceeds spatial_min_context (every sequence at 0) is spread over the
  // shards in chunks; others stay on the home shard while it has room.
  int spatial_min_context = 0;
  // Speculative decoding (docs/serving.md "Speculative decoding"): decode rows feed n-gram draft
  // tokens within the step's token budget left, verified by the same forward pass; the outputs
  // are those without it. Only with kv_policy kFull and no sliding window (else ignored).
  SpeculativeConfig speculative;
};

// Runs every input to completion (or until options.cancel). Errors: kInvalidArgument for bad
// params, empty prompts or prompts longer than the context; kResourceExhausted when one sequence
// needs more KV than the whole pool holds (smaller pools only cost preemptions). Every block taken
// from `pool` is returned before this returns, on success or error.
StatusOr<std::vector<GenerationOutput>> generate_batch(model::LlamaModel& model, kv::KvPool& pool,
                                                       const model::Tokenizer* tokenizer,
                                                       const std::vector<GenerationInput>& inputs,
                                                       const BatchOptions& options = {});

// KV blocks a batch needs to run without preemption (prompt + max_tokens - 1 positions each),
// saturated at INT32_MAX.
int blocks_needed(const std::vector<GenerationInput>& inputs, int block_size, int max_seq_len);

}  // namespace kvsplit::sched
