// The command inbox of a worker: typed messages besides KV handoffs, processed by the worker's
// thread at its next step boundary (before admission and scheduling), so they never race a step.
// This is the seam the KV cache manager drives: it changes a worker's scheduling (and, with the
// KV cuts, their parameters), moves or releases KV, and reads a worker's state.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kvsplit/status.h"
#include "sched/scheduler.h"
#include "sched/sequence.h"

namespace kvsplit::sched {

// Changes the worker's Scheduler; unset fields keep their value. Ranges: max_batch_tokens
// [1, 2^20], min_chunk_tokens [1, max_batch_tokens], max_num_seqs [1, 65536], max_chunk_tokens
// [0, 2^20] (fair prefill's cap, 0: none), max_chunk_ms [0, 1e6] (its time-based cap,
// EngineConfig::max_chunk_ms, 0: none); a value out of range is kInvalidArgument naming the
// field and changes nothing.
struct SetSchedulerParams {
  std::optional<int> max_batch_tokens = std::nullopt;
  std::optional<int> min_chunk_tokens = std::nullopt;
  std::optional<int> max_num_seqs = std::nullopt;
  std::optional<int> max_chunk_tokens = std::nullopt;
  std::optional<double> max_chunk_ms = std::nullopt;
};

// Drops the KV of one request the worker owns (running: preempted, recomputed when scheduled
// again; waiting with blocks: its prefill restarts). kNotFound when the worker does not own a
// request with this (tenant, request_id) with KV in its pool.
struct ReleaseKv {
  RequestKey key;
};

// The spatial cut's migration hook (kv/migrate.h): moves pages [first_page, end_page) of one
// request's KV (end_page -1: to its last page) to shard `to_shard` of the worker's shard group,
// from other shards or from the host tier. kNotFound when the worker holds no KV of the request,
// kInvalidArgument for a bad range or shard, kResourceExhausted (nothing moved) when the shard
// lacks free blocks.
struct MigrateKv {
  RequestKey key;
  int first_page = 0;
  int end_page = -1;
  int to_shard = 0;
  int max_pages = 0;  // > 0: at most this many of the pages that can move (kv::migrate_pages)
  // true: also no more than the target shard has room for when the worker runs the command, so
  // a move is cut to fit instead of refused whole (the KV cache manager's moves: room read from
  // an earlier snapshot may be gone by then). kResourceExhausted only when it has no room at all.
  bool up_to_room = false;
};

// The KV cache manager's cut knobs (docs/kvm.md), applied from the worker's next step on; unset
// fields keep their value. Empty sla_class: the worker's own settings, which sequences without a
// class override (and sequences admitted later) use. A class name: the override of that class's
// sequences on this worker. `semantic` replaces the thresholds, windows and steps (its
// host_capacity_mb and summary_parts are ignored: tiers keep their size and layout) and is
// checked like the YAML
// (kInvalidArgument naming the field, nothing changed); it needs a worker with a KV policy other
// than full (kFailedPrecondition otherwise).
struct SetCutParams {
  std::string sla_class;
  std::optional<SemanticCutConfig> semantic;
  std::optional<SwapMode> swap;
  std::optional<int32_t> temporal_step_size;  // >= 1
  // With sla_class: the class's sequences drop their own swap / temporal_step_size (those given
  // here) and follow the worker's again (a KVM class rule's exit, KvmDecision::inherit).
  bool inherit = false;
};

// Only reports the state (every reply carries it).
struct SnapshotState {};

using WorkerCommand =
    std::variant<SetSchedulerParams, ReleaseKv, MigrateKv, SetCutParams, SnapshotState>;

// One sequence the worker owns, as a command reply shows it.
struct SequenceState {
  std::string tenant;
  std::string request_id;  // escaped for display
  RequestKey key;          // as commands (ReleaseKv, MigrateKv) name it
  bool running = false;    // decoding; else waiting for its prefill or a recompute
  int32_t priority = 0;
  int num_tokens = 0;    // prompt + generated
  int num_computed = 0;  // positions with KV in the pool
  int num_blocks = 0;
  int32_t preemptions = 0;
  // The spatial cut: device pages on each shard of the worker's shard group (size: its shards),
  // and of those the full-precision ones (what MigrateKv can move); pages in the host tier (it
  // can move those too).
  std::vector<int> pages_per_shard;
  std::vector<int> full_pages_per_shard;
  int host_pages = 0;
};

// The worker's state after the command was applied.
struct WorkerState {
  std::string worker;
  int device = 0;  // the worker's backend device
  // KV handoffs this worker received, by route (KvCopyRoute: same device, peer, staged).
  int64_t handoffs_by_route[3] = {0, 0, 0};
  SchedulerConfig scheduler;
  double max_chunk_ms = 0;   // the configured time-based chunk cap (0: none)
  int max_prefill_seqs = 0;  // prompts it pulls and holds not started (WorkerOptions)
  int free_blocks = 0;
  int total_blocks = 0;
  int num_shards = 1;  // the spatial cut's shard group (1: the worker's pool alone)
  // Each shard's free blocks plus its idle prefix-cache pages (what a migration there can take).
  std::vector<int> shard_available;
  int64_t migrated_pages = 0;  // moved by MigrateKv since start
  int pending_handoffs = 0;    // received, waiting for admission
  int64_t steps = 0;
  std::vector<SequenceState> sequences;  // running first, then waiting
};

struct CommandReply {
  Status status;  // kUnavailable when the worker stopped before processing it
  WorkerState state;
};

// Called once per command, on the worker's thread (or the caller's, when the worker has already
// stopped); must not block.
using CommandDone = std::function<void(CommandReply)>;

}  // namespace kvsplit::sched
