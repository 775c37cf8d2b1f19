// Protocol errors at the API edge: request bytes are parsed by the service itself, after the
// caller is authenticated (the methods are registered raw, grpc::ByteBuffer in and out), so an
// unauthenticated call gets UNAUTHENTICATED whatever its body and an unparsable one gets
// INVALID_ARGUMENT with a message. Reports of parse failures are throttled.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kvsplit/status.h"

namespace google::protobuf {
class MessageLite;
}  // namespace google::protobuf

namespace kvsplit::server {

// One log line per `interval` at most: report() logs at once when the previous line is at least
// `interval` old, else counts the report as suppressed; the next line logged says how many were.
// Thread-safe; `sink` (default: a WARN line of the log) is called outside the lock.
class ThrottledLog {
 public:
  using Sink = std::function<void(const std::string& line)>;
  explicit ThrottledLog(std::chrono::milliseconds interval, Sink sink = {});

  void report(std::string_view line);

 private:
  const std::chrono::milliseconds interval_;
  const Sink sink_;
  std::mutex mu_;
  std::optional<std::chrono::steady_clock::time_point> last_;  // guarded by mu_
  int64_t suppressed_ = 0;                                     // guarded by mu_
};

// Parses `bytes` as `message` (its full name in errors). kInvalidArgument "request: not a valid
// kvsplit.v1.GenerateRequest message: <protobuf's reason, when it gave one>".
Status parse_message(const grpc::ByteBuffer& bytes, google::protobuf::MessageLite* message);

// Serializes `message` into `out` (replacing its contents). kInternal when protobuf refuses.
Status serialize_message(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out);

// Routes protobuf's own log lines (such as "String field ... contains invalid UTF-8 data") away
// from its default handler, which writes every one to stderr: during parse_message() on the same
// thread they become that parse's error message; all others go to the log through a ThrottledLog
// (one line per 10 s). Process-wide and idempotent.
void install_protobuf_log_handler();

}  // namespace kvsplit::server
