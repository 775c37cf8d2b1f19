// Attention of sequences whose KV is spread over a shard group (the spatial cut, kv-cuts.md §4),
// for one forward step. The home backend computes Q/K/V; each new token's K/V goes to the shard
// that owns its position; every shard computes partial attention over the pages it holds (an
// output normalized over its keys and their log-sum-exp, AttentionArgs::lse) and the home merges
// the partials exactly (Backend::merge_attention_states). Only queries, new K/V rows and partials
// move between shards, never pages: per layer and step the partials are
// rows x num_heads x (head_dim + 1) floats, whatever the context length. Only the step's
// **active** peers take part: a peer is active when it holds a page some row reads (a decode
// row's resident or summarised page, a prefill row's resident page) or owns the position of a
// new K/V row; an inactive peer is sent nothing, computes nothing and is left out of the merge
// (its partial would be empty). Each active peer receives every query row (its partial covers
// every row) but only the K/V rows of the positions it owns (PageEntry::shard of the page holding
// the position), so per layer, with A active peers, the home sends
// A x rows x num_heads x head_dim + (rows owned by peers) x 2 x num_kv_heads x head_dim floats and
// receives A x rows x num_heads x (head_dim + 1) (scoring, below, adds its maxima).
//
// Per shard, decode rows attend over a compact block table (only the shard's pages, in order, so
// split-K covers only what it holds; pages at any precision, evicted ones skipped but listed for
// their key summaries); prefill rows attend over the sequence's whole table with the
// other shards' pages marked evicted, so the causal mask sees true positions. A sequence none of
// whose pages a shard holds contributes an empty partial (lse -inf) there.
//
// Threads (set_concurrent): by default the shards compute their partials at once, each peer on a
// job thread of its own (common/job_thread.h) that drives its backend, the home on the calling
// thread; the calling thread then waits for every peer and merges in shard order. Off, the shards
// run one after another on the calling thread. Either way each shard's partial is the same
// computation (the same backend, split plan and inputs) and the merge order is fixed, so the
// output is bit-identical. The exchange (sends of queries and K/V rows, the partials back) runs on
// the calling thread only, before and after the shards compute, so the Communicator is used by
// one thread. The job threads sleep between layers; they live as long as this object. When the
// system refuses to start one (e.g. ulimit -u), the shards take turns from then on (the same
// output) and a warning is logged once; the step does not fail.
//
// Scoring (the semantic cut on sharded sequences): each shard's decode call also returns its
// per-head maximum logit (AttentionArgs::head_max); the home takes the maximum over shards (the
// sequence's) and sends it back, and each shard scores its own pages against it in a
// scoring-only call (AttentionArgs::score_max). The relevance is then exactly the unsharded
// definition (normalized to the most attended token of the whole sequence), at the cost of a
// second read of the scored sequences' keys and 2 x heads floats per shard, row and layer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/split_plan.h"
#include "common/job_thread.h"
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
  // The semantic cut's scoring side outputs (decode only; both or neither), host memory of
  // blocks_for(kv_len) * block_size and blocks_for(kv_len) floats, as SeqStep's: relevance is
  // normalized per layer and head to the most attended token of the WHOLE sequence (every shard),
  // exactly as the unsharded attention's. Written by collect_scores().
  float* token_relevance = nullptr;
  float* page_bound = nullptr;
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

  // Whether the shards compute at once (default) or one after another (see above). Takes effect
  // at the next run_layer; not while one runs.
  void set_concurrent(bool on) { concurrent_ = on; }
  bool concurrent() const { return concurrent_; }

  // Plans the step: `seqs` in row order (decode rows first, then prefill rows), their tables in
  // `pool`'s shard group (KvPool::num_shards() >= 2). Finds the active shards and builds and
  // uploads their metadata. Decode rows' split-K plans come from the planner with `split`, or,
  // when force_chunk_tokens >= 0, from make_split_plan with that chunk (0: no split), as the
  // home path's (ForwardOptions::force_chunk_tokens).
  Status prepare(std::span<const ShardedSeq> seqs, kv::KvPool& pool,
                 const ShardedAttentionShape& shape, const backend::SplitPlanConfig& split,
                 backend::Communicator& comm, int force_chunk_tokens = -1);
  // The shards taking part in the prepared step, in shard order: the home (always) and the
  // active peers (see above).
  std::span<const int> active_shards() const { return active_; }
  // Layer `layer`: appends the rows' K/V (home memory, [rows, num_kv_heads, head_dim]) to their
  // owning shards (a peer is sent only the rows it owns), runs every shard's partial attention for
  // q ([rows, num_heads, head_dim]) and writes the merged output to out ([rows, num_heads,
  // head_dim]), all home memory.
  Status run_layer(int layer, const float* q, const float* k, const float* v, float* out);
  // After the last layer: writes the scored sequences' token_relevance and page_bound (each
  // shard's, from its compact page order back to the sequence's pages; nothing without scoring)
  // and adds the step's times to merge_seconds / attention_seconds (waiting for the last layer's
  // work on every shard, and reporting a peer's kernel errors). Call it once per prepared step
  // that ran its layers; error or not, it leaves no time mark held.
  Status finish_step();
  // Instead of finish_step, for a step that failed after prepare: waits for every peer shard (its
  // stream may still read the home's buffers) and releases the time marks. Errors are ignored
  // (the step's own error is what the caller reports).
  void abandon_step();

  // For benchmarks, summed over finished steps, on the device's clock (Backend::mark_time; the
  // host clock on the CPU backend, whose calls finish their work before returning): the merge's
  // time (its kernel on the home's stream, per layer: the spatial cut's added cost), and the
  // shards' attention time (per layer, and per scoring pass, the longest shard's span from its
  // K/V append to the end of its partial attention: the kernels that run anyway). The exchange is
  // excluded from both (ExchangeStats). No host wait is inside either span.
  double merge_seconds() const { return merge_seconds_; }
  double attention_seconds() const { return attention_seconds_; }

 private:
  struct DecodeRun {  // consecutive decode rows a shard holds pages of: one attention call
    int first_row = 0;
    int rows = 0;
    size_t meta = 0;  // offset (ints) of qstart[rows + 1], kvlens[rows], tables[rows, max_blocks]
    backend::SplitPlan plan;
    std::vector<int32_t> pages;  // [rows, max_blocks]: the sequence's page of each table entry
  };
  // One shard's timed work in phase `phase` (an on_shards call): its backend's marks.
  struct Span {
    int phase = 0, from = 0, to = 0;
  };
  // Buffers are the shards' pools' workspaces (KvPool::workspace), so none outlives its device.
  struct Shard {
    backend::Backend* be = nullptr;
    kv::KvPool* pool = nullptr;
    bool prefill = false;  // holds a resident page of a prefill row's sequence this step
    float *q = nullptr, *k = nullptr, *v = nullptr;  // copies of the rows (peers only)
    float *o = nullptr, *lse = nullptr;  // partial [rows, heads, head_dim] and [rows, heads]
    float *recv_o = nullptr, *recv_lse = nullptr;  // the partial copied to home (peers only)
    // Peers: the rows whose positions this shard owns (runs of (first row, rows), in row order);
    // only their K/V rows are sent, packed (k, v above hold kv_rows rows). stage_k / stage_v:
    // home memory gathering them when they are more than one run.
    std::vector<std::pair<int, int>> kv_runs;
    int kv_rows = 0;
    float *stage_k = nullptr, *stage_v = nullptr;
    int32_t* meta = nullptr;           // slots, decode runs, prefill args
    uint8_t* precision = nullptr;      // [prefill seqs, max_blocks] (prefill rows only)
    uint8_t* dec_precision = nullptr;  // [decode rows, max_blocks]; null: every page full
    // Scoring (decode rows): flags [decode rows], summary slots [decode rows, max_blocks],
    // relevance [decode rows, max_blocks * block_size], bounds [decode rows, max_blocks], this
    // shard's head maxima and the sequence's [decode rows, heads].
    uint8_t* score_flags = nullptr;
    int32_t* summary_slots = nullptr;
    float *relevance = nullptr, *bound = nullptr, *head_max = nullptr, *seq_max = nullptr;
    size_t slots = 0, pre_meta = 0;
    std::vector<DecodeRun> runs;
    int max_blocks = 1;
    std::vector<Span> spans;  // this step's timed work on this shard's backend
  };

  backend::AttentionArgs base_args(const Shard& z, int layer) const;
  void set_arenas(const Shard& z, int layer, backend::AttentionArgs& a) const;
  backend::AttentionArgs decode_args(const Shard& z, int layer, const DecodeRun& run,
                                     const float* zq) const;
  // Runs fn(shard) for every active shard, each timed (a span of this call's phase): the peers on
  // their job threads while the home runs on this thread (concurrent_), or in shard order on this
  // thread. Returns after every shard's fn returned: the first error in shard order (home first).
  Status on_shards(const std::function<Status(int)>& fn);
  // fn(sh) between two time marks on shard sh's backend, recorded as a span of `phase`.
  Status timed(int sh, int phase, const std::function<Status(int)>& fn);
  // Writes the scored rows' outputs (part of finish_step).
  Status collect_scores();
  // Releases every shard's time marks (and the home's) and forgets this step's spans. The marks
  // of a backend are all this object's: one ShardedAttention per backend times with them.
  void release_marks();
  // Shard `sh`'s part of layer `layer`: appends its K/V rows and queues its partial (o, lse),
  // without waiting. Touches only shard `sh`'s buffers and backend (and reads q, k, v: home
  // memory, the home's rows, for sh == 0).
  Status partial(int sh, int layer, const float* q, const float* k, const float* v);
  // The scoring pass of layer `layer` (after its attention): merges every shard's head maxima
  // and scores each shard's pages against them.
  Status score_layer(int layer, const float* q);

  kv::KvPool* pool_ = nullptr;
  backend::Backend* home_ = nullptr;
  backend::Communicator* comm_ = nullptr;
  ShardedAttentionShape shape_;
  int rows_ = 0, decode_rows_ = 0, prefill_seqs_ = 0, pre_max_q_ = 0, pre_max_kv_ = 0;
  int dec_max_kv_ = 0;
  bool scoring_ = false;
  std::vector<float*> rel_out_, bound_out_;        // per decode row (null: not scored)
  std::vector<int> rel_pages_;                     // per decode row: blocks_for(kv_len)
  float *all_max_ = nullptr, *seq_max_ = nullptr;  // home: every shard's head maxima, merged
  std::vector<Shard> shards_;
  std::vector<int> active_;  // this step's shards taking part, in shard order (0 first)
  double merge_seconds_ = 0, attention_seconds_ = 0;
  int phase_ = 0;                                 // on_shards calls this step
  std::vector<std::pair<int, int>> merge_spans_;  // the home's marks around each merge
  bool concurrent_ = true;
  bool no_threads_ = false;  // the system refused a job thread: the shards take turns
  // runners_[s - 1] drives peer shard s (created on first use, kept across steps). Last member:
  // destroyed (joined) first.
  std::vector<std::unique_ptr<JobThread>> runners_;
};

}  // namespace kvsplit::model
