// Attention of sequences whose KV is spread over a shard group (the spatial cut, kv-cuts.md §4),
// for one forward step. The home backend computes Q/K/V; each new token's K/V goes to the shard
// that owns its position; every shard computes partial attention over the pages it holds (an
// output normalized over its keys and their log-sum-exp, AttentionArgs::lse) and the home merges
// the partials exactly (Backend::merge_attention_states). Only queries, new K/V rows and partials
// move between shards, never pages: per layer and step the partials are
// rows x num_heads x (head_dim + 1) floats, whatever the context length.
//
// Per shard, decode rows attend over a compact block table (only the shard's pages, in order, so
// split-K covers only what it holds); prefill rows attend over the sequence's whole table with the
// other shards' pages marked evicted, so the causal mask sees true positions. Shards run one after
// another on the calling thread (each on its own backend); a sequence none of whose pages a shard
// holds contributes an empty partial (lse -inf) there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/split_plan.h"
#include "kv/block_allocator.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::model {

// One sharded sequence's part of a step: rows [row, row + tokens) of the step's sharded rows.
struct ShardedSeq {
  const kv::BlockTable* table = nullptr;
  int start_pos = 0;
  int tokens = 0;
  bool decode = false;  // one query at start_pos > 0
};

struct ShardedAttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.f;
};

class ShardedAttention {
 public:
  ShardedAttention() = default;
  ShardedAttention(const ShardedAttention&) = delete;
  ShardedAttention& operator=(const ShardedAttention&) = delete;

  // Plans the step: `seqs` in row order (decode rows first, then prefill rows), their tables in
  // `pool`'s shard group (KvPool::num_shards() >= 2). Builds and uploads every shard's metadata.
  Status prepare(std::span<const ShardedSeq> seqs, kv::KvPool& pool,
                 const ShardedAttentionShape& shape, const backend::SplitPlanConfig& split,
                 backend::Communicator& comm);
  // Layer `layer`: appends the rows' K/V (home memory, [rows, num_kv_heads, head_dim]) to their
  // owning shards, runs every shard's partial attention for q ([rows, num_heads, head_dim]) and
  // writes the merged output to out ([rows, num_heads, head_dim]), all home memory.
  Status run_layer(int layer, const float* q, const float* k, const float* v, float* out);

  // Merge wall time summed over run_layer calls (the spatial cut's added cost), and the shards'
  // attention time (the kernels that run anyway), for benchmarks.
  double merge_seconds() const { return merge_seconds_; }
  double attention_seconds() const { return attention_seconds_; }

 private:
  struct DecodeRun {  // consecutive decode rows a shard holds pages of: one attention call
    int first_row = 0;
    int rows = 0;
    size_t meta = 0;  // offset (ints) of qstart[rows + 1], kvlens[rows], tables[rows, max_blocks]
    backend::SplitPlan plan;
  };
  // Buffers are the shards' pools' workspaces (KvPool::workspace), so none outlives its device.
  struct Shard {
    backend::Backend* be = nullptr;
    kv::KvPool* pool = nullptr;
    float *q = nullptr, *k = nullptr, *v = nullptr;  // copies of the rows (peers only)
    float *o = nullptr, *lse = nullptr;  // partial [rows, heads, head_dim] and [rows, heads]
    float *recv_o = nullptr, *recv_lse = nullptr;  // the partial copied to home (peers only)
    int32_t* meta = nullptr;                       // slots, decode runs, prefill args
    uint8_t* precision = nullptr;                  // [prefill seqs, max_blocks] (prefill rows only)
    size_t slots = 0, pre_meta = 0;
    std::vector<DecodeRun> runs;
    int max_blocks = 1;
  };

  kv::KvPool* pool_ = nullptr;
  backend::Backend* home_ = nullptr;
  backend::Communicator* comm_ = nullptr;
  ShardedAttentionShape shape_;
  int rows_ = 0, decode_rows_ = 0, prefill_seqs_ = 0, pre_max_q_ = 0, pre_max_kv_ = 0;
  int dec_max_kv_ = 0;
  std::vector<Shard> shards_;
  double merge_seconds_ = 0, attention_seconds_ = 0;
};

}  // namespace kvsplit::model
