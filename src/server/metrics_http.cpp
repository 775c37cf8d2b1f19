#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/log.h"
#include "server/metrics_http_parse.h"

namespace kvsplit::server {

using Clock = std::chrono::steady_clock;

struct MetricsHttpServer::Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::string in;   // bytes received so far (request line + headers)
  std::string out;  // the response, once prepared
  size_t out_offset = 0;
  bool writing = false;  // response prepared; reading is over
  bool polled = false;   // was in a poll round (its bytes so far have been read)
  bool eof = false;      // the peer closed its side before the request was complete
};

namespace {

std::string response(int code, std::string_view reason, std::string_view content_type,
                     const std::string& body, bool head_only, std::string_view extra_headers = {}) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " ";
  r.append(reason);
  r += "\r\nContent-Type: ";
  r.append(content_type);
  r += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  r.append(extra_headers);
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

std::string plain_error(int code, std::string_view reason, std::string_view extra_headers = {}) {
  std::string body(reason);
  body += "\n";
  return response(code, reason, "text/plain; charset=utf-8", body, false, extra_headers);
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::start(const std::string& host,
                                                                      int port, Handler handler,
                                                                      MetricsHttpOptions options) {
  if (port < 0 || port > 65535)
    return invalid_argument("metrics: port must be in 0..65535, got " + std::to_string(port));
  if (options.max_request_bytes < 64 || options.max_request_line_bytes < 32 ||
      options.io_timeout_ms <= 0 || options.max_connections <= 0 || options.poll_interval_ms <= 0)
    return invalid_argument(
        "metrics: max_request_bytes >= 64, max_request_line_bytes >= 32 and positive "
        "timeouts/limits required");
  if (!handler) return invalid_argument("metrics: no handler");
  const std::string shown =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
      rc != 0)
    return unavailable("metrics: cannot resolve " + shown + ": " + gai_strerror(rc));
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      close_fd(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return unavailable("metrics: cannot listen on " + shown + ": " + last_error);

  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int bound = port;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  const int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    close_fd(fd);
    return unavailable(std::string("metrics: eventfd: ") + std::strerror(errno));
  }
  std::unique_ptr<MetricsHttpServer> s(
      new MetricsHttpServer(fd, wake, bound, std::move(handler), options));
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, int port, Handler handler,
                                     MetricsHttpOptions options)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      handler_(std::move(handler)),
      options_(options) {}

MetricsHttpServer::~MetricsHttpServer() {
  stop();
  close_fd(listen_fd_);
  close_fd(wake_fd_);
}

void MetricsHttpServer::stop() {
  if (!stopping_.exchange(true)) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

void MetricsHttpServer::run() {
  std::vector<std::unique_ptr<Connection>> conns;
  std::vector<pollfd> fds;
  const auto io_timeout = std::chrono::milliseconds(options_.io_timeout_ms);
  // Out of file descriptors (or memory), accept4 fails while the listener stays readable: poll
  // would return at once forever. Accepting pauses a while instead.
  constexpr auto kAcceptPause = std::chrono::milliseconds(100);
  Clock::time_point accept_paused_until{};
  bool pause_logged = false;
  while (!stopping_.load(std::memory_order_acquire)) {
    auto now = Clock::now();
    const bool paused = now < accept_paused_until;
    // At the connection limit a new client still gets in by closing the oldest one that has not
    // sent its whole request yet (idle, slow or garbage clients cannot hold every slot for
    // io_timeout_ms); only clients taking their responses are never closed for it.
    const auto is_evictable = [](const std::unique_ptr<Connection>& c) {
      return c->polled && !c->writing;
    };
    const auto evictable = [&] { return std::any_of(conns.begin(), conns.end(), is_evictable); };
    const bool accepting =
        !paused && (static_cast<int32_t>(conns.size()) < options_.max_connections || evictable());
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // fd -1: ignored by poll()
    auto wait = std::chrono::milliseconds(options_.poll_interval_ms);
    if (paused) {
      wait = std::min(
          wait, std::chrono::duration_cast<std::chrono::milliseconds>(accept_paused_until - now) +
                    std::chrono::milliseconds(1));
    }
    for (const auto& c : conns) {
      fds.push_back({c->fd, static_cast<short>(c->writing ? POLLOUT : POLLIN), 0});
      wait =
          std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(c->deadline - now) +
                             std::chrono::milliseconds(1));
    }
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (n < 0 && errno != EINTR) {
      KVSPLIT_LOG_ERROR("metrics: poll failed: {}", std::strerror(errno));
      break;
    }
    if (stopping_.load(std::memory_order_acquire)) break;
    // Existing connections first (their pollfd slots start at index 2), then new ones.
    for (size_t i = 0; i < conns.size(); ++i) {
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      Connection* c = conns[i].get();
      bool keep;
      if (c->writing) {
        keep = (ev & (POLLERR | POLLNVAL)) == 0 && on_writable(c);
      } else {
        keep = on_readable(c);  // also sees POLLHUP/POLLERR as EOF or an error from read()
      }
      if (!keep) {
        close_fd(c->fd);
        conns[i].reset();
      }
    }
    now = Clock::now();
    for (auto& c : conns) {
      if (c && now >= c->deadline) {  // too slow to send its request or to take the response
        close_fd(c->fd);
        c.reset();
      }
    }
    conns.erase(std::remove(conns.begin(), conns.end(), nullptr), conns.end());
    for (auto& c : conns) c->polled = true;  // every one left was in this poll round
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof(v));
    }
    if (accepting && (fds[1].revents & POLLIN)) {
      for (;;) {
        // At the limit: the oldest connection that has been read without a complete request
        // makes room, once a newcomer is actually accepted (never one accepted this round).
        const bool full = static_cast<int32_t>(conns.size()) >= options_.max_connections;
        auto oldest = full ? std::find_if(conns.begin(), conns.end(), is_evictable) : conns.end();
        if (full && oldest == conns.end()) break;  // every slot is busy: the backlog waits
        const int cfd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            accept_paused_until = now + kAcceptPause;
            if (!pause_logged) {
              KVSPLIT_LOG_WARN("metrics: cannot accept connections ({}): retrying every {} ms",
                               std::strerror(errno), kAcceptPause.count());
              pause_logged = true;
            }
          }
          break;  // else EAGAIN, or a connection reset before accept
        }
        pause_logged = false;
        if (full) {
          close_fd((*oldest)->fd);
          conns.erase(oldest);
        }
        auto c = std::make_unique<Connection>();
        c->fd = cfd;
        c->deadline = now + io_timeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (auto& c : conns) close_fd(c->fd);
}

bool MetricsHttpServer::on_readable(Connection* c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
    if (n > 0) {
      // Keep at most one byte past the limit: enough to know the request is too large.
      const size_t room =
          static_cast<size_t>(options_.max_request_bytes) + 1 -
          std::min(c->in.size(), static_cast<size_t>(options_.max_request_bytes) + 1);
      c->in.append(buf, std::min(room, static_cast<size_t>(n)));
      if (parse(c->in).action != MetricsRequestAction::kNeedMore) break;
      continue;
    }
    if (n == 0) {
      // The peer closed its side before a complete request: nothing more can complete it. A
      // connection that sent nothing is closed without an answer (a port probe); else 400.
      if (c->in.empty()) return false;
      c->eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;  // wait for more
    return false;
  }
  prepare_response(c);
  return on_writable(c);
}

bool MetricsHttpServer::on_writable(Connection* c) {
  while (c->out_offset < c->out.size()) {
    const ssize_t n =
        ::send(c->fd, c->out.data() + c->out_offset, c->out.size() - c->out_offset, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_offset += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  ::shutdown(c->fd, SHUT_WR);
  return false;  // done: close
}

MetricsRequest MetricsHttpServer::parse(std::string_view in) const {
  return parse_metrics_request(in, static_cast<size_t>(options_.max_request_bytes),
                               static_cast<size_t>(options_.max_request_line_bytes));
}

void MetricsHttpServer::prepare_response(Connection* c) {
  c->writing = true;
  served_.fetch_add(1);
  const MetricsRequest req = parse(c->in);
  switch (req.action) {
    case MetricsRequestAction::kNeedMore:
      if (c->eof) {  // the peer half-closed an incomplete request
        c->out = plain_error(400, "Bad Request");
        return;
      }
      [[fallthrough]];  // else not called: an incomplete block is too large
    case MetricsRequestAction::kTooLarge:
      c->out = plain_error(431, "Request Header Fields Too Large");
      return;
    case MetricsRequestAction::kBadRequest:
      c->out = plain_error(400, "Bad Request");
      return;
    case MetricsRequestAction::kMethodNotAllowed:
      c->out = plain_error(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
      return;
    case MetricsRequestAction::kNotFound:
      c->out = response(404, "Not Found", "text/plain; charset=utf-8", "Not Found: try /metrics\n",
                        req.head);
      return;
    case MetricsRequestAction::kScrape:
      break;
  }
  const bool head = req.head;
  StatusOr<std::string> body = handler_();
  if (!body.ok()) {
    c->out = response(500, "Internal Server Error", "text/plain; charset=utf-8",
                      body.status().to_string() + "\n", head);
    return;
  }
  c->out = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", *body, head);
}

}  // namespace kvsplit::server
