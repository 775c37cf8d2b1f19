// After a worker step's forward pass: prompt logprobs, sampling, stop checks and token events
// (spread over the worker's sampling threads), the prefix cache's inserts, finishes and phase
// changes, and the step's effective-KV accounting point.
#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "sched/worker.h"

namespace kvsplit::sched {
namespace {

// Runs run(begin, end) over rows [0, n): on `pool` in small dynamic chunks (rows differ in cost:
// greedy vs top-p, logprobs) when there are at least `min_rows`, else on this thread.
template <typename Run>
void over_rows(ThreadPool* pool, int64_t min_rows, int64_t n, Run run) {
  if (pool == nullptr || n < min_rows) {
    run(int64_t{0}, n);
    return;
  }
  constexpr int64_t kRowsPerTask = 8;
  pool->parallel_for((n + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    run(t * kRowsPerTask, std::min(n, (t + 1) * kRowsPerTask));
  });
}

}  // namespace

void Worker::postprocess(std::vector<float>& logits, const std::vector<int32_t>& ids,
                         Clock::time_point now) {
  const int vocab = model_->vocab_size();
  // 1. Advance every entry; collect the rows to sample (a cancelled sequence is finished instead).
  sample_jobs_.clear();
  prompt_rows_.clear();
  size_t row = 0, id = 0;
  for (size_t i = 0; i < batch_.seqs.size(); ++i) {
    Sequence& seq = *batch_.seqs[i];
    const int n = static_cast<int>(batch_.steps[i].tokens.size());
    // A speculative row counts its fed last token here; sample_speculative adds the draft tokens
    // it accepts.
    const bool spec = batch_.samples[i] == kSampleSpec;
    seq.num_computed += spec ? 1 : n;
    if (batch_.samples[i] == kSamplePromptRows || batch_.samples[i] == kSamplePromptRowsLast) {
      KVSPLIT_CHECK((row + static_cast<size_t>(n)) * vocab <= logits.size());
      size_prompt_logprobs(seq);
      // Recorded below, a row per task, on the sampling threads.
      for (int r = 0; r < n; ++r) {
        prompt_rows_.push_back({&seq, logits.data() + (row + static_cast<size_t>(r)) * vocab,
                                batch_.steps[i].start_pos + r});
      }
      row += static_cast<size_t>(n);
      if (batch_.samples[i] == kSamplePromptRows) continue;
    }
    if (batch_.samples[i] == kSampleNone) continue;
    SampleJob job{&seq, nullptr, -1};
    if (batch_.samples[i] == kSamplePromptRowsLast) {
      job.logits = logits.data() + (row - 1) * vocab;  // its last row: sampled in place
    } else if (spec) {
      KVSPLIT_CHECK((row + static_cast<size_t>(n)) * vocab <= logits.size());
      job.logits = logits.data() + row * vocab;  // n rows, sampled in place in turn
      job.rows = n;
      row += static_cast<size_t>(n);
    } else if (batch_.samples[i] == kSampleRow) {
      KVSPLIT_CHECK((row + 1) * vocab <= logits.size());
      job.logits = logits.data() + row * vocab;  // sampled in place
      ++row;
    } else {
      KVSPLIT_CHECK(id < ids.size());
      job.token = ids[id++];
    }
    if (batch_.decode[i]) drop_behind_window(seq);
    if (batch_.decode[i] && !finish_cut(seq, now)) continue;
    if (seq.cancelled()) {
      finish(seq, FinishReason::kCancelled, cancelled_error("cancelled"), now);
      continue;
    }
    sample_jobs_.push_back(job);
  }
  // 2. Prompt logprobs (each row a log-softmax over the vocabulary), then sampling, stop checks,
  // detokenization and token events (in parallel on large steps).
  record_prompt_rows(vocab);
  sample_rows(now);
  // 3. Finishes and phase changes, on this thread, in batch order.
  size_t job = 0;
  for (size_t i = 0; i < batch_.seqs.size(); ++i) {
    Sequence& seq = *batch_.seqs[i];
    if (seq.next == Sequence::Next::kRemove) continue;  // cancelled in 1.
    const bool in_waiting = seq.phase == SeqPhase::kPrefill || seq.phase == SeqPhase::kPreempted;
    const bool sampled = job < sample_jobs_.size() && sample_jobs_[job].seq == &seq;
    // Full prompt pages join the prefix cache as soon as they are computed, before a finish
    // releases the table (a request that ends on its first token still leaves its prompt); not
    // the pages of a step whose logits were unusable (they may hold a backend's fault).
    // Each chunk's insert resumes the walk of the chain where the last one stopped (not with a
    // window: the walk touches the pages dropped behind it); the chunk that completes the
    // prefill gives the whole chain its use, as a walk from page 0 does.
    if (in_waiting && !(sampled && sample_reasons_[job] == FinishReason::kError)) {
      pool_->cache_prefix(seq.table, seq.prefix_salt, seq.tokens,
                          std::min(seq.num_computed, seq.num_prompt) / pool_->block_size(),
                          scheduler_.config().kv_window > 0 ? nullptr : &seq.prefix_cursor);
      if (seq.num_computed >= seq.prefill_target()) pool_->settle_prefix(seq.prefix_cursor);
      drop_behind_window(seq);  // after the prefix cache took its pages
    }
    if (sampled && batch_.samples[i] == kSampleSpec) {
      const int drafted = static_cast<int>(seq.spec_row.size()) - 1, accepted = spec_accepted_[job];
      spec_rows_.fetch_add(1, std::memory_order_relaxed);
      spec_draft_tokens_.fetch_add(drafted, std::memory_order_relaxed);
      spec_accepted_tokens_.fetch_add(accepted, std::memory_order_relaxed);
      seq.spec_acceptance.observe(drafted, accepted, spec_rejected_[job] != 0);
    }
    if (sampled) {
      const FinishReason reason = sample_reasons_[job++];
      if (reason == FinishReason::kError) {
        const Status st = unusable_logits_error(seq);
        KVSPLIT_LOG_ERROR("{}: {}", options_.name, st.message());
        finish(seq, reason, st, now);
        continue;
      }
      if (reason != FinishReason::kNone) {
        finish(seq, reason, ok_status(), now);
        continue;
      }
    }
    if (batch_.samples[i] == kSampleSpec) {
      // The pages reserved for the draft tokens rejected go back (the next step's row needs
      // room for position num_computed only).
      pool_->release_tail(seq.table, seq.num_computed + 1);
      seq.spec_row.clear();
    }
    if (!in_waiting) continue;                              // a decode step
    if (seq.num_computed < seq.prefill_target()) continue;  // more chunks to go
    // Prompt (or recompute) complete.
    if (options_.role == WorkerRole::kPrefill) {
      seq.next = Sequence::Next::kHandoff;
    } else {
      seq.enter_phase(SeqPhase::kDecode, now);
      seq.next = Sequence::Next::kToRunning;
    }
  }
  // 4. Effective-KV accounting point of every sequence that ran (finished ones were closed):
  // what its pages hold after this step. A decode row's cut already measured its table.
  for (size_t i = 0; i < batch_.seqs.size(); ++i) {
    Sequence& seq = *batch_.seqs[i];
    if (seq.next == Sequence::Next::kRemove) continue;
    if (batch_.decode[i] && seq.cut) {
      seq.kv_account.update(now, seq.cut->level());
    } else {
      account_kv(seq, now);
    }
  }
}

// Prompt-logprob rows write disjoint entries of their sequences' prompt_lp: spread over the
// sampling threads like the sampled rows (a 512-token chunk is 512 log-softmaxes).
void Worker::record_prompt_rows(int vocab) {
  over_rows(sampling_pool_.get(), options_.parallel_sampling_min_rows,
            static_cast<int64_t>(prompt_rows_.size()), [&](int64_t begin, int64_t end) {
              for (int64_t k = begin; k < end; ++k) {
                const PromptRow& p = prompt_rows_[static_cast<size_t>(k)];
                record_prompt_logprobs(*p.seq, p.logits, p.pos, 1, vocab);
              }
            });
}

// Every sequence has its own Sampler, StopChecker, StreamDecoder and event stream, so rows are
// independent: the tokens do not depend on how rows are spread over threads (per-request
// determinism); only the interleaving of different requests' events changes.
void Worker::sample_rows(Clock::time_point now) {
  const int vocab = model_->vocab_size();
  sample_reasons_.assign(sample_jobs_.size(), FinishReason::kNone);
  spec_accepted_.assign(sample_jobs_.size(), 0);
  spec_rejected_.assign(sample_jobs_.size(), 0);
  const bool drafts = speculating();
  over_rows(sampling_pool_.get(), options_.parallel_sampling_min_rows,
            static_cast<int64_t>(sample_jobs_.size()), [&](int64_t begin, int64_t end) {
              for (int64_t k = begin; k < end; ++k) {
                const SampleJob& job = sample_jobs_[k];
                if (job.rows > 1) {
                  bool rejected = false;
                  sample_reasons_[k] = sample_speculative(*job.seq, job.logits, vocab, now,
                                                          &spec_accepted_[k], &rejected);
                  spec_rejected_[k] = rejected ? 1 : 0;
                } else {
                  sample_reasons_[k] = job.logits
                                           ? sample_and_append(*job.seq, job.logits, vocab, now)
                                           : append_token(*job.seq, job.token, now);
                }
                // The next row's draft, looked up here: in parallel over the step's rows (not for
                // a sequence whose next token is its last: it gets none).
                const Sequence& s = *job.seq;
                if (drafts && sample_reasons_[k] == FinishReason::kNone &&
                    s.stop->max_new_tokens() - s.stop->num_generated() > 1)
                  propose_draft(*job.seq);
              }
            });
}

}  // namespace kvsplit::sched
