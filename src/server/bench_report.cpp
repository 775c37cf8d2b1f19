#include "server/bench_report.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <numeric>
#include <random>
#include <string_view>
#include <system_error>

namespace kvsplit::server::bench {
namespace {

Status parse_range(const std::string& flag, const std::string& s, int* lo, int* hi) {
  const auto colon = s.find(':');
  // Whole decimal numbers ("16-128" was read as 16, "32:128x" as 32:128).
  auto number = [](std::string_view t, int* v) {
    const auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
    return !t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size();
  };
  const std::string_view all(s);
  if (!number(all.substr(0, colon), lo) ||
      !(colon == std::string::npos ? (*hi = *lo, true) : number(all.substr(colon + 1), hi)))
    return invalid_argument(flag + ": expected MIN:MAX (or N), got '" + s + "'");
  if (*lo < 1 || *hi < *lo)
    return invalid_argument(flag + ": need 1 <= MIN <= MAX, got '" + s + "'");
  return ok_status();
}

}  // namespace

Status parse_spec(const std::string& prompt_len, const std::string& output_len,
                  const std::string& class_mix, Spec* spec) {
  KVSPLIT_RETURN_IF_ERROR(
      parse_range("--prompt-len", prompt_len, &spec->prompt_min, &spec->prompt_max));
  KVSPLIT_RETURN_IF_ERROR(
      parse_range("--output-len", output_len, &spec->output_min, &spec->output_max));
  if (spec->num_requests < 1) return invalid_argument("--num-requests: must be >= 1");
  if (spec->concurrency < 1) return invalid_argument("--concurrency: must be >= 1");
  if (spec->rate < 0) return invalid_argument("--rate: must be >= 0");
  spec->classes.clear();
  size_t start = 0;
  while (start < class_mix.size()) {
    size_t end = class_mix.find(',', start);
    if (end == std::string::npos) end = class_mix.size();
    const std::string item = class_mix.substr(start, end - start);
    const auto colon = item.find(':');
    double w = 1.0;
    try {
      if (colon != std::string::npos) w = std::stod(item.substr(colon + 1));
    } catch (const std::exception&) {
      return invalid_argument("--class-mix: bad weight in '" + item + "'");
    }
    if (!(w > 0)) return invalid_argument("--class-mix: weights must be > 0 in '" + item + "'");
    spec->classes.emplace_back(item.substr(0, colon), w);
    start = end + 1;
  }
  return ok_status();
}

std::vector<Work> make_workload(const Spec& spec, int32_t vocab_size, int32_t max_context) {
  std::mt19937_64 rng(spec.seed);
  std::uniform_int_distribution<int> plen(spec.prompt_min, spec.prompt_max);
  std::uniform_int_distribution<int> olen(spec.output_min, spec.output_max);
  std::uniform_int_distribution<int32_t> tok(3,
                                             std::max(3, vocab_size - 1));  // skip special ids 0..2
  std::exponential_distribution<double> gap(spec.rate > 0 ? spec.rate : 1.0);
  std::vector<double> weights;
  for (const auto& c : spec.classes) weights.push_back(c.second);
  std::discrete_distribution<size_t> cls(weights.begin(), weights.end());
  std::vector<Work> out(static_cast<size_t>(spec.num_requests));
  double t = 0;
  for (Work& w : out) {
    const int p = std::min(plen(rng), std::max(1, max_context - 2));
    w.prompt.resize(static_cast<size_t>(p));
    for (auto& id : w.prompt) id = tok(rng);
    // What the engine admits: prompt + max_tokens - 1 <= max_context (the last token needs no KV).
    w.max_tokens = static_cast<uint32_t>(std::max(1, std::min(olen(rng), max_context - p + 1)));
    w.sla_class = spec.classes.empty() ? "" : spec.classes[cls(rng)].first;
    if (spec.rate > 0) t += gap(rng);
    w.arrival_s = t;
  }
  return out;
}

std::string error_kind(const std::string& message) {
  // Numbers and hex ids (waits, request ids such as grpc-<32 hex digits>) differ per request;
  // grouping ignores them: a run of hex digits that holds a decimal digit becomes one '#'.
  std::string kind;
  for (size_t i = 0; i < message.size() && kind.size() < 240;) {
    size_t end = i;
    bool digit = false;
    while (end < message.size() && std::isxdigit(static_cast<unsigned char>(message[end]))) {
      digit = digit || std::isdigit(static_cast<unsigned char>(message[end]));
      ++end;
    }
    if (end == i) {
      kind += message[i++];
    } else if (!digit) {
      kind.append(message, i, end - i);
      i = end;
    } else {
      if (kind.empty() || kind.back() != '#') kind += '#';
      i = end;
    }
  }
  return kind.substr(0, 240);
}

void Outcome::record_message(double ms, double gap_ms, int n) {
  if (n <= 0) return;
  if (tokens == 0) {
    ttft_ms = ms;
  } else {
    itl_ms.push_back(gap_ms / n);
    itl_total_ms += gap_ms;
    itl_tokens += n;
  }
  tokens += n;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double frac = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - frac) + v[i + 1] * frac : v[i];
}

nlohmann::json summarize(const std::string& mode, const Spec& spec,
                         const std::vector<Outcome>& outcomes, double seconds,
                         const std::map<std::string, std::pair<double, double>>& targets) {
  std::vector<double> ttft, itl, e2e;
  int64_t tokens = 0;
  int errors = 0, good = 0;
  std::map<std::string, int> error_kinds;
  for (const Outcome& o : outcomes) {
    if (!o.ok) {
      ++errors;
      ++error_kinds[error_kind(o.error)];
      continue;
    }
    tokens += o.tokens;
    ttft.push_back(o.ttft_ms);
    e2e.push_back(o.e2e_ms);
    itl.insert(itl.end(), o.itl_ms.begin(), o.itl_ms.end());
    auto t = targets.find(o.sla_class);
    if (t == targets.end() || (o.ttft_ms <= t->second.first && o.mean_itl_ms() <= t->second.second))
      ++good;
  }
  auto stats = [](const std::vector<double>& v) {
    const double mean =
        v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    return nlohmann::json{{"p50", quantile(v, 0.5)},
                          {"p90", quantile(v, 0.9)},
                          {"p99", quantile(v, 0.99)},
                          {"mean", mean}};
  };
  return {{"mode", mode},
          {"rate", spec.rate},
          {"concurrency", spec.concurrency},
          {"num_requests", spec.num_requests},
          {"seed", spec.seed},
          {"prompt_len", {spec.prompt_min, spec.prompt_max}},
          {"output_len", {spec.output_min, spec.output_max}},
          {"errors", errors},
          {"error_kinds", error_kinds},
          {"duration_s", seconds},
          {"generated_tokens", tokens},
          {"tokens_per_s", seconds > 0 ? static_cast<double>(tokens) / seconds : 0},
          {"requests_per_s", seconds > 0 ? (outcomes.size() - errors) / seconds : 0},
          {"goodput_rps", seconds > 0 ? good / seconds : 0},
          {"slo_attainment", outcomes.empty() ? 0 : static_cast<double>(good) / outcomes.size()},
          {"ttft_ms", stats(ttft)},
          {"itl_ms", stats(itl)},
          {"e2e_ms", stats(e2e)},
          {"samples", {{"ttft_ms", ttft}, {"e2e_ms", e2e}, {"itl_ms", itl}}}};
}

void print_summary(const nlohmann::json& s) {
  std::printf("== %s: %d requests, %d errors, %.2f s, rate %g, concurrency %d\n",
              s["mode"].get<std::string>().c_str(), s["num_requests"].get<int>(),
              s["errors"].get<int>(), s["duration_s"].get<double>(), s["rate"].get<double>(),
              s["concurrency"].get<int>());
  std::printf("   tokens/s %.1f   requests/s %.2f   goodput %.2f req/s (SLO attainment %.1f%%)\n",
              s["tokens_per_s"].get<double>(), s["requests_per_s"].get<double>(),
              s["goodput_rps"].get<double>(), 100 * s["slo_attainment"].get<double>());
  for (const char* k : {"ttft_ms", "itl_ms", "e2e_ms"}) {
    const auto& m = s[k];
    std::printf("   %-8s p50 %9.2f  p90 %9.2f  p99 %9.2f  mean %9.2f\n", k, m["p50"].get<double>(),
                m["p90"].get<double>(), m["p99"].get<double>(), m["mean"].get<double>());
  }
  for (const auto& [msg, n] : s["error_kinds"].items())
    std::printf("   error x%d: %s\n", n.get<int>(), msg.c_str());
}

}  // namespace kvsplit::server::bench
