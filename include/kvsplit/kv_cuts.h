// Public settings of the KV cuts (docs/kv-cuts.md). Engine::EngineConfig and SLA classes carry
// them; src/cuts/ plans with them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvsplit {

// Which policy acts on a sequence's KV pages between its decode steps.
enum class KvPolicy : uint8_t {
  kFull,       // nothing changes
  kSemantic,   // the semantic cut: precision ladder with recall
  kStreaming,  // StreamingLLM: sinks + recent tokens only, the rest dropped (no recall)
  kH2O,        // H2O: sinks + recent + the heavy_tokens most relevant, rest dropped (no quant)
};

// The rung an evicted page comes back at when its key summary's bound calls it back.
enum class RecallPrecision : uint8_t {
  kFull,  // the host original copied back (asynchronous where the backend allows)
  kInt8,  // requantized from the host original, which stays with the summary
  kInt4,
};

// "full" | "int8" | "int4"; nullopt for anything else.
inline std::optional<RecallPrecision> parse_recall_precision(std::string_view name) {
  if (name == "full") return RecallPrecision::kFull;
  if (name == "int8") return RecallPrecision::kInt8;
  if (name == "int4") return RecallPrecision::kInt4;
  return std::nullopt;
}

inline const char* recall_precision_name(RecallPrecision p) {
  return p == RecallPrecision::kFull ? "full" : p == RecallPrecision::kInt8 ? "int8" : "int4";
}

// The semantic cut (kv-cuts.md §2). Relevance is defined in docs/kv-cuts.md.
struct SemanticCutConfig {
  // Relevance below semantic_threshold for demote_after_steps consecutive scored steps: one rung
  // down (full -> int8 -> int4). Below evict_threshold for evict_after_steps: evicted (the
  // full-precision original kept in the host tier).
  float semantic_threshold = 0.15f;
  float evict_threshold = 0.05f;
  int32_t demote_after_steps = 3;
  int32_t evict_after_steps = 3;
  // Recall to full precision: an evicted page when the upper bound of its relative attention
  // (from its key summary, each scored step) reaches recall_threshold; a quantized page, which is
  // still read and scored, when its relevance does.
  float recall_threshold = 0.5f;
  // The rung an evicted page is recalled at. The bound is loose (most pages it calls back turn
  // out cold: docs/kv-cuts.md "Recall at a quantized rung"), so int4 makes each call a cheap
  // probe: the page is read at int4, and goes on to full when its measured relevance reaches
  // recall_threshold, or back down when it stays cold.
  RecallPrecision recall_precision = RecallPrecision::kFull;
  // At most this many evicted pages recalled per sequence and scored step, the highest bounds
  // first (Quest's top-k selection); 0: every page whose bound reaches recall_threshold.
  int32_t max_recalls_per_step = 0;
  // A recall's copy from the host tier is asynchronous where the backend allows (a second CUDA
  // stream): the next step waits at most recall_wait_ms for it, then runs with the page as it is
  // (quantized, or left out when evicted) and takes it at full precision once it has landed.
  // < 0: wait until it lands (results never depend on timing). Synchronous backends (the CPU
  // backend by default) have every restore landed before the step.
  double recall_wait_ms = 1.0;
  int32_t semantic_window = 4096;   // tokens scored: the most recent ones (older pages keep state)
  int32_t sink_tokens = 4;          // never degraded: the first tokens ...
  int32_t recent_tokens = 256;      // ... and the last ones
  int32_t score_interval = 4;       // decode steps between scorings (1: every step)
  float smoothing = 0.5f;           // weight of a new score in a page's relevance (EMA), (0, 1]
  int64_t host_capacity_mb = 1024;  // host tier for full-precision originals, per worker
  // Each page's key summary covers it in this many equal parts, the recall bound taking the
  // largest part's: a tighter bound (fewer recalls of pages that prove cold) for summary_parts
  // times the summary bytes. Per pool (as host_capacity_mb); divides the block size; [1, 1024].
  int32_t summary_parts = 1;
  int32_t heavy_tokens = 64;  // kH2O only: tokens kept beyond sinks and recent (pages, rounded up)
  bool operator==(const SemanticCutConfig&) const = default;
};

// The temporal cut (kv-cuts.md §3): how a sequence preempted under memory pressure keeps its KV.
enum class SwapMode : uint8_t {
  kAuto,    // swap to the host tier when the cost model predicts it is cheaper than recompute
  kAlways,  // swap whenever the host tier has room
  kNever,   // recompute (the KV is dropped and prefilled again)
};

// "auto" | "always" | "never"; nullopt for anything else.
inline std::optional<SwapMode> parse_swap_mode(std::string_view name) {
  if (name == "auto") return SwapMode::kAuto;
  if (name == "always") return SwapMode::kAlways;
  if (name == "never") return SwapMode::kNever;
  return std::nullopt;
}

struct TemporalCutConfig {
  // Host tier for swapped-out pages, per worker (pinned host memory on CUDA). 0: no swapping.
  int64_t host_capacity_mb = 0;
  SwapMode swap = SwapMode::kAuto;
  // A swapped-out sequence is considered for resumption every temporal_step_size steps of its
  // worker (the seed's name; 1: at every step boundary). >= 1.
  int32_t temporal_step_size = 1;
  // Host-tier prefetch (kv.cuts.temporal.host_prefetch): a swapped-out sequence on the host tier
  // that the swap predictor expects to resume at the next step gets its device blocks a step
  // early, from blocks free beyond what that step needs, and its host -> device copy starts
  // then (Backend::copy_batch_fenced: a copy stream on CUDA, a copy thread on the CPU backend
  // with async_copies); the blocks are given back whenever other work needs them
  // (docs/kv-cuts.md, "Swap predictor and prefetch"). Off: the copy is made by the resuming
  // step. The disk tier's read-ahead is not affected.
  bool host_prefetch = true;
  // Disk tier below the host tier (kv.disk): swapped-out sequences go there when the host tier is
  // full, one checksummed record each. Empty path: none. Each decoding worker uses its own
  // sub-directory <disk_path>/<worker name>, wiped when it opens (records never outlive it).
  std::string disk_path;
  int64_t disk_capacity_mb = 1024;  // per worker, >= 1
  // kv.disk.direct_io: O_DIRECT (records bypass the page cache; docs/kv-tiers.md). Off: buffered.
  bool disk_direct_io = false;
  // kv.disk.write_behind: a disk swap-out frees its device blocks once the pages are copied to a
  // staging buffer and returns while the record is written (kv/swap.h, swap_out; at most
  // KvPool::kMaxSwapWrites at once; a write that fails keeps the staging as the copy). Off: the
  // swap-out returns once the record is written.
  bool disk_write_behind = true;
};

// The spatial cut (kv-cuts.md §4): each worker's KV pool is a shard group of `shards` pools, one
// per shard (the worker's own pool is shard 0; on the CPU backend each other shard is its own
// backend with its own threads). A sequence that may grow past min_context tokens (prompt +
// max_tokens; 0: every sequence) is placed across the group, chunk c of spatial_chunk_size
// tokens on shard c mod shards; others fill the home shard first. Each shard computes partial
// attention over its pages; the home merges them exactly (docs/kv-cuts.md, spatial section).
// How a shard group's shards exchange queries, new K/V rows and partials (docs/kv-cuts.md
// "Communicator"). kAuto: NCCL when the binary is built with it and every shard of the group is a
// CUDA backend on a device of its own, else in-process. kNccl: NCCL or a start-up error (never a
// silent fallback); virtual shards (two shards on one GPU) cannot use it: NCCL refuses two ranks
// on one device.
enum class SpatialCommunicator : uint8_t {
  kAuto,
  kInProcess,
  kNccl,
};

// "auto" | "in_process" | "nccl"; nullopt for anything else.
inline std::optional<SpatialCommunicator> parse_spatial_communicator(std::string_view name) {
  if (name == "auto") return SpatialCommunicator::kAuto;
  if (name == "in_process") return SpatialCommunicator::kInProcess;
  if (name == "nccl") return SpatialCommunicator::kNccl;
  return std::nullopt;
}

inline const char* spatial_communicator_name(SpatialCommunicator c) {
  switch (c) {
    case SpatialCommunicator::kAuto:
      return "auto";
    case SpatialCommunicator::kInProcess:
      return "in_process";
    case SpatialCommunicator::kNccl:
      return "nccl";
  }
  return "?";
}

struct SpatialCutConfig {
  int32_t shards = 1;                 // 1: off; in [1, 16]
  int32_t spatial_chunk_size = 4096;  // tokens, a positive multiple of the block size
  int32_t min_context = 0;            // >= 0
  SpatialCommunicator communicator = SpatialCommunicator::kAuto;
};

}  // namespace kvsplit
