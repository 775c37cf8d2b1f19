#include "kvm/expr.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <span>

#include "common/escape.h"

namespace kvsplit::kvm {
namespace {

constexpr std::array<std::string_view, 10> kGlobalMetrics = {
    "device_kv_use",      "host_kv_use",           "disk_kv_use",     "link_use",
    "peer_exchange_mb_s", "storage_latency_ms",    "prefix_hit_rate", "swap_rate",
    "recall_rate",        "pages_evicted_fraction"};
constexpr std::array<std::string_view, 6> kClassMetrics = {
    "queue_depth", "queue_wait_ms", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"};
constexpr std::array<std::string_view, 17> kParams = {
    "semantic_threshold",   "evict_threshold",    "recall_threshold",
    "recall_wait_ms",       "semantic_window",    "recent_tokens",
    "score_interval",       "temporal_step_size", "swap",
    "spatial_min_context",  "max_num_seqs",       "max_chunk_tokens",
    "max_chunk_ms",         "max_queue",          "migrate_to_shard",
    "max_recalls_per_step", "recall_precision"};
constexpr std::array<std::string_view, 12> kIntegerParams = {
    "recall_precision",     "semantic_window",    "recent_tokens", "score_interval",
    "max_recalls_per_step", "temporal_step_size", "swap",          "spatial_min_context",
    "max_num_seqs",         "max_chunk_tokens",   "max_queue",     "migrate_to_shard"};
constexpr std::array<std::string_view, 3> kSwapNames = {"auto", "always", "never"};
// In RecallPrecision's order (kFull, kInt8, kInt4).
constexpr std::array<std::string_view, 3> kRecallNames = {"full", "int8", "int4"};

// The names of a parameter set by name (swap, recall_precision), value i = names[i]; empty for
// a numeric one.
std::span<const std::string_view> value_names(std::string_view param) {
  if (param == "swap") return kSwapNames;
  if (param == "recall_precision") return kRecallNames;
  return {};
}

std::string names_text(std::span<const std::string_view> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
  return out;
}

template <size_t N>
bool contains(const std::array<std::string_view, N>& a, std::string_view s) {
  return std::find(a.begin(), a.end(), s) != a.end();
}

template <size_t N>
std::string list(const std::array<std::string_view, N>& a) {
  std::string out;
  for (std::string_view s : a) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

std::string known_metrics() { return list(kGlobalMetrics) + ", " + list(kClassMetrics); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string q(std::string_view s) {
  std::string out(1, '\'');
  out += escape_for_message(s, 64);
  out += '\'';
  return out;
}

// A leading name of [A-Za-z0-9_]; advances *s past it.
std::string_view take_name(std::string_view* s) {
  size_t n = 0;
  while (n < s->size() && is_name_char((*s)[n])) ++n;
  std::string_view name = s->substr(0, n);
  s->remove_prefix(n);
  *s = trim(*s);
  return name;
}

StatusOr<double> parse_number(std::string_view text, std::string_view what) {
  const std::string s(trim(text));
  char* end = nullptr;
  const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
    return invalid_argument(std::string(what) + " must be a finite number, got " + q(s));
  return v;
}

const char* cmp_text(KvmCmp c) {
  switch (c) {
    case KvmCmp::kGreater:
      return ">";
    case KvmCmp::kGreaterEqual:
      return ">=";
    case KvmCmp::kLess:
      return "<";
    case KvmCmp::kLessEqual:
      return "<=";
  }
  return "?";
}

const char* op_text(KvmActionOp op) {
  switch (op) {
    case KvmActionOp::kSet:
      return "=";
    case KvmActionOp::kAdd:
      return "+=";
    case KvmActionOp::kSub:
      return "-=";
    case KvmActionOp::kMul:
      return "*=";
  }
  return "?";
}

// The worst (largest) value of a class-scoped metric, or the named class's.
double class_metric(const KvmClassLatency& c, std::string_view metric) {
  if (metric == "queue_depth") return c.queue_depth;
  if (metric == "queue_wait_ms") return c.queue_wait_ms;
  if (metric == "ttft_p50_ms") return c.ttft_p50_ms;
  if (metric == "ttft_p99_ms") return c.ttft_p99_ms;
  if (metric == "itl_p50_ms") return c.itl_p50_ms;
  return c.itl_p99_ms;  // itl_p99_ms
}

}  // namespace

bool is_metric(std::string_view name) {
  return contains(kGlobalMetrics, name) || contains(kClassMetrics, name);
}
bool is_class_metric(std::string_view name) { return contains(kClassMetrics, name); }
bool is_param(std::string_view name) { return contains(kParams, name); }
bool param_needs_class(std::string_view name) { return name == "max_queue"; }
bool param_is_global_only(std::string_view name) {
  return name == "max_num_seqs" || name == "max_chunk_tokens" || name == "max_chunk_ms" ||
         name == "spatial_min_context" || name == "migrate_to_shard";
}
std::optional<ParamRange> param_range(std::string_view name) {
  // pools.max_chunk_tokens' range (config/validate.cpp) and the worker's (SetSchedulerParams).
  if (name == "max_chunk_tokens") return ParamRange{0, 1 << 20, true};
  // pools.max_chunk_ms' range: 0 turns the time-based cap off, as for max_chunk_tokens.
  if (name == "max_chunk_ms") return ParamRange{0, 1e6, true};
  // kv.cuts.semantic.max_recalls_per_step: 0 lifts the limit, so a rule that lowers it must stop
  // at 1.
  if (name == "max_recalls_per_step") return ParamRange{0, 2147483647.0, true};
  // kv.cuts.semantic.recall_wait_ms's bounded range (a rule never sets "until it lands", < 0).
  if (name == "recall_wait_ms") return ParamRange{0, 60000, false};
  return std::nullopt;
}
bool param_is_integer(std::string_view name) { return contains(kIntegerParams, name); }

bool param_is_semantic(std::string_view p) {
  return std::find(std::begin(kSemanticParams), std::end(kSemanticParams), p) !=
         std::end(kSemanticParams);
}

Status check_setting(std::string_view param, double value) {
  constexpr double kInt32Max = 2147483647.0;
  double lo = 0, hi = kInt32Max;
  if (param == "semantic_threshold" || param == "evict_threshold" || param == "recall_threshold") {
    hi = 1;
  } else if (param == "recall_wait_ms") {
    hi = 60000;
  } else if (param == "max_num_seqs") {
    lo = 1, hi = 65536;
  } else if (param == "max_chunk_tokens") {
    hi = 1 << 20;
  } else if (param == "max_chunk_ms") {
    hi = 1e6;
  } else if (param == "max_queue") {
    lo = 1, hi = 1000000;
  } else if (!value_names(param).empty()) {
    hi = static_cast<double>(value_names(param).size() - 1);
  } else if (param == "score_interval" || param == "temporal_step_size" ||
             param == "migrate_to_shard") {
    lo = 1;
  } else if (!is_param(param)) {
    return invalid_argument(fmt::format("unknown parameter '{}'", param));
  }
  const double v = param_is_integer(param) ? std::round(value) : value;
  if (!(std::isfinite(v) && v >= lo && v <= hi))
    return invalid_argument(fmt::format("{}: must be in [{}, {}], got {}", param, lo, hi, value));
  return ok_status();
}
bool param_is_one_shot(std::string_view name) { return name == "migrate_to_shard"; }

std::optional<double> named_value(std::string_view param, std::string_view name) {
  const std::span<const std::string_view> names = value_names(param);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<double>(i);
  }
  return std::nullopt;
}
std::optional<double> swap_value(std::string_view name) { return named_value("swap", name); }
bool param_is_named(std::string_view name) { return !value_names(name).empty(); }
int param_name_count(std::string_view name) { return static_cast<int>(value_names(name).size()); }
std::string param_names_text(std::string_view name) { return names_text(value_names(name)); }

StatusOr<KvmCondition> parse_condition(std::string_view text) {
  std::string_view s = trim(text);
  if (s.empty()) return invalid_argument("empty condition (expected 'metric op number')");
  KvmCondition c;
  c.metric = std::string(take_name(&s));
  if (c.metric.empty()) return invalid_argument("expected a metric name at " + q(s));
  if (!is_metric(c.metric))
    return invalid_argument("unknown metric " + q(c.metric) + " (known: " + known_metrics() + ")");
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return invalid_argument("missing ']' after the class");
    c.sla_class = std::string(trim(s.substr(1, close - 1)));
    s = trim(s.substr(close + 1));
    if (c.sla_class.empty()) return invalid_argument("empty class in " + q(text));
    if (!is_class_metric(c.metric))
      return invalid_argument(
          "metric " + q(c.metric) +
          " is engine-wide and takes no class (per-class metrics: " + list(kClassMetrics) + ")");
  }
  if (s.rfind(">=", 0) == 0) {
    c.cmp = KvmCmp::kGreaterEqual;
    s.remove_prefix(2);
  } else if (s.rfind("<=", 0) == 0) {
    c.cmp = KvmCmp::kLessEqual;
    s.remove_prefix(2);
  } else if (s.rfind(">", 0) == 0) {
    c.cmp = KvmCmp::kGreater;
    s.remove_prefix(1);
  } else if (s.rfind("<", 0) == 0) {
    c.cmp = KvmCmp::kLess;
    s.remove_prefix(1);
  } else {
    return invalid_argument("bad operator in " + q(text) +
                            " (a condition compares with >, >=, < or <=)");
  }
  KVSPLIT_ASSIGN_OR_RETURN(c.value, parse_number(s, "the value of " + q(text)));
  return c;
}

StatusOr<KvmAction> parse_action(std::string_view text) {
  std::string_view s = trim(text);
  if (s.empty()) return invalid_argument("empty action (expected 'parameter op value')");
  KvmAction a;
  a.param = std::string(take_name(&s));
  if (a.param.empty()) return invalid_argument("expected a parameter name at " + q(s));
  if (!is_param(a.param))
    return invalid_argument("unknown parameter " + q(a.param) + " (known: " + list(kParams) + ")");
  if (!s.empty() && s.front() == '[')
    return invalid_argument("an action takes no [class]: give the rule a `class:` instead");
  if (s.rfind("+=", 0) == 0) {
    a.op = KvmActionOp::kAdd;
    s.remove_prefix(2);
  } else if (s.rfind("-=", 0) == 0) {
    a.op = KvmActionOp::kSub;
    s.remove_prefix(2);
  } else if (s.rfind("*=", 0) == 0) {
    a.op = KvmActionOp::kMul;
    s.remove_prefix(2);
  } else if (s.rfind("=", 0) == 0 && s.rfind("==", 0) != 0) {
    a.op = KvmActionOp::kSet;
    s.remove_prefix(1);
  } else {
    return invalid_argument("bad operator in " + q(text) +
                            " (an action assigns with =, +=, -= or *=)");
  }
  s = trim(s);
  if (param_is_named(a.param)) {
    const std::span<const std::string_view> names = value_names(a.param);
    if (a.op != KvmActionOp::kSet) {
      std::string alts;
      for (std::string_view n : names) alts += (alts.empty() ? "" : "|") + std::string(n);
      return invalid_argument(a.param + " takes '=' (" + a.param + " = " + alts + "), got " +
                              q(text));
    }
    const std::optional<double> v = named_value(a.param, s);
    if (!v) return invalid_argument(a.param + " must be " + names_text(names) + ", got " + q(s));
    a.value = *v;
    return a;
  }
  if (param_is_one_shot(a.param) && a.op != KvmActionOp::kSet)
    return invalid_argument(a.param + " is a one-shot action and takes '=' (" + a.param +
                            " = pages), got " + q(text));
  KVSPLIT_ASSIGN_OR_RETURN(a.value, parse_number(s, "the value of " + q(text)));
  return a;
}

std::string to_string(const KvmCondition& c) {
  std::string out = c.metric;
  if (!c.sla_class.empty()) out += "[" + c.sla_class + "]";
  return out + " " + cmp_text(c.cmp) + " " + fmt::format("{}", c.value);
}

std::string to_string(const KvmAction& a) {
  std::string value = fmt::format("{}", a.value);
  const std::span<const std::string_view> names = value_names(a.param);
  if (!names.empty()) {
    const auto i = static_cast<size_t>(a.value);
    if (a.value >= 0 && i < names.size() && static_cast<double>(i) == a.value)
      value = std::string(names[i]);
  }
  return a.param + " " + op_text(a.op) + " " + value;
}

std::optional<double> read_metric(const KvmSnapshot& snap, const KvmCondition& c,
                                  std::string* class_out) {
  if (class_out) class_out->clear();
  const std::string& m = c.metric;
  if (m == "device_kv_use") return snap.device_kv_use;
  if (m == "host_kv_use") return snap.host_kv_use;
  if (m == "disk_kv_use") return snap.disk_kv_use;
  if (m == "link_use") return snap.link_use;
  if (m == "peer_exchange_mb_s") return snap.peer_exchange_mb_s;
  if (m == "storage_latency_ms") return snap.storage_latency_ms;
  if (m == "prefix_hit_rate") return snap.prefix_hit_rate;
  if (m == "swap_rate") return snap.swap_rate;
  if (m == "recall_rate") return snap.recall_rate;
  if (m == "pages_evicted_fraction") return snap.pages_evicted_fraction;
  if (!is_class_metric(m)) return std::nullopt;
  std::optional<double> worst;
  for (const KvmClassLatency& cl : snap.classes) {
    const double v = class_metric(cl, m);
    if (!c.sla_class.empty()) {
      if (cl.name != c.sla_class) continue;
      if (class_out) *class_out = cl.name;
      return v;
    }
    if (!worst || v > *worst) {
      worst = v;
      if (class_out) *class_out = cl.name;
    }
  }
  return worst;
}

bool holds(const KvmSnapshot& snap, const KvmCondition& c, double* value_out) {
  const std::optional<double> v = read_metric(snap, c);
  if (!v) return false;
  if (value_out) *value_out = *v;
  switch (c.cmp) {
    case KvmCmp::kGreater:
      return *v > c.value;
    case KvmCmp::kGreaterEqual:
      return *v >= c.value;
    case KvmCmp::kLess:
      return *v < c.value;
    case KvmCmp::kLessEqual:
      return *v <= c.value;
  }
  return false;
}

}  // namespace kvsplit::kvm
