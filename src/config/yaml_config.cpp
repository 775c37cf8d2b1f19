// YAML -> Config. The only yaml-cpp user: every yaml-cpp exception is caught here and turned into
// a Status. Scalars are parsed by hand (from_chars / strtod) so that "12abc", overflow and
// fractional integers are errors instead of silent truncation.
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

#include "common/config_rules.h"
#include "common/escape.h"
#include "common/file_read.h"
#include "config/config.h"
#include "config/yaml_strict.h"
#include "kvm/expr.h"

namespace kvsplit::config {
namespace {

std::string quoted(const std::string& value) { return "'" + escape_for_message(value, 64) + "'"; }

Status parse_scalar(const YAML::Node& n, const std::string& path, std::string* out) {
  if (!n.IsScalar()) return field_error(path, "must be a string");
  *out = n.Scalar();
  return ok_status();
}

template <typename Int>
Status parse_int(const YAML::Node& n, const std::string& path, Int* out) {
  if (!n.IsScalar()) return field_error(path, "must be an integer");
  const std::string& s = n.Scalar();
  Int v{};
  if (std::is_unsigned_v<Int> && s == "-0") {  // zero, as the command-line flags read it
    *out = 0;
    return ok_status();
  }
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) return field_error(path, "out of range: " + quoted(s));
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    if (std::is_unsigned_v<Int> && !s.empty() && s[0] == '-')
      return field_error(path, "must be a non-negative integer, got " + quoted(s));
    return field_error(path, "must be an integer, got " + quoted(s));
  }
  *out = v;
  return ok_status();
}
Status parse_scalar(const YAML::Node& n, const std::string& p, int32_t* o) {
  return parse_int(n, p, o);
}
Status parse_scalar(const YAML::Node& n, const std::string& p, int64_t* o) {
  return parse_int(n, p, o);
}
Status parse_scalar(const YAML::Node& n, const std::string& p, uint64_t* o) {
  return parse_int(n, p, o);
}

Status parse_scalar(const YAML::Node& n, const std::string& path, double* out) {
  if (!n.IsScalar()) return field_error(path, "must be a number");
  const std::string& s = n.Scalar();
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
    return field_error(path, "must be a finite number, got " + quoted(s));
  *out = v;
  return ok_status();
}

Status parse_scalar(const YAML::Node& n, const std::string& path, float* out) {
  double v = 0;
  KVSPLIT_RETURN_IF_ERROR(parse_scalar(n, path, &v));
  if (std::fabs(v) > 1e30) return field_error(path, "out of range: " + quoted(n.Scalar()));
  *out = static_cast<float>(v);
  return ok_status();
}

Status parse_scalar(const YAML::Node& n, const std::string& path, bool* out) {
  if (!n.IsScalar()) return field_error(path, "must be true or false");
  const std::string& s = n.Scalar();
  if (s == "true") {
    *out = true;
  } else if (s == "false") {
    *out = false;
  } else {
    return field_error(path, "must be true or false, got " + quoted(s));
  }
  return ok_status();
}

// One YAML mapping: typed getters that remember which keys were read, so finish() can reject
// the rest as unknown.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  Status check_is_map() const {
    if (!node_.IsMap())
      return field_error(path_.empty() ? "(top level)" : path_, "must be a mapping");
    return ok_status();
  }
  // Leaves *out untouched when the key is absent. A key given with no value (`mode:`, `~`,
  // `null`) is an error: read as absent it silently took the default (kvm.mode: enforce).
  template <typename T>
  Status get(const std::string& key, T* out) {
    seen_.insert(key);
    const YAML::Node n = cnode()[key];
    if (!n) return ok_status();
    if (n.IsNull())
      return field_error(join(path_, key),
                         "has no value (remove the key to take the default, or give one)");
    return parse_scalar(n, join(path_, key), out);
  }
  bool has(const std::string& key) const {
    const YAML::Node n = cnode()[key];
    return n && !n.IsNull();
  }
  // The key is written, with a value or without one (get() then names it).
  bool present(const std::string& key) const { return static_cast<bool>(cnode()[key]); }
  // A section (mapping or list) or a value read by hand; one written with no value (`api_keys:`,
  // `rules:`) is an error at finish(), as get()'s are: read as absent, an empty templated
  // `api_keys:` meant no authentication and `rules:` no KVM.
  YAML::Node child(const std::string& key) {
    seen_.insert(key);
    YAML::Node n = cnode()[key];
    if (n && n.IsNull() && empty_child_.empty()) empty_child_ = key;
    return n;
  }
  // `known` non-empty: an unknown field is reported without its name, listing these instead (a
  // server.api_keys entry, where a stray field name may be a secret key).
  Status finish(std::string_view known = {}) const {
    if (!empty_child_.empty())
      return field_error(join(path_, empty_child_),
                         "has no value (remove the key to take the default, or give one)");
    for (const auto& kv : node_) {
      std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      if (seen_.count(key)) continue;
      if (!known.empty())
        return field_error(path_,
                           "unknown field (its name is not shown: it may be a secret); "
                           "the fields are " +
                               std::string(known));
      return field_error(join(path_, key), "unknown key");
    }
    return ok_status();
  }
  const std::string& path() const { return path_; }

 private:
  // Lookups go through the const overload: the non-const operator[] may insert keys.
  const YAML::Node& cnode() const { return node_; }
  YAML::Node node_;
  std::string path_;
  std::set<std::string> seen_;
  std::string empty_child_;  // the first key child() found written with no value
};

Status read_model(const YAML::Node& n, Config* c) {
  EngineConfig* e = &c->engine;
  if (n.IsScalar()) {
    c->model_given = true;
    return parse_scalar(n, "model", &e->model);
  }
  MapReader r(n, "model");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  KVSPLIT_RETURN_IF_ERROR(r.get("path", &e->model));
  c->model_given = r.has("path");
  KVSPLIT_RETURN_IF_ERROR(r.get("tokenizer", &e->tokenizer));
  return r.finish();
}

// One server.api_keys entry: a plain key (full rights), or a mapping of `key` and its policy
// (KeyPolicy; range and class checks are validate_config's).
Status read_api_key(const YAML::Node& n, const std::string& path, ApiKey* out) {
  if (n.IsScalar()) return parse_scalar(n, path, &out->key);
  if (!n.IsMap())
    return field_error(path, "must be a key (a string) or a mapping with `key` and its policy");
  MapReader r(n, path);
  KVSPLIT_RETURN_IF_ERROR(r.get("key", &out->key));
  if (!r.has("key")) return field_error(join(path, "key"), "required (the bearer key)");
  KeyPolicy& p = out->policy;
  if (YAML::Node classes = r.child("sla_classes"); classes && !classes.IsNull()) {
    const std::string list = join(path, "sla_classes");
    if (!classes.IsSequence()) return field_error(list, "must be a list of SLA class names");
    for (size_t i = 0; i < classes.size(); ++i) {
      std::string name;
      KVSPLIT_RETURN_IF_ERROR(
          parse_scalar(classes[i], list + "[" + std::to_string(i) + "]", &name));
      p.sla_classes.push_back(std::move(name));
    }
  }
  int32_t v = 0;
  KVSPLIT_RETURN_IF_ERROR(r.get("max_priority", &v));
  if (r.has("max_priority")) p.max_priority = v;
  KVSPLIT_RETURN_IF_ERROR(r.get("max_streams", &v));
  if (r.has("max_streams")) p.max_streams = v;
  KVSPLIT_RETURN_IF_ERROR(r.get("server_stats", &p.server_stats));
  return r.finish("key, sla_classes, max_priority, max_streams, server_stats");
}

Status read_server(const YAML::Node& n, ServerConfig* s) {
  MapReader r(n, "server");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  KVSPLIT_RETURN_IF_ERROR(r.get("host", &s->host));
  KVSPLIT_RETURN_IF_ERROR(r.get("port", &s->port));
  KVSPLIT_RETURN_IF_ERROR(r.get("metrics_port", &s->metrics_port));
  KVSPLIT_RETURN_IF_ERROR(r.get("metrics_host", &s->metrics_host));
  if (YAML::Node tls = r.child("tls"); tls && !tls.IsNull()) {
    MapReader t(tls, "server.tls");
    KVSPLIT_RETURN_IF_ERROR(t.check_is_map());
    KVSPLIT_RETURN_IF_ERROR(t.get("cert_file", &s->tls.cert_file));
    KVSPLIT_RETURN_IF_ERROR(t.get("key_file", &s->tls.key_file));
    KVSPLIT_RETURN_IF_ERROR(t.finish());
  }
  if (YAML::Node keys = r.child("api_keys"); keys && !keys.IsNull()) {
    if (!keys.IsSequence())
      return field_error("server.api_keys",
                         "must be a list of keys (strings, or mappings with `key` and a policy)");
    s->api_keys.clear();
    for (size_t i = 0; i < keys.size(); ++i) {
      ApiKey k;
      KVSPLIT_RETURN_IF_ERROR(
          read_api_key(keys[i], "server.api_keys[" + std::to_string(i) + "]", &k));
      s->api_keys.push_back(std::move(k));
    }
  }
  KVSPLIT_RETURN_IF_ERROR(r.get("max_concurrent_streams", &s->max_concurrent_streams));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_streams_per_tenant", &s->max_streams_per_tenant));
  KVSPLIT_RETURN_IF_ERROR(r.get("request_message_timeout_ms", &s->request_message_timeout_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_message_bytes", &s->max_message_bytes));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_prompt_bytes", &s->max_prompt_bytes));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_tokens_limit", &s->max_tokens_limit));
  KVSPLIT_RETURN_IF_ERROR(r.get("default_max_tokens", &s->default_max_tokens));
  KVSPLIT_RETURN_IF_ERROR(r.get("drain_timeout_ms", &s->drain_timeout_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("keepalive_ms", &s->keepalive_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("keepalive_timeout_ms", &s->keepalive_timeout_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_connection_idle_ms", &s->max_connection_idle_ms));
  return r.finish();
}

Status read_pools(const YAML::Node& n, EngineConfig* e) {
  MapReader r(n, "pools");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  std::string mode;
  KVSPLIT_RETURN_IF_ERROR(r.get("mode", &mode));
  if (mode == "colocated")
    e->mode = ServingMode::kColocated;
  else if (mode == "disaggregated")
    e->mode = ServingMode::kDisaggregated;
  else if (r.has("mode"))
    return field_error("pools.mode", "must be 'colocated' or 'disaggregated', got " + quoted(mode));
  KVSPLIT_RETURN_IF_ERROR(r.get("backend", &e->backend));
  KVSPLIT_RETURN_IF_ERROR(r.get("prefill_workers", &e->num_prefill_workers));
  KVSPLIT_RETURN_IF_ERROR(r.get("decode_workers", &e->num_decode_workers));
  if (YAML::Node devices = r.child("devices"); devices && !devices.IsNull()) {
    if (!devices.IsSequence()) return field_error("pools.devices", "must be a list of integers");
    e->devices.clear();
    for (size_t i = 0; i < devices.size(); ++i) {
      int32_t d = 0;
      KVSPLIT_RETURN_IF_ERROR(
          parse_scalar(devices[i], "pools.devices[" + std::to_string(i) + "]", &d));
      e->devices.push_back(d);
    }
  }
  KVSPLIT_RETURN_IF_ERROR(r.get("threads_per_worker", &e->threads_per_worker));
  KVSPLIT_RETURN_IF_ERROR(r.get("async_copies", &e->async_copies));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_num_seqs", &e->max_num_seqs));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_batch_tokens", &e->max_batch_tokens));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_chunk_tokens", &e->max_chunk_tokens));
  // A number of ms, or `auto` (EngineConfig::max_chunk_ms_auto: from the SLA classes' ITL).
  if (YAML::Node n = r.child("max_chunk_ms"); n && n.IsScalar() && n.Scalar() == "auto") {
    e->max_chunk_ms_auto = true;
    e->max_chunk_ms = 0;
  } else if (n && n.IsScalar() && !n.IsNull()) {
    double ms = 0;
    if (!parse_scalar(n, "pools.max_chunk_ms", &ms).ok())
      return field_error("pools.max_chunk_ms",
                         "must be a number of milliseconds or 'auto', got " + quoted(n.Scalar()));
    e->max_chunk_ms = ms;
    e->max_chunk_ms_auto = false;
  } else {
    KVSPLIT_RETURN_IF_ERROR(r.get("max_chunk_ms", &e->max_chunk_ms));
  }
  KVSPLIT_RETURN_IF_ERROR(r.get("max_unread_events", &e->max_unread_events));
  KVSPLIT_RETURN_IF_ERROR(r.get("handoff_timeout_ms", &e->handoff_timeout_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("handoff_stall_ms", &e->handoff_stall_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("cache_aware_handoffs", &e->cache_aware_handoffs));
  KVSPLIT_RETURN_IF_ERROR(r.get("forward_waiting_handoffs", &e->forward_waiting_handoffs));
  return r.finish();
}

// speculative: {method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max}.
Status read_speculative(const YAML::Node& n, SpeculativeConfig* c) {
  MapReader r(n, "speculative");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  std::string method;
  KVSPLIT_RETURN_IF_ERROR(r.get("method", &method));
  if (r.has("method")) {
    StatusOr<SpeculativeMethod> m = parse_speculative_method(method);
    if (!m.ok()) return field_error("speculative.method", m.status().message());
    c->method = *m;
  }
  KVSPLIT_RETURN_IF_ERROR(r.get("num_speculative_tokens", &c->num_speculative_tokens));
  KVSPLIT_RETURN_IF_ERROR(r.get("prompt_lookup_min", &c->prompt_lookup_min));
  KVSPLIT_RETURN_IF_ERROR(r.get("prompt_lookup_max", &c->prompt_lookup_max));
  return r.finish();
}

// The semantic cut's keys (kv.cuts.semantic and sla_classes.<name>.kv): each one present replaces
// the field of *c; range checks are validate_semantic_cut's (validate_config).
// The keys read_semantic_keys reads.
constexpr const char* kSemanticKeys[] = {
    "semantic_threshold", "evict_threshold",  "demote_after_steps",
    "evict_after_steps",  "recall_threshold", "recall_wait_ms",
    "semantic_window",    "sink_tokens",      "recent_tokens",
    "score_interval",     "smoothing",        "host_capacity_mb",
    "heavy_tokens",       "recall_precision", "max_recalls_per_step",
    "summary_parts"};

Status read_semantic_keys(MapReader& r, SemanticCutConfig* c) {
  KVSPLIT_RETURN_IF_ERROR(r.get("semantic_threshold", &c->semantic_threshold));
  KVSPLIT_RETURN_IF_ERROR(r.get("evict_threshold", &c->evict_threshold));
  KVSPLIT_RETURN_IF_ERROR(r.get("demote_after_steps", &c->demote_after_steps));
  KVSPLIT_RETURN_IF_ERROR(r.get("evict_after_steps", &c->evict_after_steps));
  KVSPLIT_RETURN_IF_ERROR(r.get("recall_threshold", &c->recall_threshold));
  KVSPLIT_RETURN_IF_ERROR(r.get("recall_wait_ms", &c->recall_wait_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("semantic_window", &c->semantic_window));
  KVSPLIT_RETURN_IF_ERROR(r.get("sink_tokens", &c->sink_tokens));
  KVSPLIT_RETURN_IF_ERROR(r.get("recent_tokens", &c->recent_tokens));
  KVSPLIT_RETURN_IF_ERROR(r.get("score_interval", &c->score_interval));
  KVSPLIT_RETURN_IF_ERROR(r.get("smoothing", &c->smoothing));
  KVSPLIT_RETURN_IF_ERROR(r.get("host_capacity_mb", &c->host_capacity_mb));
  KVSPLIT_RETURN_IF_ERROR(r.get("heavy_tokens", &c->heavy_tokens));
  KVSPLIT_RETURN_IF_ERROR(r.get("max_recalls_per_step", &c->max_recalls_per_step));
  KVSPLIT_RETURN_IF_ERROR(r.get("summary_parts", &c->summary_parts));
  std::string rung;
  KVSPLIT_RETURN_IF_ERROR(r.get("recall_precision", &rung));
  if (r.has("recall_precision")) {
    const std::optional<RecallPrecision> p = parse_recall_precision(rung);
    if (!p)
      return field_error(join(r.path(), "recall_precision"),
                         "must be 'full', 'int8' or 'int4', got " + quoted(rung));
    c->recall_precision = *p;
  }
  return ok_status();
}

// kv.policy, kv.kv_cache_compression and kv.cuts.semantic.enabled all choose the policy; when
// more than one is given they must agree.
Status read_kv_policy(MapReader& r, EngineConfig* e) {
  std::optional<KvPolicy> chosen;
  std::string chosen_by;
  auto choose = [&](KvPolicy p, const std::string& field) -> Status {
    if (chosen && *chosen != p) {
      return field_error(field, "asks for KV policy '" + std::string(kv_policy_name(p)) + "' but " +
                                    chosen_by + " asks for '" + kv_policy_name(*chosen) + "'");
    }
    chosen = p;
    chosen_by = field;
    return ok_status();
  };
  std::string policy;
  KVSPLIT_RETURN_IF_ERROR(r.get("policy", &policy));
  if (r.has("policy")) {
    auto p = parse_kv_policy(policy);
    if (!p.ok())
      return field_error("kv.policy",
                         "must be 'full', 'semantic', 'streaming' or 'h2o', got " + quoted(policy));
    KVSPLIT_RETURN_IF_ERROR(choose(*p, "kv.policy"));
  }
  std::string compression;
  KVSPLIT_RETURN_IF_ERROR(r.get("kv_cache_compression", &compression));
  if (r.has("kv_cache_compression")) {
    if (compression == "semantic_v2") {
      KVSPLIT_RETURN_IF_ERROR(choose(KvPolicy::kSemantic, "kv.kv_cache_compression"));
    } else if (compression != "none") {
      return field_error("kv.kv_cache_compression",
                         "must be 'semantic_v2' or 'none', got " + quoted(compression));
    } else if (chosen == KvPolicy::kSemantic) {
      return field_error("kv.kv_cache_compression",
                         "is 'none' but " + chosen_by + " asks for the semantic cut");
    } else {  // full KV, as --kv-cache-compression none asks
      KVSPLIT_RETURN_IF_ERROR(choose(KvPolicy::kFull, "kv.kv_cache_compression"));
    }
  }
  if (YAML::Node cuts = r.child("cuts"); cuts && !cuts.IsNull()) {
    MapReader c(cuts, "kv.cuts");
    KVSPLIT_RETURN_IF_ERROR(c.check_is_map());
    if (YAML::Node sem = c.child("semantic"); sem && !sem.IsNull()) {
      MapReader sr(sem, "kv.cuts.semantic");
      KVSPLIT_RETURN_IF_ERROR(sr.check_is_map());
      bool enabled = false;
      KVSPLIT_RETURN_IF_ERROR(sr.get("enabled", &enabled));
      if (sr.has("enabled")) {
        if (enabled) {
          KVSPLIT_RETURN_IF_ERROR(choose(KvPolicy::kSemantic, "kv.cuts.semantic.enabled"));
        } else if (chosen == KvPolicy::kSemantic) {
          return field_error("kv.cuts.semantic.enabled",
                             "is false but " + chosen_by + " asks for the semantic cut");
        }
      }
      KVSPLIT_RETURN_IF_ERROR(read_semantic_keys(sr, &e->semantic));
      KVSPLIT_RETURN_IF_ERROR(sr.finish());
    }
    if (YAML::Node tem = c.child("temporal"); tem && !tem.IsNull()) {
      MapReader tr(tem, "kv.cuts.temporal");
      KVSPLIT_RETURN_IF_ERROR(tr.check_is_map());
      KVSPLIT_RETURN_IF_ERROR(tr.get("temporal_step_size", &e->temporal.temporal_step_size));
      if (e->temporal.temporal_step_size < 1)
        return field_error("kv.cuts.temporal.temporal_step_size",
                           "must be >= 1, got " + std::to_string(e->temporal.temporal_step_size));
      std::string swap;
      KVSPLIT_RETURN_IF_ERROR(tr.get("swap", &swap));
      if (tr.has("swap")) {
        const std::optional<SwapMode> mode = parse_swap_mode(swap);
        if (!mode)
          return field_error("kv.cuts.temporal.swap",
                             "must be 'auto', 'always' or 'never', got " + quoted(swap));
        e->temporal.swap = *mode;
      }
      KVSPLIT_RETURN_IF_ERROR(tr.get("host_prefetch", &e->temporal.host_prefetch));
      KVSPLIT_RETURN_IF_ERROR(tr.finish());
    }
    if (YAML::Node spa = c.child("spatial"); spa && !spa.IsNull()) {
      MapReader pr(spa, "kv.cuts.spatial");
      KVSPLIT_RETURN_IF_ERROR(pr.check_is_map());
      KVSPLIT_RETURN_IF_ERROR(pr.get("shards", &e->spatial.shards));
      if (e->spatial.shards < 1 || e->spatial.shards > 16)
        return field_error("kv.cuts.spatial.shards",
                           "must be in [1, 16], got " + std::to_string(e->spatial.shards));
      KVSPLIT_RETURN_IF_ERROR(pr.get("spatial_chunk_size", &e->spatial.spatial_chunk_size));
      if (e->spatial.spatial_chunk_size < 1)
        return field_error("kv.cuts.spatial.spatial_chunk_size",
                           "must be a positive multiple of kv.block_size, got " +
                               std::to_string(e->spatial.spatial_chunk_size));
      KVSPLIT_RETURN_IF_ERROR(pr.get("min_context", &e->spatial.min_context));
      if (e->spatial.min_context < 0)
        return field_error("kv.cuts.spatial.min_context",
                           "must be >= 0, got " + std::to_string(e->spatial.min_context));
      std::string communicator;
      KVSPLIT_RETURN_IF_ERROR(pr.get("communicator", &communicator));
      if (pr.has("communicator")) {
        const std::optional<SpatialCommunicator> comm = parse_spatial_communicator(communicator);
        if (!comm)
          return field_error("kv.cuts.spatial.communicator",
                             "must be 'auto', 'in_process' or 'nccl', got " + quoted(communicator));
        e->spatial.communicator = *comm;
      }
      KVSPLIT_RETURN_IF_ERROR(pr.finish());
    }
    KVSPLIT_RETURN_IF_ERROR(c.finish());
  }
  if (chosen) e->kv_policy = *chosen;
  return ok_status();
}

Status read_kv(const YAML::Node& n, EngineConfig* e) {
  MapReader r(n, "kv");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  KVSPLIT_RETURN_IF_ERROR(r.get("block_size", &e->block_size));
  KVSPLIT_RETURN_IF_ERROR(r.get("blocks_per_worker", &e->kv_blocks_per_worker));
  int64_t capacity_mb = 0;
  KVSPLIT_RETURN_IF_ERROR(r.get("capacity_mb", &capacity_mb));
  if (r.has("capacity_mb")) {
    if (capacity_mb < 1 || capacity_mb > (int64_t{1} << 24))
      return field_error("kv.capacity_mb",
                         "must be in [1, 16777216], got " + std::to_string(capacity_mb));
    e->kv_capacity_bytes = capacity_mb << 20;
  }
  std::string dtype;
  KVSPLIT_RETURN_IF_ERROR(r.get("dtype", &dtype));
  if (r.has("dtype") && dtype != "auto" && dtype != "fp32")
    return field_error("kv.dtype",
                       "must be 'auto' or 'fp32' (the engine stores KV in the model's "
                       "compute dtype), got " +
                           quoted(dtype));
  KVSPLIT_RETURN_IF_ERROR(r.get("quant_fraction", &e->kv_quant_fraction));
  if (!(e->kv_quant_fraction >= 0.0 && e->kv_quant_fraction <= 0.9))
    return field_error("kv.quant_fraction",
                       "must be in [0, 0.9], got " + std::to_string(e->kv_quant_fraction));
  if (YAML::Node disk = r.child("disk"); disk && !disk.IsNull()) {
    MapReader dr(disk, "kv.disk");
    KVSPLIT_RETURN_IF_ERROR(dr.check_is_map());
    KVSPLIT_RETURN_IF_ERROR(dr.get("path", &e->temporal.disk_path));
    if (e->temporal.disk_path.empty())
      return field_error("kv.disk.path", "must be a directory path (the disk tier's files)");
    KVSPLIT_RETURN_IF_ERROR(dr.get("capacity_mb", &e->temporal.disk_capacity_mb));
    if (e->temporal.disk_capacity_mb < 1 || e->temporal.disk_capacity_mb > (int64_t{1} << 30))
      return field_error("kv.disk.capacity_mb", "must be in [1, 1073741824], got " +
                                                    std::to_string(e->temporal.disk_capacity_mb));
    KVSPLIT_RETURN_IF_ERROR(dr.get("direct_io", &e->temporal.disk_direct_io));
    KVSPLIT_RETURN_IF_ERROR(dr.get("write_behind", &e->temporal.disk_write_behind));
    KVSPLIT_RETURN_IF_ERROR(dr.finish());
  }
  std::string prefix;
  KVSPLIT_RETURN_IF_ERROR(r.get("prefix_cache", &prefix));
  if (r.has("prefix_cache")) {
    if (prefix != "on" && prefix != "off")
      return field_error("kv.prefix_cache", "must be 'on' or 'off', got " + quoted(prefix));
    e->prefix_cache = prefix == "on";
  }
  KVSPLIT_RETURN_IF_ERROR(r.get("prefix_spill_ahead_blocks", &e->prefix_spill_ahead_blocks));
  if (e->prefix_spill_ahead_blocks < 0 || e->prefix_spill_ahead_blocks > (1 << 24))
    return field_error(
        "kv.prefix_spill_ahead_blocks",
        "must be in [0, 16777216], got " + std::to_string(e->prefix_spill_ahead_blocks));
  KVSPLIT_RETURN_IF_ERROR(r.get("host_capacity_mb", &e->temporal.host_capacity_mb));
  if (e->temporal.host_capacity_mb < 0 || e->temporal.host_capacity_mb > (int64_t{1} << 24))
    return field_error("kv.host_capacity_mb", "must be in [0, 16777216], got " +
                                                  std::to_string(e->temporal.host_capacity_mb));
  KVSPLIT_RETURN_IF_ERROR(read_kv_policy(r, e));
  return r.finish();
}

// `defaults`: the engine's semantic settings (kv.cuts.semantic, read before the classes), which a
// class's `kv` keys override one by one.
Status read_sla_classes(const YAML::Node& n, const SemanticCutConfig& defaults,
                        std::vector<SlaClass>* out) {
  if (!n.IsMap() || n.size() == 0)
    return field_error("sla_classes", "must be a non-empty mapping of class name -> settings");
  out->clear();
  for (const auto& kv : n) {
    SlaClass c;
    KVSPLIT_RETURN_IF_ERROR(parse_scalar(kv.first, "sla_classes", &c.name));
    const std::string path = join("sla_classes", c.name);
    MapReader r(kv.second, path);
    KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
    KVSPLIT_RETURN_IF_ERROR(r.get("max_ttft_ms", &c.max_ttft_ms));
    KVSPLIT_RETURN_IF_ERROR(r.get("max_itl_ms", &c.max_itl_ms));
    KVSPLIT_RETURN_IF_ERROR(r.get("priority", &c.priority));
    KVSPLIT_RETURN_IF_ERROR(r.get("max_queue", &c.max_queue));
    KVSPLIT_RETURN_IF_ERROR(r.get("queue_timeout_ms", &c.queue_timeout_ms));
    KVSPLIT_RETURN_IF_ERROR(r.get("max_hold_ms", &c.max_hold_ms));
    if (YAML::Node kv_node = r.child("kv"); kv_node && !kv_node.IsNull()) {
      MapReader k(kv_node, join(path, "kv"));
      KVSPLIT_RETURN_IF_ERROR(k.check_is_map());
      // Sizes and layouts of the worker's pool are not per class: refused rather than ignored.
      for (const char* key : {"host_capacity_mb", "summary_parts"}) {
        if (k.present(key))
          return field_error(join(join(path, "kv"), key),
                             "is a per-worker pool setting: set it in kv.cuts.semantic");
      }
      // A semantic override only when the block sets a semantic key: a class with only temporal
      // or spatial keys keeps following the engine's semantic settings (and the KV cache
      // manager's engine-wide changes to them).
      if (std::any_of(std::begin(kSemanticKeys), std::end(kSemanticKeys),
                      [&](const char* key) { return k.present(key); })) {
        c.semantic = defaults;
        KVSPLIT_RETURN_IF_ERROR(read_semantic_keys(k, &*c.semantic));
      }
      // The temporal cut's per-class keys.
      std::string swap;
      KVSPLIT_RETURN_IF_ERROR(k.get("swap", &swap));
      if (k.has("swap")) {
        c.swap = parse_swap_mode(swap);
        if (!c.swap)
          return field_error(join(join(path, "kv"), "swap"),
                             "must be 'auto', 'always' or 'never', got " + quoted(swap));
      }
      KVSPLIT_RETURN_IF_ERROR(k.get("temporal_step_size", &c.temporal_step_size));
      if (k.has("temporal_step_size") && c.temporal_step_size < 1)
        return field_error(join(join(path, "kv"), "temporal_step_size"),
                           "must be >= 1, got " + std::to_string(c.temporal_step_size));
      // The spatial cut's per-class key.
      bool spread = false;
      KVSPLIT_RETURN_IF_ERROR(k.get("spread", &spread));
      if (k.has("spread")) c.spread = spread;
      KVSPLIT_RETURN_IF_ERROR(k.finish());
    }
    KVSPLIT_RETURN_IF_ERROR(r.finish());
    out->push_back(std::move(c));
  }
  return ok_status();
}

// kvm.rules[i] / rules[i] of a rules file: one map per rule, conditions and actions in the
// expression form of kvm/expr.h. `index`: the rule's place in the whole policy (default name).
Status read_kvm_expr_field(MapReader& m, const std::string& key, const char* example,
                           std::string* text) {
  const std::string path = join(m.path(), key);
  KVSPLIT_RETURN_IF_ERROR(m.get(key, text));
  if (!m.has(key)) return field_error(path, std::string("required, e.g. \"") + example + "\"");
  return ok_status();
}

Status read_kvm_rule(const YAML::Node& n, const std::string& path, size_t index, KvmRule* r) {
  MapReader m(n, path);
  KVSPLIT_RETURN_IF_ERROR(m.check_is_map());
  r->name = "rule-" + std::to_string(index);
  KVSPLIT_RETURN_IF_ERROR(m.get("name", &r->name));
  // Expression errors name the rule as the engine's checks do: kvm.rules[0] (hot).when: ...
  const std::string named = m.has("name") ? path + " (" + r->name + ")" : path;
  std::string text;
  KVSPLIT_RETURN_IF_ERROR(read_kvm_expr_field(m, "when", "device_kv_use > 0.90", &text));
  auto when = kvm::parse_condition(text);
  if (!when.ok()) return field_error(join(named, "when"), when.status().message());
  r->when = *when;
  KVSPLIT_RETURN_IF_ERROR(read_kvm_expr_field(m, "exit", "device_kv_use < 0.80", &text));
  auto exit = kvm::parse_condition(text);
  if (!exit.ok()) return field_error(join(named, "exit"), exit.status().message());
  r->exit = *exit;
  KVSPLIT_RETURN_IF_ERROR(read_kvm_expr_field(m, "then", "semantic_threshold += 0.05", &text));
  auto then = kvm::parse_action(text);
  if (!then.ok()) return field_error(join(named, "then"), then.status().message());
  r->then = *then;
  KVSPLIT_RETURN_IF_ERROR(m.get("class", &r->sla_class));
  KVSPLIT_RETURN_IF_ERROR(m.get("min", &r->min));
  KVSPLIT_RETURN_IF_ERROR(m.get("max", &r->max));
  KVSPLIT_RETURN_IF_ERROR(m.get("cooldown_ms", &r->cooldown_ms));
  KVSPLIT_RETURN_IF_ERROR(m.get("restore_on_exit", &r->restore_on_exit));
  KVSPLIT_RETURN_IF_ERROR(m.get("hold_ms", &r->hold_ms));
  return m.finish();
}

Status read_kvm_rules(const YAML::Node& n, const std::string& path, size_t first_index,
                      std::vector<KvmRule>* out) {
  if (!n.IsSequence()) return field_error(path, "must be a list of rules");
  for (size_t i = 0; i < n.size(); ++i) {
    KvmRule r;
    KVSPLIT_RETURN_IF_ERROR(
        read_kvm_rule(n[i], path + "[" + std::to_string(i) + "]", first_index + i, &r));
    out->push_back(std::move(r));
  }
  return ok_status();
}

StatusOr<std::vector<KvmRule>> load_rules_file(const std::string& path, size_t first_index);

Status read_kvm(const YAML::Node& n, KvmConfig* k) {
  MapReader r(n, "kvm");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  std::string mode;
  KVSPLIT_RETURN_IF_ERROR(r.get("mode", &mode));
  if (mode == "enforce")
    k->mode = KvmMode::kEnforce;
  else if (mode == "dry-run")
    k->mode = KvmMode::kDryRun;
  else if (r.has("mode"))
    return field_error("kvm.mode", "must be 'enforce' or 'dry-run', got " + quoted(mode));
  KVSPLIT_RETURN_IF_ERROR(r.get("interval_ms", &k->interval_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("window_ms", &k->window_ms));
  KVSPLIT_RETURN_IF_ERROR(r.get("decision_log", &k->decision_log));
  KVSPLIT_RETURN_IF_ERROR(r.get("rules_file", &k->rules_file));
  if (r.has("rules_file") && k->rules_file.empty())
    return field_error("kvm.rules_file", "must be a file path");
  k->rules.clear();
  if (YAML::Node rules = r.child("rules"); rules && !rules.IsNull())
    KVSPLIT_RETURN_IF_ERROR(read_kvm_rules(rules, "kvm.rules", 0, &k->rules));
  KVSPLIT_RETURN_IF_ERROR(r.finish());
  if (!k->rules_file.empty()) {
    KVSPLIT_ASSIGN_OR_RETURN(std::vector<KvmRule> more,
                             load_rules_file(k->rules_file, k->rules.size()));
    k->file_rules_begin = k->rules.size();
    for (KvmRule& rule : more) k->rules.push_back(std::move(rule));
  }
  k->enabled = !k->rules.empty();
  return ok_status();
}

// class_base: what a class's kv block is read over (null: the file's kv.cuts.semantic).
Status parse_into(const YAML::Node& root, Config* c, const SemanticCutConfig* class_base) {
  if (!root || root.IsNull()) return ok_status();  // an empty file: all defaults
  MapReader r(root, "");
  KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
  if (YAML::Node n = r.child("model"); n && !n.IsNull()) KVSPLIT_RETURN_IF_ERROR(read_model(n, c));
  if (YAML::Node n = r.child("server"); n && !n.IsNull())
    KVSPLIT_RETURN_IF_ERROR(read_server(n, &c->server));
  if (YAML::Node n = r.child("pools"); n && !n.IsNull())
    KVSPLIT_RETURN_IF_ERROR(read_pools(n, &c->engine));
  if (YAML::Node n = r.child("kv"); n && !n.IsNull())
    KVSPLIT_RETURN_IF_ERROR(read_kv(n, &c->engine));
  if (YAML::Node n = r.child("sla_classes"); n && !n.IsNull())
    KVSPLIT_RETURN_IF_ERROR(
        read_sla_classes(n, class_base ? *class_base : c->engine.semantic, &c->engine.sla_classes));
  if (YAML::Node n = r.child("kvm"); n && !n.IsNull())
    KVSPLIT_RETURN_IF_ERROR(read_kvm(n, &c->engine.kvm));
  if (YAML::Node n = r.child("speculative"); n && !n.IsNull())
    KVSPLIT_RETURN_IF_ERROR(read_speculative(n, &c->engine.speculative));
  KVSPLIT_RETURN_IF_ERROR(r.get("seed", &c->engine.seed));
  return r.finish();
}

// Runs `body` on the root of one strict YAML document (load_strict_yaml), turning yaml-cpp's
// exceptions into kInvalidArgument.
template <typename Body>
Status with_strict_yaml(const std::string& text, Body&& body) {
  try {
    KVSPLIT_ASSIGN_OR_RETURN(const YAML::Node root, load_strict_yaml(text));
    return body(root);
  } catch (const YAML::DeepRecursion& e) {
    return invalid_argument("YAML nested deeper than " + std::to_string(kMaxYamlDepth) +
                            " levels (the limit): the parser gave up at depth " +
                            std::to_string(e.depth()) + ", line " +
                            std::to_string(e.mark.line + 1));
  } catch (const YAML::Exception& e) {
    return invalid_argument("YAML error at line " + std::to_string(e.mark.line + 1) + ", column " +
                            std::to_string(e.mark.column + 1) + ": " +
                            escape_for_message(e.msg));  // it may quote the file's bytes
  } catch (const std::exception& e) {
    return invalid_argument(std::string("YAML error: ") + escape_for_message(e.what()));
  }
}

// A rules file: one document whose top level holds `rules:` only. Errors start with
// "kvm.rules_file <path>: ".
StatusOr<std::vector<KvmRule>> load_rules_file(const std::string& path, size_t first_index) {
  KVSPLIT_ASSIGN_OR_RETURN(
      std::string text,
      common::read_regular_file(path, common::kMaxConfigFileBytes, "kvm.rules_file"));
  std::vector<KvmRule> rules;
  Status s = with_strict_yaml(text, [&](const YAML::Node& root) -> Status {
    if (!root || root.IsNull()) return field_error("rules", "required (a list of rules)");
    MapReader r(root, "");
    KVSPLIT_RETURN_IF_ERROR(r.check_is_map());
    const YAML::Node list = r.child("rules");
    if (!list || list.IsNull()) return field_error("rules", "required (a list of rules)");
    KVSPLIT_RETURN_IF_ERROR(read_kvm_rules(list, "rules", first_index, &rules));
    return r.finish();
  });
  if (!s.ok()) return s.with_prefix("kvm.rules_file " + escape_for_message(path, 256));
  return rules;
}

}  // namespace

StatusOr<std::vector<KvmRule>> load_kvm_rules_file(const std::string& path) {
  return load_rules_file(path, 0);
}

namespace {

StatusOr<Config> parse_config_over(std::string_view yaml_text,
                                   const SemanticCutConfig* class_base) {
  Config config;
  KVSPLIT_RETURN_IF_ERROR(with_strict_yaml(std::string(yaml_text), [&](const YAML::Node& root) {
    return parse_into(root, &config, class_base);
  }));
  KVSPLIT_RETURN_IF_ERROR(validate_config(config));
  return config;
}

StatusOr<Config> load_config_over(const std::string& path, const SemanticCutConfig* class_base) {
  KVSPLIT_ASSIGN_OR_RETURN(std::string text,
                           common::read_regular_file(path, common::kMaxConfigFileBytes, "config"));
  auto config = parse_config_over(text, class_base);
  if (!config.ok()) return config.status().with_prefix(path);
  return config;
}

}  // namespace

StatusOr<Config> parse_config(std::string_view yaml_text) {
  return parse_config_over(yaml_text, nullptr);
}

StatusOr<Config> load_config_file(const std::string& path) {
  return load_config_over(path, nullptr);
}

StatusOr<Config> load_config_file(const std::string& path, const SemanticCutConfig& running) {
  return load_config_over(path, &running);
}

}  // namespace kvsplit::config
