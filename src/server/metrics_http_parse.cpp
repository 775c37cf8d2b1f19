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

// RFC 9110 5.6.2: the characters of a token (a method).
bool is_tchar(char ch) {
  const unsigned char c = static_cast<unsigned char>(ch);
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
}

// A request-target byte: anything visible (bytes >= 0x80 included), no SP or control byte.
bool is_target_char(char ch) {
  const unsigned char c = static_cast<unsigned char>(ch);
  return c > 0x20 && c != 0x7f;
}

// Whether `line` (without its line break) is, when `complete`, a request line
// "method SP target SP HTTP/1.<digit>" of at most `max_bytes`, or else can still become one as
// more bytes arrive. So a line that fails it with `complete` false fails with every continuation.
bool request_line_ok(std::string_view line, bool complete, size_t max_bytes) {
  if (line.size() > max_bytes) return false;
  size_t i = 0;
  while (i < line.size() && is_tchar(line[i])) ++i;
  if (i == line.size()) return !complete;  // the method so far
  if (i == 0 || line[i] != ' ') return false;
  const size_t target = ++i;
  while (i < line.size() && is_target_char(line[i])) ++i;
  if (i == line.size()) return !complete;  // the target so far (maybe empty yet)
  if (i == target || line[i] != ' ') return false;
  const std::string_view version = line.substr(i + 1);
  constexpr std::string_view kPrefix = "HTTP/1.";
  if (version.size() > kPrefix.size() + 1) return false;
  if (kPrefix.substr(0, version.size()) != version.substr(0, kPrefix.size())) return false;
  if (version.size() <= kPrefix.size()) return !complete;
  const char minor = version.back();
  return minor >= '0' && minor <= '9';
}

}  // namespace

MetricsRequest parse_metrics_request(std::string_view in, size_t max_request_bytes,
                                     size_t max_request_line_bytes) {
  // Only the first max_request_bytes bytes decide (the listener keeps one more, enough to know
  // the header block does not end within the limit), so the answer to a prefix that decides
  // stays the answer as more bytes arrive.
  const std::string_view head = in.substr(0, max_request_bytes);
  // One empty line before the request line is ignored (RFC 9112 2.2: a client may send a CRLF
  // after a previous request's body). A lone CR may still be the start of that CRLF.
  std::string_view all = head;
  if (all.starts_with("\r\n")) {
    all.remove_prefix(2);
  } else if (all.starts_with("\n")) {
    all.remove_prefix(1);
  } else if (all == "\r" && in.size() == 1) {
    return with_action(MetricsRequestAction::kNeedMore);
  }
  // The request line ends at the first CR or LF. It is checked as soon as its bytes arrive: a
  // line that cannot become a request line (a byte no method or target may hold, a third space,
  // a version other than HTTP/1.x, more than max_request_line_bytes) is answered at once, not
  // after the header block or the I/O timeout.
  const size_t eol = all.find_first_of("\r\n");
  const std::string_view line = all.substr(0, eol);
  if (!request_line_ok(line, eol != std::string_view::npos, max_request_line_bytes))
    return with_action(MetricsRequestAction::kBadRequest);
  if (header_end(head) == std::string_view::npos) {
    return with_action(in.size() > max_request_bytes ? MetricsRequestAction::kTooLarge
                                                     : MetricsRequestAction::kNeedMore);
  }
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.find(' ', sp1 + 1);
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
