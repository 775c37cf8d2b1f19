#include "server/protocol.h"

#include <fmt/format.h>
#include <google/protobuf/message_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "common/escape.h"
#include "common/log.h"

namespace kvsplit::server {
namespace {

// Where protobuf's log lines go while parse_message() runs on this thread.
thread_local std::string* t_parse_errors = nullptr;

void protobuf_log_handler(google::protobuf::LogLevel level, const char* file, int line,
                          const std::string& message) {
  if (t_parse_errors != nullptr) {
    if (!t_parse_errors->empty()) t_parse_errors->append("; ");
    t_parse_errors->append(message);
    return;
  }
  static ThrottledLog* const throttle = new ThrottledLog(std::chrono::seconds(10));
  throttle->report(fmt::format("protobuf {} ({}:{}): {}",
                               level >= google::protobuf::LOGLEVEL_ERROR ? "error" : "warning",
                               file ? file : "?", line, escape_for_message(message, 512)));
}

}  // namespace

ThrottledLog::ThrottledLog(std::chrono::milliseconds interval, Sink sink)
    : interval_(interval), sink_(std::move(sink)) {}

void ThrottledLog::report(std::string_view line) {
  const auto now = std::chrono::steady_clock::now();
  int64_t suppressed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_ && now - *last_ < interval_) {
      ++suppressed_;
      return;
    }
    last_ = now;
    suppressed = suppressed_;
    suppressed_ = 0;
  }
  std::string out(line);
  if (suppressed > 0) {
    out += fmt::format(" ({} similar reports suppressed in the last {} ms)", suppressed,
                       interval_.count());
  }
  if (sink_) {
    sink_(out);
  } else {
    KVSPLIT_LOG_WARN("{}", out);
  }
}

Status parse_message(const grpc::ByteBuffer& bytes, google::protobuf::MessageLite* message) {
  grpc::ByteBuffer copy(bytes);  // the reader consumes its buffer; copying shares the slices
  grpc::ProtoBufferReader reader(&copy);
  std::string reasons;
  t_parse_errors = &reasons;
  const bool ok = message->ParseFromZeroCopyStream(&reader);
  t_parse_errors = nullptr;
  if (ok) return ok_status();
  std::string msg = "request: not a valid " + message->GetTypeName() + " message";
  msg += reasons.empty() ? " (malformed protobuf wire format)"
                         : ": " + escape_for_message(reasons, 512);
  return invalid_argument(msg);
}

Status serialize_message(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out) {
  out->Clear();  // the writer appends only to an empty buffer
  bool own_buffer = false;
  grpc::Status st = grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
      message, out, &own_buffer);
  if (!st.ok()) return internal_error("response: cannot serialize: " + st.error_message());
  return ok_status();
}

void install_protobuf_log_handler() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&protobuf_log_handler); });
}

}  // namespace kvsplit::server
