// kvsplit.v1.Generation on the gRPC callback API. The four methods are registered raw
// (grpc::ByteBuffer in and out) and, on the server side only, as bidi streams: gRPC then runs the
// handler when a call's headers arrive, before any of its message is read (for a unary or
// server-streaming method it would first buffer the whole request, up to
// server.max_message_bytes). Each call is authenticated from its metadata, and a Generate call
// checked against draining and the stream limits, before its one message is read; a refused call
// is finished at once. The message is parsed here, so an unparsable one gets INVALID_ARGUMENT
// with a message (server/protocol.h); none, or more than one, is INVALID_ARGUMENT too. The wire
// format is the same for every method type: clients call the methods as generation.proto
// declares them. Each Generate stream is a GenerateReactor (server/generate_reactor.h). Request
// ids are scoped to the caller's tenant (server/auth.h). Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/v1/generation.grpc.pb.h"
#include "server/auth.h"
#include "server/convert.h"
#include "server/message_timer.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace kvsplit::server {

struct ServiceOptions {
  int32_t max_concurrent_streams = 1024;  // open Generate calls; more -> RESOURCE_EXHAUSTED
  // Open Generate calls of one tenant (API key); more -> RESOURCE_EXHAUSTED. 0: no such limit.
  int32_t max_streams_per_tenant = 0;
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_tokens_limit = 8192;
  int32_t default_max_tokens = 16;
  // Empty: no authentication (one tenant, "anonymous", full rights). Distinct keys.
  std::vector<config::ApiKey> api_keys;
  ServerMetrics* metrics = nullptr;  // optional; must outlive the service
  // Unparsable requests are logged at most once per interval (with the count suppressed).
  std::chrono::milliseconds parse_error_log_interval{10000};
  // A call whose request message (and, for the unary methods, half-close) has not arrived this
  // long after its headers ends with DEADLINE_EXCEEDED, releasing its stream slot.
  std::chrono::milliseconds request_message_timeout{10000};
};

class PumpThread;       // server/generate_reactor.h
class GenerateReactor;  // server/generate_reactor.cpp

// The INVALID_ARGUMENT messages of a call that sends no request message, or more than one.
inline constexpr char kNoRequestMessage[] =
    "no request message: the call was half-closed before sending one";
inline constexpr char kSecondRequestMessage[] =
    "more than one request message: the method takes exactly one";

using RawBidiReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

class GenerationService final : public grpc::Service {
 public:
  // `engine` must outlive the service and the gRPC server it is registered with.
  GenerationService(Engine* engine, ServiceOptions options, std::vector<SlaClass> classes);
  ~GenerationService() override;

  // The method handlers: gRPC calls them as a call's headers arrive, with no message read.
  RawBidiReactor* Generate(grpc::CallbackServerContext* context);
  RawBidiReactor* Abort(grpc::CallbackServerContext* context);
  RawBidiReactor* GetModelInfo(grpc::CallbackServerContext* context);
  RawBidiReactor* GetServerStats(grpc::CallbackServerContext* context);

  // The SLA classes requests are validated against (after Engine::update_sla_classes succeeded).
  void set_sla_classes(std::vector<SlaClass> classes);
  std::vector<SlaClass> sla_classes() const;
  // Replaces the accepted API keys and their policies (SIGHUP): calls starting from now on are
  // authenticated against `keys` and get their policies, and the open Generate calls of a key no
  // longer among them end with UNAUTHENTICATED (their requests are cancelled in the engine); open
  // calls of a kept key keep the policy they were admitted with. Authentication cannot be turned
  // on or off this way (keys <-> none): kFailedPrecondition, nothing changed. Returns the number
  // of calls ended. Any thread; slow for many new keys (ApiKeyAuth::tenant_id), not under a lock.
  StatusOr<int> update_api_keys(const std::vector<config::ApiKey>& keys);
  // New Generate calls get UNAVAILABLE from now on (SIGTERM drain), and so do those still
  // waiting for their request message: they are not in the engine, so nothing else ends them.
  void start_draining();
  bool draining() const { return draining_.load(); }
  int32_t active_streams() const { return active_streams_.load(); }
  const std::atomic<int32_t>* active_streams_counter() const { return &active_streams_; }

  // Used by the reactors.
  Engine* engine() const { return engine_; }
  ServerMetrics* metrics() const { return options_.metrics; }
  std::weak_ptr<PumpThread> pump_thread() const { return pump_thread_; }
  MessageTimer* message_timer() const { return message_timer_.get(); }
  // Admits a Generate call from its metadata alone: the caller (tenant and key policy), holding a
  // stream slot of the server and of the tenant (give it back with stream_closed), or
  // UNAUTHENTICATED, UNAVAILABLE (draining) or RESOURCE_EXHAUSTED (a stream limit: the server's,
  // or the tenant's, server/tenant_policy.h stream_limit), holding none.
  // An admitted call is registered as `stream` until stream_done, so that a reload revoking its
  // key ends it (revoke_generate, server/generate_reactor.h).
  StatusOr<Caller> admit_stream(const grpc::CallbackServerContext& context,
                                const std::shared_ptr<GenerateReactor>& stream);
  // Gives back a stream slot of the server and of `tenant` (taken by admit_stream).
  void stream_closed(const std::string& tenant);
  // Forgets `stream` (registered by admit_stream; none: no-op). Called from its OnDone.
  void stream_done(const GenerateReactor* stream);
  // Parses the request message `bytes` of `method` into `message`: INVALID_ARGUMENT when it does
  // not parse (counted and reported through parse_errors_).
  Status parse_request(const grpc::CallbackServerContext& context, const char* method,
                       const std::string& tenant, const grpc::ByteBuffer& bytes,
                       google::protobuf::MessageLite* message);
  // The engine request of `caller`'s parsed Generate request, validated against the limits and
  // the caller's key policy (PERMISSION_DENIED: a class or priority the key may not use).
  StatusOr<Request> engine_request(const v1::GenerateRequest& request, const Caller& caller) const;

 private:
  RequestLimits limits() const;
  // Counts one more open stream of `tenant`: its open streams, this one included.
  int32_t tenant_stream_opened(const std::string& tenant);
  // Registers method `index` (of generation.proto) as a raw callback bidi stream.
  void add_method(int index, const char* name,
                  RawBidiReactor* (GenerationService::*handler)(grpc::CallbackServerContext*));

  Engine* const engine_;
  const ServiceOptions options_;
  // The accepted keys (replaced whole by update_api_keys) and the Generate calls admitted with
  // them, with their tenants: a call is registered under the key set that admitted it, so a
  // reload either sees it or it sees the reload.
  std::shared_ptr<const ApiKeyAuth> auth() const;
  mutable std::mutex auth_mu_;
  std::shared_ptr<const ApiKeyAuth> auth_;  // guarded by auth_mu_
  struct OpenStream {
    std::string tenant;
    std::weak_ptr<GenerateReactor> reactor;
  };
  std::unordered_map<const GenerateReactor*, OpenStream> open_streams_;  // guarded by auth_mu_
  const ModelInfo model_info_;
  ThrottledLog parse_errors_;
  mutable std::mutex mu_;
  std::vector<SlaClass> classes_;  // guarded by mu_
  std::atomic<int32_t> active_streams_{0};
  std::mutex slots_mu_;
  std::unordered_map<std::string, int32_t> tenant_streams_;  // open streams; guarded by slots_mu_
  std::atomic<bool> draining_{false};
  // Shared so that a notifier outliving the service finds it gone (weak_ptr) instead of dangling.
  std::shared_ptr<PumpThread> pump_thread_;
  std::unique_ptr<MessageTimer> message_timer_;
};

}  // namespace kvsplit::server
