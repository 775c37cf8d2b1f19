#include "kvm/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/file_read.h"
#include "common/json_util.h"

namespace kvsplit::kvm {

namespace {

using Json = nlohmann::json;

constexpr size_t kMaxTraceBytes = size_t{1} << 30;

Status line_error(const std::string& what, size_t line, const std::string& msg) {
  return invalid_argument(what + ":" + std::to_string(line) + ": " + msg);
}

// An integer field in [1, 2^31): JSON integers, or floats with no fraction.
StatusOr<int> token_count(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return invalid_argument(std::string(key) + ": missing");
  const Json& v = *it;
  double d = 0;
  if (v.is_number_integer() || v.is_number_unsigned()) {
    d = v.get<double>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
    d = v.get<double>();
  } else {
    return invalid_argument(std::string(key) + ": must be an integer >= 1, got " + v.dump());
  }
  if (d < 1 || d > 2147483647.0)
    return invalid_argument(std::string(key) + ": must be an integer >= 1, got " + v.dump());
  return static_cast<int>(d);
}

StatusOr<TraceRequest> parse_line(std::string_view line) {
  KVSPLIT_ASSIGN_OR_RETURN(Json obj, common::parse_json(line, ""));
  if (!obj.is_object()) return invalid_argument("must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& k = it.key();
    if (k != "arrival_ms" && k != "prompt_tokens" && k != "output_tokens" && k != "class")
      return invalid_argument(k + ": unknown field");
  }
  TraceRequest r;
  auto a = obj.find("arrival_ms");
  if (a == obj.end()) return invalid_argument("arrival_ms: missing");
  if (!a->is_number() || !std::isfinite(a->get<double>()) || a->get<double>() < 0 ||
      a->get<double>() > kMaxTraceMs)
    return invalid_argument("arrival_ms: must be a number in [0, 1e9] (11.6 days), got " +
                            a->dump());
  r.arrival_ms = a->get<double>();
  KVSPLIT_ASSIGN_OR_RETURN(r.prompt_tokens, token_count(obj, "prompt_tokens"));
  KVSPLIT_ASSIGN_OR_RETURN(r.output_tokens, token_count(obj, "output_tokens"));
  auto c = obj.find("class");
  if (c != obj.end() && !c->is_null()) {
    if (!c->is_string()) return invalid_argument("class: must be a string, got " + c->dump());
    r.sla_class = c->get<std::string>();
  }
  return r;
}

}  // namespace

StatusOr<std::vector<TraceRequest>> parse_trace(std::string_view text, const std::string& what) {
  std::vector<TraceRequest> out;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto r = parse_line(line);
    if (!r.ok()) return line_error(what, line_no, r.status().message());
    out.push_back(std::move(r).value());
    out.back().line = static_cast<int64_t>(line_no);
  }
  return out;
}

StatusOr<std::vector<TraceRequest>> read_trace_file(const std::string& path) {
  KVSPLIT_ASSIGN_OR_RETURN(std::string text,
                           common::read_regular_file(path, kMaxTraceBytes, "trace file"));
  return parse_trace(text, path);
}

namespace {

// One JSON object as a line of a JSONL file (invalid UTF-8 replaced, not thrown).
void append_json_line(std::string* out, const Json& j) {
  *out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
  *out += '\n';
}

}  // namespace

std::string format_trace(const std::vector<TraceRequest>& trace) {
  std::string out;
  for (const TraceRequest& r : trace) {
    Json j;
    j["arrival_ms"] = r.arrival_ms;
    j["prompt_tokens"] = r.prompt_tokens;
    j["output_tokens"] = r.output_tokens;
    if (!r.sla_class.empty()) j["class"] = r.sla_class;
    append_json_line(&out, j);
  }
  return out;
}

namespace {

Status write_text_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return not_found(path + ": cannot open the " + what + " file for writing");
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) return internal_error(path + ": writing the " + what + " file failed");
  return ok_status();
}

}  // namespace

Status write_trace_file(const std::string& path, const std::vector<TraceRequest>& trace) {
  return write_text_file(path, format_trace(trace), "trace");
}

std::string format_outcomes(const std::vector<RequestOutcome>& outcomes) {
  std::string out;
  for (const RequestOutcome& r : outcomes) {
    Json j;
    j["index"] = r.index;
    j["arrival_ms"] = r.arrival_ms;
    j["class"] = r.sla_class;
    j["prompt_tokens"] = r.prompt_tokens;
    j["output_tokens"] = r.output_tokens;
    j["ok"] = r.ok;
    j["ttft_ms"] = r.ok ? r.ttft_ms : 0.0;
    j["mean_itl_ms"] = r.ok ? r.mean_itl_ms : 0.0;
    j["e2e_ms"] = r.ok ? r.e2e_ms : 0.0;
    j["preemptions"] = r.preemptions;
    append_json_line(&out, j);
  }
  return out;
}

Status write_outcomes_file(const std::string& path, const std::vector<RequestOutcome>& outcomes) {
  return write_text_file(path, format_outcomes(outcomes), "requests");
}

Status validate(const PhasedTraceOptions& o) {
  auto pos = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!pos(o.calm_ms)) return invalid_argument("calm_ms: must be >= 0");
  if (!pos(o.spike_ms)) return invalid_argument("spike_ms: must be >= 0");
  if (!pos(o.interactive_rate)) return invalid_argument("interactive_rate: must be >= 0");
  if (!pos(o.batch_rate_calm)) return invalid_argument("batch_rate_calm: must be >= 0");
  if (!pos(o.batch_rate_spike)) return invalid_argument("batch_rate_spike: must be >= 0");
  if (!std::isfinite(o.rate_scale) || o.rate_scale <= 0)
    return invalid_argument("rate_scale: must be > 0");
  // Bounded so that a trace fits in memory and its arrivals in the trace reader's range.
  if (2 * o.calm_ms + o.spike_ms > kMaxTraceMs)
    return invalid_argument(
        "calm_ms, spike_ms: the trace (2 x calm_ms + spike_ms) must span at "
        "most 1e9 ms, got " +
        std::to_string(2 * o.calm_ms + o.spike_ms));
  const double expected =  // requests, on average
      o.rate_scale *
      (o.interactive_rate * (2 * o.calm_ms + o.spike_ms) + o.batch_rate_calm * 2 * o.calm_ms +
       o.batch_rate_spike * o.spike_ms) /
      1000.0;
  if (!(expected <= kMaxTraceRequests))
    return invalid_argument("rates x rate_scale x phase lengths: about " +
                            std::to_string(expected) + " requests, more than " +
                            std::to_string(kMaxTraceRequests));
  for (auto [name, v] : {std::pair{"interactive_prompt", o.interactive_prompt},
                         {"interactive_output", o.interactive_output},
                         {"batch_prompt", o.batch_prompt},
                         {"batch_output", o.batch_output},
                         {"spike_prompt", o.spike_prompt},
                         {"spike_output", o.spike_output}}) {
    // At most 1e8: a length drawn up to 1.5 x the median stays an int.
    if (v < 1 || v > 100000000)
      return invalid_argument(std::string(name) + ": must be in [1, 1e8]");
  }
  if (o.interactive_class == o.batch_class)
    return invalid_argument("batch_class: must differ from interactive_class");
  return ok_status();
}

std::vector<TraceRequest> make_phased_trace(const PhasedTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<TraceRequest> out;
  auto length = [&](int median) {
    // Uniform in [median / 2, median * 3 / 2]: integer draws keep it portable across libstdc++
    // versions (no distribution objects whose algorithms may differ).
    const int lo = std::max(1, median / 2), hi = std::max(lo, median + median / 2);
    return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  auto uniform01 = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  // Poisson arrivals of `rate` per second over [t0, t1).
  auto phase = [&](double t0, double t1, double rate, const std::string& cls, int prompt,
                   int output) {
    if (rate <= 0) return;
    double t = t0;
    for (;;) {
      t += -std::log(uniform01()) * 1000.0 / rate;
      if (t >= t1) break;
      TraceRequest r;
      r.arrival_ms = std::round(t * 1000.0) / 1000.0;  // microseconds: exact in the JSON text
      r.prompt_tokens = length(prompt);
      r.output_tokens = length(output);
      r.sla_class = cls;
      out.push_back(std::move(r));
    }
  };
  const double a = o.calm_ms, b = a + o.spike_ms, c = b + o.calm_ms, k = o.rate_scale;
  phase(0, c, k * o.interactive_rate, o.interactive_class, o.interactive_prompt,
        o.interactive_output);
  phase(0, a, k * o.batch_rate_calm, o.batch_class, o.batch_prompt, o.batch_output);
  phase(a, b, k * o.batch_rate_spike, o.batch_class, o.spike_prompt, o.spike_output);
  phase(b, c, k * o.batch_rate_calm, o.batch_class, o.batch_prompt, o.batch_output);
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& x, const TraceRequest& y) {
    return x.arrival_ms < y.arrival_ms;
  });
  return out;
}

}  // namespace kvsplit::kvm
