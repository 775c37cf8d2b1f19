// Public types of the KV cache manager (KVM, docs/kvm.md): the operator's policy (rules with
// hysteresis, cooldown and bounds), the monitor snapshot the rules read, and the decisions they
// make. EngineConfig::kvm carries the policy; EngineStats carries the snapshot and the latest
// decisions. No YAML here: src/config/ parses the `kvm:` section into these structs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvsplit {

enum class KvmMode : uint8_t {
  kEnforce,  // decisions are applied (worker inbox commands, class settings)
  kDryRun,   // decisions are logged and counted, nothing changes
};

enum class KvmCmp : uint8_t { kGreater, kGreaterEqual, kLess, kLessEqual };

// `metric[class] op value`, e.g. "device_kv_use > 0.90" or "ttft_p99_ms[voice] > 250".
// Metrics (KvmSnapshot): device_kv_use, host_kv_use, disk_kv_use (fractions, the most loaded
// decoding worker), link_use (fraction of the host link), peer_exchange_mb_s (shard exchange off
// the host link, MB/s), storage_latency_ms, queue_depth, ttft_p50_ms,
// ttft_p99_ms, itl_p50_ms, itl_p99_ms, prefix_hit_rate, swap_rate (swaps per second),
// recall_rate (recalls per second), pages_evicted_fraction. Class-scoped metrics (queue_depth,
// ttft_*, itl_*) without a class read the worst class.
struct KvmCondition {
  std::string metric;
  std::string sla_class;  // empty: global
  KvmCmp cmp = KvmCmp::kGreater;
  double value = 0;
};

enum class KvmActionOp : uint8_t { kSet, kAdd, kSub, kMul };

// `param op value`, e.g. "semantic_threshold += 0.05", "swap = never".
// Parameters: semantic_threshold, evict_threshold, recall_threshold, semantic_window,
// recent_tokens, score_interval, temporal_step_size, swap (value 0 auto, 1 always, 2 never; the
// text form takes the names), spatial_min_context (tokens; new sequences longer than it are
// spread over the shards), max_num_seqs (admission: running sequences per worker),
// max_chunk_tokens (fair prefill's cap on one prompt's chunk per step, [0, 2^20], 0: none),
// max_queue (admission: queued requests of the class), migrate_to_shard (one-shot: moves up to
// `value` pages from the fullest shard or the host tier to the emptiest shard of each decoding
// worker).
struct KvmAction {
  std::string param;
  KvmActionOp op = KvmActionOp::kSet;
  double value = 0;
};

// One rule: when `when` holds the rule enters (is active) and applies `then` at once and again
// every cooldown_ms while `when` still holds, within [min, max]. It exits when `exit` holds (the
// hysteresis: `exit` should be a lower level than `when`), and on exit restores the value the
// parameter had when it entered when `restore_on_exit`. While active and neither holds, nothing
// changes. A rule with a class applies its action to that class only (its override); without
// one, to the engine-wide setting.
struct KvmRule {
  std::string name;  // unique; default "rule-<index>"
  KvmCondition when;
  KvmCondition exit;  // required
  KvmAction then;
  std::string sla_class;  // empty: global
  double min = -1e300;    // bounds of the parameter the action moves
  double max = 1e300;
  double cooldown_ms = 1000;  // >= 0; between two applications of this rule
  bool restore_on_exit = true;
  // Dwell before exiting: `exit` must hold on every sample for this long (>= 0; 0: the first
  // sample where it holds). A monitor that dips below the exit level for one sample and comes
  // back (a pool emptying and refilling between samples) does not end the rule. While `exit`
  // holds, the rule does not repeat either.
  double hold_ms = 0;
};

struct KvmConfig {
  bool enabled = false;  // true when the config has a kvm section with rules
  KvmMode mode = KvmMode::kEnforce;
  int32_t interval_ms = 100;  // monitor sampling period, [10, 60000]
  int32_t window_ms = 10000;  // sliding window of the latency percentiles, [100, 3600000]
  std::string rules_file;     // YAML file with a `rules:` list, read after the inline rules
  std::string decision_log;   // JSON-lines file the decisions are appended to; empty: log only
  std::vector<KvmRule> rules;
  // rules[file_rules_begin, end) were read from rules_file (errors name them by the file).
  size_t file_rules_begin = 0;
};

// What the monitors saw at one sample (KvmConfig::interval_ms).
struct KvmWorkerUse {
  std::string name;
  double device_kv_use = 0;       // used / total device blocks over the worker's shard group
  double host_kv_use = 0;         // host tier bytes used / total (0 without a host tier)
  double disk_kv_use = 0;         // disk tier bytes used / capacity (0 without a disk tier)
  std::vector<double> shard_use;  // per shard of the group
};

struct KvmClassLatency {
  std::string name;
  int32_t queue_depth = 0;
  // How long the class's oldest queued request (not yet admitted by a worker) has waited, at the
  // sample: a leading signal of its TTFT, where the percentiles lag by the requests' own latency.
  double queue_wait_ms = 0;
  int64_t samples = 0;  // finished and failed requests in the window
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double itl_p50_ms = 0, itl_p99_ms = 0;  // over requests' mean inter-token latency
};

struct KvmSnapshot {
  double time_ms = 0;  // since the engine started
  std::vector<KvmWorkerUse> workers;
  double device_kv_use = 0, host_kv_use = 0, disk_kv_use = 0;  // max over decoding workers
  // The busiest worker's host link: bytes that crossed it per second (swaps, host-staged shard
  // exchange) / its measured bandwidth.
  double link_use = 0;
  // The busiest worker's shard exchange that stayed off the host link (in one memory or GPU to
  // GPU directly), MB (1e6 bytes) per second over the last interval.
  double peer_exchange_mb_s = 0;
  double storage_latency_ms = 0;      // EWMA of disk tier operations
  double prefix_hit_rate = 0;         // hits / queries since start
  double swap_rate = 0;               // swaps (in + out) per second over the last interval
  double recall_rate = 0;             // recalls per second over the last interval
  double pages_evicted_fraction = 0;  // evicted / all pages of decoding sequences
  int64_t pages_full = 0, pages_int8 = 0, pages_int4 = 0, pages_evicted = 0;
  std::vector<KvmClassLatency> classes;
};

// One decision of the rule engine.
struct KvmDecision {
  double time_ms = 0;
  std::string rule;
  std::string action;  // "enter", "repeat", "exit" (restore), "exit-keep"
  std::string param;
  std::string sla_class;  // empty: global
  double before = 0, after = 0;
  // An exit of a class rule that entered while its class had no value of its own (swap or
  // temporal_step_size): the class drops its value and follows the engine-wide one
  // again (`after` is that value now), so later engine-wide changes reach it. Semantic settings
  // never inherit again: a class's first one gives it a whole semantic block of its own.
  bool inherit = false;
  std::string monitors;  // the metric the condition read and its value, e.g. "device_kv_use=0.93"
  bool applied = false;  // false in dry-run or when the worker refused it (then `error`)
  std::string error;
};

}  // namespace kvsplit
