#include "server/metrics_http_parse.h"

namespace kvsplit::server {

namespace {

// Position just past the end of the header block, or npos: the first empty line, ended by CRLF or
// a bare LF ("\r\n\r\n", "\n\n", and the mixed "\n\r\n", which went unseen: the connection then
// waited out the I/O timeout with no answer).
size_t header_end(std::string_view in) {
  for (size_t i = in.find('\n'); i != std::string_view::npos; i = in.find('\n', i + 1)) {
    if (i + 1 < in.size() && in[i + 1] == '\n') return i + 2;
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') return i + 3;
  }
  return std::string_view::npos;
}

MetricsRequest with_action(MetricsRequestAction action) {
  MetricsRequest r;
  r.action = action;
  return r;
}

}  // namespace

MetricsRequest parse_metrics_request(std::string_view in, size_t max_request_bytes) {
  const size_t end = header_end(in);
  if (end == std::string_view::npos) {
    return with_action(in.size() > max_request_bytes ? MetricsRequestAction::kTooLarge
                                                     : MetricsRequestAction::kNeedMore);
  }
  if (end > max_request_bytes) return with_action(MetricsRequestAction::kTooLarge);
  // Request line: METHOD SP target SP HTTP/1.x. One empty line before it is ignored (RFC 9112
  // 2.2: a client may send a CRLF after a previous request's body).
  std::string_view all = in;
  if (all.starts_with("\r\n")) {
    all.remove_prefix(2);
  } else if (all.starts_with("\n")) {
    all.remove_prefix(1);
  }
  const std::string_view line = all.substr(0, all.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0 ||
      sp2 == sp1 + 1 || line.substr(sp2 + 1).substr(0, 7) != "HTTP/1." ||
      line.find(' ', sp2 + 1) != std::string_view::npos) {
    return with_action(MetricsRequestAction::kBadRequest);
  }
  MetricsRequest r;
  r.method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  // The absolute form (RFC 9112 3.2.2, "http://host:port/metrics", which a server must accept):
  // its path.
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() > scheme.size() && target.substr(0, scheme.size()) == scheme) {
      const size_t slash = target.find('/', scheme.size());
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
    }
  }
  r.path = target.substr(0, target.find('?'));
  r.head = r.method == "HEAD";
  if (r.method != "GET" && !r.head) {
    r.action = MetricsRequestAction::kMethodNotAllowed;
  } else if (r.path != "/metrics") {
    r.action = MetricsRequestAction::kNotFound;
  } else {
    r.action = MetricsRequestAction::kScrape;
  }
  return r;
}

int http_status(MetricsRequestAction action) {
  switch (action) {
    case MetricsRequestAction::kNeedMore:
      return 0;
    case MetricsRequestAction::kScrape:
      return 200;
    case MetricsRequestAction::kBadRequest:
      return 400;
    case MetricsRequestAction::kNotFound:
      return 404;
    case MetricsRequestAction::kMethodNotAllowed:
      return 405;
    case MetricsRequestAction::kTooLarge:
      return 431;
  }
  return 0;
}

}  // namespace kvsplit::server
