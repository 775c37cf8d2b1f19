// Fuzzes the /metrics listener's request parsing (parse_metrics_request, what MetricsHttpServer
// runs on the bytes of each connection) at the default and the smallest request limit, and the
// smallest request line limit. Any input must end in one of the listener's answers, consistent
// with the method and path it reports, and a decided answer never changes when more bytes arrive
// (the listener stops reading there).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "common/check.h"
#include "server/metrics_http_parse.h"

namespace {

using kvsplit::server::MetricsRequest;
using kvsplit::server::MetricsRequestAction;

bool inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

void check_consistent(const MetricsRequest& r, std::string_view in, size_t limit) {
  const bool get_or_head = r.method == "GET" || r.method == "HEAD";
  KVSPLIT_CHECK(r.head == (r.method == "HEAD"));
  KVSPLIT_CHECK(inside(r.method, in));
  KVSPLIT_CHECK(r.path == "/" || inside(r.path, in));
  switch (r.action) {
    case MetricsRequestAction::kNeedMore:
      KVSPLIT_CHECK(in.size() <= limit);
      [[fallthrough]];
    case MetricsRequestAction::kBadRequest:
    case MetricsRequestAction::kTooLarge:
      KVSPLIT_CHECK(r.method.empty() && r.path.empty());
      break;
    case MetricsRequestAction::kScrape:
      KVSPLIT_CHECK(get_or_head && r.path == "/metrics");
      break;
    case MetricsRequestAction::kNotFound:
      KVSPLIT_CHECK(get_or_head && r.path != "/metrics");
      break;
    case MetricsRequestAction::kMethodNotAllowed:
      KVSPLIT_CHECK(!get_or_head && !r.method.empty());
      KVSPLIT_CHECK(r.method.find_first_of(" \r\n") == std::string_view::npos);
      break;
  }
  const int code = kvsplit::server::http_status(r.action);
  KVSPLIT_CHECK((code == 0) == (r.action == MetricsRequestAction::kNeedMore));
}

bool same(const MetricsRequest& a, const MetricsRequest& b) {
  return a.action == b.action && a.method == b.method && a.path == b.path && a.head == b.head;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  constexpr size_t kDefaultLine = kvsplit::server::kMaxMetricsRequestLineBytes;
  for (auto [limit, line_limit] :
       {std::pair<size_t, size_t>{8192, kDefaultLine}, std::pair<size_t, size_t>{64, kDefaultLine},
        std::pair<size_t, size_t>{64, 32}}) {
    const MetricsRequest full = kvsplit::server::parse_metrics_request(in, limit, line_limit);
    check_consistent(full, in, limit);
    // What the listener holds (at most limit + 1 bytes) and an earlier read: once either is
    // decided, the whole input gets the same answer.
    for (size_t n : {limit + 1, size / 2}) {
      const std::string_view prefix = in.substr(0, n);
      const MetricsRequest early =
          kvsplit::server::parse_metrics_request(prefix, limit, line_limit);
      check_consistent(early, prefix, limit);
      if (early.action != MetricsRequestAction::kNeedMore) KVSPLIT_CHECK(same(early, full));
    }
  }
  return 0;
}
