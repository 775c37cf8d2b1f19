// Typed configuration of a kvsplit server, loaded from one YAML file (docs/configuration.md).
// The loader is the project's only yaml-cpp user; every error names the field path, e.g.
// "sla_classes.voice.max_itl_ms: must be > 0, got 0". Unknown keys are errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/status.h"

namespace kvsplit::config {

struct TlsConfig {
  std::string cert_file;  // PEM server certificate chain; empty with key_file empty: plaintext
  std::string key_file;   // PEM private key
  bool enabled() const { return !cert_file.empty(); }
};

// Bytes of a request message kept for its fields other than the prompt (ids, stop strings,
// sampling, guided decoding): a prompt of max_prompt_bytes always fits in max_message_bytes. The
// largest valid set is about 41,000 bytes: 7,610 without guided decoding (16 stop strings of 256
// bytes, a 128-byte id, a 256-byte cache_salt, 64 stop ids, 200 logit_bias entries, ...) and at
// most 33,536 for guided decoding (a 32 KiB regex or schema takes 32,776; choices, 32 KiB in all,
// add 3 bytes of framing each). 48 KiB leaves room for a few small fields more
// (ConvertTest.TheLargestValidRequestFitsBesideItsPrompt,
// ConvertTest.TheLargestGuidedRequestFitsBesideItsPrompt). It was 8192 before guided decoding;
// max_message_bytes must be at least twice this (96 KiB).
inline constexpr int32_t kRequestFieldsBytes = 48 * 1024;

// What the calls of one API key may do (a `server.api_keys` entry written as a mapping;
// docs/configuration.md "Per-key policy"). The defaults are a plain key's: full rights.
struct KeyPolicy {
  // The SLA classes its requests may name, each a configured class, once; the first is its
  // default, which a request naming none gets. Empty: every class, the server's default.
  std::vector<std::string> sla_classes;
  // The highest GenerateRequest.priority it may ask for, in
  // [-kMaxRequestPriority, kMaxRequestPriority]; unset: no ceiling.
  std::optional<int32_t> max_priority;
  // [0, 100000]; its open Generate calls at most, in place of server.max_streams_per_tenant (0: no
  // limit for this key). Unset: server.max_streams_per_tenant.
  std::optional<int32_t> max_streams;
  bool server_stats = true;  // may call GetServerStats (server-wide figures)
  bool operator==(const KeyPolicy&) const = default;
};

// One accepted `authorization: Bearer <key>` value and its policy.
struct ApiKey {
  std::string key;  // >= 8 characters, printable ASCII without spaces
  KeyPolicy policy;
  bool operator==(const ApiKey&) const = default;
};

// Keys with full rights (the plain string entries of server.api_keys, --api-key flags).
std::vector<ApiKey> plain_api_keys(const std::vector<std::string>& keys);

struct ServerConfig {
  std::string host = "0.0.0.0";
  int32_t port = 50051;         // [0, 65535]; 0 = pick a free port (logged)
  int32_t metrics_port = 9090;  // [-1, 65535]; -1 = no metrics endpoint, 0 = any port
  // Address the (unauthenticated) metrics listener binds; a host name or IP literal of at most
  // 253 bytes of [A-Za-z0-9.:_%-]. Empty: metrics_bind_host()'s default.
  std::string metrics_host;
  TlsConfig tls;
  std::vector<ApiKey> api_keys;  // empty: no authentication; keys distinct
  int32_t max_concurrent_streams =
      1024;  // [1, 100000]; more open Generate calls -> RESOURCE_EXHAUSTED
  // [0, 100000]; open Generate calls of one API key (tenant) at most, so one tenant cannot hold
  // every stream slot; 0: no per-tenant limit.
  int32_t max_streams_per_tenant = 0;
  // [100, 3600000]; a call whose request message has not arrived this long after its headers
  // ends DEADLINE_EXCEEDED (an admitted Generate call holds a stream slot while it waits).
  int32_t request_message_timeout_ms = 10000;
  int32_t max_message_bytes = 4 << 20;  // [16384, 1 GiB]; receive limit of one request
  // [1, max_message_bytes - kRequestFieldsBytes]; longer prompts -> INVALID_ARGUMENT
  int32_t max_prompt_bytes = 1 << 20;
  int32_t max_tokens_limit = 8192;   // [1, 1 << 20]; GenerateRequest.max_tokens upper bound
  int32_t default_max_tokens = 16;   // [1, max_tokens_limit]; when max_tokens is 0
  int32_t drain_timeout_ms = 10000;  // [0, 3600000]; SIGTERM: wait this long, then cancel
  // HTTP/2 keepalive of connections with calls open: a ping after this long without one, and
  // the connection is closed (its calls cancelled, their KV freed) when the peer does not answer
  // within keepalive_timeout_ms: a client that vanished without closing its connection (a
  // dropped network, a powered-off host) holds nothing for long. [0, 86400000]; 0: gRPC's
  // default (2 hours). keepalive_timeout_ms: [100, 3600000].
  int32_t keepalive_ms = 30000;
  int32_t keepalive_timeout_ms = 10000;
  // A connection with no call open for this long is closed (GOAWAY; clients reconnect at their
  // next call), so idle connections cannot pile up until the process runs out of descriptors
  // (gRPC then stops accepting for good). [0, 86400000]; 0: never closed (gRPC's default).
  int32_t max_connection_idle_ms = 300000;

  // metrics_host when set; else loopback (127.0.0.1) when API keys are set, so that a server that
  // asks for keys does not expose its metrics, and `host` otherwise.
  std::string metrics_bind_host() const {
    if (!metrics_host.empty()) return metrics_host;
    return api_keys.empty() ? host : "127.0.0.1";
  }
};

struct Config {
  EngineConfig engine;
  ServerConfig server;
  bool model_given = false;  // model / model.path appeared in the file (else the caller's default)
};

// Parses and validates a whole config. Errors: kInvalidArgument naming the field path (or the
// YAML line/column for syntax errors).
StatusOr<Config> parse_config(std::string_view yaml_text);
// Same, from a file (kNotFound when it cannot be read). Error messages start with the path.
StatusOr<Config> load_config_file(const std::string& path);
// The same for a reload (SIGHUP), which applies only the SLA classes and the kvm policy: a class's
// kv block is read over `running`, the kv.cuts.semantic the engine started with, not over the
// file's (a changed kv.cuts.semantic needs a restart, and would otherwise reach only the classes
// with a kv block of their own).
StatusOr<Config> load_config_file(const std::string& path, const SemanticCutConfig& running);

// The settings whose values differ between two versions of a config file's text, as field paths
// ("kv.capacity_mb", "model", "server.api_keys") in `new_text`'s order, each mapping's keys that
// only `old_text` sets after its others: mappings are compared key by key down to their leaves,
// a list or a scalar as one setting. A key absent, null or an empty mapping is unset. Values
// compare as written (`16` and `16.0` differ; quoting, flow or block style, comments and key order
// do not). Only the YAML is compared: neither text is validated. kInvalidArgument when either is
// not strict YAML (parse_config's syntax errors). For SIGHUP's report of the changes it does not
// apply.
StatusOr<std::vector<std::string>> changed_settings(const std::string& old_text,
                                                    const std::string& new_text);

// The rules of a KVM rules file (kvm.rules_file, docs/kvm.md): a YAML file whose top level holds
// one `rules:` list, read from `path` as given (relative: to the current directory). Parsed, not
// validated (validate_config / kvm::validate_rules check them against the SLA classes). Errors
// start with "kvm.rules_file <path>: " and name the field, e.g. "rules[0].then: ...";
// kNotFound when the file is missing.
StatusOr<std::vector<KvmRule>> load_kvm_rules_file(const std::string& path);

// Validates the engine and server sections (on parsing, and again after command-line overrides).
Status validate_config(const Config& config);
// The rules a command-line flag can change (--backend: `--backend cpu` runs a file written for
// cuda, whose pages may then be any size): checked after the overrides (kvsplit-server's
// check_config), not on parsing.
Status validate_after_flags(const Config& config);

// A short human-readable summary of the config (one line per section), for the startup log.
std::string describe(const Config& config);

}  // namespace kvsplit::config
