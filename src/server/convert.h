// proto <-> engine types, and request validation at the API edge. Every rejection is
// kInvalidArgument naming the proto field ("sampling.top_p: must be in (0, 1], got 1.5").
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/v1/generation.pb.h"

namespace kvsplit::server {

namespace v1 = ::kvsplit::v1;

// Server-assigned request ids: this prefix + 32 random hex digits. Reserved: a client id that
// starts with it is INVALID_ARGUMENT, so assigned ids never collide with clients' ids.
inline constexpr std::string_view kServerIdPrefix = "grpc-";

// What a request may ask for; a snapshot taken per request (classes change on SIGHUP).
struct RequestLimits {
  int32_t vocab_size = 0;   // token ids must be in [0, vocab_size)
  int32_t max_context = 0;  // prompt_token_ids.size() <= max_context
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_tokens_limit = 8192;
  int32_t default_max_tokens = 16;
  std::vector<std::string> class_names;  // known SLA classes; empty sla_class = the first
};

// Validates `in` and builds the engine request (request_id as given, tenant empty: the caller sets
// both). The engine re-checks what needs the tokenizer (prompt + max_tokens against the context
// and the KV pool). User strings echoed in messages are escaped (escape_for_message).
StatusOr<Request> to_engine_request(const v1::GenerateRequest& in, const RequestLimits& limits);

// Appends the tokens (and logprobs when asked) of `event` to `out`; text is handled by the caller.
void append_tokens(const TokenEvent& event, bool want_logprobs, v1::GenerateResponse* out);
void to_proto(const TokenLogprob& lp, v1::TokenLogprob* out);
// Sets finish_reason, usage and timings from a final event.
void set_final_fields(const TokenEvent& event, v1::GenerateResponse* out);

v1::FinishReason to_proto(FinishReason reason);
grpc::Status to_grpc(const Status& status);

void fill_model_info(const ModelInfo& info, const RequestLimits& limits,
                     v1::GetModelInfoResponse* out);
void fill_server_stats(const EngineStats& stats, const std::vector<SlaClass>& classes,
                       int32_t active_streams, v1::GetServerStatsResponse* out);
// The KV cache manager's part of GetServerStats (called by fill_server_stats).
void fill_kvm_stats(const EngineStats& stats, v1::GetServerStatsResponse* out);

}  // namespace kvsplit::server
