#include "server/generation_service.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <thread>

#include "common/log.h"
#include "server/utf8.h"

namespace kvsplit::server {
namespace {

constexpr int kMaxTokensPerMessage = 256;  // bounds one response when a consumer falls behind

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

const char* code_name(grpc::StatusCode code) {
  return status_code_name(static_cast<StatusCode>(code)).data();
}

class GenerateReactor;
// Queues `reactor` for a pump() on the service's pump thread; dropped when either is gone.
void post_pump(const std::weak_ptr<PumpThread>& pumps,
               const std::weak_ptr<GenerateReactor>& reactor);

// One Generate call. Owned by itself (self_) from creation until OnDone; the engine's notifier
// holds only a weak_ptr, so a late event after the call ended is dropped safely.
class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(GenerationService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  static GenerateReactor* start(GenerationService* service, grpc::CallbackServerContext* context,
                                const v1::GenerateRequest& request,
                                StatusOr<Request> engine_request) {
    auto r = std::make_shared<GenerateReactor>(service, context);
    r->self_ = r;
    if (!engine_request.ok()) {
      r->finish_now(to_grpc(engine_request.status()));
      return r.get();
    }
    r->want_logprobs_ = engine_request->top_logprobs > 0;
    if (ServerMetrics* m = service->metrics())
      r->histograms_ = m->histograms(engine_request->sla_class);
    auto handle = service->engine()->submit(std::move(engine_request).value());
    if (!handle.ok()) {
      r->finish_now(to_grpc(handle.status()));
      return r.get();
    }
    {
      std::lock_guard<std::mutex> lock(r->mu_);
      r->handle_ = *handle;
      r->request_id_ = handle->request_id();
      r->submitted_ = true;
    }
    // Engine threads only enqueue the reactor; the pump thread builds and starts the writes.
    r->handle_.set_notifier([pumps = service->pump_thread(),
                             weak = std::weak_ptr<GenerateReactor>(r)] { post_pump(pumps, weak); });
    return r.get();
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok) broken_ = true;
    }
    if (!ok) abort_in_engine();
    pump();
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = true;
    }
    abort_in_engine();
    pump();
  }

  void OnDone() override {
    service_->stream_closed();
    if (service_->metrics()) service_->metrics()->count_call(code_name(final_code_));
    auto keep = std::move(self_);  // destroyed when this returns
  }

 private:
  friend class ::kvsplit::server::PumpThread;

  void finish_now(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_code_ = status.error_code();
      finish_called_ = true;
    }
    Finish(status);
  }

  void abort_in_engine() {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!submitted_ || final_seen_ || aborted_) return;
      aborted_ = true;
      id = request_id_;
    }
    service_->engine()->cancel("", id);  // one tenant until the server sets them
  }

  // Drains queued events into one message and starts its write, unless a write is in flight
  // (OnWriteDone calls back here). gRPC operations are started outside mu_.
  void pump() {
    std::unique_lock<std::mutex> lock(mu_);
    if (write_in_flight_ || finish_called_ || !submitted_) return;
    if (broken_) {
      finish_called_ = true;
      final_code_ = grpc::StatusCode::CANCELLED;
      lock.unlock();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled; request aborted"));
      return;
    }
    resp_.Clear();
    resp_.set_request_id(request_id_);
    TokenEvent ev;
    bool got = false;
    grpc::Status final_status;
    while (resp_.token_ids_size() < kMaxTokensPerMessage && handle_.try_next(&ev)) {
      got = true;
      observe_itl(ev);
      append_tokens(ev, want_logprobs_, &resp_);
      text_.push(ev.text);
      if (ev.final) {
        final_seen_ = true;
        set_final_fields(ev, &resp_);
        // A request aborted by the server side (Abort RPC, drain) ends normally with
        // finish_reason CANCELLED; only real failures end the call with an error status.
        final_status = ev.finish_reason == FinishReason::kCancelled &&
                               ev.status.code() == StatusCode::kCancelled
                           ? grpc::Status::OK
                           : to_grpc(ev.status);
        if (histograms_.e2e) ServerMetrics::observe_request(histograms_, ev);
        break;
      }
    }
    if (!got) return;
    resp_.set_text(text_.take(/*flush=*/final_seen_));
    write_in_flight_ = true;
    if (final_seen_) {
      finish_called_ = true;
      final_code_ = final_status.error_code();
      lock.unlock();
      StartWriteAndFinish(&resp_, grpc::WriteOptions(), final_status);
    } else {
      lock.unlock();
      StartWrite(&resp_);
    }
  }

  // Inter-token gaps: an event of n tokens after a gap g counts as n gaps of g / n.
  void observe_itl(const TokenEvent& ev) {
    if (ev.token_ids.empty()) return;
    if (have_last_ && histograms_.itl) {
      const double gap = std::chrono::duration<double>(ev.time - last_token_time_).count();
      ServerMetrics::observe_itl(histograms_, gap / static_cast<double>(ev.token_ids.size()),
                                 ev.token_ids.size());
    }
    last_token_time_ = ev.time;
    have_last_ = true;
  }

  GenerationService* const service_;
  grpc::CallbackServerContext* const context_;
  std::shared_ptr<GenerateReactor> self_;
  std::mutex mu_;
  RequestHandle handle_;  // guarded by mu_ until submitted_, then read-only
  std::string request_id_;
  ServerMetrics::ClassHistograms histograms_;  // set before the first event; null without metrics
  bool want_logprobs_ = false;
  bool submitted_ = false;  // guarded by mu_ (all flags below too)
  bool write_in_flight_ = false;
  bool finish_called_ = false;
  bool final_seen_ = false;
  bool broken_ = false;  // cancelled, deadline passed, or a write failed
  bool aborted_ = false;
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  v1::GenerateResponse resp_;  // the message being written; touched only between writes
  Utf8Joiner text_;
  std::chrono::steady_clock::time_point last_token_time_;
  bool have_last_ = false;
};

}  // namespace

// Runs GenerateReactor::pump() for the engine's event notifications on one thread of its own, so
// an engine thread only takes a lock and appends a pointer per event (the condition variable is
// signalled only when the thread sleeps); building messages and starting gRPC writes overlap with
// the engine's next step. Duplicate entries are harmless: pump() drains everything queued.
class PumpThread {
 public:
  PumpThread() : thread_([this] { run(); }) {}
  ~PumpThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void post(std::weak_ptr<GenerateReactor> reactor) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake = sleeping_;
      sleeping_ = false;  // one signal per sleep is enough
      queue_.push_back(std::move(reactor));
    }
    if (wake) cv_.notify_one();
  }

 private:
  void run() {
    std::vector<std::weak_ptr<GenerateReactor>> batch;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (queue_.empty() && !stop_) {
        sleeping_ = true;
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        sleeping_ = false;
      }
      if (stop_) return;  // the gRPC server is shut down: no reactor is left to pump
      batch.swap(queue_);
      lock.unlock();
      for (auto& weak : batch) {
        if (auto r = weak.lock()) r->pump();
      }
      batch.clear();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<GenerateReactor>> queue_;  // guarded by mu_
  bool sleeping_ = false;                              // guarded by mu_
  bool stop_ = false;                                  // guarded by mu_
  std::thread thread_;                                 // last: starts after the fields above
};

namespace {
void post_pump(const std::weak_ptr<PumpThread>& pumps,
               const std::weak_ptr<GenerateReactor>& reactor) {
  if (auto p = pumps.lock()) p->post(reactor);
}
}  // namespace

GenerationService::~GenerationService() = default;

GenerationService::GenerationService(Engine* engine, ServiceOptions options,
                                     std::vector<SlaClass> classes)
    : engine_(engine),
      options_(std::move(options)),
      model_info_(engine->model_info()),
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

grpc::Status GenerationService::authenticate(const grpc::CallbackServerContext* context) const {
  if (options_.api_keys.empty()) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end())
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <key>' metadata");
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view key = value.substr(kPrefix.size());
    bool match = false;
    for (const std::string& k : options_.api_keys) match |= constant_time_equal(key, k);
    if (match) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid API key");
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  const int32_t open = active_streams_.fetch_add(1) + 1;  // released in OnDone
  StatusOr<Request> engine_request = unavailable("unreachable");
  if (grpc::Status auth = authenticate(context); !auth.ok()) {
    engine_request = Status(static_cast<StatusCode>(auth.error_code()), auth.error_message());
  } else if (draining_.load()) {
    engine_request = unavailable("server is draining; not accepting new requests");
  } else if (open > options_.max_concurrent_streams) {
    engine_request =
        resource_exhausted("server is at its limit of " +
                           std::to_string(options_.max_concurrent_streams) + " concurrent streams");
  } else {
    engine_request = to_engine_request(*request, limits());
    // Ids are assigned here, from one atomic counter, so concurrent calls never share one.
    if (engine_request.ok() && engine_request->request_id.empty())
      engine_request->request_id = "grpc-" + std::to_string(next_id_.fetch_add(1));
  }
  return GenerateReactor::start(this, context, *request, std::move(engine_request));
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* context,
                                                   const v1::AbortRequest* request,
                                                   v1::AbortResponse* response) {
  auto* reactor = context->DefaultReactor();
  grpc::Status auth = authenticate(context);
  if (!auth.ok()) {
    reactor->Finish(auth);
  } else if (request->request_id().empty()) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty"));
  } else {
    response->set_aborted(engine_->cancel("", request->request_id()));
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::GetModelInfoResponse* response) {
  auto* reactor = context->DefaultReactor();
  grpc::Status auth = authenticate(context);
  if (auth.ok()) fill_model_info(model_info_, limits(), response);
  reactor->Finish(auth);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetServerStats(grpc::CallbackServerContext* context,
                                                            const v1::GetServerStatsRequest*,
                                                            v1::GetServerStatsResponse* response) {
  auto* reactor = context->DefaultReactor();
  grpc::Status auth = authenticate(context);
  if (auth.ok()) fill_server_stats(engine_->stats(), sla_classes(), active_streams(), response);
  reactor->Finish(auth);
  return reactor;
}

}  // namespace kvsplit::server
