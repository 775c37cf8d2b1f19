// Range checks of a Config with field-path errors (YAML-free: also used after flag overrides).
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "common/config_rules.h"
#include "common/escape.h"
#include "config/config.h"
#include "kvm/rule_engine.h"

namespace kvsplit::config {
namespace {

// Integers print as integers ("got 2147483647", never "2.14748e+09"); reals in shortest form.
Status range_error(const std::string& field, const std::string& rule, int64_t got) {
  return invalid_argument(field + ": must be " + rule + ", got " + std::to_string(got));
}

Status check_range(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return range_error(field, "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
  return ok_status();
}

// server.api_keys: each key valid and listed once, each policy within its ranges and naming
// only configured classes (on a reload, the reloaded file's). Keys never appear in a message.
Status validate_api_keys(const std::vector<ApiKey>& keys, const std::vector<SlaClass>& classes) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string at = "server.api_keys[" + std::to_string(i) + "]";
    const std::string& k = keys[i].key;
    if (k.size() < 8) return invalid_argument(at + ": must be at least 8 characters");
    // What a client can send after "Bearer ": the server strips the spaces before the key, and
    // gRPC refuses control characters in metadata, so such a key never matched anyone.
    for (const char c : k) {
      if (c < 0x21 || c > 0x7e)
        return invalid_argument(at +
                                ": must be printable ASCII without spaces (a client sends it in "
                                "an authorization header)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (keys[j].key == k)
        return invalid_argument(at + ": the same key as server.api_keys[" + std::to_string(j) +
                                "] (each key once: one key has one policy)");
    }
    const KeyPolicy& p = keys[i].policy;
    for (size_t c = 0; c < p.sla_classes.size(); ++c) {
      const std::string& name = p.sla_classes[c];
      const std::string field = at + ".sla_classes[" + std::to_string(c) + "]";
      if (std::none_of(classes.begin(), classes.end(),
                       [&](const SlaClass& sc) { return sc.name == name; })) {
        std::string known;
        for (const SlaClass& sc : classes) known += (known.empty() ? "" : ", ") + sc.name;
        return invalid_argument(field + ": unknown class '" + escape_for_message(name, 64) +
                                "' (sla_classes: " + escape_for_message(known, 256) + ")");
      }
      if (std::find(p.sla_classes.begin(), p.sla_classes.begin() + c, name) !=
          p.sla_classes.begin() + c)
        return invalid_argument(field + ": class '" + escape_for_message(name, 64) +
                                "' is listed twice");
    }
    if (p.max_priority)
      KVSPLIT_RETURN_IF_ERROR(check_range(at + ".max_priority", *p.max_priority,
                                          -kMaxRequestPriority, kMaxRequestPriority));
    if (p.max_streams)
      KVSPLIT_RETURN_IF_ERROR(check_range(at + ".max_streams", *p.max_streams, 0, 100000));
  }
  return ok_status();
}

}  // namespace

std::vector<ApiKey> plain_api_keys(const std::vector<std::string>& keys) {
  std::vector<ApiKey> out;
  for (const std::string& k : keys) out.push_back(ApiKey{k, KeyPolicy{}});
  return out;
}

Status validate_after_flags(const Config& config) {
  return validate_cuda_block_size(config.engine, kYamlKvNames);
}

Status validate_config(const Config& config) {
  const EngineConfig& e = config.engine;
  if (e.model.empty()) return invalid_argument("model.path: must not be empty");
  if (e.backend != "cpu" && e.backend != "cuda")
    return invalid_argument("pools.backend: must be 'cpu' or 'cuda', got '" +
                            escape_for_message(e.backend, 64) + "'");
  KVSPLIT_RETURN_IF_ERROR(check_range("pools.prefill_workers", e.num_prefill_workers, 1, 64));
  KVSPLIT_RETURN_IF_ERROR(check_range("pools.decode_workers", e.num_decode_workers, 1, 64));
  if (e.devices.size() > 64) {
    return invalid_argument("pools.devices: at most 64 entries, got " +
                            std::to_string(e.devices.size()));
  }
  for (size_t i = 0; i < e.devices.size(); ++i) {
    KVSPLIT_RETURN_IF_ERROR(
        check_range("pools.devices[" + std::to_string(i) + "]", e.devices[i], 0, 1023));
  }
  KVSPLIT_RETURN_IF_ERROR(validate_pool_limits(e, "pools."));
  KVSPLIT_RETURN_IF_ERROR(validate_speculative(e.speculative, "speculative."));
  KVSPLIT_RETURN_IF_ERROR(check_range("pools.max_chunk_tokens", e.max_chunk_tokens, 0, 1 << 20));
  if (!(e.max_chunk_ms >= 0 && e.max_chunk_ms <= 1e6))
    return invalid_argument("pools.max_chunk_ms: must be in [0, 1e6] (0: off), got " +
                            std::to_string(e.max_chunk_ms));
  KVSPLIT_RETURN_IF_ERROR(check_range("pools.max_unread_events", e.max_unread_events, 0, 1 << 20));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("pools.handoff_timeout_ms", e.handoff_timeout_ms, 1, 3600000));
  KVSPLIT_RETURN_IF_ERROR(check_range("pools.handoff_stall_ms", e.handoff_stall_ms, 0, 3600000));
  KVSPLIT_RETURN_IF_ERROR(validate_block_size(e.block_size, "kv.block_size"));
  KVSPLIT_RETURN_IF_ERROR(check_range("kv.blocks_per_worker", e.kv_blocks_per_worker, 0, 1 << 26));
  // The engine's own check (validate_engine_config) names its fields; this names the YAML's.
  KVSPLIT_RETURN_IF_ERROR(validate_quant_fraction(e, kYamlKvNames));
  KVSPLIT_RETURN_IF_ERROR(validate_semantic_cut(e.semantic, "kv.cuts.semantic."));
  if (e.block_size % e.semantic.summary_parts != 0)
    return invalid_argument("kv.cuts.semantic.summary_parts: must divide kv.block_size " +
                            std::to_string(e.block_size) + ", got " +
                            std::to_string(e.semantic.summary_parts));
  if (e.spatial.spatial_chunk_size % e.block_size != 0)
    return invalid_argument(
        "kv.cuts.spatial.spatial_chunk_size: must be a multiple of "
        "kv.block_size " +
        std::to_string(e.block_size) + ", got " + std::to_string(e.spatial.spatial_chunk_size));
  KVSPLIT_RETURN_IF_ERROR(validate_sla_classes(e.sla_classes));
  KVSPLIT_RETURN_IF_ERROR(check_range("kvm.interval_ms", e.kvm.interval_ms, 10, 60000));
  KVSPLIT_RETURN_IF_ERROR(validate_kvm_window(e.kvm));
  {
    std::vector<std::string> classes;
    for (const SlaClass& c : e.sla_classes) classes.push_back(c.name);
    KVSPLIT_RETURN_IF_ERROR(kvm::validate_rules(e.kvm, classes));
  }

  const ServerConfig& s = config.server;
  // A host name or an IP address, an IPv6 one without brackets (the server adds them: "[::1]"
  // became "[[::1]]" and the start failed after --check-config had passed it).
  auto check_host = [](const char* field, const std::string& host) -> Status {
    if (host.size() > 253 ||
        host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               "0123456789.:_%-") != std::string::npos) {
      return invalid_argument(std::string(field) +
                              ": must be a host name or IP address, IPv6 without brackets (at "
                              "most 253 of A-Z a-z 0-9 . : _ % -), got '" +
                              escape_for_message(host) + "'");
    }
    return ok_status();
  };
  if (s.host.empty()) return invalid_argument("server.host: must not be empty");
  KVSPLIT_RETURN_IF_ERROR(check_host("server.host", s.host));
  KVSPLIT_RETURN_IF_ERROR(check_range("server.port", s.port, 0, 65535));
  KVSPLIT_RETURN_IF_ERROR(check_range("server.metrics_port", s.metrics_port, -1, 65535));
  KVSPLIT_RETURN_IF_ERROR(check_host("server.metrics_host", s.metrics_host));
  if (s.tls.cert_file.empty() != s.tls.key_file.empty())
    return invalid_argument("server.tls: cert_file and key_file must be given together");
  KVSPLIT_RETURN_IF_ERROR(validate_api_keys(s.api_keys, e.sla_classes));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("server.max_concurrent_streams", s.max_concurrent_streams, 1, 100000));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("server.max_streams_per_tenant", s.max_streams_per_tenant, 0, 100000));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("server.request_message_timeout_ms", s.request_message_timeout_ms, 100, 3600000));
  KVSPLIT_RETURN_IF_ERROR(check_range("server.max_message_bytes", s.max_message_bytes,
                                      2 * kRequestFieldsBytes, 1 << 30));
  // A prompt of max_prompt_bytes and the request's other fields fit in one message (else gRPC
  // refuses it, RESOURCE_EXHAUSTED, before the server sees it).
  KVSPLIT_RETURN_IF_ERROR(check_range("server.max_prompt_bytes", s.max_prompt_bytes, 1,
                                      s.max_message_bytes - kRequestFieldsBytes));
  KVSPLIT_RETURN_IF_ERROR(check_range("server.max_tokens_limit", s.max_tokens_limit, 1, 1 << 20));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("server.default_max_tokens", s.default_max_tokens, 1, s.max_tokens_limit));
  KVSPLIT_RETURN_IF_ERROR(check_range("server.drain_timeout_ms", s.drain_timeout_ms, 0, 3600000));
  KVSPLIT_RETURN_IF_ERROR(check_range("server.keepalive_ms", s.keepalive_ms, 0, 86400000));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("server.keepalive_timeout_ms", s.keepalive_timeout_ms, 100, 3600000));
  KVSPLIT_RETURN_IF_ERROR(
      check_range("server.max_connection_idle_ms", s.max_connection_idle_ms, 0, 86400000));
  return ok_status();
}

std::string describe(const Config& config) {
  const EngineConfig& e = config.engine;
  const ServerConfig& s = config.server;
  std::ostringstream ss;
  ss << "model=" << e.model << (e.tokenizer.empty() ? "" : " tokenizer=" + e.tokenizer)
     << " backend=" << e.backend
     << " mode=" << (e.mode == ServingMode::kColocated ? "colocated" : "disaggregated")
     << " prefill_workers=" << e.num_prefill_workers << " decode_workers=" << e.num_decode_workers
     << " block_size=" << e.block_size << " kv_policy=" << kv_policy_name(e.kv_policy)
     << " listen=" << s.host << ":" << s.port << " metrics=" << s.metrics_bind_host() << ":"
     << s.metrics_port << " tls=" << (s.tls.enabled() ? "on" : "off")
     << " api_keys=" << s.api_keys.size();
  const auto restricted = std::count_if(s.api_keys.begin(), s.api_keys.end(),
                                        [](const ApiKey& k) { return k.policy != KeyPolicy{}; });
  if (restricted > 0) ss << "(" << restricted << " with a policy)";
  ss << " classes=[";
  for (size_t i = 0; i < e.sla_classes.size(); ++i) {
    const SlaClass& c = e.sla_classes[i];
    ss << (i ? ", " : "") << c.name << "(ttft<" << c.max_ttft_ms << "ms itl<" << c.max_itl_ms
       << "ms prio " << c.priority;
    if (c.semantic) ss << " kv.semantic_threshold " << c.semantic->semantic_threshold;
    ss << ")";
  }
  ss << "]";
  if (e.kvm.enabled) {
    ss << " kvm=" << (e.kvm.mode == KvmMode::kDryRun ? "dry-run" : "enforce") << "("
       << e.kvm.rules.size() << (e.kvm.rules.size() == 1 ? " rule" : " rules") << ")";
  } else {
    ss << " kvm=off";
  }
  return ss.str();
}

}  // namespace kvsplit::config
