// Admission checks run at submit, before a request is queued: pure functions returning Status
// (kInvalidArgument with the offending field and the numbers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/status.h"
#include "model/tokenizer.h"

namespace kvsplit::sched {

struct AdmissionLimits {
  int vocab_size = 0;
  int max_context = 0;           // the model's context length (tokens)
  int block_size = 16;           // tokens per KV page
  int kv_blocks_per_worker = 0;  // the smallest KvPool a request may have to fit in
  // Sliding windows (model::ModelConfig::kv_window; 0: none): a sequence then holds at most the
  // window's pages plus those of the chunk it computes (chunk_tokens, SchedulerConfig::chunk_cap),
  // since the pages behind the window are freed after each step (on prefill workers too: a
  // handoff moves only the pages inside the window).
  int kv_window = 0;
  int chunk_tokens = 0;
};

inline constexpr uint32_t kMaxTopLogprobs = 20;
// Request::priority's bound (kvsplit/engine.h), under the name the scheduler has always used.
using ::kvsplit::kMaxRequestPriority;
// The scheduling priority of a request: its class's priority first, its own priority (in
// [-kMaxRequestPriority, kMaxRequestPriority]) only orders requests of classes of equal priority.
// So no request priority lifts a request above a class of higher priority (a client picks its
// request priority; the operator orders the classes). Class priorities are in [-1000, 1000]:
// the result stays within +-2,002,000.
inline int32_t effective_priority(int32_t class_priority, int32_t request_priority) {
  return class_priority * (2 * kMaxRequestPriority + 1) + request_priority;
}

// Index of the class `name` (empty: 0, the default class), or -1 when unknown.
int find_sla_class(const std::vector<SlaClass>& classes, const std::string& name);

// The request's prompt ids: prompt_token_ids as given (each in [0, vocab)), else the tokenized
// prompt with BOS. An empty result is kInvalidArgument.
StatusOr<std::vector<int32_t>> prompt_token_ids(const Request& request,
                                                const model::Tokenizer& tokenizer, int vocab_size);

// Field checks (sampling params against the vocabulary, priority, n, top_logprobs) and the fit
// check: the prompt + max_tokens - 1 KV positions one completion can need fit the context and one
// worker's KV pool.
Status check_admission(const Request& request, int num_prompt_tokens,
                       const AdmissionLimits& limits);

}  // namespace kvsplit::sched
