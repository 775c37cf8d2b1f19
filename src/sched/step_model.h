// StepModel: what a worker needs from a model: one forward step over a mixed prefill/decode batch
// through block tables. LlamaStepModel adapts model::LlamaModel; tests plug in fakes.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kv/kv_pool.h"
#include "kvsplit/status.h"
#include "model/llama_model.h"

namespace kvsplit::sched {

class StepModel {
 public:
  virtual ~StepModel() = default;
  // Same contract as LlamaModel::forward: appends logits rows ([rows, vocab] f32) in `seqs` order,
  // and for kArgmax steps their greedy token ids to *ids.
  virtual Status forward(std::span<const model::SeqStep> seqs, kv::KvPool& pool,
                         std::vector<float>* logits, std::vector<int32_t>* ids) = 0;
  virtual int vocab_size() const = 0;
  // Sliding windows: keys further back than this from the next position are never read again
  // (model::ModelConfig::kv_window); 0: some layer reads the whole context.
  virtual int kv_window() const { return 0; }
  // The spatial cut: bytes the model's shards exchanged since start (0 without shards).
  virtual int64_t shard_exchange_bytes() const { return 0; }
  // Of those, the bytes staged through host memory (backend::ExchangeLink::kHost).
  virtual int64_t shard_exchange_host_bytes() const { return 0; }
  // ... and the wall time of those exchanges (seconds).
  virtual double shard_exchange_seconds() const { return 0; }
};

class LlamaStepModel final : public StepModel {
 public:
  explicit LlamaStepModel(std::unique_ptr<model::LlamaModel> model) : model_(std::move(model)) {}
  Status forward(std::span<const model::SeqStep> seqs, kv::KvPool& pool, std::vector<float>* logits,
                 std::vector<int32_t>* ids) override {
    return model_->forward(seqs, pool, logits, {}, ids);
  }
  int vocab_size() const override { return model_->config().vocab_size; }
  int kv_window() const override { return model_->config().kv_window(); }
  int64_t shard_exchange_bytes() const override { return model_->sharding_stats().exchange.bytes; }
  int64_t shard_exchange_host_bytes() const override {
    return model_->sharding_stats().exchange.host_bytes;
  }
  double shard_exchange_seconds() const override {
    return model_->sharding_stats().exchange.seconds;
  }
  model::LlamaModel& model() { return *model_; }

 private:
  std::unique_ptr<model::LlamaModel> model_;
};

}  // namespace kvsplit::sched
