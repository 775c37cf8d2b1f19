// A gate around a disk tier's I/O backend (DiskTierConfig::io.wrap) that holds writes in flight
// for as long as a test needs: the tests of asynchronous disk writes (prefix-cache spills, swap
// write-behind).
#pragma once

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kv/block_io.h"

namespace kvsplit::kv {

// Holds every write submitted while closed; open() runs them (on the opening thread) and
// completes them.
struct WriteGate {
  std::mutex mu;
  bool closed = false;
  BlockIo* inner = nullptr;
  std::vector<std::pair<IoRequest, std::shared_ptr<IoCompletion>>> held;

  void close() {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
  }
  void open() {
    std::vector<std::pair<IoRequest, std::shared_ptr<IoCompletion>>> run;
    {
      std::lock_guard<std::mutex> lock(mu);
      closed = false;
      run.swap(held);
    }
    for (auto& [req, c] : run) c->complete(inner->submit(std::move(req))->wait());
  }
  int num_held() {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<int>(held.size());
  }
};

class GatedIo final : public BlockIo {
 public:
  GatedIo(std::unique_ptr<BlockIo> inner, std::shared_ptr<WriteGate> gate)
      : inner_(std::move(inner)), gate_(std::move(gate)) {
    gate_->inner = inner_.get();
  }
  std::shared_ptr<IoCompletion> submit(IoRequest r) override {
    {
      std::lock_guard<std::mutex> lock(gate_->mu);
      if (gate_->closed && r.op == IoOp::kWrite) {
        auto c = std::make_shared<IoCompletion>(r.bytes());
        gate_->held.emplace_back(std::move(r), c);
        return c;
      }
    }
    return inner_->submit(std::move(r));
  }
  IoBackend backend() const override { return inner_->backend(); }

 private:
  std::unique_ptr<BlockIo> inner_;
  std::shared_ptr<WriteGate> gate_;
};

}  // namespace kvsplit::kv
