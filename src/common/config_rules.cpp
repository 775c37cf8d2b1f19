#include "common/config_rules.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "common/escape.h"

namespace kvsplit {
namespace {

std::string real(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

Status check_positive(const std::string& field, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    return invalid_argument(field + ": must be > 0, got " + real(v));
  }
  return ok_status();
}

Status check_range(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return invalid_argument(field + ": must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + std::to_string(v));
  }
  return ok_status();
}

}  // namespace

bool valid_config_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
    if (!ok) return false;
  }
  return true;
}

Status validate_sla_classes(const std::vector<SlaClass>& classes) {
  if (classes.empty()) return invalid_argument("sla_classes: at least one class is required");
  std::set<std::string> names;
  for (const SlaClass& c : classes) {
    if (!valid_config_name(c.name)) {
      return invalid_argument("sla_classes." + escape_for_message(c.name, 64) +
                              ": class names are 1..64 characters of [A-Za-z0-9_.-]");
    }
    if (!names.insert(c.name).second) {
      return invalid_argument("sla_classes." + c.name + ": duplicate class name");
    }
    const std::string p = "sla_classes." + c.name + ".";
    KVSPLIT_RETURN_IF_ERROR(check_positive(p + "max_ttft_ms", c.max_ttft_ms));
    KVSPLIT_RETURN_IF_ERROR(check_positive(p + "max_itl_ms", c.max_itl_ms));
    KVSPLIT_RETURN_IF_ERROR(check_range(p + "priority", c.priority, -1000, 1000));
    KVSPLIT_RETURN_IF_ERROR(check_range(p + "max_queue", c.max_queue, 1, 1000000));
    // Bounded: a deadline of submit + 1e13 ms or more overflows the clock (every request of the
    // class would expire at once).
    if (!(c.queue_timeout_ms > 0 && c.queue_timeout_ms <= 1e9))
      return invalid_argument(p + "queue_timeout_ms: must be in (0, 1e9], got " +
                              real(c.queue_timeout_ms));
    if (c.temporal_step_size < 0)
      return invalid_argument(p + "kv.temporal_step_size: must be >= 1 (0: the engine's), got " +
                              std::to_string(c.temporal_step_size));
    if (!(c.max_hold_ms >= 0 && c.max_hold_ms <= 1e9))
      return invalid_argument(p + "max_hold_ms: must be in [0, 1e9] (0: never paused), got " +
                              std::to_string(c.max_hold_ms));
    if (c.semantic) KVSPLIT_RETURN_IF_ERROR(validate_semantic_cut(*c.semantic, p + "kv."));
  }
  return ok_status();
}

Status validate_kvm_window(const KvmConfig& kvm) {
  if (kvm.window_ms < 100 || kvm.window_ms > 3600000)
    return invalid_argument("kvm.window_ms: must be in [100, 3600000], got " +
                            std::to_string(kvm.window_ms));
  if (kvm.window_ms < kvm.interval_ms)
    return invalid_argument("kvm.window_ms: must be >= kvm.interval_ms (" +
                            std::to_string(kvm.interval_ms) + "), got " +
                            std::to_string(kvm.window_ms));
  return ok_status();
}

Status validate_semantic_cut(const SemanticCutConfig& c, std::string_view path) {
  auto error = [&](const char* field, const std::string& what) {
    return invalid_argument(std::string(path) + field + ": " + what);
  };
  auto in_unit = [](float x) { return std::isfinite(x) && x >= 0.f && x <= 1.f; };
  auto got = [](auto v) {  // integers print as integers (real() would give 1.67772e+07)
    if constexpr (std::is_integral_v<decltype(v)>)
      return ", got " + std::to_string(v);
    else
      return ", got " + real(v);
  };
  if (!in_unit(c.semantic_threshold))
    return error("semantic_threshold", "must be in [0, 1]" + got(c.semantic_threshold));
  if (!in_unit(c.evict_threshold))
    return error("evict_threshold", "must be in [0, 1]" + got(c.evict_threshold));
  if (!in_unit(c.recall_threshold))
    return error("recall_threshold", "must be in [0, 1]" + got(c.recall_threshold));
  if (c.evict_threshold > 0.f && c.semantic_threshold > 0.f &&
      c.evict_threshold >= c.semantic_threshold) {
    return error("evict_threshold", "must be below semantic_threshold (" +
                                        real(c.semantic_threshold) + ")" + got(c.evict_threshold));
  }
  if (!(std::isfinite(c.recall_wait_ms) && c.recall_wait_ms <= 60000.0))
    return error("recall_wait_ms",
                 "must be <= 60000 (< 0: until the copy lands)" + got(c.recall_wait_ms));
  if (c.demote_after_steps < 1)
    return error("demote_after_steps", "must be >= 1" + got(c.demote_after_steps));
  if (c.evict_after_steps < 1)
    return error("evict_after_steps", "must be >= 1" + got(c.evict_after_steps));
  if (c.semantic_window < 0)
    return error("semantic_window", "must be >= 0" + got(c.semantic_window));
  if (c.sink_tokens < 0) return error("sink_tokens", "must be >= 0" + got(c.sink_tokens));
  if (c.recent_tokens < 0) return error("recent_tokens", "must be >= 0" + got(c.recent_tokens));
  if (c.score_interval < 1) return error("score_interval", "must be >= 1" + got(c.score_interval));
  if (!(std::isfinite(c.smoothing) && c.smoothing > 0.f && c.smoothing <= 1.f))
    return error("smoothing", "must be in (0, 1]" + got(c.smoothing));
  // The upper bound of the engine's temporal host tier: MiB << 20 stays far from overflow.
  if (c.host_capacity_mb < 0 || c.host_capacity_mb > (int64_t{1} << 24))
    return error("host_capacity_mb", "must be in [0, 16777216]" + got(c.host_capacity_mb));
  if (c.heavy_tokens < 0) return error("heavy_tokens", "must be >= 0" + got(c.heavy_tokens));
  if (c.summary_parts < 1 || c.summary_parts > 1024)
    return error("summary_parts", "must be in [1, 1024]" + got(c.summary_parts));
  if (c.max_recalls_per_step < 0)
    return error("max_recalls_per_step", "must be >= 0" + got(c.max_recalls_per_step));
  return ok_status();
}

StatusOr<SpeculativeMethod> parse_speculative_method(std::string_view name) {
  if (name == "none") return SpeculativeMethod::kNone;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  return invalid_argument("speculative method must be none or ngram, got '" +
                          escape_for_message(std::string(name), 64) + "'");
}

const char* speculative_method_name(SpeculativeMethod method) {
  return method == SpeculativeMethod::kNgram ? "ngram" : "none";
}

Status validate_speculative(const SpeculativeConfig& c, std::string_view path) {
  const std::string p(path);
  if (c.method != SpeculativeMethod::kNone && c.method != SpeculativeMethod::kNgram)
    return invalid_argument(p + "method: must be none or ngram, got " +
                            std::to_string(static_cast<int>(c.method)));
  KVSPLIT_RETURN_IF_ERROR(
      check_range(p + "num_speculative_tokens", c.num_speculative_tokens, 1, 16));
  KVSPLIT_RETURN_IF_ERROR(check_range(p + "prompt_lookup_max", c.prompt_lookup_max, 1, 32));
  return check_range(p + "prompt_lookup_min", c.prompt_lookup_min, 1, c.prompt_lookup_max);
}

StatusOr<KvPolicy> parse_kv_policy(std::string_view name) {
  if (name == "full") return KvPolicy::kFull;
  if (name == "semantic") return KvPolicy::kSemantic;
  if (name == "streaming") return KvPolicy::kStreaming;
  if (name == "h2o") return KvPolicy::kH2O;
  return invalid_argument("kv policy must be full, semantic, streaming or h2o, got '" +
                          escape_for_message(std::string(name), 64) + "'");
}

const char* kv_policy_name(KvPolicy policy) {
  switch (policy) {
    case KvPolicy::kFull:
      return "full";
    case KvPolicy::kSemantic:
      return "semantic";
    case KvPolicy::kStreaming:
      return "streaming";
    case KvPolicy::kH2O:
      return "h2o";
  }
  return "?";
}

Status validate_block_size(int32_t block_size, std::string_view field) {
  if (block_size != 8 && block_size != 16 && block_size != 32 && block_size != 64) {
    return invalid_argument(std::string(field) + ": must be one of 8, 16, 32, 64, got " +
                            std::to_string(block_size));
  }
  return ok_status();
}

Status validate_cuda_block_size(const EngineConfig& e, const KvFieldNames& names) {
  if (e.backend == "cuda" && e.block_size != 16)
    return unimplemented(std::string(names.block_size) +
                         ": must be 16 on the cuda backend (its kernels are built for 16-token "
                         "pages), got " +
                         std::to_string(e.block_size));
  return ok_status();
}

Status validate_quant_fraction(const EngineConfig& e, const KvFieldNames& names) {
  if (e.kv_quant_fraction <= 0.0) return ok_status();
  std::ostringstream got;
  got << e.kv_quant_fraction;
  if (e.kv_policy != KvPolicy::kSemantic)
    return invalid_argument(
        std::string(names.quant_fraction) + ": must be 0 unless " + std::string(names.policy) +
        " is semantic (the share goes to the int8 / int4 arenas), got " + got.str() + " with " +
        std::string(names.policy) + " " + kv_policy_name(e.kv_policy));
  if (e.kv_blocks_per_worker > 0)
    return invalid_argument(std::string(names.quant_fraction) + ": must be 0 when " +
                            std::string(names.blocks_per_worker) + " is set (it splits " +
                            std::string(names.capacity) + "), got " + got.str());
  return ok_status();
}

Status validate_pool_limits(const EngineConfig& e, std::string_view path) {
  const std::string p(path);
  KVSPLIT_RETURN_IF_ERROR(check_range(p + "threads_per_worker", e.threads_per_worker, 0, 1024));
  constexpr int64_t kMaxThreads = 16384;
  const bool disagg = e.mode == ServingMode::kDisaggregated;
  const int64_t workers = (disagg ? int64_t{e.num_prefill_workers} : 0) + e.num_decode_workers;
  const int64_t per = std::max(1, e.threads_per_worker);
  const int64_t compute = e.backend == "cpu" ? per * std::max(1, e.spatial.shards) : 0;
  const int64_t total = workers * (per + compute);
  if (total > kMaxThreads) {
    return invalid_argument(p + "threads_per_worker: " + std::to_string(e.threads_per_worker) +
                            " threads per worker start " + std::to_string(total) +
                            " threads over " + std::to_string(workers) +
                            " workers (sampling, and compute per shard on the CPU backend), "
                            "more than " +
                            std::to_string(kMaxThreads));
  }
  KVSPLIT_RETURN_IF_ERROR(check_range(p + "max_num_seqs", e.max_num_seqs, 1, 65536));
  return check_range(p + "max_batch_tokens", e.max_batch_tokens, 1, 1 << 20);
}

}  // namespace kvsplit
