// The request parsing of the /metrics listener (metrics_http.h), a pure function of the bytes a
// connection has sent so far: whether to keep reading, and which response the listener sends.
// Internal to the server module; fuzzed by fuzz/metrics_http_fuzz.cpp.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvsplit::server {

enum class MetricsRequestAction {
  kNeedMore,          // no complete header block yet and within the limit: read on
  kScrape,            // GET or HEAD /metrics: 200 with the handler's body (500 when it fails)
  kBadRequest,        // 400: not a request line "METHOD SP target SP HTTP/1.x", nor its start
  kNotFound,          // 404: GET or HEAD of another path
  kMethodNotAllowed,  // 405: another method (any path)
  kTooLarge,          // 431: the header block does not end within the limit
};

// What parse_metrics_request found. The views point into the bytes it was given (valid while
// they are; `path` may instead be a static "/"); both are empty for kNeedMore, kBadRequest and
// kTooLarge.
struct MetricsRequest {
  MetricsRequestAction action = MetricsRequestAction::kNeedMore;
  std::string_view method;  // as sent ("GET", "HEAD", "POST", ...)
  // The target's path: the absolute form ("http://host:port/metrics", RFC 9112 3.2.2) reduced to
  // its path ("/" when it has none), the query string dropped.
  std::string_view path;
  bool head = false;  // method == "HEAD": the response carries headers only
};

// The longest request line parse_metrics_request accepts by default. RFC 9112 3 recommends that
// recipients support 8000 octets; this listener serves one path, and a scrape's line ("GET
// /metrics HTTP/1.1", a query string, or the absolute form) is far shorter.
inline constexpr size_t kMaxMetricsRequestLineBytes = 2048;

// `in`: the bytes received on one connection so far (the listener keeps at most
// max_request_bytes + 1 of them); only the first max_request_bytes of them are read. The request
// line ends at the first CR or LF and is checked as its bytes arrive: kBadRequest as soon as they
// cannot begin a valid one (a method that is not a token, a control byte or a second space in the
// target, a version other than HTTP/1.<digit>, a line longer than `max_request_line_bytes`, with
// or without its line break), whatever follows. Else the header block ends at the first empty
// line, ended by CRLF or a bare LF; it must end within `max_request_bytes` bytes, else
// kTooLarge. One empty line before the request line is ignored (RFC 9112 2.2). Headers are not
// interpreted. An answer other than kNeedMore never changes as more bytes arrive; a peer that
// closes its side while this says kNeedMore has sent an incomplete request (the listener answers
// 400 then, metrics_http.h).
MetricsRequest parse_metrics_request(std::string_view in, size_t max_request_bytes,
                                     size_t max_request_line_bytes = kMaxMetricsRequestLineBytes);

// The HTTP status code of `action` (0 for kNeedMore; 200 for kScrape).
int http_status(MetricsRequestAction action);

}  // namespace kvsplit::server
