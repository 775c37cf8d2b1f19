// MetricsHttpServer (the /metrics listener) in-process on 127.0.0.1 with ephemeral ports: scrape,
// 404/405/400/431, malformed input answered at once, slow and garbage clients never block other
// scrapes, concurrent scrapes,
// prompt shutdown with clients connected, bind errors.
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace kvsplit::server {
namespace {

using Clock = std::chrono::steady_clock;

int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads until EOF or `timeout`; returns what arrived.
std::string read_all(int fd, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  std::string out;
  const auto deadline = Clock::now() + timeout;
  char buf[8192];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` (raw bytes) and returns the whole response ("" when the connection failed).
std::string http_exchange(int port, const std::string& request) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "";
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out = read_all(fd);
  close(fd);
  return out;
}

std::string get(int port, const std::string& path) {
  return http_exchange(port,
                       "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n");
}

std::string status_line(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

std::string body_of(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

class MetricsHttpTest : public ::testing::Test {
 protected:
  void start(MetricsHttpOptions options = {}) {
    auto s = MetricsHttpServer::start(
        "127.0.0.1", 0,
        [this]() -> StatusOr<std::string> {
          const int n = ++scrapes_;
          if (fail_) return internal_error("collector broke");
          return "# TYPE test_scrapes counter\ntest_scrapes " + std::to_string(n) + "\n" +
                 std::string(body_pad_, '#');
        },
        options);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server_ = std::move(s).value();
    ASSERT_GT(server_->port(), 0);
  }

  std::unique_ptr<MetricsHttpServer> server_;
  std::atomic<int> scrapes_{0};
  std::atomic<bool> fail_{false};
  size_t body_pad_ = 0;
};

TEST_F(MetricsHttpTest, ScrapeReturnsTextExposition) {
  start();
  const std::string r = get(server_->port(), "/metrics");
  EXPECT_EQ(status_line(r), "HTTP/1.1 200 OK");
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r;
  EXPECT_EQ(body_of(r), "# TYPE test_scrapes counter\ntest_scrapes 1\n");
  EXPECT_NE(r.find("Content-Length: " + std::to_string(body_of(r).size()) + "\r\n"),
            std::string::npos);
  // A query string is ignored; HTTP/1.0 clients are served; HEAD has headers only.
  EXPECT_EQ(status_line(http_exchange(server_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n")),
            "HTTP/1.1 200 OK");
  const std::string head = http_exchange(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(status_line(head), "HTTP/1.1 200 OK");
  EXPECT_EQ(body_of(head), "");
  // The absolute form, which a server must accept (RFC 9112 3.2.2), and one empty line before the
  // request line, which it should ignore (2.2); both were refused (404, 400).
  EXPECT_EQ(status_line(http_exchange(server_->port(),
                                      "GET http://127.0.0.1:" + std::to_string(server_->port()) +
                                          "/metrics HTTP/1.1\r\nHost: x\r\n\r\n")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(status_line(http_exchange(server_->port(), "\r\nGET /metrics HTTP/1.1\r\n\r\n")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(status_line(get(server_->port(), "http://x/other")), "HTTP/1.1 404 Not Found");
  // A request line ended by a bare LF and the empty line by CRLF: served (it went unanswered until
  // the I/O timeout closed the connection).
  EXPECT_EQ(status_line(http_exchange(server_->port(), "GET /metrics HTTP/1.1\n\r\n")),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(scrapes_.load(), 6);
}

TEST_F(MetricsHttpTest, LargeBodyIsWrittenCompletely) {
  body_pad_ = 3 << 20;  // larger than the socket buffers: needs several POLLOUT rounds
  start();
  const std::string r = get(server_->port(), "/metrics");
  EXPECT_EQ(status_line(r), "HTTP/1.1 200 OK");
  EXPECT_EQ(body_of(r).size(),
            std::string("# TYPE test_scrapes counter\ntest_scrapes 1\n").size() + body_pad_);
}

TEST_F(MetricsHttpTest, ErrorsForOtherPathsMethodsAndGarbage) {
  start();
  const int port = server_->port();
  EXPECT_EQ(status_line(get(port, "/")), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(status_line(get(port, "/metricsX")), "HTTP/1.1 404 Not Found");
  const std::string post =
      http_exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(status_line(post), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos);
  EXPECT_EQ(status_line(http_exchange(port, "\x16\x03\x01garbage\r\n\r\n")),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_line(http_exchange(port, "GET /metrics\r\n\r\n")), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_line(http_exchange(port, "GET /metrics SPDY/3\r\n\r\n")),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_line(http_exchange(port, "\r\n\r\n")), "HTTP/1.1 400 Bad Request");
  // Oversized header block: 431, and the server keeps serving.
  EXPECT_EQ(status_line(http_exchange(
                port, "GET /metrics HTTP/1.1\r\nX: " + std::string(100000, 'a') + "\r\n\r\n")),
            "HTTP/1.1 431 Request Header Fields Too Large");
  fail_ = true;
  const std::string failed = get(port, "/metrics");
  EXPECT_EQ(status_line(failed), "HTTP/1.1 500 Internal Server Error");
  EXPECT_NE(failed.find("collector broke"), std::string::npos);
  fail_ = false;
  EXPECT_EQ(status_line(get(port, "/metrics")), "HTTP/1.1 200 OK");
}

// Input known to be malformed is answered 400 at once: a request line that cannot become valid,
// with or without its line break, one longer than max_request_line_bytes, and a request the peer
// stops sending by closing its side. Each went unanswered until the I/O timeout closed the
// connection (here a minute; read_all gives up after 3 s).
TEST_F(MetricsHttpTest, MalformedInputIsAnsweredAtOnce) {
  MetricsHttpOptions opt;
  opt.io_timeout_ms = 60000;
  start(opt);
  const int port = server_->port();
  struct Case {
    std::string name, bytes;
    bool half_close;
  };
  const std::vector<Case> cases = {
      {"a TLS ClientHello", std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11), false},
      {"a third word after the version", "GET /metrics HTTP/1.1 x", false},
      {"another protocol", "GET /metrics HTTP/2", false},
      {"a control byte in the target", "GET /metr\x01", false},
      {"a request line over the limit", "GET /" + std::string(3000, 'a'), false},
      {"a complete line that is no request line", "hello\r\n", false},
      {"half-closed after the request line", "GET /metrics HTTP/1.1\r\nHost: x\r\n", true},
      {"half-closed in the request line", "GET /metr", true},
  };
  for (const Case& c : cases) {
    const int fd = connect_loopback(port);
    ASSERT_GE(fd, 0);
    const auto t0 = Clock::now();
    (void)!send(fd, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL);
    if (c.half_close) shutdown(fd, SHUT_WR);
    const std::string r = read_all(fd, std::chrono::milliseconds(3000));
    EXPECT_EQ(status_line(r), "HTTP/1.1 400 Bad Request") << c.name;
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000)) << c.name;
    close(fd);
  }
  // A connection that sends nothing and closes its side is closed without an answer.
  const int probe = connect_loopback(port);
  ASSERT_GE(probe, 0);
  shutdown(probe, SHUT_WR);
  const auto t0 = Clock::now();
  EXPECT_EQ(read_all(probe, std::chrono::milliseconds(3000)), "");
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  close(probe);
  EXPECT_EQ(status_line(get(port, "/metrics")), "HTTP/1.1 200 OK");
  EXPECT_EQ(server_->requests_served(), static_cast<int64_t>(cases.size()) + 1);
}

TEST_F(MetricsHttpTest, SlowClientsDoNotBlockScrapesAndTimeOut) {
  MetricsHttpOptions opt;
  opt.io_timeout_ms = 1500;
  start(opt);
  const int port = server_->port();
  // Idle, half-request and byte-dribbling clients stay connected while others scrape.
  const int idle = connect_loopback(port);
  const int half = connect_loopback(port);
  ASSERT_GE(idle, 0);
  ASSERT_GE(half, 0);
  (void)!send(half, "GET /metr", 9, MSG_NOSIGNAL);
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(status_line(get(port, "/metrics")), "HTTP/1.1 200 OK");
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000))
      << "scrapes waited for the slow clients";
  // Past io_timeout_ms the server drops them: EOF without a response.
  EXPECT_EQ(read_all(idle, std::chrono::milliseconds(5000)), "");
  EXPECT_EQ(read_all(half, std::chrono::milliseconds(5000)), "");
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(1400));  // held until io_timeout_ms
  close(idle);
  close(half);
  EXPECT_EQ(status_line(get(port, "/metrics")), "HTTP/1.1 200 OK");
}

// Idle clients holding every slot do not delay a scrape: the newcomer closes the oldest idle one
// (it used to wait in the backlog for io_timeout_ms, here a minute: get() gives up after 5 s).
TEST_F(MetricsHttpTest, IdleClientsAtTheLimitDoNotDelayAScrape) {
  MetricsHttpOptions opt;
  opt.max_connections = 2;
  opt.io_timeout_ms = 60000;
  start(opt);
  const int a = connect_loopback(server_->port());
  const int b = connect_loopback(server_->port());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  // Both accepted before the scrape connects (each poll round accepts what is queued).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(status_line(get(server_->port(), "/metrics")), "HTTP/1.1 200 OK");
  // The oldest idle one was closed: EOF at once (read_all returns early), long before its
  // 60 s timeout or read_all's own 5 s.
  const auto t0 = Clock::now();
  EXPECT_EQ(read_all(a, std::chrono::milliseconds(5000)), "");
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(4000)) << "the oldest was not closed";
  close(a);
  close(b);
}

TEST_F(MetricsHttpTest, ConcurrentScrapes) {
  start();
  constexpr int kThreads = 8, kEach = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        const std::string r = get(server_->port(), "/metrics");
        if (status_line(r) == "HTTP/1.1 200 OK" &&
            body_of(r).find("test_scrapes ") != std::string::npos)
          ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kEach);
  EXPECT_EQ(scrapes_.load(), kThreads * kEach);
  EXPECT_EQ(server_->requests_served(), kThreads * kEach);
}

TEST_F(MetricsHttpTest, ShutdownIsPromptWithClientsConnected) {
  MetricsHttpOptions opt;
  opt.io_timeout_ms = 60000;  // the clients would hold on for a minute
  opt.poll_interval_ms = 10000;
  start(opt);
  const int idle = connect_loopback(server_->port());
  const int half = connect_loopback(server_->port());
  ASSERT_GE(idle, 0);
  (void)!send(half, "GET /", 5, MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the server accept them
  const auto t0 = Clock::now();
  server_.reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_EQ(read_all(idle, std::chrono::milliseconds(2000)), "");  // closed by the server
  close(idle);
  close(half);
}

TEST(MetricsHttpStart, BindErrorsNameTheAddress) {
  auto a = MetricsHttpServer::start("127.0.0.1", 0,
                                    [] { return StatusOr<std::string>(std::string("x")); });
  ASSERT_TRUE(a.ok());
  auto b = MetricsHttpServer::start("127.0.0.1", (*a)->port(),
                                    [] { return StatusOr<std::string>(std::string()); });
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(b.status().message().find("127.0.0.1:" + std::to_string((*a)->port())),
            std::string::npos)
      << b.status().message();
  auto c = MetricsHttpServer::start("no-such-host.invalid", 0,
                                    [] { return StatusOr<std::string>(std::string()); });
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  auto d = MetricsHttpServer::start("127.0.0.1", 70000,
                                    [] { return StatusOr<std::string>(std::string()); });
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  // IPv6 loopback, when the machine has it.
  auto e = MetricsHttpServer::start("::1", 0, [] { return StatusOr<std::string>(std::string()); });
  if (e.ok()) {
    EXPECT_GT((*e)->port(), 0);
  }
}

}  // namespace
}  // namespace kvsplit::server
