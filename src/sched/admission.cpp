#include "sched/admission.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>

#include "kv/block_allocator.h"

namespace kvsplit::sched {

int find_sla_class(const std::vector<SlaClass>& classes, const std::string& name) {
  if (name.empty()) return classes.empty() ? -1 : 0;
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

StatusOr<std::vector<int32_t>> prompt_token_ids(const Request& request,
                                                const model::Tokenizer& tokenizer, int vocab_size) {
  std::vector<int32_t> ids;
  if (!request.prompt_token_ids.empty()) {
    for (size_t i = 0; i < request.prompt_token_ids.size(); ++i) {
      const int32_t id = request.prompt_token_ids[i];
      if (id < 0 || id >= vocab_size) {
        return invalid_argument(fmt::format(
            "prompt_token_ids[{}] = {} is outside the vocabulary [0, {})", i, id, vocab_size));
      }
    }
    ids = request.prompt_token_ids;
  } else {
    KVSPLIT_RETURN_IF_ERROR(model::check_no_dropped_text(tokenizer, request.prompt, "prompt"));
    KVSPLIT_ASSIGN_OR_RETURN(ids, tokenizer.encode(request.prompt, /*add_bos=*/true));
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size) {
        return internal_error(
            fmt::format("tokenizer produced id {} outside the vocabulary [0, {})", id, vocab_size));
      }
    }
  }
  if (ids.empty())
    return invalid_argument("prompt: empty (no tokens and the tokenizer has no BOS)");
  return ids;
}

Status check_admission(const Request& request, int num_prompt_tokens,
                       const AdmissionLimits& limits) {
  KVSPLIT_RETURN_IF_ERROR(request.sampling.validate(limits.vocab_size));
  if (request.priority < -kMaxRequestPriority || request.priority > kMaxRequestPriority) {
    return invalid_argument(fmt::format("priority: must be in [{}, {}], got {}",
                                        -kMaxRequestPriority, kMaxRequestPriority,
                                        request.priority));
  }
  if (request.n < 1 || request.n > kMaxCompletions) {
    return invalid_argument(
        fmt::format("n: must be in [1, {}], got {}", kMaxCompletions, request.n));
  }
  if (request.prompt_logprobs < -1 ||
      request.prompt_logprobs > static_cast<int32_t>(kMaxTopLogprobs)) {
    return invalid_argument(fmt::format("prompt_logprobs: must be in [-1, {}] (-1: off), got {}",
                                        kMaxTopLogprobs, request.prompt_logprobs));
  }
  if (request.top_logprobs > kMaxTopLogprobs) {
    return invalid_argument(fmt::format("top_logprobs: must be in [0, {}], got {}", kMaxTopLogprobs,
                                        request.top_logprobs));
  }
  // KV positions the request can need: the last generated token is never fed.
  const int64_t total = static_cast<int64_t>(num_prompt_tokens) + request.sampling.max_tokens - 1;
  // The messages quote max_tokens as the client's only when it set one: a default one (the
  // engine fits it to the context) is named as such, and a prompt the context cannot hold is
  // refused for its own length.
  const std::string max_tokens =
      request.max_tokens_is_default
          ? fmt::format("the default max_tokens ({}; the request set none)",
                        request.sampling.max_tokens)
          : fmt::format("max_tokens ({})", request.sampling.max_tokens);
  if (request.max_tokens_is_default && num_prompt_tokens > limits.max_context) {
    return invalid_argument(
        fmt::format("prompt ({} tokens) is longer than the model context of {} tokens: no room "
                    "to generate a token",
                    num_prompt_tokens, limits.max_context));
  }
  if (total > limits.max_context) {
    return invalid_argument(
        fmt::format("prompt ({} tokens) + {} - 1 = {} positions exceeds the model context of {} "
                    "tokens",
                    num_prompt_tokens, max_tokens, total, limits.max_context));
  }
  const auto blocks_for = [&](int64_t tokens) {
    return (tokens + limits.block_size - 1) / limits.block_size;
  };
  int64_t blocks = blocks_for(total);
  std::string at_once;
  if (limits.kv_window > 0) {
    // Held at once: the pages a chunk's first query reads back to, through the chunk's last
    // (one more when neither end is page-aligned).
    const int64_t peak =
        blocks_for(int64_t{limits.kv_window} - 1 + std::max(1, limits.chunk_tokens)) + 1;
    if (peak < blocks) {
      blocks = peak;
      at_once = fmt::format(" at once (a sliding window of {} keys and a chunk of {} tokens)",
                            limits.kv_window, limits.chunk_tokens);
    }
  }
  if (blocks > limits.kv_blocks_per_worker) {
    // The request is valid; this deployment lacks the memory (more spatial shards would add it).
    return resource_exhausted(
        fmt::format("prompt ({} tokens) + {} - 1 = {} positions need {} KV blocks of {} "
                    "tokens{}, more than a worker's KV pool holds ({} blocks over all its "
                    "spatial shards)",
                    num_prompt_tokens, max_tokens, total, blocks, limits.block_size, at_once,
                    limits.kv_blocks_per_worker));
  }
  return ok_status();
}

}  // namespace kvsplit::sched
