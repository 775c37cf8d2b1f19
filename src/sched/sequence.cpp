#include "sched/sequence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "common/check.h"
#include "sampling/logprobs.h"
#include "sched/swap_cost.h"

namespace kvsplit::sched {
namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

void Sequence::enter_phase(SeqPhase next, Clock::time_point now) {
  const int cur = static_cast<int>(phase);
  if (cur < 5) phase_ms[cur] += ms_between(phase_start, now);
  if (phase == SeqPhase::kPreempted) interval_from += now - phase_start;  // not a step interval
  phase = next;
  phase_start = now;
}

void Sequence::note_step_interval(Clock::time_point now) {
  step_interval_ewma_ms =
      ewma(step_interval_ewma_ms, ms_between(interval_from, now), kStepIntervalAlpha);
}

namespace {

// Appends `token`, updates the timings, pushes its event; `raw` (the unmodified logits) only when
// logprobs were asked for.
FinishReason push_token(Sequence& seq, int32_t token, const float* raw, int vocab,
                        Clock::time_point now) {
  TokenEvent ev;
  ev.request_id = seq.id();
  ev.index = seq.ctl->index;
  seq.tokens.push_back(token);

  if (seq.num_output() == 1) {
    seq.first_token_time = now;
    seq.release_siblings();
  } else {
    const double gap = ms_between(seq.last_token_time, now);
    seq.itl_sum_ms += gap;
    seq.itl_max_ms = std::max(seq.itl_max_ms, gap);
    // Once per step: the tokens of one speculative row share its time, and 0 ms gaps would make
    // the sequence look served more often than it is (the SwapPredictor's "served least often").
    if (now != seq.last_token_time) seq.note_step_interval(now);
  }
  seq.last_token_time = now;
  seq.interval_from = now;

  // A stop token's text is not emitted: it does not reach the detokenizer (StopChecker).
  const std::string delta =
      seq.stop->is_stop_token(token) ? std::string() : seq.decoder->push(token);
  sampling::StopChecker::Step step = seq.stop->on_token(token, delta);
  ev.token_ids.push_back(token);
  ev.text = std::move(step.text);
  if (raw != nullptr) {
    TokenLogprob lp;
    lp.token_id = token;
    sampling::compute_logprobs(raw, vocab, token, static_cast<int>(seq.top_logprobs), &lp.logprob,
                               &lp.top);
    ev.logprobs.push_back(std::move(lp));
  }
  if (seq.num_output() == 1 && seq.prompt_logprobs >= 0) {
    ev.prompt_logprobs = std::move(seq.prompt_lp);
    seq.prompt_lp = {};
  }
  ev.time = now;
  seq.ctl->stream->push(std::move(ev));
  return step.reason;
}

}  // namespace

FinishReason sample_and_append(Sequence& seq, float* logits, int vocab, Clock::time_point now) {
  const std::span<const int32_t> prompt(seq.tokens.data(), seq.num_prompt);
  const std::span<const int32_t> output(seq.tokens.data() + seq.num_prompt, seq.num_output());
  // The logprob of the chosen token is read before the sampler rewrites the logits.
  if (!sampling::logits_usable(logits, vocab)) return FinishReason::kError;  // nothing pushed
  // The raw logits go to the sampling thread's own buffer (allocated once per thread, not per
  // token nor per sequence).
  thread_local std::vector<float> raw;
  if (seq.top_logprobs > 0) raw.assign(logits, logits + vocab);
  const int32_t token = seq.sampler->sample(logits, vocab, prompt, output);
  if (token == sampling::Sampler::kNoAllowedToken) {  // guided: the constraint allows nothing
    return seq.sampler->guide_status().ok() ? FinishReason::kStop : FinishReason::kError;
  }
  KVSPLIT_CHECK(token >= 0 && token < vocab);
  return push_token(seq, token, seq.top_logprobs > 0 ? raw.data() : nullptr, vocab, now);
}

FinishReason sample_speculative(Sequence& seq, float* rows, int vocab, Clock::time_point now,
                                int* accepted, bool* rejected) {
  const int drafts = static_cast<int>(seq.spec_row.size()) - 1;
  KVSPLIT_CHECK(drafts >= 1);
  *accepted = 0;
  *rejected = false;
  FinishReason reason = FinishReason::kNone;
  for (int j = 0; j <= drafts; ++j) {
    const FinishReason r = sample_and_append(
        seq, rows + static_cast<size_t>(j) * static_cast<size_t>(vocab), vocab, now);
    // Row j > 0 unusable (nothing was appended): the tokens so far stand, and the next step
    // decodes this position again, on its own, where the error surfaces.
    if (r == FinishReason::kError && j > 0) break;
    reason = r;
    if (r != FinishReason::kNone || j == drafts) break;
    if (seq.tokens.back() != seq.spec_row[j + 1]) {
      *rejected = true;
      break;
    }
    // Draft token j + 1 is what was sampled: its KV (written by this step) is valid, and row
    // j + 1 predicts the token after it.
    ++seq.num_computed;
    ++*accepted;
  }
  return reason;
}

void size_prompt_logprobs(Sequence& seq) {
  if (seq.prompt_lp.size() + 1 < static_cast<size_t>(seq.num_prompt))
    seq.prompt_lp.resize(static_cast<size_t>(seq.num_prompt - 1));
}

void record_prompt_logprobs(Sequence& seq, const float* rows, int start, int n, int vocab) {
  KVSPLIT_CHECK(seq.prompt_lp.size() + 1 >= static_cast<size_t>(seq.num_prompt));
  for (int r = 0; r < n; ++r) {
    const int p = start + r;
    if (p + 1 >= seq.num_prompt) break;  // the last prompt position samples the first token
    TokenLogprob& lp = seq.prompt_lp[static_cast<size_t>(p)];
    lp.token_id = seq.tokens[static_cast<size_t>(p) + 1];
    lp.top.clear();
    sampling::compute_logprobs(rows + static_cast<size_t>(r) * vocab, vocab, lp.token_id,
                               seq.prompt_logprobs, &lp.logprob, &lp.top);
  }
}

Status unusable_logits_error(const Sequence& seq) {
  if (seq.sampler && seq.sampler->guided() && !seq.sampler->guide_status().ok())
    return seq.sampler->guide_status().with_prefix(fmt::format("request {}", seq.display_id()));
  return internal_error(fmt::format(
      "request {}: the model produced no usable logits (NaN or infinite) at position {}: its "
      "activations overflow float32 (check the model's weights) or the backend failed",
      seq.display_id(), seq.num_computed - 1));
}

bool greedy_without_logits(const Sequence& seq) {
  return sampling::is_plain_greedy(seq.params) && seq.top_logprobs == 0 &&
         !seq.wants_prompt_logprobs();
}

FinishReason append_token(Sequence& seq, int32_t token, Clock::time_point now) {
  KVSPLIT_CHECK(greedy_without_logits(seq));
  if (token < 0) return FinishReason::kError;  // the model's logits were not usable
  return push_token(seq, token, nullptr, 0, now);
}

void finish_sequence(Sequence& seq, FinishReason reason, Status status, Clock::time_point now,
                     FinishSink& sink) {
  KVSPLIT_CHECK(seq.table.blocks.empty());
  seq.enter_phase(SeqPhase::kDone, now);
  // Text still held back (a possible stop string's start, an incomplete UTF-8 character): flushed
  // unless generation ended on a stop string (then it is dropped). A cancel or an error after
  // some tokens flushes it too, so the stream's text is always that of the ids it delivered.
  if (seq.num_output() > 0 && seq.stop && seq.decoder) {
    const int32_t last = seq.tokens.back();
    // (A guided text that is complete with no end id to sample stops without the checker.)
    const bool stop_string =
        reason == FinishReason::kStop && seq.stop->finished() &&
        std::find(seq.params.stop_token_ids.begin(), seq.params.stop_token_ids.end(), last) ==
            seq.params.stop_token_ids.end() &&
        std::find(seq.eos_ids.begin(), seq.eos_ids.end(), last) == seq.eos_ids.end();
    if (!stop_string) {
      std::string rest = seq.stop->flush();
      rest += seq.decoder->flush();
      if (!rest.empty()) {
        TokenEvent text_ev;
        text_ev.request_id = seq.id();
        text_ev.index = seq.ctl->index;
        text_ev.text = std::move(rest);
        text_ev.time = now;
        seq.ctl->stream->push(std::move(text_ev));
      }
    }
  }
  seq.release_siblings();
  TokenEvent ev;
  ev.request_id = seq.id();
  ev.index = seq.ctl->index;
  ev.time = now;
  ev.final = true;
  ev.finish_reason = reason;
  ev.status = std::move(status);
  ev.usage.prompt_tokens = seq.num_prompt;
  ev.usage.completion_tokens = seq.num_output();
  ev.usage.cached_tokens = seq.cached_tokens;
  seq.kv_account.close(now);  // the table is empty: nothing is held from now on
  ev.usage.effective_kv_byte_seconds = seq.kv_account.byte_seconds();
  ev.usage.kv_token_seconds = seq.kv_account.token_seconds();
  Timings& t = ev.timings;
  t.queue_ms = seq.phase_ms[static_cast<int>(SeqPhase::kQueued)];
  t.prefill_ms = seq.phase_ms[static_cast<int>(SeqPhase::kPrefill)];
  t.handoff_ms = seq.phase_ms[static_cast<int>(SeqPhase::kHandoff)];
  t.decode_ms = seq.phase_ms[static_cast<int>(SeqPhase::kDecode)];
  t.preempted_ms = seq.phase_ms[static_cast<int>(SeqPhase::kPreempted)];
  t.preemptions = seq.preemptions;
  t.e2e_ms = ms_between(seq.submit_time, now);
  if (seq.num_output() > 0) t.ttft_ms = ms_between(seq.submit_time, seq.first_token_time);
  if (seq.num_output() > 1) {
    t.mean_itl_ms = seq.itl_sum_ms / (seq.num_output() - 1);
    t.max_itl_ms = seq.itl_max_ms;
  }
  sink.on_final(seq, ev);
  seq.ctl->stream->push(std::move(ev));
}

}  // namespace kvsplit::sched
