// Rules for the public API's plain configuration types that several layers check (the YAML
// loader, the Engine at create and at every SIGHUP reload): written once, here, with field-path
// messages ("sla_classes.voice.max_itl_ms: must be > 0, got 0").
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/kv_cuts.h"
#include "kvsplit/status.h"

namespace kvsplit {

// 1..64 characters of [A-Za-z0-9_.-]: SLA class and KVM rule names (they travel in metric
// labels, proto string fields and log lines as they are).
bool valid_config_name(std::string_view name);

// At least one class; names valid_config_name, unique; max_ttft_ms,
// max_itl_ms and queue_timeout_ms finite and > 0; priority in [-1000, 1000]; max_queue in
// [1, 1000000]; a `semantic` override passes validate_semantic_cut ("sla_classes.<name>.kv.").
Status validate_sla_classes(const std::vector<SlaClass>& classes);

// The semantic cut's settings (kv-cuts.md §2); kInvalidArgument naming the field, prefixed by
// `path` (e.g. "kv.cuts.semantic.", "sla_classes.voice.kv."): thresholds outside [0, 1],
// evict_threshold >= semantic_threshold (when both > 0), demote/evict_after_steps < 1, negative
// windows, score_interval < 1, smoothing outside (0, 1], host_capacity_mb, heavy_tokens or
// max_recalls_per_step < 0, recall_wait_ms not finite or above 60000, summary_parts outside
// [1, 1024] (that it divides the block size is checked where the block size is known).
// cuts::semantic::validate is this function.
Status validate_semantic_cut(const SemanticCutConfig& config, std::string_view path);

// kvm.window_ms in [100, 3600000] and not shorter than kvm.interval_ms: a window shorter than the
// sampling period leaves out the requests that finished between two windows.
Status validate_kvm_window(const KvmConfig& kvm);

// "full" | "semantic" | "streaming" | "h2o" (kInvalidArgument otherwise) and back.
StatusOr<KvPolicy> parse_kv_policy(std::string_view name);
const char* kv_policy_name(KvPolicy policy);

// "none" | "ngram" (kInvalidArgument otherwise) and back.
StatusOr<SpeculativeMethod> parse_speculative_method(std::string_view name);
const char* speculative_method_name(SpeculativeMethod method);
// Speculative decoding's settings, with `path` before each field ("speculative." from YAML,
// "EngineConfig.speculative." from the API): num_speculative_tokens in [1, 16],
// prompt_lookup_max in [1, 32], prompt_lookup_min in [1, prompt_lookup_max].
Status validate_speculative(const SpeculativeConfig& config, std::string_view path);

// KV page size: one of 8, 16, 32, 64 tokens (the CUDA kernels ship 16 only; see
// docs/configuration.md). `field` names it in the message.
Status validate_block_size(int32_t block_size, std::string_view field);

// The engine's pool limits, with `path` before each field ("pools." from YAML, "EngineConfig."
// from the API): threads_per_worker in [0, 1024] and the threads all workers start (a sampling
// pool each, and on the CPU backend compute threads per shard) at most 16384, or creating them
// throws and aborts the process; max_num_seqs in [1, 65536]; max_batch_tokens in [1, 2^20].
Status validate_pool_limits(const EngineConfig& config, std::string_view path);

// The names a caller gives the KV fields in its messages: the YAML's (config/validate.cpp) or the
// C++ API's (validate_engine_config).
struct KvFieldNames {
  std::string_view block_size, quant_fraction, policy, blocks_per_worker, capacity;
};
inline constexpr KvFieldNames kYamlKvNames{"kv.block_size", "kv.quant_fraction", "kv.policy",
                                           "kv.blocks_per_worker", "kv.capacity_mb"};
inline constexpr KvFieldNames kEngineKvNames{"EngineConfig.block_size",
                                             "EngineConfig.kv_quant_fraction", "kv_policy",
                                             "kv_blocks_per_worker", "kv_capacity_bytes"};
// The CUDA kernels are built for 16-token pages: kUnimplemented for another size on cuda.
Status validate_cuda_block_size(const EngineConfig& config, const KvFieldNames& names);
// kv_quant_fraction > 0 only under the semantic cut (the share goes to its arenas) and without an
// explicit block count (it splits the capacity): kInvalidArgument otherwise.
Status validate_quant_fraction(const EngineConfig& config, const KvFieldNames& names);

}  // namespace kvsplit
