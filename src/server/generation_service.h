// kvsplit.v1.Generation on the gRPC callback API: one reactor per Generate stream, woken by the
// engine through RequestHandle::set_notifier. The notifier only queues the reactor for the
// service's pump thread (engine threads never build messages or call into gRPC); the pump drains
// every queued event into one message per write. A client cancel or deadline aborts the request
// in the engine at once (its KV is freed). Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/v1/generation.grpc.pb.h"
#include "server/convert.h"
#include "server/metrics.h"

namespace kvsplit::server {

struct ServiceOptions {
  int32_t max_concurrent_streams = 1024;  // open Generate calls; more -> RESOURCE_EXHAUSTED
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_tokens_limit = 8192;
  int32_t default_max_tokens = 16;
  std::vector<std::string> api_keys;  // empty: no authentication
  ServerMetrics* metrics = nullptr;   // optional; must outlive the service
};

class PumpThread;  // runs the reactors' pumps for engine notifications (generation_service.cpp)

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // `engine` must outlive the service and the gRPC server it is registered with.
  GenerationService(Engine* engine, ServiceOptions options, std::vector<SlaClass> classes);
  ~GenerationService() override;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetServerStats(grpc::CallbackServerContext* context,
                                           const v1::GetServerStatsRequest* request,
                                           v1::GetServerStatsResponse* response) override;

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
  void stream_closed() { active_streams_.fetch_sub(1); }

 private:
  // OK, or UNAUTHENTICATED when API keys are configured and the bearer token is not one of them.
  grpc::Status authenticate(const grpc::CallbackServerContext* context) const;
  RequestLimits limits() const;

  Engine* const engine_;
  const ServiceOptions options_;
  const ModelInfo model_info_;
  mutable std::mutex mu_;
  std::vector<SlaClass> classes_;  // guarded by mu_
  std::atomic<int32_t> active_streams_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};  // server-assigned request ids: "grpc-<n>"
  // Shared so that a notifier outliving the service finds it gone (weak_ptr) instead of dangling.
  std::shared_ptr<PumpThread> pump_thread_;
};

}  // namespace kvsplit::server
