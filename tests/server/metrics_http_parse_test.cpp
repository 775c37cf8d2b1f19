// parse_metrics_request, the /metrics listener's request parsing on bytes: each answer with the
// method and path it reports, the limit on the header block, and answers that stay decided as more
// bytes arrive (the socket-level behaviour is in metrics_http_test.cpp).
#include "server/metrics_http_parse.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace kvsplit::server {
namespace {

using A = MetricsRequestAction;

// The views in the result point into `in`: string literals here, or a temporary whose result is
// only read for its action.
MetricsRequest parse(std::string_view in, size_t limit = 8192,
                     size_t line_limit = kMaxMetricsRequestLineBytes) {
  return parse_metrics_request(in, limit, line_limit);
}

TEST(MetricsRequestParse, EachAnswerWithMethodAndPath) {
  const MetricsRequest get = parse("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(get.action, A::kScrape);
  EXPECT_EQ(get.method, "GET");
  EXPECT_EQ(get.path, "/metrics");
  EXPECT_FALSE(get.head);
  const MetricsRequest head = parse("\nHEAD http://h:9090/metrics?x=1 HTTP/1.0\n\r\n");
  EXPECT_EQ(head.action, A::kScrape);
  EXPECT_EQ(head.path, "/metrics");
  EXPECT_TRUE(head.head);
  const MetricsRequest other = parse("GET http://h:9090 HTTP/1.1\n\n");
  EXPECT_EQ(other.action, A::kNotFound);
  EXPECT_EQ(other.path, "/");
  const MetricsRequest post = parse("POST /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(post.action, A::kMethodNotAllowed);
  EXPECT_EQ(post.method, "POST");
  for (const char* bad :
       {"GET /metrics\r\n\r\n", "GET /metrics SPDY/3\r\n\r\n", "\r\n\r\n",
        " /metrics HTTP/1.1\r\n\r\n", "GET  HTTP/1.1\r\n\r\n", "GET /metrics HTTP/1.1 x\r\n\r\n"}) {
    const MetricsRequest r = parse(bad);
    EXPECT_EQ(r.action, A::kBadRequest) << bad;
    EXPECT_TRUE(r.method.empty() && r.path.empty()) << bad;
  }
  EXPECT_EQ(http_status(A::kNeedMore), 0);
  EXPECT_EQ(http_status(A::kScrape), 200);
  EXPECT_EQ(http_status(A::kBadRequest), 400);
  EXPECT_EQ(http_status(A::kNotFound), 404);
  EXPECT_EQ(http_status(A::kMethodNotAllowed), 405);
  EXPECT_EQ(http_status(A::kTooLarge), 431);
}

TEST(MetricsRequestParse, NeedMoreUntilTheEmptyLineWithinTheLimit) {
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  for (size_t n = 0; n < req.size(); ++n) {
    EXPECT_EQ(parse(req.substr(0, n)).action, A::kNeedMore) << n;
  }
  // Decided answers do not change with the bytes that follow (the listener stops reading).
  EXPECT_EQ(parse(req + "GET / HTTP/1.1\r\n\r\n").action, A::kScrape);
  // The header block must end within the limit: at it, served; one byte more, 431.
  EXPECT_EQ(parse(req, req.size()).action, A::kScrape);
  EXPECT_EQ(parse(req, req.size() - 1).action, A::kTooLarge);
  EXPECT_EQ(parse(std::string(64, 'a'), 64).action, A::kNeedMore);
  EXPECT_EQ(parse(std::string(65, 'a'), 64).action, A::kTooLarge);
}

// A request line is checked as its bytes arrive: one that cannot become valid is decided at once,
// line break or not (the listener waited for the end of the header block, or the I/O timeout).
TEST(MetricsRequestParse, AMalformedRequestLineIsDecidedBeforeItsLineBreak) {
  for (const std::string& bad :
       {std::string("\x16\x03\x01\x02\x00", 5), std::string(" GET"), std::string("G(T /"),
        std::string("GET  /"), std::string("GET /a\x01"), std::string("GET /a\x7f"),
        std::string("GET /metrics HTTP/1.1 "), std::string("GET /metrics HTTP/2"),
        std::string("GET /metrics HTTP/1.x"), std::string("GET /metrics HTTP/1.10"),
        std::string("GET /metrics\r"), std::string("hello\r\n"), std::string("\r\n\r"),
        std::string("\rGET /metrics HTTP/1.1\r\n\r\n"),
        "GET /" + std::string(kMaxMetricsRequestLineBytes, 'a')}) {
    EXPECT_EQ(parse(bad).action, A::kBadRequest) << bad;
    // Decided: more bytes, even a whole header block, do not change it.
    EXPECT_EQ(parse(bad + " HTTP/1.1\r\n\r\n").action, A::kBadRequest) << bad;
  }
  // Prefixes of valid request lines wait for more, up to the line limit.
  for (const std::string& ok :
       {std::string(""), std::string("\r"), std::string("\r\n"), std::string("\n"),
        std::string("GET"), std::string("GET "), std::string("GET /metr"),
        std::string("GET /metrics HTTP/1"), std::string("GET /metrics HTTP/1.1"),
        std::string("GET /metrics HTTP/1.1\r\nHost: x\r\n"), std::string("GET /\x80\xff"),
        "GET /" + std::string(kMaxMetricsRequestLineBytes - 5, 'a')}) {
    EXPECT_EQ(parse(ok).action, A::kNeedMore) << ok;
  }
  // The line limit is a parameter; a complete line over it is refused as well.
  EXPECT_EQ(parse("GET /metrics?" + std::string(40, 'x'), 8192, 32).action, A::kBadRequest);
  EXPECT_EQ(parse_metrics_request("GET /metrics HTTP/1.1\r\n\r\n", 8192, 21).action, A::kScrape);
  EXPECT_EQ(parse_metrics_request("GET /metrics HTTP/1.1\r\n\r\n", 8192, 20).action,
            A::kBadRequest);
}

}  // namespace
}  // namespace kvsplit::server
