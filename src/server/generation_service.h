// kvsplit.v1.Generation on the gRPC callback API. The four methods are registered raw
// (grpc::ByteBuffer in and out): each call is authenticated from its metadata first, then its
// message is parsed here, so an unauthenticated call gets UNAUTHENTICATED whatever its body and an
// unparsable one INVALID_ARGUMENT with a message (server/protocol.h). Each Generate stream is a
// GenerateReactor (server/generate_reactor.h). Request ids are scoped to the caller's tenant
// (server/auth.h). Thread-safe.
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
  std::vector<std::string> api_keys;  // empty: no authentication (one tenant, "anonymous")
  ServerMetrics* metrics = nullptr;   // optional; must outlive the service
  // Unparsable requests are logged at most once per interval (with the count suppressed).
  std::chrono::milliseconds parse_error_log_interval{10000};
};

class PumpThread;  // server/generate_reactor.h

using GenerationBase = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_Abort<v1::Generation::WithRawCallbackMethod_GetModelInfo<
        v1::Generation::WithRawCallbackMethod_GetServerStats<v1::Generation::Service>>>>;

class GenerationService final : public GenerationBase {
 public:
  // `engine` must outlive the service and the gRPC server it is registered with.
  GenerationService(Engine* engine, ServiceOptions options, std::vector<SlaClass> classes);
  ~GenerationService() override;

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerStats(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;

  // The SLA classes requests are validated against (after Engine::update_sla_classes succeeded).
  void set_sla_classes(std::vector<SlaClass> classes);
  std::vector<SlaClass> sla_classes() const;
  // New Generate calls get UNAVAILABLE from now on (SIGTERM drain).
  void start_draining() { draining_.store(true); }
  int32_t active_streams() const { return active_streams_.load(); }
  const std::atomic<int32_t>* active_streams_counter() const { return &active_streams_; }

  // Used by the reactors.
  Engine* engine() const { return engine_; }
  ServerMetrics* metrics() const { return options_.metrics; }
  std::weak_ptr<PumpThread> pump_thread() const { return pump_thread_; }
  // Gives back a stream slot of the server and of `tenant` (taken by Generate).
  void stream_closed(const std::string& tenant);

 private:
  RequestLimits limits() const;
  // Counts one more open stream of `tenant`: its open streams, this one included.
  int32_t tenant_stream_opened(const std::string& tenant);
  // Authenticates the call, then parses `bytes` into `message`: the caller's tenant, or
  // UNAUTHENTICATED / INVALID_ARGUMENT (counted and reported through parse_errors_).
  StatusOr<std::string> accept(grpc::CallbackServerContext* context, const char* method,
                               const grpc::ByteBuffer& bytes,
                               google::protobuf::MessageLite* message);
  // Finishes a unary call: `response` serialized into `out` when `status` is OK.
  grpc::ServerUnaryReactor* finish_unary(grpc::CallbackServerContext* context, Status status,
                                         const google::protobuf::MessageLite* response,
                                         grpc::ByteBuffer* out);

  Engine* const engine_;
  const ServiceOptions options_;
  const ApiKeyAuth auth_;
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
};

}  // namespace kvsplit::server
