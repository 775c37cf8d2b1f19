#include "server/generation_service.h"

#include <fmt/format.h>

#include <functional>

#include "common/escape.h"
#include "common/random_id.h"
#include "server/generate_reactor.h"
#include "server/tenant_policy.h"

namespace kvsplit::server {

namespace {

// One unary call on a raw bidi stream: reads its one request message, then the half-close
// (INVALID_ARGUMENT for no message or a second one), and answers with `handler`'s response. A
// call refused from its metadata (`tenant` an error) is finished at once, reading nothing; one
// whose message and half-close have not arrived within the timer's limit ends DEADLINE_EXCEEDED.
// Owned by itself (self_) until OnDone; the timer holds only a weak_ptr.
class UnaryReactor final : public RawBidiReactor, public MessageWaiter {
 public:
  using Handler = std::function<Status(const grpc::ByteBuffer& request, const std::string& tenant,
                                       grpc::ByteBuffer* response)>;

  UnaryReactor(MessageTimer* timer, grpc::CallbackServerContext* context, Handler handler)
      : timer_(timer), context_(context), handler_(std::move(handler)) {}

  static RawBidiReactor* start(MessageTimer* timer, grpc::CallbackServerContext* context,
                               StatusOr<std::string> tenant, Handler handler) {
    auto r = std::make_shared<UnaryReactor>(timer, context, std::move(handler));
    r->self_ = r;
    if (!tenant.ok()) {
      r->finish(to_grpc(tenant.status()));
      return r.get();
    }
    r->tenant_ = *std::move(tenant);
    // Under mu_, so that end_waiting cannot finish the call before its read is started (gRPC
    // never runs OnReadDone inline from StartRead).
    std::lock_guard<std::mutex> lock(r->mu_);
    r->timer_id_ = timer->start(r, /*generate=*/false);
    r->StartRead(&r->request_);
    return r.get();
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (finish_called_) return;  // ended while waiting (end_waiting)
    if (!have_request_ && ok) {
      have_request_ = true;
      StartRead(&extra_);  // the half-close, or a second message; under mu_ as in start()
      return;
    }
    done_reading_ = true;
    timer_->done(timer_id_);
    const bool had_request = have_request_;
    lock.unlock();
    // A cancelled call's status reaches no one; its read fails like a half-close.
    if (context_->IsCancelled()) {
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
    } else if (!had_request) {
      finish(to_grpc(invalid_argument(kNoRequestMessage)));
    } else if (ok) {
      finish(to_grpc(invalid_argument(kSecondRequestMessage)));
    } else {
      const Status status = handler_(request_, tenant_, &response_);
      request_.Clear();
      if (!status.ok()) {
        finish(to_grpc(status));
      } else if (claim_finish()) {
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      }
    }
  }

  bool end_waiting(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_called_ || done_reading_) return false;
      finish_called_ = true;
    }
    Finish(status);
    return true;
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      timer_->done(timer_id_);
    }
    auto keep = std::move(self_);  // destroyed when this returns (or by the timer's last use)
  }

 private:
  // Whether the caller is the one to finish the call (once only).
  bool claim_finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_called_) return false;
    finish_called_ = true;
    return true;
  }
  void finish(const grpc::Status& status) {
    if (claim_finish()) Finish(status);
  }

  MessageTimer* const timer_;
  grpc::CallbackServerContext* const context_;
  Handler handler_;
  std::shared_ptr<UnaryReactor> self_;
  std::string tenant_;  // set before the first read, then read-only
  std::mutex mu_;
  uint64_t timer_id_ = 0;      // guarded by mu_ (the flags below too)
  bool have_request_ = false;  // the first read brought a message
  bool done_reading_ = false;  // the last read completed: no longer waiting
  bool finish_called_ = false;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer extra_;
  grpc::ByteBuffer response_;
};

// The tenant of an authenticated caller (UnaryReactor::start), or the refusal.
StatusOr<std::string> tenant_of(StatusOr<Caller> caller) {
  if (!caller.ok()) return caller.status();
  return std::move(caller->tenant);
}

}  // namespace

GenerationService::~GenerationService() = default;

GenerationService::GenerationService(Engine* engine, ServiceOptions options,
                                     std::vector<SlaClass> classes)
    : engine_(engine),
      options_(std::move(options)),
      auth_(std::make_shared<const ApiKeyAuth>(options_.api_keys)),
      model_info_(engine->model_info()),
      parse_errors_(options_.parse_error_log_interval),
      classes_(std::move(classes)),
      pump_thread_(std::make_shared<PumpThread>()),
      message_timer_(std::make_unique<MessageTimer>(options_.request_message_timeout)) {
  // In generation.proto's order; the names must outlive the service (gRPC keeps the pointers).
  add_method(0, "/kvsplit.v1.Generation/Generate", &GenerationService::Generate);
  add_method(1, "/kvsplit.v1.Generation/Abort", &GenerationService::Abort);
  add_method(2, "/kvsplit.v1.Generation/GetModelInfo", &GenerationService::GetModelInfo);
  add_method(3, "/kvsplit.v1.Generation/GetServerStats", &GenerationService::GetServerStats);
}

void GenerationService::add_method(
    int index, const char* name,
    RawBidiReactor* (GenerationService::*handler)(grpc::CallbackServerContext*)) {
  // BIDI_STREAMING: gRPC reads no message before the handler runs (a unary or server-streaming
  // method's first message is read, whole, before it).
  AddMethod(new grpc::internal::RpcServiceMethod(name, grpc::internal::RpcMethod::BIDI_STREAMING,
                                                 /*handler=*/nullptr));
  MarkMethodRawCallback(index,
                        new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                            [this, handler](grpc::CallbackServerContext* context) {
                              return (this->*handler)(context);
                            }));
}

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

Status GenerationService::parse_request(const grpc::CallbackServerContext& context,
                                        const char* method, const std::string& tenant,
                                        const grpc::ByteBuffer& bytes,
                                        google::protobuf::MessageLite* message) {
  Status parsed = parse_message(bytes, message);
  if (!parsed.ok()) {
    if (options_.metrics) options_.metrics->count_parse_error(method);
    parse_errors_.report(fmt::format(
        "unparsable kvsplit.v1.Generation/{} request ({} bytes) from "
        "{} (tenant {}): {}",
        method, bytes.Length(), escape_for_message(context.peer()), tenant, parsed.message()));
  }
  return parsed;
}

std::shared_ptr<const ApiKeyAuth> GenerationService::auth() const {
  std::lock_guard<std::mutex> lock(auth_mu_);
  return auth_;
}

StatusOr<Caller> GenerationService::admit_stream(const grpc::CallbackServerContext& context,
                                                 const std::shared_ptr<GenerateReactor>& stream) {
  std::shared_ptr<const ApiKeyAuth> keys = auth();
  KVSPLIT_ASSIGN_OR_RETURN(Caller caller, keys->authenticate(context));
  const std::string& tenant = caller.tenant;
  // Only an authenticated call takes a stream slot: calls refused by authentication must not push
  // other tenants' calls over the limit.
  const int32_t open = active_streams_.fetch_add(1) + 1;
  const int32_t tenant_open = tenant_stream_opened(tenant);
  // The tenant's stream limit under `policy` (its key's, or the server's per-tenant one).
  auto over_tenant_limit = [&](const config::KeyPolicy& policy) {
    const int32_t limit = stream_limit(policy, options_.max_streams_per_tenant);
    return limit > 0 && tenant_open > limit
               ? stream_limit_error(policy, options_.max_streams_per_tenant, tenant)
               : ok_status();
  };
  Status refused = ok_status();
  if (draining_.load()) {
    refused = unavailable("server is draining; not accepting new requests");
  } else if (open > options_.max_concurrent_streams) {
    refused =
        resource_exhausted("server is at its limit of " +
                           std::to_string(options_.max_concurrent_streams) + " concurrent streams");
  } else {
    refused = over_tenant_limit(*caller.policy);
  }
  if (refused.ok()) {
    // Registered under the key set it was admitted with: a reload since then is checked again,
    // and the call takes its key's policy from the new set.
    std::lock_guard<std::mutex> lock(auth_mu_);
    if (auth_ != keys) {
      if (StatusOr<Caller> again = auth_->authenticate(context); !again.ok()) {
        refused = again.status();
      } else {
        caller.policy = again->policy;                // the same key: the same tenant
        refused = over_tenant_limit(*caller.policy);  // the reload may have lowered it
      }
    }
    if (refused.ok()) open_streams_[stream.get()] = OpenStream{tenant, stream};
  }
  if (!refused.ok()) {
    stream_closed(tenant);
    return refused;
  }
  return caller;
}

StatusOr<Request> GenerationService::engine_request(const v1::GenerateRequest& request,
                                                    const Caller& caller) const {
  const RequestLimits l = limits();
  KVSPLIT_ASSIGN_OR_RETURN(Request out, to_engine_request(request, l));
  // The key's policy as it is now, not as it was when the call was admitted: a call held open
  // without its message must not keep rights a reload took away. A key removed since then has
  // none (revoke ends such calls; this covers the message that races it).
  std::shared_ptr<const config::KeyPolicy> policy = auth()->policy_of_tenant(caller.tenant);
  if (policy == nullptr)
    return Status(StatusCode::kUnauthenticated,
                  "API key revoked (server.api_keys reloaded); request aborted");
  KVSPLIT_RETURN_IF_ERROR(
      apply_key_policy(*policy, !request.sla_class().empty(), l.class_names, &out));
  out.tenant = caller.tenant;
  // Random, with a prefix clients may not use: never a client's id, never predictable.
  if (out.request_id.empty()) out.request_id = random_id(kServerIdPrefix);
  return out;
}

RawBidiReactor* GenerationService::Generate(grpc::CallbackServerContext* context) {
  return start_generate(this, context);
}

void GenerationService::stream_done(const GenerateReactor* stream) {
  std::lock_guard<std::mutex> lock(auth_mu_);
  open_streams_.erase(stream);
}

StatusOr<int> GenerationService::update_api_keys(const std::vector<config::ApiKey>& keys) {
  const std::shared_ptr<const ApiKeyAuth> old = auth();
  if (keys.empty() != !old->enabled()) {
    return failed_precondition(
        old->enabled() ? "removing every key would turn authentication off: needs a restart"
                       : "adding keys would turn authentication on: needs a restart");
  }
  auto fresh = std::make_shared<const ApiKeyAuth>(keys, old.get());
  std::vector<std::shared_ptr<GenerateReactor>> revoked;
  {
    std::lock_guard<std::mutex> lock(auth_mu_);
    auth_ = fresh;
    for (const auto& [ptr, open] : open_streams_) {
      if (fresh->has_tenant(open.tenant)) continue;
      if (auto r = open.reactor.lock()) revoked.push_back(std::move(r));
    }
  }
  // Calls finished already but not yet at OnDone are still registered: not counted.
  int ended = 0;
  for (const auto& r : revoked) ended += revoke_generate(r.get()) ? 1 : 0;
  return ended;
}

void GenerationService::start_draining() {
  draining_.store(true);
  // A call admitted before draining_ was set and timed after this sweep sees it
  // (GenerateReactor::start).
  message_timer_->end_generate(
      to_grpc(unavailable("server is draining; not accepting new requests")));
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

RawBidiReactor* GenerationService::Abort(grpc::CallbackServerContext* context) {
  return UnaryReactor::start(
      message_timer_.get(), context, tenant_of(auth()->authenticate(*context)),
      [this, context](const grpc::ByteBuffer& bytes, const std::string& tenant,
                      grpc::ByteBuffer* out) -> Status {
        v1::AbortRequest request;
        KVSPLIT_RETURN_IF_ERROR(parse_request(*context, "Abort", tenant, bytes, &request));
        if (request.request_id().empty()) return invalid_argument("request_id: must not be empty");
        // Another tenant's request is not found: the answer is the same as for an unknown id.
        v1::AbortResponse response;
        response.set_aborted(engine_->cancel(tenant, request.request_id()));
        return serialize_message(response, out);
      });
}

RawBidiReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context) {
  return UnaryReactor::start(
      message_timer_.get(), context, tenant_of(auth()->authenticate(*context)),
      [this, context](const grpc::ByteBuffer& bytes, const std::string& tenant,
                      grpc::ByteBuffer* out) -> Status {
        v1::GetModelInfoRequest request;
        KVSPLIT_RETURN_IF_ERROR(parse_request(*context, "GetModelInfo", tenant, bytes, &request));
        v1::GetModelInfoResponse response;
        fill_model_info(model_info_, limits(), &response);
        return serialize_message(response, out);
      });
}

RawBidiReactor* GenerationService::GetServerStats(grpc::CallbackServerContext* context) {
  // Refused from the headers, as a bad key is: a key without server_stats reads no message.
  StatusOr<Caller> caller = auth()->authenticate(*context);
  if (caller.ok()) {
    if (Status allowed = check_server_stats_allowed(*caller->policy); !allowed.ok())
      caller = allowed;
  }
  return UnaryReactor::start(
      message_timer_.get(), context, tenant_of(std::move(caller)),
      [this, context](const grpc::ByteBuffer& bytes, const std::string& tenant,
                      grpc::ByteBuffer* out) -> Status {
        v1::GetServerStatsRequest request;
        KVSPLIT_RETURN_IF_ERROR(parse_request(*context, "GetServerStats", tenant, bytes, &request));
        v1::GetServerStatsResponse response;
        fill_server_stats(engine_->stats(), sla_classes(), active_streams(), &response);
        return serialize_message(response, out);
      });
}

}  // namespace kvsplit::server
