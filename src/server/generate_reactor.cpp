#include "server/generate_reactor.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <vector>

#include "common/log.h"
#include "common/utf8.h"
#include "server/convert.h"
#include "server/generation_service.h"
#include "server/protocol.h"

namespace kvsplit::server {
namespace {

constexpr int kMaxTokensPerMessage = 256;  // bounds one response when a consumer falls behind
// Prompt logprobs per message (GenerateResponse.prompt_logprobs): a long prompt's would exceed a
// client's 4 MiB default receive limit in one message.
constexpr size_t kMaxPromptLogprobsPerMessage = 256;
// Events a call takes from the engine before writing them: enough to pick one completion's run of
// tokens when several interleave (GenerateRequest.n), few enough to leave back-pressure to the
// engine (EngineConfig::max_unread_events).
constexpr size_t kMaxBufferedEvents = 512;
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
class GenerateReactor : public RawBidiReactor, public MessageWaiter {
 public:
  GenerateReactor(GenerationService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  // Admits the call from its metadata (finished at once when refused), then reads its message.
  static GenerateReactor* start(GenerationService* service, grpc::CallbackServerContext* context) {
    auto r = std::make_shared<GenerateReactor>(service, context);
    r->self_ = r;
    {
      // Under mu_ from before admit_stream publishes the call (a revoke() may reach it at once)
      // until its read is started (gRPC never runs OnReadDone inline from StartRead).
      std::unique_lock<std::mutex> lock(r->mu_);
      StatusOr<Caller> caller = service->admit_stream(*context, r);
      if (!caller.ok()) {
        lock.unlock();
        r->finish_now(to_grpc(caller.status()));
        return r.get();
      }
      r->slot_ = caller->tenant;
      r->caller_ = *std::move(caller);
      r->timer_id_ = service->message_timer()->start(r, /*generate=*/true);
      r->StartRead(&r->in_);
    }
    // A drain that began after admit_stream swept the timer before this call was in it.
    if (service->draining()) {
      r->end_waiting(to_grpc(unavailable("server is draining; not accepting new requests")));
    }
    return r.get();
  }

  // The first read brings the request; a second one the half-close (ok false) or a second
  // message, which ends the call with INVALID_ARGUMENT.
  void OnReadDone(bool ok) override {
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = !have_request_;
      have_request_ = true;
      if (first) service_->message_timer()->done(timer_id_);
    }
    if (first) {
      on_request(ok);
      return;
    }
    if (!ok) return;  // half-closed (or the call ended)
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = to_grpc(invalid_argument(kSecondRequestMessage));
      broken_ = true;
    }
    abort_in_engine();
    pump();
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

  // Ends the call with UNAUTHENTICATED: its key was revoked (GenerationService::update_api_keys).
  // Whether this ended it (false: it had finished already).
  bool revoke() {
    const grpc::Status revoked(grpc::StatusCode::UNAUTHENTICATED,
                               "API key revoked (server.api_keys reloaded); request aborted");
    bool waiting;  // for the request message: nothing else will finish the call
    bool submitted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_called_) return false;
      error_ = revoked;
      broken_ = true;
      waiting = !have_request_;
      submitted = submitted_;
    }
    if (waiting) {
      finish_now(revoked);
    } else if (submitted) {
      abort_in_engine();
      pump();
    }
    // Else on_request is between the message and the submission: it finds broken_ set.
    return true;
  }

  // Ends the call with `status` while it waits for its request message (MessageTimer: too long,
  // or a drain); whether it did.
  bool end_waiting(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_called_ || have_request_) return false;
      error_ = status;  // on_request finds the call broken when the message comes after all
      broken_ = true;
      final_code_ = status.error_code();
      finish_called_ = true;
      release_slot_locked();
    }
    Finish(status);
    return true;
  }

  void OnDone() override {
    service_->stream_done(this);
    {
      std::lock_guard<std::mutex> lock(mu_);
      service_->message_timer()->done(timer_id_);
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
      grpc::Status status;
      if (error_) {
        status = *error_;
      } else if (deadline_passed()) {
        status =
            grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded; request aborted");
      } else {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled; request aborted");
      }
      final_code_ = status.error_code();
      lock.unlock();
      Finish(status);
      return;
    }
    resp_.Clear();
    resp_.set_request_id(request_id_);
    // 1. What the engine has queued, up to a bound (the rest stays in its stream: back-pressure
    // sees a reader that is behind), sorted by completion (GenerateRequest.n).
    TokenEvent ev;
    while (!stream_ended_ && buffered_ < kMaxBufferedEvents && handle_.try_next(&ev)) {
      stream_ended_ = ev.last;
      const size_t i = static_cast<size_t>(std::max(0, ev.index));
      if (i >= pending_.size()) pending_.resize(i + 1);
      pending_[i].push_back(std::move(ev));
      ++buffered_;
    }
    // 2. One message: the prompt's logprobs first, in messages of their own; else the events of
    // the completion with the most buffered (the lowest index on ties), up to its final event.
    bool got = false;
    int index = -1;
    auto prompt_logprobs_chunk = [&] {
      const size_t end =
          std::min(prompt_lp_.size(), prompt_lp_sent_ + kMaxPromptLogprobsPerMessage);
      for (size_t i = prompt_lp_sent_; i < end; ++i)
        to_proto(prompt_lp_[i], resp_.add_prompt_logprobs());
      prompt_lp_sent_ = end;
      if (end == prompt_lp_.size()) {
        prompt_lp_.clear();
        prompt_lp_sent_ = 0;
      }
      got = true;
      index = prompt_lp_index_;
    };
    // A completion whose final event is pending goes first (its usage is not held back behind
    // others still generating); else the one with the most events buffered; the lowest index on
    // ties.
    size_t best = pending_.size();
    auto ahead = [&](size_t a, size_t b) {
      const bool fa = pending_[a].back().final, fb = pending_[b].back().final;
      return fa != fb ? fa : pending_[a].size() > pending_[b].size();
    };
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (!pending_[i].empty() && (best == pending_.size() || ahead(i, best))) best = i;
    }
    if (!prompt_lp_.empty()) {
      prompt_logprobs_chunk();
    } else if (best < pending_.size()) {
      std::deque<TokenEvent>& q = pending_[best];
      index = static_cast<int>(best);
      while (!q.empty() && resp_.token_ids_size() < kMaxTokensPerMessage) {
        TokenEvent& e = q.front();
        if (!e.prompt_logprobs.empty()) {
          if (got) break;  // they start a message
          prompt_lp_ = std::move(e.prompt_logprobs);
          e.prompt_logprobs.clear();
          prompt_lp_index_ = index;
          prompt_logprobs_chunk();  // its token follows them
          break;
        }
        got = true;
        observe_itl(e);
        append_tokens(e, want_logprobs_, &resp_);
        text_.append(e.text);
        const bool final = e.final;
        if (final) {
          set_final_fields(e, &resp_);
          // A request aborted by the server side (Abort RPC) ends normally with finish_reason
          // CANCELLED; only real failures (a drain's cut-off included) end with an error
          // status: the first one of its completions'.
          const grpc::Status status = e.finish_reason == FinishReason::kCancelled &&
                                              e.status.code() == StatusCode::kCancelled
                                          ? grpc::Status::OK
                                          : to_grpc(e.status);
          if (!status.ok() && completion_error_.ok()) completion_error_ = status;
          if (histograms_.e2e) ServerMetrics::observe_request(histograms_, e);
        }
        q.pop_front();
        --buffered_;
        if (final) break;  // the completion's last message
      }
    }
    // The call ends with the message that leaves nothing to send.
    last_seen_ = stream_ended_ && buffered_ == 0 && prompt_lp_.empty();
    if (!got) return;
    // Event text is whole characters already (StreamDecoder, StopChecker); proto3 strings must be
    // valid UTF-8, so anything else would be a bug: replaced by U+FFFD rather than sent.
    std::string text;
    utf8::append_valid(text_, /*final=*/true, text);
    text_.clear();
    resp_.set_text(std::move(text));
    resp_.set_index(static_cast<uint32_t>(index));
    if (Status st = serialize_message(resp_, &out_); !st.ok()) {
      KVSPLIT_LOG_ERROR("Generate {}: {}", request_id_, st.message());
      broken_ = true;
      lock.unlock();
      abort_in_engine();
      pump();
      return;
    }
    write_in_flight_ = true;
    if (last_seen_) {
      finish_called_ = true;
      release_slot_locked();
      final_code_ = completion_error_.error_code();
      lock.unlock();
      StartWriteAndFinish(&out_, grpc::WriteOptions(), completion_error_);
    } else {
      lock.unlock();
      StartWrite(&out_);
    }
  }

 private:
  // The request message arrived (`ok`), or the call was half-closed or ended before it.
  void on_request(bool ok) {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mu_);
      const bool broken = broken_;
      lock.unlock();
      // A cancelled call's status reaches no one; it is counted as what it is.
      if (broken || context_->IsCancelled()) {
        finish_now(grpc::Status(
            deadline_passed() ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED,
            "call ended before its request message"));
      } else {
        finish_now(to_grpc(invalid_argument(kNoRequestMessage)));
      }
      return;
    }
    if (std::optional<grpc::Status> ended = broken_status()) {
      finish_now(*ended);
      return;
    }
    v1::GenerateRequest request;
    Status parsed = service_->parse_request(*context_, "Generate", caller_.tenant, in_, &request);
    in_.Clear();
    if (!parsed.ok()) {
      finish_now(to_grpc(parsed));
      return;
    }
    StatusOr<Request> engine_request = service_->engine_request(request, caller_);
    if (!engine_request.ok()) {
      finish_now(to_grpc(engine_request.status()));
      return;
    }
    // Before the submission: once it is made, the pump thread may finish the call at any time.
    // A revoke() from here on is seen by submit().
    if (std::optional<grpc::Status> ended = broken_status()) {
      finish_now(*ended);
      return;
    }
    StartRead(&extra_);
    submit(*std::move(engine_request));
  }

  void submit(Request engine_request) {
    want_logprobs_ = engine_request.top_logprobs > 0;
    if (ServerMetrics* m = service_->metrics())
      histograms_ = m->histograms(engine_request.sla_class);
    auto handle = service_->engine()->submit(std::move(engine_request));
    if (!handle.ok()) {
      finish_now(to_grpc(handle.status()));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      handle_ = *handle;
      request_id_ = handle->request_id();
      submitted_ = true;
    }
    // Engine threads only enqueue the reactor; the pump thread builds and starts the writes.
    handle_.set_notifier([pumps = service_->pump_thread(), weak = std::weak_ptr<GenerateReactor>(
                                                               self_)] { post_pump(pumps, weak); });
    // A cancel or a second message that came while submitting: abort now (pump() finishes).
    abort_in_engine_if_broken();
    pump();
  }

  void abort_in_engine_if_broken() {
    bool broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken = broken_;
    }
    if (broken) abort_in_engine();
  }

  // The status to end a broken call with (none: not broken).
  std::optional<grpc::Status> broken_status() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) return std::nullopt;
    if (error_) return error_;
    return grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled");
  }

  // Finishes the call unless it was finished already.
  void finish_now(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_called_) return;
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
      if (!submitted_ || stream_ended_ || aborted_) return;
      aborted_ = true;
      tenant = caller_.tenant;
    }
    service_->engine()->cancel(tenant, handle_);
  }

  bool deadline_passed() const {
    const auto deadline = context_->deadline();
    return deadline != std::chrono::system_clock::time_point::max() &&
           std::chrono::system_clock::now() + kDeadlineGrace >= deadline;
  }

  // Inter-token gaps: an event of n tokens after a gap g counts as n gaps of g / n; each
  // completion's gaps between its own tokens.
  void observe_itl(const TokenEvent& ev) {
    if (ev.token_ids.empty() || ev.index < 0) return;
    const size_t i = static_cast<size_t>(ev.index);
    if (i >= last_token_time_.size()) last_token_time_.resize(i + 1);
    if (last_token_time_[i] && histograms_.itl) {
      const double gap = std::chrono::duration<double>(ev.time - *last_token_time_[i]).count();
      ServerMetrics::observe_itl(histograms_, gap / static_cast<double>(ev.token_ids.size()),
                                 ev.token_ids.size());
    }
    last_token_time_[i] = ev.time;
  }

  GenerationService* const service_;
  grpc::CallbackServerContext* const context_;
  // The tenant whose stream slot the call holds (none: it took none); guarded by mu_.
  std::optional<std::string> slot_;
  uint64_t timer_id_ = 0;  // the request message's time limit (MessageTimer); guarded by mu_
  std::shared_ptr<GenerateReactor> self_;
  std::mutex mu_;
  RequestHandle handle_;  // guarded by mu_ until submitted_, then read-only
  std::string request_id_;
  // The tenant and its key's policy as admitted: set before the first read, then read-only.
  Caller caller_;
  ServerMetrics::ClassHistograms histograms_;  // set before the first event; null without metrics
  bool want_logprobs_ = false;
  bool submitted_ = false;  // guarded by mu_ (all flags below too)
  bool write_in_flight_ = false;
  bool finish_called_ = false;
  bool last_seen_ =
      false;  // the message being written leaves nothing to send (every completion ended)
  bool broken_ = false;  // cancelled, deadline passed, a write failed, or a second message
  std::optional<grpc::Status> error_;  // the status to end a broken call with, when not CANCELLED
  bool have_request_ = false;          // the first read completed
  grpc::ByteBuffer in_;                // the request message; cleared once parsed
  grpc::ByteBuffer extra_;             // a second message, refused
  bool aborted_ = false;
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  v1::GenerateResponse resp_;  // the message being built; touched only between writes
  grpc::ByteBuffer out_;       // resp_ serialized: the write in flight
  std::string text_;           // text of the events not yet written
  // Per completion: the time of its last token (none yet: unset).
  std::vector<std::optional<std::chrono::steady_clock::time_point>> last_token_time_;
  // Events taken from the engine and not yet written, per completion (at most kMaxBufferedEvents
  // in all), and whether the engine's last event is among those taken.
  std::vector<std::deque<TokenEvent>> pending_;
  size_t buffered_ = 0;
  bool stream_ended_ = false;
  // Prompt logprobs (GenerateRequest.prompt_logprobs) being sent, those sent, and their
  // completion; touched only between writes.
  std::vector<TokenLogprob> prompt_lp_;
  size_t prompt_lp_sent_ = 0;
  int prompt_lp_index_ = 0;
  grpc::Status completion_error_;  // the first failed completion's status (OK: none)
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

bool revoke_generate(GenerateReactor* reactor) { return reactor->revoke(); }

RawBidiReactor* start_generate(GenerationService* service, grpc::CallbackServerContext* context) {
  return GenerateReactor::start(service, context);
}

}  // namespace kvsplit::server
