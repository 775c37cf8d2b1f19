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
MetricsRequest parse(std::string_view in, size_t limit = 8192) {
  return parse_metrics_request(in, limit);
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

}  // namespace
}  // namespace kvsplit::server
