// RawStream: one call of a kvsplit.v1 method over gRPC's generic async API, sending its headers,
// messages and half-close only when a test asks (a call holding a stream slot with nothing sent;
// HeaderAuthTest, TenantPolicyTest).
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace kvsplit::testing {

// One call of `method` over the generic async API as a bidi stream: start() sends only the
// headers; messages and the half-close go out only when the test asks.
class RawStream {
 public:
  RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
            const std::string& bearer)
      : stub_(channel) {
    if (!bearer.empty()) ctx_.AddMetadata("authorization", "Bearer " + bearer);
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    rw_ = stub_.PrepareCall(&ctx_, method, &cq_);
    rw_->StartCall(tag(kStart));
    started_ = wait(kStart, std::chrono::seconds(30)).value_or(false);
  }
  ~RawStream() {
    ctx_.TryCancel();
    if (!finish_started_) {
      rw_->Finish(&status_, tag(kFinish));
      finish_started_ = true;
    }
    for (int op : {kRead, kFinish, kWrite}) {
      if (pending_.count(op)) (void)wait(op, std::chrono::seconds(30));
    }
    cq_.Shutdown();
    void* t;
    bool ok;
    while (cq_.Next(&t, &ok)) {
    }
  }

  bool started() const { return started_; }
  bool write(const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buf(&slice, 1);
    rw_->Write(buf, tag(kWrite));
    return wait(kWrite, std::chrono::seconds(30)).value_or(false);
  }
  bool writes_done() {
    rw_->WritesDone(tag(kWrite));
    return wait(kWrite, std::chrono::seconds(30)).value_or(false);
  }
  // Reads (and drops) the responses, then the status: nullopt when it did not come `within`.
  std::optional<grpc::Status> finish(std::chrono::milliseconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    for (;;) {
      grpc::ByteBuffer buf;
      rw_->Read(&buf, tag(kRead));
      std::optional<bool> ok = wait(kRead, deadline - std::chrono::steady_clock::now());
      if (!ok) return std::nullopt;
      if (!*ok) break;
    }
    rw_->Finish(&status_, tag(kFinish));
    finish_started_ = true;
    if (!wait(kFinish, deadline - std::chrono::steady_clock::now())) return std::nullopt;
    return status_;
  }

 private:
  enum Op { kStart = 1, kWrite, kRead, kFinish };
  void* tag(int op) {
    pending_.insert(op);
    return reinterpret_cast<void*>(static_cast<intptr_t>(op));
  }
  // The outcome of operation `op`, or nullopt when it did not complete within `within`.
  template <class Duration>
  std::optional<bool> wait(int op, Duration within) {
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(within);
    while (!done_.count(op)) {
      void* t;
      bool ok;
      if (cq_.AsyncNext(&t, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) return std::nullopt;
      const int got = static_cast<int>(reinterpret_cast<intptr_t>(t));
      pending_.erase(got);
      done_[got] = ok;
    }
    const bool ok = done_[op];
    done_.erase(op);
    return ok;
  }

  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> rw_;
  std::set<int> pending_;
  std::map<int, bool> done_;
  grpc::Status status_;
  bool started_ = false;
  bool finish_started_ = false;
};

}  // namespace kvsplit::testing
