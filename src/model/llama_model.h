// The Llama forward pass, written once against Backend ops. One call runs a batch that mixes
// decode tokens of some sequences with prefill (or chunked-prefill) tokens of others; KV is read
// and written only through each sequence's block table in a KvPool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/split_plan.h"
#include "kv/block_allocator.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"
#include "model/loader.h"

namespace kvsplit::model {

// One sequence's part of a step.
struct SeqStep {
  std::span<const int32_t> tokens;  // the tokens fed this step (1 for decode, a chunk for prefill)
  int start_pos = 0;                // position of tokens[0] (= tokens already in the KV cache)
  const kv::BlockTable* table = nullptr;  // must already hold start_pos + tokens.size() tokens
  // Which rows of logits to return: kLast (sampling), kAll (teacher-forced scoring), kNone
  // (a chunk of a prompt that is not finished yet), kArgmax (greedy decoding: not the last row's
  // logits but its argmax, lowest id on exact ties, NaN never wins, as sampling::argmax_lowest;
  // -1 when the row's logits are not usable, sampling::logits_usable: NaN or infinite).
  enum class Logits : uint8_t { kNone, kLast, kAll, kArgmax } logits = Logits::kLast;
  // Semantic scoring, decode steps only (host outputs, both or neither). With pages =
  // blocks_for(kv_len), token_relevance[0, pages * block_size) receives each token's attention
  // relative to its head's most attended token, max over heads and layers (0 for evicted pages),
  // and page_bound[0, pages) the summary bound of the same quantity for pages with a summary
  // (backend::AttentionArgs documents both).
  float* token_relevance = nullptr;
  float* page_bound = nullptr;
};

struct ForwardOptions {
  backend::SplitPlanConfig split;  // decode split-K planning
  int force_chunk_tokens = -1;     // >= 0: use make_split_plan with this chunk size (tests)
  // Sequences spread over a shard group: the shards compute their partial attention at once, each
  // on its own backend's threads (true), or one after another on the calling thread (false, for
  // comparison). The output is bit-identical either way (model/sharded_attention.h).
  bool concurrent_shards = true;
};

class LlamaModel {
 public:
  // Uploads the weights to `backend` (zero-copy views for f32 on CPU). The LoadedModel must
  // outlive the LlamaModel when its weights are memory-mapped.
  static StatusOr<std::unique_ptr<LlamaModel>> create(const LoadedModel& model,
                                                      backend::Backend& backend);
  ~LlamaModel();

  // Runs one step. Pages of the tables may be at any precision or evicted (their page entries),
  // except those this step writes, which must be full precision and resident. Sequences may come
  // in any order; decode steps (1 token, start_pos > 0) use the
  // paged split-K decode kernel, others the prefill kernel. Appends logits rows to *logits in
  // sequence order ([rows, vocab] f32, host): for kLast one row, for kAll tokens.size() rows; and
  // for kArgmax one token id to *ids (required then), in sequence order. A backend with
  // sample_tokens computes those ids on the device, so only 4 bytes per greedy row cross to the
  // host; others copy the row and take the argmax on the host (the same ids either way).
  Status forward(std::span<const SeqStep> seqs, kv::KvPool& pool, std::vector<float>* logits,
                 const ForwardOptions& options = {}, std::vector<int32_t>* ids = nullptr);

  const ModelConfig& config() const { return config_; }
  backend::Backend& backend() const { return backend_; }
  // Bytes of the matrices one token's forward pass reads (every layer's projections and the
  // LM head), at the dtype the backend holds them in: what a decode step streams.
  double matmul_weight_bytes() const;

  // The spatial cut's cost so far (sequences spread over a shard group, sharded_attention.h):
  // bytes and time the shards exchanged, the merge's wall time and the shards' attention time.
  struct ShardingStats {
    backend::ExchangeStats exchange;
    std::string communicator;  // the last sharded step's communicator's name ("" before any)
    double merge_seconds = 0;
    double attention_seconds = 0;
  };
  ShardingStats sharding_stats() const;
  kv::KvShape kv_shape() const {
    return kv::KvShape{config_.num_layers, config_.num_kv_heads, config_.head_dim};
  }

 private:
  struct Impl;
  LlamaModel(const ModelConfig& config, backend::Backend& backend);

  ModelConfig config_;
  backend::Backend& backend_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvsplit::model
