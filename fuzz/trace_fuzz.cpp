// Fuzzes the request-trace parser (kvm::parse_trace, JSON lines read by the policy simulator and
// the serving benchmarks). Any input must end in requests within the documented bounds or in a
// kInvalidArgument naming the line; an accepted trace survives format_trace and a second parse
// unchanged.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "kvm/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvsplit::kvm::TraceRequest;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto t = kvsplit::kvm::parse_trace(in, "trace");
  if (!t.ok()) {
    KVSPLIT_CHECK(t.status().code() == kvsplit::StatusCode::kInvalidArgument);
    KVSPLIT_CHECK_MSG(t.status().message().starts_with("trace:"), t.status().message().c_str());
    return 0;
  }
  int64_t last_line = 0;
  for (const TraceRequest& r : *t) {
    KVSPLIT_CHECK(std::isfinite(r.arrival_ms) && r.arrival_ms >= 0 &&
                  r.arrival_ms <= kvsplit::kvm::kMaxTraceMs);
    KVSPLIT_CHECK(r.prompt_tokens >= 1 && r.output_tokens >= 1);
    KVSPLIT_CHECK(r.line > last_line);
    last_line = r.line;
  }
  auto again = kvsplit::kvm::parse_trace(kvsplit::kvm::format_trace(*t), "formatted");
  KVSPLIT_CHECK_MSG(again.ok(), again.status().message().c_str());
  KVSPLIT_CHECK(again->size() == t->size());
  for (size_t i = 0; i < t->size(); ++i) {
    const TraceRequest& a = (*t)[i];
    const TraceRequest& b = (*again)[i];
    KVSPLIT_CHECK(a.arrival_ms == b.arrival_ms && a.prompt_tokens == b.prompt_tokens &&
                  a.output_tokens == b.output_tokens && a.sla_class == b.sla_class);
  }
  return 0;
}
