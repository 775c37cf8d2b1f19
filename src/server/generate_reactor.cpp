#include "server/generate_reactor.h"

#include <chrono>

#include "common/log.h"
#include "common/utf8.h"
#include "server/convert.h"
#include "server/generation_service.h"
#include "server/protocol.h"

namespace kvsplit::server {
namespace {

constexpr int kMaxTokensPerMessage = 256;  // bounds one response when a consumer falls behind
// A call cancelled this close to its deadline (or after it) counts as DEADLINE_EXCEEDED: when the
// client's deadline fires first, its cancel reaches the server just before the server's own
// deadline does (the server's copy of the deadline is later by the transfer time).
constexpr auto kDeadlineGrace = std::chrono::milliseconds(100);

const char* code_name(grpc::StatusCode code) {
  return status_code_name(static_cast<StatusCode>(code)).data();
}

void post_pump(const std::weak_ptr<PumpThread>& pumps,
               const std::weak_ptr<GenerateReactor>& reactor) {
  if (auto p = pumps.lock()) p->post(reactor);
}

}  // namespace

// One Generate call. Owned by itself (self_) from creation until OnDone; the engine's notifier
// holds only a weak_ptr, so a late event after the call ended is dropped safely.
class GenerateReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(GenerationService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  static GenerateReactor* start(GenerationService* service, grpc::CallbackServerContext* context,
                                StatusOr<Request> engine_request, std::optional<std::string> slot) {
    auto r = std::make_shared<GenerateReactor>(service, context);
    r->self_ = r;
    r->slot_ = std::move(slot);
    if (!engine_request.ok()) {
      r->finish_now(to_grpc(engine_request.status()));
      return r.get();
    }
    r->want_logprobs_ = engine_request->top_logprobs > 0;
    if (ServerMetrics* m = service->metrics())
      r->histograms_ = m->histograms(engine_request->sla_class);
    const std::string tenant = engine_request->tenant;
    auto handle = service->engine()->submit(std::move(engine_request).value());
    if (!handle.ok()) {
      r->finish_now(to_grpc(handle.status()));
      return r.get();
    }
    {
      std::lock_guard<std::mutex> lock(r->mu_);
      r->handle_ = *handle;
      r->request_id_ = handle->request_id();
      r->tenant_ = tenant;
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_slot_locked();  // every path finishes first; this only makes sure
    }
    if (service_->metrics()) service_->metrics()->count_call(code_name(final_code_));
    auto keep = std::move(self_);  // destroyed when this returns
  }

  // Drains queued events into one message and starts its write, unless a write is in flight
  // (OnWriteDone calls back here). gRPC operations are started outside mu_.
  void pump() {
    std::unique_lock<std::mutex> lock(mu_);
    if (write_in_flight_ || finish_called_ || !submitted_) return;
    if (broken_) {
      finish_called_ = true;
      release_slot_locked();
      const bool deadline = deadline_passed();
      final_code_ = deadline ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED;
      lock.unlock();
      Finish(grpc::Status(final_code_, deadline ? "deadline exceeded; request aborted"
                                                : "call cancelled; request aborted"));
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
      text_.append(ev.text);
      if (ev.final) {
        final_seen_ = true;
        set_final_fields(ev, &resp_);
        // A request aborted by the server side (Abort RPC) ends normally with finish_reason
        // CANCELLED; only real failures (a drain's cut-off included) end with an error status.
        final_status = ev.finish_reason == FinishReason::kCancelled &&
                               ev.status.code() == StatusCode::kCancelled
                           ? grpc::Status::OK
                           : to_grpc(ev.status);
        if (histograms_.e2e) ServerMetrics::observe_request(histograms_, ev);
        break;
      }
    }
    if (!got) return;
    // Event text is whole characters already (StreamDecoder, StopChecker); proto3 strings must be
    // valid UTF-8, so anything else would be a bug: replaced by U+FFFD rather than sent.
    std::string text;
    utf8::append_valid(text_, /*final=*/true, text);
    text_.clear();
    resp_.set_text(std::move(text));
    if (Status st = serialize_message(resp_, &out_); !st.ok()) {
      KVSPLIT_LOG_ERROR("Generate {}: {}", request_id_, st.message());
      broken_ = true;
      lock.unlock();
      abort_in_engine();
      pump();
      return;
    }
    write_in_flight_ = true;
    if (final_seen_) {
      finish_called_ = true;
      release_slot_locked();
      final_code_ = final_status.error_code();
      lock.unlock();
      StartWriteAndFinish(&out_, grpc::WriteOptions(), final_status);
    } else {
      lock.unlock();
      StartWrite(&out_);
    }
  }

 private:
  void finish_now(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_code_ = status.error_code();
      finish_called_ = true;
      release_slot_locked();
    }
    Finish(status);
  }

  // The call's stream slot goes back as it finishes, not at OnDone, which gRPC may run after the
  // client has its status: a client calling one request at a time would otherwise find its
  // previous call still counted against server.max_concurrent_streams.
  void release_slot_locked() {
    if (!slot_) return;
    service_->stream_closed(*slot_);
    slot_.reset();
  }

  // Cancels this stream's own request only: by the time a cancel arrives its request may have
  // ended (final event queued, not yet read) and the tenant may have reused the id.
  void abort_in_engine() {
    std::string tenant;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!submitted_ || final_seen_ || aborted_) return;
      aborted_ = true;
      tenant = tenant_;
    }
    service_->engine()->cancel(tenant, handle_);
  }

  bool deadline_passed() const {
    const auto deadline = context_->deadline();
    return deadline != std::chrono::system_clock::time_point::max() &&
           std::chrono::system_clock::now() + kDeadlineGrace >= deadline;
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
  // The tenant whose stream slot the call holds (none: it took none): set before gRPC can call
  // OnDone, then under mu_.
  std::optional<std::string> slot_;
  std::shared_ptr<GenerateReactor> self_;
  std::mutex mu_;
  RequestHandle handle_;  // guarded by mu_ until submitted_, then read-only
  std::string request_id_;
  std::string tenant_;
  ServerMetrics::ClassHistograms histograms_;  // set before the first event; null without metrics
  bool want_logprobs_ = false;
  bool submitted_ = false;  // guarded by mu_ (all flags below too)
  bool write_in_flight_ = false;
  bool finish_called_ = false;
  bool final_seen_ = false;
  bool broken_ = false;  // cancelled, deadline passed, or a write failed
  bool aborted_ = false;
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  v1::GenerateResponse resp_;  // the message being built; touched only between writes
  grpc::ByteBuffer out_;       // resp_ serialized: the write in flight
  std::string text_;           // text of the events not yet written
  std::chrono::steady_clock::time_point last_token_time_;
  bool have_last_ = false;
};

PumpThread::PumpThread() : thread_([this] { run(); }) {}

PumpThread::~PumpThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void PumpThread::post(std::weak_ptr<GenerateReactor> reactor) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = sleeping_;
    sleeping_ = false;  // one signal per sleep is enough
    queue_.push_back(std::move(reactor));
  }
  if (wake) cv_.notify_one();
}

void PumpThread::run() {
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

grpc::ServerWriteReactor<grpc::ByteBuffer>* start_generate(GenerationService* service,
                                                           grpc::CallbackServerContext* context,
                                                           StatusOr<Request> engine_request,
                                                           std::optional<std::string> slot) {
  return GenerateReactor::start(service, context, std::move(engine_request), std::move(slot));
}

}  // namespace kvsplit::server
