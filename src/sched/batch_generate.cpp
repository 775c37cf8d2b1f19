#include "sched/batch_generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <span>

#include "common/check.h"
#include "common/config_rules.h"
#include "common/log.h"
#include "model/guide_vocabulary.h"
#include "sampling/ngram_draft.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"
#include "sched/prefix_share.h"
#include "sched/scheduler.h"
#include "sched/swap_cost.h"
#include "sched/swap_predictor.h"

namespace kvsplit::sched {

namespace {

using model::SeqStep;

struct SeqState {
  const GenerationInput* in = nullptr;
  std::vector<int32_t> tokens;  // prompt followed by the output; KV holds tokens[0, computed)
  int num_prompt = 0;
  int prompt_target = 0;  // prompt positions prefilled; the rest is fed by decode steps
  int fed = 0;            // most positions ever computed (a recompute goes back that far)
  int computed = 0;
  kv::BlockTable table;
  std::unique_ptr<sampling::Sampler> sampler;
  std::unique_ptr<sampling::StopChecker> stop;
  std::unique_ptr<model::StreamDecoder> decoder;
  std::unique_ptr<SequenceCut> cut;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  bool admitted = false;
  bool running = false;  // decoding (else waiting for its prompt or a recompute)
  bool greedy = false;   // plain greedy: the model returns the argmax (SeqStep::Logits::kArgmax)
  int64_t last_prefill_step = -1;
  int64_t waiting_since = -1;  // the step it was admitted (SchedSeq::waiting_since)
  int preemptions = 0;
  int swapped_out_pages = 0;
  int recomputed_tokens = 0;
  int cached_tokens = 0;
  bool dropped = false;  // its KV was dropped for a recompute: the next chunk looks the cache up
  // Where its prefill's chunks have walked its prompt's chain in the prefix cache (Sequence's).
  kv::PrefixCache::Cursor prefix_cursor;
  KvAccount kv;             // effective-KV accounting (docs/kvm.md)
  int64_t resume_step = 0;  // swapped out: not resumed before this step while others run
  int shards = 0;           // most shards of the pool's shard group its KV used at once
  int window_dropped = 0;   // pages freed behind the sliding window
  // Speculative decoding: this step's fed last token and drafts (empty: a plain row), and the
  // draft tokens fed and accepted so far.
  std::vector<int32_t> spec_row;
  int spec_drafts = 0, spec_accepted = 0;
  sampling::DraftAcceptance spec_acceptance;  // its drafts' acceptance: their length
  // The disk read of its swapped-out pages started a step ahead (kv::SwapPrefetch); dropped
  // before the table is released (a record being read cannot be freed).
  std::unique_ptr<kv::SwapPrefetch> prefetch;

  int num_output() const { return static_cast<int>(tokens.size()) - num_prompt; }
  // Positions whose KV must exist before the next decode step: prompt + output[:-1] (of the
  // prompt, the prefilled part or as far as decode steps had fed it).
  int target() const {
    return num_output() == 0 ? std::max(prompt_target, fed) : static_cast<int>(tokens.size()) - 1;
  }
  bool done() const { return reason != FinishReason::kNone; }
  std::span<const int32_t> prompt() const {
    return {tokens.data(), static_cast<size_t>(num_prompt)};
  }
  std::span<const int32_t> output() const {
    return {tokens.data() + num_prompt, static_cast<size_t>(num_output())};
  }
};

// Releases every sequence's blocks when the batch ends, whatever the outcome.
struct PoolGuard {
  kv::KvPool& pool;
  std::vector<SeqState>& seqs;
  ~PoolGuard() {
    for (SeqState& s : seqs) {
      s.prefetch.reset();
      pool.settle_prefix(s.prefix_cursor);
      pool.release(s.table);
    }
  }
};

Status validate_inputs(const std::vector<GenerationInput>& inputs, const model::ModelConfig& cfg) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const GenerationInput& in = inputs[i];
    const std::string where = "prompt " + std::to_string(i) + ": ";
    // Against the vocabulary too (top_k, stop_token_ids), as the engine and the server check.
    KVSPLIT_RETURN_IF_ERROR(
        in.params.validate(cfg.vocab_size).with_prefix("prompt " + std::to_string(i)));
    const int n = static_cast<int>(in.prompt_ids.size());
    if (n == 0) return invalid_argument(where + "empty prompt (no tokens)");
    if (n > cfg.max_seq_len) {
      return invalid_argument(where + "prompt of " + std::to_string(n) +
                              " tokens is longer than the context length " +
                              std::to_string(cfg.max_seq_len));
    }
    for (int32_t t : in.prompt_ids) {
      if (t < 0 || t >= cfg.vocab_size) {
        return invalid_argument(where + "token id " + std::to_string(t) + " outside [0, " +
                                std::to_string(cfg.vocab_size) + ")");
      }
    }
  }
  return ok_status();
}

// The last of `waiting` (service order: the batch's order) that holds blocks, after the first
// waiting sequence: its full pages are cached (as a preemption's are) and its blocks released;
// it starts again from what the cache still holds. False when there is none.
bool release_youngest_waiting(const std::vector<SchedSeq>& waiting, std::vector<SeqState>& seqs,
                              kv::KvPool& pool, const BatchOptions& options) {
  for (size_t k = waiting.size(); k-- > 1;) {
    SeqState& s = seqs[static_cast<size_t>(waiting[k].id)];
    if (s.table.blocks.empty() || kv::swapped_pages(s.table) > 0) continue;
    s.recomputed_tokens += s.computed;
    pool.settle_prefix(s.prefix_cursor);
    pool.cache_prefix(
        s.table, options.prefix_salt, s.tokens,
        cacheable_tokens(options.kv_policy, s.computed, s.prompt_target) / pool.block_size());
    pool.release(s.table);
    s.computed = 0;
    s.dropped = true;
    s.kv.close(std::chrono::steady_clock::now());
    return true;
  }
  return false;
}

// What generate_batch returns for `s` (once it is done, or when the batch ends).
GenerationOutput output_of(const SeqState& s) {
  GenerationOutput o;
  o.output_ids.assign(s.output().begin(), s.output().end());
  o.text = s.text;
  o.finish_reason = s.reason;
  o.preemptions = s.preemptions;
  o.swapped_out_pages = s.swapped_out_pages;
  o.recomputed_tokens = s.recomputed_tokens;
  o.cached_tokens = s.cached_tokens;
  o.effective_kv_byte_seconds = s.kv.byte_seconds();
  o.kv_token_seconds = s.kv.token_seconds();
  o.shards = s.shards;
  o.window_dropped_pages = s.window_dropped;
  o.spec_draft_tokens = s.spec_drafts;
  o.spec_accepted_tokens = s.spec_accepted;
  return o;
}

// BatchOptions::cancel: every sequence not finished ends kCancelled and gives its blocks back
// (its disk read ahead first, as PoolGuard does), as a sequence that finishes does.
void cancel_unfinished(std::vector<SeqState>& seqs, kv::KvPool& pool) {
  const auto now = std::chrono::steady_clock::now();
  for (SeqState& s : seqs) {
    if (s.done()) continue;
    s.reason = FinishReason::kCancelled;
    s.prefetch.reset();
    pool.settle_prefix(s.prefix_cursor);
    pool.release(s.table);
    s.kv.close(now);
  }
}

}  // namespace

int blocks_needed(const std::vector<GenerationInput>& inputs, int block_size, int max_seq_len) {
  int64_t total = 0;
  for (const GenerationInput& in : inputs) {
    // The last generated token is never fed: prompt + max_tokens - 1 positions at most.
    const int positions =
        static_cast<int>(std::min<int64_t>(max_seq_len, static_cast<int64_t>(in.prompt_ids.size()) +
                                                            std::max(0, in.params.max_tokens - 1)));
    total += kv::BlockTable::blocks_for(std::max(positions, 1), block_size);
  }
  // Saturated, never wrapped: more than a pool may have is refused by KvPool::create.
  return static_cast<int>(std::min<int64_t>(total, std::numeric_limits<int32_t>::max()));
}

StatusOr<std::vector<GenerationOutput>> generate_batch(model::LlamaModel& model, kv::KvPool& pool,
                                                       const model::Tokenizer* tokenizer,
                                                       const std::vector<GenerationInput>& inputs,
                                                       const BatchOptions& options) {
  const model::ModelConfig& cfg = model.config();
  const int ctx = cfg.max_seq_len;
  if (options.max_batch_tokens < 1) return invalid_argument("max_batch_tokens must be >= 1");
  if (options.prefill_tokens < 0) return invalid_argument("prefill_tokens must be >= 0");
  KVSPLIT_RETURN_IF_ERROR(cuts::semantic::validate(options.semantic));
  KVSPLIT_RETURN_IF_ERROR(validate_inputs(inputs, cfg));
  if (options.spatial_min_context < 0) return invalid_argument("spatial_min_context must be >= 0");
  KVSPLIT_RETURN_IF_ERROR(validate_speculative(options.speculative, "speculative."));
  // Guided decoding: constraints compiled once per distinct constraint, over the token bytes.
  std::unique_ptr<sampling::GuideCache> guides;
  for (const GenerationInput& in : inputs) {
    if (!in.params.guided.on() || guides) continue;
    if (tokenizer == nullptr) return invalid_argument("guided decoding needs a tokenizer");
    guides =
        std::make_unique<sampling::GuideCache>(model::guide_vocabulary(*tokenizer, cfg.vocab_size));
  }
  std::vector<SeqState> seqs(inputs.size());
  PoolGuard guard{pool, seqs};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const GenerationInput& in = inputs[i];
    SeqState& s = seqs[i];
    s.in = &in;
    s.tokens = in.prompt_ids;
    s.num_prompt = static_cast<int>(in.prompt_ids.size());
    s.prompt_target =
        options.prefill_tokens > 0 ? std::min(s.num_prompt, options.prefill_tokens) : s.num_prompt;
    if (options.kv_policy != cuts::semantic::KvPolicy::kFull)
      s.cut = std::make_unique<SequenceCut>(options.kv_policy, options.semantic);
    s.sampler = std::make_unique<sampling::Sampler>(in.params, in.params.seed.value_or(in.seed),
                                                    cfg.eos_token_ids);
    if (in.params.guided.on()) {
      StatusOr<std::shared_ptr<sampling::GuideGrammar>> g = guides->get(in.params.guided);
      if (!g.ok()) return g.status().with_prefix(fmt::format("prompt {}", i));
      s.sampler->set_guide(std::make_unique<sampling::GuideState>(
          std::move(*g), in.prompt_ids.back() == tokenizer->bos_id()));
    }
    s.greedy = sampling::is_plain_greedy(in.params);
    // Positions past the prompt are bounded by the context: the last sampled token is never fed.
    const int max_new = std::min(max_generated_tokens(in.params), ctx - s.num_prompt + 1);
    s.stop = std::make_unique<sampling::StopChecker>(in.params, cfg.eos_token_ids, max_new);
    // The spatial cut: a sequence that may grow past spatial_min_context is spread over the
    // pool's shards (KvPool::reserve's placement).
    s.table.spread =
        pool.num_shards() > 1 &&
        (options.spatial_min_context == 0 || s.num_prompt + max_new > options.spatial_min_context);
    if (tokenizer)
      s.decoder = std::make_unique<model::StreamDecoder>(*tokenizer, in.prompt_ids.back());
  }

  // A sequence ends: held-back text (a possible stop-string prefix, an incomplete UTF-8
  // character) is released unless a stop string cut it (as the server does: finish_sequence).
  auto end = [&](SeqState& s, int index, FinishReason reason, bool stop_string) {
    s.reason = reason;
    std::string rest = s.stop->flush();
    if (s.decoder && !stop_string) rest += s.decoder->flush();
    if (!rest.empty()) {
      s.text += rest;
      if (options.on_text) options.on_text(index, rest);
    }
    pool.release(s.table);
  };

  // The token sampled from logits row `lg`: kUnusable when the row is unusable (NaN or
  // infinite), or Sampler::kNoAllowedToken (-1) when a guide allows nothing.
  constexpr int32_t kUnusable = std::numeric_limits<int32_t>::min();
  auto draw = [&](SeqState& s, float* lg) -> int32_t {
    if (!sampling::logits_usable(lg, cfg.vocab_size)) return kUnusable;
    return s.sampler->sample(lg, cfg.vocab_size, s.prompt(), s.output());
  };
  // A token that could not be drawn (kUnusable, also a model's argmax of -1, or kNoAllowedToken):
  // a guided text complete with no end id to sample ends (kStop); a guide's error or unusable
  // logits fail the batch.
  auto undrawn = [&](SeqState& s, int index, int32_t tok) -> Status {
    if (tok == sampling::Sampler::kNoAllowedToken) {  // guided: nothing may follow
      if (!s.sampler->guide_status().ok())
        return s.sampler->guide_status().with_prefix(fmt::format("prompt {}", index));
      end(s, index, FinishReason::kStop, false);  // complete, no end id to sample
      return ok_status();
    }
    return internal_error("prompt " + std::to_string(index) +
                          ": the model produced no usable logits (NaN or infinite) at position " +
                          std::to_string(s.computed - 1) +
                          ": its activations overflow float32 (check the model's weights)");
  };
  // Appends `tok` to s: its text through the detokenizer and the stop checker; ends s on a stop.
  auto take = [&](SeqState& s, int index, int32_t tok) {
    s.tokens.push_back(tok);
    const std::string delta =
        s.decoder && !s.stop->is_stop_token(tok) ? s.decoder->push(tok) : std::string();
    sampling::StopChecker::Step r = s.stop->on_token(tok, delta);
    if (!r.text.empty()) {
      s.text += r.text;
      if (options.on_text) options.on_text(index, r.text);
    }
    if (r.reason != FinishReason::kNone) end(s, index, r.reason, r.stop_string);
  };

  const int bs = pool.block_size();
  SchedulerConfig sc;
  sc.block_size = pool.block_size();
  sc.max_batch_tokens = options.max_batch_tokens;
  sc.min_chunk_tokens = std::max(1, options.min_chunk_tokens);
  sc.max_num_seqs = std::max<int>(1, static_cast<int>(inputs.size()));
  sc.decode_in_budget = true;
  sc.kv_window = cfg.kv_window();  // pages behind the window are freed after each step
  const Scheduler scheduler(sc);

  // The temporal cut: swapping needs the pool's host tier.
  const bool swapping = options.swap != SwapMode::kNever &&
                        (pool.host_allocator().num_blocks() > 0 || pool.disk() != nullptr);
  SwapCosts costs;
  kv::SwapStats swap_stats;
  kv::PageOpStats window_ops;  // drop_behind_window's count (each sequence keeps its own)
  if (swapping && options.swap == SwapMode::kAuto) {
    measure_copy_bandwidth(pool, &costs);
    measure_disk_swap_bandwidth(pool, &costs);
  }
  std::vector<SchedSeq> running, waiting;
  std::vector<SeqStep> steps;
  std::vector<int> step_seq;  // seqs index of each step
  std::vector<float> logits;
  std::vector<int32_t> ids;
  // Speculative decoding (BatchOptions::speculative).
  const bool speculating = options.speculative.enabled() &&
                           options.kv_policy == cuts::semantic::KvPolicy::kFull &&
                           sc.kv_window == 0;
  const sampling::NgramDraftConfig draft_config{options.speculative.num_speculative_tokens,
                                                options.speculative.prompt_lookup_min,
                                                options.speculative.prompt_lookup_max};
  std::vector<int32_t> draft;
  for (int64_t step = 0;; ++step) {
    if (pool.disk() != nullptr) kv::poll_swap_writes(pool, &swap_stats);  // write-behind
    if (options.cancel != nullptr && options.cancel->load(std::memory_order_acquire)) {
      cancel_unfinished(seqs, pool);
      break;
    }
    int admitted_now = 0;
    const int max_new = pool.prefix_cache() ? 1 : options.max_new_prompts_per_step;
    for (SeqState& s : seqs) {
      if (s.admitted || admitted_now >= max_new) continue;
      s.admitted = true;
      s.waiting_since = step;
      ++admitted_now;
      const int hits = share_prompt_pages(pool, sc, s.table, options.prefix_salt, s.tokens,
                                          s.target(), s.num_prompt);
      s.computed = s.fed = s.cached_tokens = hits * bs;
      s.kv.update(std::chrono::steady_clock::now(), kv_level(pool, s.table, s.computed));
    }
    running.clear();
    waiting.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqState& s = seqs[i];
      if (!s.admitted || s.done()) continue;
      SchedSeq v;
      v.id = static_cast<int>(i);
      v.arrival = static_cast<int64_t>(i);
      v.num_computed = s.computed;
      v.num_blocks = static_cast<int>(s.table.blocks.size());
      v.held_blocks = pool.releasable_blocks(s.table);
      v.last_prefill_step = s.last_prefill_step;
      v.waiting_since = s.waiting_since;
      v.target = s.running ? 0 : s.target();
      if (s.running) {
        v.final_positions = s.num_prompt + std::max(0, s.in->params.max_tokens - 1);
      } else {
        v.swapped_pages = kv::swapped_pages(s.table);
        v.resume_step = s.resume_step;
        v.restart = s.num_output() > 0 && v.swapped_pages == 0;
      }
      (s.running ? running : waiting).push_back(v);
    }
    if (running.empty() && waiting.empty()) break;
    SchedulerInput sin;
    sin.running = running;
    sin.waiting = waiting;
    sin.free_blocks = pool.available_blocks();
    sin.total_blocks = pool.total_blocks();
    sin.step = step;
    const SchedulerOutput plan = scheduler.schedule(sin);
    if (!plan.never_fit.empty()) {
      const SeqState& s = seqs[plan.never_fit.front()];
      return resource_exhausted(fmt::format(
          "KV pool exhausted: prompt {} needs KV for {} tokens, more than the pool's {} blocks of "
          "{} tokens",
          plan.never_fit.front(), s.running ? s.computed + 1 : s.target(), pool.total_blocks(),
          pool.block_size()));
    }
    for (const Preemption& p : plan.preempted) {
      SeqState& s = seqs[p.id];
      s.running = false;
      ++s.preemptions;
      if (s.cut) KVSPLIT_RETURN_IF_ERROR(s.cut->settle_all(pool, s.table));  // recalls land first
      if (const int pages = swapping ? kv::swappable_pages(s.table) : 0; pages > 0) {
        // What a recompute redoes (as the worker prices it): the positions computed so far.
        const SwapChoice c = choose_swap(options.swap, costs, pages * pool.bytes_per_block(),
                                         std::min(s.target(), s.computed), swap_tier(pool, pages));
        if (c.swap) {
          auto done = kv::swap_out(pool, s.table, &swap_stats);
          // A failed swap-out (a staging allocation, a copy) is recomputed, as the server's
          // worker does (Worker::try_swap_out): slower, never the whole batch lost.
          if (!done.ok()) {
            KVSPLIT_LOG_WARN("swap out of prompt {} failed, recomputing instead: {}", p.id,
                             done.status().to_string());
          } else if (*done) {
            s.swapped_out_pages += pages;
            s.resume_step = step + std::max(1, options.temporal_step_size);
            s.kv.update(std::chrono::steady_clock::now(), kv_level(pool, s.table, s.computed));
            continue;
          }
        }
      }
      s.recomputed_tokens += s.computed;
      // Its full pages stay cached for the restart (Worker::preempt).
      // (Under a degrading policy only the prefilled part: prompt tokens fed by decode steps, with
      // --prefill N, were computed attending to degraded KV.)
      pool.cache_prefix(s.table, options.prefix_salt, s.tokens,
                        cacheable_tokens(options.kv_policy, s.computed, s.prompt_target) / bs);
      pool.release(s.table);
      s.computed = 0;
      s.dropped = true;
      s.kv.close(std::chrono::steady_clock::now());
    }
    for (const SwapIn& r : plan.swap_in) {
      SeqState& s = seqs[r.id];
      auto done = kv::swap_in(pool, s.table, &swap_stats, s.prefetch.get());
      if (done.ok()) {
        KVSPLIT_CHECK(*done);  // the scheduler reserved the blocks
        s.running = true;      // decodes from the next step
        s.kv.update(std::chrono::steady_clock::now(), kv_level(pool, s.table, s.computed));
        continue;
      }
      // A disk fault (checksum, I/O) or a copy error: slower, never wrong; recompute it.
      ++swap_stats.fallbacks;
      s.recomputed_tokens += s.computed;
      pool.release(s.table);  // swap_in consumed its prefetch
      s.computed = 0;
      s.dropped = true;
      s.kv.close(std::chrono::steady_clock::now());
    }
    // Read ahead the disk records of the sequences expected to resume next step (the worker's
    // rule: Worker::start_prefetches).
    if (pool.disk() != nullptr) {
      // Those swapped in this step are not waiting any more (their pages are in the free count).
      for (SchedSeq& w : waiting)
        if (seqs[w.id].running) w.swapped_pages = 0;
      for (int k : scheduler.predictor().prefetch(waiting, step + 1, plan.free_blocks_after)) {
        SeqState& s = seqs[waiting[k].id];
        if (s.running || s.table.disk_record == 0 || (s.prefetch && s.prefetch->record != 0))
          continue;
        if (!s.prefetch) s.prefetch = std::make_unique<kv::SwapPrefetch>();
        (void)kv::start_prefetch(pool, s.table, s.prefetch.get(), &swap_stats);  // else: read later
      }
    }

    steps.clear();
    step_seq.clear();
    const auto step_start = std::chrono::steady_clock::now();  // recalls' bounded wait
    for (const DecodeRow& d : plan.decode) {
      SeqState& s = seqs[d.id];
      KVSPLIT_CHECK(pool.reserve(s.table, s.computed + 1));
      s.shards = std::max(s.shards, s.table.shards_used());
      SeqStep st;
      st.tokens = std::span<const int32_t>(s.tokens.data() + s.computed, 1);
      st.start_pos = s.computed;
      st.table = &s.table;
      // Feeding the prompt past its prefilled part samples nothing until its last token.
      const bool sample = s.computed + 1 >= s.num_prompt;
      st.logits = !sample ? SeqStep::Logits::kNone
                          : (s.greedy ? SeqStep::Logits::kArgmax : SeqStep::Logits::kLast);
      if (s.cut) {
        KVSPLIT_RETURN_IF_ERROR(s.cut->settle(pool, s.table, step_start));
        s.cut->prepare(st, pool.block_size());
      }
      steps.push_back(st);
      step_seq.push_back(d.id);
    }
    for (const PrefillChunk& c : plan.prefill) {
      SeqState& s = seqs[c.id];
      if (c.new_blocks > 0) {
        // A recompute starts from an empty table: its prompt pages may still be cached, and the
        // chunk then starts after them (Worker::schedule does the same).
        if (s.dropped) {
          s.dropped = false;
          const int hits = pool.share_prefix(
              s.table, options.prefix_salt, s.tokens,
              sc.shares_prefix(s.target())
                  ? pool.shareable_prefix_pages(
                        s.target(),
                        cacheable_tokens(options.kv_policy, s.target(), s.prompt_target))
                  : 0);
          s.computed = hits * bs;
          s.recomputed_tokens -= s.computed;  // counted when dropped; not computed again
        }
        // The whole target, or with a sliding window as far as this chunk reaches.
        KVSPLIT_CHECK(pool.reserve(s.table, sc.chunk_reach(s.computed, c.tokens, s.target())));
        // Held from here, this step included (as Worker::admit_from_router accounts them).
        s.kv.update(std::chrono::steady_clock::now(), kv_level(pool, s.table, s.computed));
      }
      s.shards = std::max(s.shards, s.table.shards_used());
      s.last_prefill_step = step;
      const int tokens = std::min(c.tokens, s.target() - s.computed);
      SeqStep st;
      st.tokens = std::span<const int32_t>(s.tokens.data() + s.computed, tokens);
      st.start_pos = s.computed;
      st.table = &s.table;
      // The first token is sampled after the prompt's last chunk; a recompute samples nothing.
      const bool sample =
          s.computed + tokens == s.target() && s.num_output() == 0 && s.target() == s.num_prompt;
      st.logits = !sample ? SeqStep::Logits::kNone
                          : (s.greedy ? SeqStep::Logits::kArgmax : SeqStep::Logits::kLast);
      steps.push_back(st);
      step_seq.push_back(c.id);
    }
    if (speculating) {
      // Drafts for the decode rows (the first plan.decode.size() steps) within the budget left,
      // on the room their tables have plus blocks nobody holds (Worker::speculate's rule).
      int budget = options.max_batch_tokens;
      for (const SeqStep& st : steps) budget -= static_cast<int>(st.tokens.size());
      int spare = pool.num_shards() > 1 ? 0 : pool.allocator().num_free();
      for (size_t k = 0; k < plan.decode.size() && budget > 0; ++k) {
        SeqState& s = seqs[step_seq[k]];
        if (s.num_output() == 0 || steps[k].logits == SeqStep::Logits::kNone) continue;
        const int left = s.stop->max_new_tokens() - s.stop->num_generated() - 1;
        const int want = std::min(
            {s.spec_acceptance.length(options.speculative.num_speculative_tokens), budget, left});
        if (want <= 0) continue;
        sampling::propose_ngram_draft(s.tokens, draft_config, &draft);
        int n = std::min(want, static_cast<int>(draft.size()));
        const int room = static_cast<int>(s.table.blocks.size()) * bs - (s.computed + 1);
        if (n > room) {
          const int need = kv::BlockTable::blocks_for(s.computed + 1 + n, bs) -
                           static_cast<int>(s.table.blocks.size());
          if (need <= spare && pool.reserve(s.table, s.computed + 1 + n))
            spare -= need;
          else
            n = room;
        }
        if (n <= 0) continue;
        s.spec_row.assign(1, s.tokens[static_cast<size_t>(s.computed)]);
        s.spec_row.insert(s.spec_row.end(), draft.begin(), draft.begin() + n);
        steps[k].tokens = std::span<const int32_t>(s.spec_row);
        steps[k].logits = SeqStep::Logits::kAll;
        s.spec_drafts += n;
        budget -= n;
      }
    }
    if (steps.empty()) {
      // A step of preemptions or swap-ins only (they wait or decode next step) is progress.
      if (!plan.preempted.empty() || !plan.swap_in.empty()) continue;
      // Waiting sequences do not overtake: a younger one holding pages (its prompt's cached
      // pages, shared when it was admitted) can keep an older one that needs them from ever
      // starting. The youngest such one lets its pages go (still cached for its own start).
      if (release_youngest_waiting(waiting, seqs, pool, options)) continue;
      return internal_error("generate_batch: the scheduler planned an empty step with work left");
    }

    logits.clear();
    ids.clear();
    const auto t_fwd = std::chrono::steady_clock::now();
    KVSPLIT_RETURN_IF_ERROR(model.forward(steps, pool, &logits, options.forward, &ids));
    if (swapping && options.swap == SwapMode::kAuto) {
      int prefill = 0;
      for (const PrefillChunk& c : plan.prefill) prefill += c.tokens;
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fwd).count();
      if (prefill >= pool.block_size() && secs > 0)
        costs.prefill_tokens_per_s = ewma(costs.prefill_tokens_per_s, prefill / secs, 0.2);
    }

    size_t row = 0, id = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
      SeqState& s = seqs[step_seq[k]];
      const bool decode = s.running;
      // A speculative row counts its fed last token; the loop below adds the accepted drafts.
      const bool spec = !s.spec_row.empty();
      s.computed += spec ? 1 : static_cast<int>(steps[k].tokens.size());
      s.fed = std::max(s.fed, std::min(s.computed, s.num_prompt));
      // The chunks resume the chain's walk (Worker::postprocess); settled when the prefill ends.
      if (!decode) {
        pool.cache_prefix(s.table, options.prefix_salt, s.tokens,
                          std::min(s.computed, s.num_prompt) / bs,
                          sc.kv_window > 0 ? nullptr : &s.prefix_cursor);
        if (s.computed == s.target()) pool.settle_prefix(s.prefix_cursor);
      }
      // Pages every layer's window has passed go back to the pool (after the prefix cache took
      // its pages; before the cut measures the table).
      s.window_dropped +=
          kv::drop_behind_window(pool, s.table, s.computed, sc.kv_window, &window_ops);
      if (!s.running && s.computed == s.target()) s.running = true;  // prompt or recompute done
      if (decode && s.cut) KVSPLIT_RETURN_IF_ERROR(s.cut->finish(pool, s.table, s.computed));
      const int index = step_seq[k];
      if (spec) {
        // Row j is sampled while the token from row j - 1 was draft token j (the sampler draws
        // once per token emitted, as without drafts: the same tokens).
        const int n = static_cast<int>(s.spec_row.size());
        int accepted_here = 0;
        bool rejected = false;
        for (int j = 0; j < n; ++j) {
          const int32_t tok = draw(s, logits.data() + (row + j) * cfg.vocab_size);
          if (tok < 0 && j > 0) break;  // the next step decodes this position again, alone
          if (tok < 0) {
            KVSPLIT_RETURN_IF_ERROR(undrawn(s, index, tok));
            break;
          }
          take(s, index, tok);
          if (s.done() || j == n - 1) break;
          if (tok != s.spec_row[static_cast<size_t>(j) + 1]) {
            rejected = true;
            break;
          }
          ++s.computed;  // the draft token's KV (written by this step) is valid
          ++s.spec_accepted;
          ++accepted_here;
        }
        s.spec_acceptance.observe(n - 1, accepted_here, rejected);
        row += static_cast<size_t>(n);
        s.spec_row.clear();
        if (!s.done()) pool.release_tail(s.table, s.computed + 1);  // the rejected drafts' pages
        continue;
      }
      int32_t tok = -1;
      if (steps[k].logits == SeqStep::Logits::kArgmax) {
        tok = ids[id++];  // greedy: picked by the model (on the device where it can); -1: unusable
        if (tok < 0) tok = kUnusable;
      } else if (steps[k].logits == SeqStep::Logits::kLast) {
        tok = draw(s, logits.data() + row * cfg.vocab_size);
        ++row;
      } else {
        continue;
      }
      if (tok < 0) {
        KVSPLIT_RETURN_IF_ERROR(undrawn(s, index, tok));
        continue;
      }
      take(s, index, tok);
    }
    // Effective-KV accounting point of every sequence that ran: what its pages hold after the
    // step (a decode row's cut measured its table already; finished ones hold nothing).
    const auto t_end = std::chrono::steady_clock::now();
    for (size_t k = 0; k < steps.size(); ++k) {
      SeqState& s = seqs[step_seq[k]];
      if (s.done()) {
        s.kv.close(t_end);
      } else if (s.cut && k < plan.decode.size()) {
        s.kv.update(t_end, s.cut->level());
      } else {
        s.kv.update(t_end, kv_level(pool, s.table, s.computed));
      }
    }
    // Those that finished in this step (a done sequence takes no further step).
    if (options.on_finish) {
      for (size_t k = 0; k < steps.size(); ++k)
        if (seqs[step_seq[k]].done()) options.on_finish(step_seq[k], output_of(seqs[step_seq[k]]));
    }
  }

  // Disk records of released tables still being written (write-behind; a cancel releases
  // swapped-out tables) are freed as their writes end: waited for, so nothing is held on return.
  if (pool.disk() != nullptr) {
    for (kv::KvPool::SwapWrite& w : pool.swap_writes())
      if (w.detached) pool.wait_swap_write(w);
    kv::poll_swap_writes(pool, &swap_stats);
  }
  std::vector<GenerationOutput> out(seqs.size());
  if (options.cut_stats != nullptr) {
    for (const SeqState& s : seqs)
      if (s.cut) options.cut_stats->add(s.cut->stats());
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].kv.close(std::chrono::steady_clock::now());  // nothing held after the batch
    out[i] = output_of(seqs[i]);
  }
  if (options.swap_stats != nullptr) options.swap_stats->add(swap_stats);
  return out;
}

}  // namespace kvsplit::sched
