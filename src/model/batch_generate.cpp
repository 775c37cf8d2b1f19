#include "model/batch_generate.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "sampling/sampler.h"
#include "sampling/stop.h"

namespace kvsplit::model {

namespace {

struct SeqState {
  const GenerationInput* in = nullptr;
  kv::BlockTable table;
  int computed = 0;  // prompt positions whose KV is in the cache
  std::vector<int32_t> output;
  std::unique_ptr<sampling::Sampler> sampler;
  std::unique_ptr<sampling::StopChecker> stop;
  std::unique_ptr<StreamDecoder> decoder;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  bool admitted = false;
  bool greedy = false;  // plain greedy: the model returns the argmax (SeqStep::Logits::kArgmax)

  int prompt_len() const { return static_cast<int>(in->prompt_ids.size()); }
  bool prefilling() const { return computed < prompt_len(); }
  bool done() const { return reason != FinishReason::kNone; }
};

// Releases every sequence's blocks when the batch ends, whatever the outcome.
struct PoolGuard {
  kv::KvPool& pool;
  std::vector<SeqState>& seqs;
  ~PoolGuard() {
    for (SeqState& s : seqs) pool.release(s.table);
  }
};

}  // namespace

int blocks_needed(const std::vector<GenerationInput>& inputs, int block_size, int max_seq_len) {
  int total = 0;
  for (const GenerationInput& in : inputs) {
    // The last generated token is never fed: prompt + max_tokens - 1 positions at most.
    const int positions = std::min<int64_t>(
        max_seq_len, static_cast<int64_t>(in.prompt_ids.size()) + std::max(0, in.params.max_tokens - 1));
    total += kv::BlockTable::blocks_for(std::max(positions, 1), block_size);
  }
  return total;
}

StatusOr<std::vector<GenerationOutput>> generate_batch(LlamaModel& model, kv::KvPool& pool,
                                                       const Tokenizer* tokenizer,
                                                       const std::vector<GenerationInput>& inputs,
                                                       const BatchOptions& options) {
  const ModelConfig& cfg = model.config();
  const int ctx = cfg.max_seq_len;
  if (options.max_batch_tokens < 1) return invalid_argument("max_batch_tokens must be >= 1");
  std::vector<SeqState> seqs(inputs.size());
  PoolGuard guard{pool, seqs};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const GenerationInput& in = inputs[i];
    const std::string where = "prompt " + std::to_string(i) + ": ";
    KVSPLIT_RETURN_IF_ERROR(in.params.validate().with_prefix("prompt " + std::to_string(i)));
    const int n = static_cast<int>(in.prompt_ids.size());
    if (n == 0) return invalid_argument(where + "empty prompt (no tokens)");
    if (n > ctx) {
      return invalid_argument(where + "prompt of " + std::to_string(n) +
                              " tokens is longer than the context length " + std::to_string(ctx));
    }
    for (int32_t t : in.prompt_ids) {
      if (t < 0 || t >= cfg.vocab_size) {
        return invalid_argument(where + "token id " + std::to_string(t) + " outside [0, " +
                                std::to_string(cfg.vocab_size) + ")");
      }
    }
    SeqState& s = seqs[i];
    s.in = &in;
    s.sampler = std::make_unique<sampling::Sampler>(in.params, in.params.seed.value_or(in.seed));
    s.greedy = sampling::is_plain_greedy(in.params);
    // Positions past the prompt are bounded by the context: the last sampled token is never fed.
    const int max_new = std::min(max_generated_tokens(in.params), ctx - n + 1);
    s.stop = std::make_unique<sampling::StopChecker>(in.params, cfg.eos_token_ids, max_new);
    if (tokenizer) s.decoder = std::make_unique<StreamDecoder>(*tokenizer, in.prompt_ids.back());
  }

  std::vector<SeqStep> steps;
  std::vector<int> step_seq;  // seqs index of each step
  std::vector<int32_t> decode_tokens(seqs.size());
  std::vector<float> logits;
  std::vector<int32_t> ids;
  const int block_size = pool.block_size();
  for (;;) {
    steps.clear();
    step_seq.clear();
    int budget = options.max_batch_tokens;
    // Running decodes first: one token each.
    for (size_t i = 0; i < seqs.size(); ++i) {
      SeqState& s = seqs[i];
      if (!s.admitted || s.done() || s.prefilling()) continue;
      const int pos = s.prompt_len() + static_cast<int>(s.output.size()) - 1;
      if (!pool.reserve(s.table, pos + 1)) {
        return resource_exhausted("KV pool exhausted (" + std::to_string(pool.allocator().num_blocks()) +
                                  " blocks of " + std::to_string(block_size) + " tokens)");
      }
      decode_tokens[i] = s.output.back();
      SeqStep st;
      st.tokens = std::span<const int32_t>(&decode_tokens[i], 1);
      st.start_pos = pos;
      st.table = &s.table;
      st.logits = s.greedy ? SeqStep::Logits::kArgmax : SeqStep::Logits::kLast;
      steps.push_back(st);
      step_seq.push_back(static_cast<int>(i));
      --budget;
    }
    // Prefill chunks of admitted prompts, then admit new prompts while the budget lasts.
    int new_prompts = 0;
    for (size_t i = 0; i < seqs.size() && budget > 0; ++i) {
      SeqState& s = seqs[i];
      if (s.done() || !s.prefilling()) continue;
      if (!s.admitted) {
        if (new_prompts >= options.max_new_prompts_per_step) continue;
        s.admitted = true;
        ++new_prompts;
      }
      const int chunk = std::min(budget, s.prompt_len() - s.computed);
      if (!pool.reserve(s.table, s.computed + chunk)) {
        return resource_exhausted("KV pool exhausted (" + std::to_string(pool.allocator().num_blocks()) +
                                  " blocks of " + std::to_string(block_size) + " tokens)");
      }
      SeqStep st;
      st.tokens = std::span<const int32_t>(s.in->prompt_ids.data() + s.computed, chunk);
      st.start_pos = s.computed;
      st.table = &s.table;
      st.logits = s.computed + chunk != s.prompt_len()
                      ? SeqStep::Logits::kNone
                      : (s.greedy ? SeqStep::Logits::kArgmax : SeqStep::Logits::kLast);
      steps.push_back(st);
      step_seq.push_back(static_cast<int>(i));
      budget -= chunk;
    }
    if (steps.empty()) break;

    logits.clear();
    ids.clear();
    KVSPLIT_RETURN_IF_ERROR(model.forward(steps, pool, &logits, options.forward, &ids));

    size_t row = 0, id = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
      SeqState& s = seqs[step_seq[k]];
      const bool was_prefill = s.prefilling();
      if (was_prefill) s.computed += static_cast<int>(steps[k].tokens.size());
      int32_t tok = -1;
      if (steps[k].logits == SeqStep::Logits::kArgmax) {
        tok = ids[id++];  // greedy: picked by the model (on the device where it can)
      } else if (steps[k].logits == SeqStep::Logits::kLast) {
        float* lg = logits.data() + row * cfg.vocab_size;
        ++row;
        tok = s.sampler->sample(lg, cfg.vocab_size, s.in->prompt_ids, s.output);
      } else {
        continue;
      }
      s.output.push_back(tok);
      const std::string delta = s.decoder ? s.decoder->push(tok) : std::string();
      sampling::StopChecker::Step r = s.stop->on_token(tok, delta);
      if (!r.text.empty()) {
        s.text += r.text;
        if (options.on_text) options.on_text(step_seq[k], r.text);
      }
      if (r.reason != FinishReason::kNone) {
        s.reason = r.reason;
        // Held-back text (a possible stop-string prefix) is released unless a stop string cut it.
        std::string rest = s.stop->flush();
        if (s.decoder) rest += s.decoder->flush();
        if (!rest.empty()) {
          s.text += rest;
          if (options.on_text) options.on_text(step_seq[k], rest);
        }
        pool.release(s.table);
      }
    }
  }

  std::vector<GenerationOutput> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    out[i].output_ids = std::move(seqs[i].output);
    out[i].text = std::move(seqs[i].text);
    out[i].finish_reason = seqs[i].reason;
  }
  return out;
}

}  // namespace kvsplit::model
