#include "server/generation_service.h"

#include <fmt/format.h>

#include "common/escape.h"
#include "common/random_id.h"
#include "server/generate_reactor.h"

namespace kvsplit::server {

GenerationService::~GenerationService() = default;

GenerationService::GenerationService(Engine* engine, ServiceOptions options,
                                     std::vector<SlaClass> classes)
    : engine_(engine),
      options_(std::move(options)),
      auth_(options_.api_keys),
      model_info_(engine->model_info()),
      parse_errors_(options_.parse_error_log_interval),
      classes_(std::move(classes)),
      pump_thread_(std::make_shared<PumpThread>()) {}

void GenerationService::set_sla_classes(std::vector<SlaClass> classes) {
  std::lock_guard<std::mutex> lock(mu_);
  classes_ = std::move(classes);
}

std::vector<SlaClass> GenerationService::sla_classes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return classes_;
}

RequestLimits GenerationService::limits() const {
  RequestLimits l;
  l.vocab_size = model_info_.vocab_size;
  l.max_context = model_info_.max_context;
  l.max_prompt_bytes = options_.max_prompt_bytes;
  l.max_tokens_limit = options_.max_tokens_limit;
  l.default_max_tokens = options_.default_max_tokens;
  std::lock_guard<std::mutex> lock(mu_);
  for (const SlaClass& c : classes_) l.class_names.push_back(c.name);
  return l;
}

StatusOr<std::string> GenerationService::accept(grpc::CallbackServerContext* context,
                                                const char* method, const grpc::ByteBuffer& bytes,
                                                google::protobuf::MessageLite* message) {
  KVSPLIT_ASSIGN_OR_RETURN(std::string tenant, auth_.authenticate(*context));
  Status parsed = parse_message(bytes, message);
  if (!parsed.ok()) {
    if (options_.metrics) options_.metrics->count_parse_error(method);
    parse_errors_.report(fmt::format(
        "unparsable kvsplit.v1.Generation/{} request ({} bytes) from "
        "{} (tenant {}): {}",
        method, bytes.Length(), escape_for_message(context->peer()), tenant, parsed.message()));
    return parsed;
  }
  return tenant;
}

grpc::ServerUnaryReactor* GenerationService::finish_unary(
    grpc::CallbackServerContext* context, Status status,
    const google::protobuf::MessageLite* response, grpc::ByteBuffer* out) {
  if (status.ok()) status = serialize_message(*response, out);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(to_grpc(status));
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* bytes) {
  v1::GenerateRequest request;
  StatusOr<std::string> tenant = accept(context, "Generate", *bytes, &request);
  // Only an authenticated call takes a stream slot (released as the call finishes): calls refused
  // by authentication must not push other tenants' calls over the limit.
  const bool counted = tenant.ok();
  const int32_t open = counted ? active_streams_.fetch_add(1) + 1 : 0;
  const int32_t tenant_open = counted ? tenant_stream_opened(*tenant) : 0;
  StatusOr<Request> engine_request = unavailable("unreachable");
  if (!tenant.ok()) {
    engine_request = tenant.status();
  } else if (draining_.load()) {
    engine_request = unavailable("server is draining; not accepting new requests");
  } else if (open > options_.max_concurrent_streams) {
    engine_request =
        resource_exhausted("server is at its limit of " +
                           std::to_string(options_.max_concurrent_streams) + " concurrent streams");
  } else if (options_.max_streams_per_tenant > 0 && tenant_open > options_.max_streams_per_tenant) {
    engine_request =
        resource_exhausted(fmt::format("tenant {} is at its limit of {} concurrent streams "
                                       "(server.max_streams_per_tenant)",
                                       *tenant, options_.max_streams_per_tenant));
  } else {
    engine_request = to_engine_request(request, limits());
    if (engine_request.ok()) {
      engine_request->tenant = *tenant;
      // Random, with a prefix clients may not use: never a client's id, never predictable.
      if (engine_request->request_id.empty())
        engine_request->request_id = random_id(kServerIdPrefix);
    }
  }
  return start_generate(this, context, std::move(engine_request),
                        counted ? std::optional<std::string>(*tenant) : std::nullopt);
}

int32_t GenerationService::tenant_stream_opened(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(slots_mu_);
  return ++tenant_streams_[tenant];
}

void GenerationService::stream_closed(const std::string& tenant) {
  active_streams_.fetch_sub(1);
  std::lock_guard<std::mutex> lock(slots_mu_);
  auto it = tenant_streams_.find(tenant);
  if (it != tenant_streams_.end() && --it->second <= 0) tenant_streams_.erase(it);
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* bytes,
                                                   grpc::ByteBuffer* out) {
  v1::AbortRequest request;
  v1::AbortResponse response;
  StatusOr<std::string> tenant = accept(context, "Abort", *bytes, &request);
  if (!tenant.ok()) return finish_unary(context, tenant.status(), nullptr, out);
  if (request.request_id().empty()) {
    return finish_unary(context, invalid_argument("request_id: must not be empty"), nullptr, out);
  }
  // Another tenant's request is not found: the answer is the same as for an unknown id.
  response.set_aborted(engine_->cancel(*tenant, request.request_id()));
  return finish_unary(context, ok_status(), &response, out);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* bytes,
                                                          grpc::ByteBuffer* out) {
  v1::GetModelInfoRequest request;
  v1::GetModelInfoResponse response;
  StatusOr<std::string> tenant = accept(context, "GetModelInfo", *bytes, &request);
  if (tenant.ok()) fill_model_info(model_info_, limits(), &response);
  return finish_unary(context, tenant.status(), &response, out);
}

grpc::ServerUnaryReactor* GenerationService::GetServerStats(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* bytes,
                                                            grpc::ByteBuffer* out) {
  v1::GetServerStatsRequest request;
  v1::GetServerStatsResponse response;
  StatusOr<std::string> tenant = accept(context, "GetServerStats", *bytes, &request);
  if (tenant.ok()) fill_server_stats(engine_->stats(), sla_classes(), active_streams(), &response);
  return finish_unary(context, tenant.status(), &response, out);
}

}  // namespace kvsplit::server
