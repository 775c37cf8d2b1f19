// A minimal HTTP/1.1 listener for Prometheus scrapes: GET (or HEAD) /metrics -> 200
// "text/plain; version=0.0.4" with the body the handler returns; any other path -> 404, other
// methods -> 405, malformed requests -> 400, oversized ones -> 431. One connection = one request
// (the response carries "Connection: close"). Malformed is answered as soon as it is known: a
// request line that cannot become valid (parse_metrics_request), or a peer that closes its side
// (shutdown(SHUT_WR)) after some bytes but before the end of the header block.
//
// One thread multiplexes the listening socket and every open connection with poll() on
// non-blocking sockets, so a slow or garbage client never delays other scrapes; each connection
// must deliver its request and take its response within `io_timeout_ms`, else it is dropped
// without an answer (a request still arriving may yet be valid).
// The destructor (or stop()) wakes the thread through an eventfd and joins it promptly, even with
// clients still connected.
//
// Replaces prometheus-cpp's civetweb Exposer, which fails to start ("null context when
// constructing CivetServer") in processes that load libcublasLt.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "kvsplit/status.h"
#include "server/metrics_http_parse.h"

namespace kvsplit::server {

struct MetricsHttpOptions {
  int32_t max_request_bytes = 8192;  // request line + headers; more -> 431 and close
  // [32, ...]: a longer request line -> 400 and close, as soon as that many bytes arrived without
  // a line break.
  int32_t max_request_line_bytes = static_cast<int32_t>(kMaxMetricsRequestLineBytes);
  int32_t io_timeout_ms = 5000;  // accept -> response fully written; then the socket is closed
  // Open connections; at the limit a new one closes the oldest that has not sent its whole
  // request yet (more wait in the listen backlog only while every slot is sending a response).
  int32_t max_connections = 64;
  int32_t poll_interval_ms = 200;  // upper bound on one poll() wait (timeouts are checked after)
};

class MetricsHttpServer {
 public:
  // Builds the body of one /metrics response; called on the listener thread. May return an error
  // (answered 500 with its message).
  using Handler = std::function<StatusOr<std::string>()>;

  // Binds host:port (IPv4/IPv6 literal or name; port 0 = any free port, see port()) and starts
  // the thread. kUnavailable naming the address when it cannot be bound; kInvalidArgument for a
  // bad port or options.
  static StatusOr<std::unique_ptr<MetricsHttpServer>> start(const std::string& host, int port,
                                                            Handler handler,
                                                            MetricsHttpOptions options = {});
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // Closes the listener and every connection, joins the thread. Idempotent.
  void stop();
  // Requests answered so far (any status), for tests.
  int64_t requests_served() const { return served_.load(); }

 private:
  struct Connection;
  MetricsHttpServer(int listen_fd, int wake_fd, int port, Handler handler,
                    MetricsHttpOptions options);
  void run();
  // Reads what is available; once the header block is complete, prepares the response.
  // Returns false when the connection is to be closed now.
  bool on_readable(Connection* c);
  bool on_writable(Connection* c);
  void prepare_response(Connection* c);
  MetricsRequest parse(std::string_view in) const;  // parse_metrics_request with options_' limits

  const int listen_fd_;
  const int wake_fd_;  // eventfd: stop() writes it to end a poll() wait at once
  const int port_;
  const Handler handler_;
  const MetricsHttpOptions options_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> served_{0};
  std::thread thread_;
};

}  // namespace kvsplit::server
