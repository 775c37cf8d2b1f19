// Fuzzes the request path of the gRPC front end after authentication: the raw body is parsed as
// a kvsplit.v1.GenerateRequest (parse_message, the code the service runs) and converted to an
// engine Request (to_engine_request). Any accepted request must carry sampling parameters the
// engine accepts, and every rejection must be an INVALID_ARGUMENT with a message.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>

#include "common/check.h"
#include "server/convert.h"
#include "server/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool installed = [] {
    kvsplit::server::install_protobuf_log_handler();
    return true;
  }();
  (void)installed;
  grpc::Slice slice(data, size);
  grpc::ByteBuffer bytes(&slice, 1);
  kvsplit::v1::GenerateRequest req;
  const kvsplit::Status parsed = kvsplit::server::parse_message(bytes, &req);
  if (!parsed.ok()) {
    KVSPLIT_CHECK(parsed.code() == kvsplit::StatusCode::kInvalidArgument);
    return 0;
  }
  kvsplit::server::RequestLimits limits;
  limits.vocab_size = 512;
  limits.max_context = 512;
  limits.max_prompt_bytes = 4096;
  limits.max_tokens_limit = 600;
  limits.default_max_tokens = 16;
  limits.class_names = {"standard", "interactive", "batch"};
  auto r = kvsplit::server::to_engine_request(req, limits);
  if (!r.ok()) {
    KVSPLIT_CHECK(r.status().code() == kvsplit::StatusCode::kInvalidArgument);
    KVSPLIT_CHECK(!r.status().message().empty());
    return 0;
  }
  KVSPLIT_CHECK(r->sampling.validate().ok());
  KVSPLIT_CHECK(r->sampling.max_tokens >= 1 && r->sampling.max_tokens <= limits.max_tokens_limit);
  for (int32_t id : r->prompt_token_ids) KVSPLIT_CHECK(id >= 0 && id < limits.vocab_size);
  return 0;
}
