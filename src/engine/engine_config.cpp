#include <fmt/format.h>

#include "backend/communicator.h"
#include "common/config_rules.h"
#include "cuts/semantic/semantic.h"
#include "engine/engine_impl.h"
#include "kvm/rule_engine.h"

namespace kvsplit {

Status validate_engine_config(const EngineConfig& c) {
  auto bad = [](const char* field, auto value, const char* want) {
    return invalid_argument(fmt::format("EngineConfig.{}: must be {}, got {}", field, want, value));
  };
  if (c.model.empty()) return invalid_argument("EngineConfig.model: must not be empty");
  if (c.mode != ServingMode::kColocated && c.mode != ServingMode::kDisaggregated) {
    return bad("mode", static_cast<int>(c.mode), "colocated or disaggregated");
  }
  if (c.mode == ServingMode::kDisaggregated && c.num_prefill_workers < 1) {
    return bad("num_prefill_workers", c.num_prefill_workers, ">= 1");
  }
  if (c.num_decode_workers < 1) return bad("num_decode_workers", c.num_decode_workers, ">= 1");
  if (c.num_prefill_workers > 64 || c.num_decode_workers > 64) {
    return invalid_argument("EngineConfig: at most 64 prefill and 64 decode workers");
  }
  KVSPLIT_RETURN_IF_ERROR(validate_block_size(c.block_size, "EngineConfig.block_size"));
  KVSPLIT_RETURN_IF_ERROR(validate_cuda_block_size(c, kEngineKvNames));
  if (c.kv_blocks_per_worker < 0)
    return bad("kv_blocks_per_worker", c.kv_blocks_per_worker, ">= 0");
  if (c.kv_blocks_per_worker == 0 && c.kv_capacity_bytes <= 0) {
    return bad("kv_capacity_bytes", c.kv_capacity_bytes, "> 0 when kv_blocks_per_worker is 0");
  }
  // Bounded as the YAML's pools: 100000 threads per worker threw from the thread pool's
  // constructor and aborted the process.
  KVSPLIT_RETURN_IF_ERROR(validate_pool_limits(c, "EngineConfig."));
  if (c.devices.size() > 64) return bad("devices", c.devices.size(), "at most 64 entries");
  for (int32_t d : c.devices) {
    if (d < 0 || d > 1023) return bad("devices", d, "in [0, 1023] (every entry)");
  }
  if (c.max_chunk_tokens < 0 || c.max_chunk_tokens > (1 << 20))
    return bad("max_chunk_tokens", c.max_chunk_tokens, "in [0, 1048576] (0: no cap)");
  if (!(c.max_chunk_ms >= 0 && c.max_chunk_ms <= 1e6))
    return bad("max_chunk_ms", c.max_chunk_ms, "in [0, 1e6] (0: off)");
  if (c.max_unread_events < 0 || c.max_unread_events > (1 << 20))
    return bad("max_unread_events", c.max_unread_events, "in [0, 1048576] (0: no bound)");
  if (c.handoff_timeout_ms < 1) return bad("handoff_timeout_ms", c.handoff_timeout_ms, ">= 1");
  if (c.handoff_stall_ms < 0 || c.handoff_stall_ms > 3600000)
    return bad("handoff_stall_ms", c.handoff_stall_ms, "in [0, 3600000] (0: off)");
  KVSPLIT_RETURN_IF_ERROR(validate_speculative(c.speculative, "EngineConfig.speculative."));
  if (c.kv_policy != KvPolicy::kFull && c.kv_policy != KvPolicy::kSemantic &&
      c.kv_policy != KvPolicy::kStreaming && c.kv_policy != KvPolicy::kH2O) {
    return bad("kv_policy", static_cast<int>(c.kv_policy), "full, semantic, streaming or h2o");
  }
  KVSPLIT_RETURN_IF_ERROR(cuts::semantic::validate(c.semantic, "EngineConfig.semantic."));
  if (c.block_size % c.semantic.summary_parts != 0)
    return bad("semantic.summary_parts", c.semantic.summary_parts,
               ("a divisor of block_size " + std::to_string(c.block_size)).c_str());
  if (!(c.kv_quant_fraction >= 0.0 && c.kv_quant_fraction <= 0.9))
    return bad("kv_quant_fraction", c.kv_quant_fraction, "in [0, 0.9]");
  // Only the semantic cut has int8 / int4 arenas to give the share to (it was accepted and
  // ignored under the other policies).
  KVSPLIT_RETURN_IF_ERROR(validate_quant_fraction(c, kEngineKvNames));
  if (c.temporal.host_capacity_mb < 0 || c.temporal.host_capacity_mb > (int64_t{1} << 24))
    return bad("temporal.host_capacity_mb", c.temporal.host_capacity_mb, "in [0, 16777216]");
  if (c.prefix_spill_ahead_blocks < 0 || c.prefix_spill_ahead_blocks > (1 << 24))
    return bad("prefix_spill_ahead_blocks", c.prefix_spill_ahead_blocks, "in [0, 16777216]");
  if (c.temporal.swap != SwapMode::kAuto && c.temporal.swap != SwapMode::kAlways &&
      c.temporal.swap != SwapMode::kNever)
    return bad("temporal.swap", static_cast<int>(c.temporal.swap), "auto, always or never");
  if (!c.temporal.disk_path.empty() &&
      (c.temporal.disk_capacity_mb < 1 || c.temporal.disk_capacity_mb > (int64_t{1} << 30)))
    return bad("temporal.disk_capacity_mb", c.temporal.disk_capacity_mb, "in [1, 2^30]");
  if (c.temporal.temporal_step_size < 1)
    return bad("temporal.temporal_step_size", c.temporal.temporal_step_size, ">= 1");
  if (c.spatial.shards < 1 || c.spatial.shards > 16)
    return bad("spatial.shards", c.spatial.shards, "in [1, 16]");
  if (c.spatial.spatial_chunk_size < 1 || c.spatial.spatial_chunk_size % c.block_size != 0)
    return bad("spatial.spatial_chunk_size", c.spatial.spatial_chunk_size,
               "a positive multiple of the block size");
  if (c.spatial.min_context < 0) return bad("spatial.min_context", c.spatial.min_context, ">= 0");
  if (c.spatial.shards > 1 && c.backend != "cpu" && c.backend != "cuda")
    return invalid_argument(fmt::format(
        "EngineConfig.spatial.shards: must be 1 on the {} backend (spatial shards run on the cpu "
        "and cuda backends), got {}",
        c.backend, c.spatial.shards));
  // What choose_communicator refuses for `nccl` that is known before any device is opened (so
  // kvsplit-server --check-config refuses it too); the devices themselves are checked at start.
  if (c.spatial.shards > 1 && c.spatial.communicator == SpatialCommunicator::kNccl) {
    if (!backend::nccl_communicator_built())
      return unimplemented("kv.cuts.spatial.communicator: nccl: this binary is built without NCCL");
    if (c.backend != "cuda")
      return invalid_argument("kv.cuts.spatial.communicator: nccl: the shards run on the " +
                              c.backend + " backend, not a CUDA backend (NCCL connects GPUs)");
  }
  KVSPLIT_RETURN_IF_ERROR(validate_sla_classes(c.sla_classes).with_prefix("EngineConfig"));
  if (!c.kvm.rules.empty()) {
    std::vector<std::string> names;
    for (const SlaClass& k : c.sla_classes) names.push_back(k.name);
    KVSPLIT_RETURN_IF_ERROR(kvm::validate_rules(c.kvm, names));
    KVSPLIT_RETURN_IF_ERROR(kvm::validate_rules_for_engine(c.kvm, c));
    KVSPLIT_RETURN_IF_ERROR(validate_kvm_window(c.kvm).with_prefix("EngineConfig"));
  }
  return ok_status();
}

}  // namespace kvsplit
