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

// Position just past the end of the header block, or npos: the first empty line, ended by CRLF or
// a bare LF ("\r\n\r\n", "\n\n", and the mixed "\n\r\n", which went unseen: the connection then
// waited out the I/O timeout with no answer).
size_t header_end(const std::string& in) {
  for (size_t i = in.find('\n'); i != std::string::npos; i = in.find('\n', i + 1)) {
    if (i + 1 < in.size() && in[i + 1] == '\n') return i + 2;
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') return i + 3;
  }
  return std::string::npos;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::start(const std::string& host,
                                                                      int port, Handler handler,
                                                                      MetricsHttpOptions options) {
  if (port < 0 || port > 65535)
    return invalid_argument("metrics: port must be in 0..65535, got " + std::to_string(port));
  if (options.max_request_bytes < 64 || options.io_timeout_ms <= 0 ||
      options.max_connections <= 0 || options.poll_interval_ms <= 0)
    return invalid_argument(
        "metrics: max_request_bytes >= 64 and positive timeouts/limits required");
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
      if (header_end(c->in) != std::string::npos ||
          c->in.size() > static_cast<size_t>(options_.max_request_bytes))
        break;
      continue;
    }
    if (n == 0) return false;  // the peer closed before a complete request
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

void MetricsHttpServer::prepare_response(Connection* c) {
  c->writing = true;
  served_.fetch_add(1);
  const size_t end = header_end(c->in);
  if (end == std::string::npos || end > static_cast<size_t>(options_.max_request_bytes)) {
    c->out = plain_error(431, "Request Header Fields Too Large");
    return;
  }
  // Request line: METHOD SP target SP HTTP/1.x. One empty line before it is ignored (RFC 9112
  // 2.2: a client may send a CRLF after a previous request's body).
  std::string_view all(c->in);
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
    c->out = plain_error(400, "Bad Request");
    return;
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  // The absolute form (RFC 9112 3.2.2, "http://host:port/metrics", which a server must accept):
  // its path.
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() > scheme.size() && target.substr(0, scheme.size()) == scheme) {
      const size_t slash = target.find('/', scheme.size());
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
    }
  }
  target = target.substr(0, target.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    c->out = plain_error(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
    return;
  }
  if (target != "/metrics") {
    c->out =
        response(404, "Not Found", "text/plain; charset=utf-8", "Not Found: try /metrics\n", head);
    return;
  }
  StatusOr<std::string> body = handler_();
  if (!body.ok()) {
    c->out = response(500, "Internal Server Error", "text/plain; charset=utf-8",
                      body.status().to_string() + "\n", head);
    return;
  }
  c->out = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", *body, head);
}

}  // namespace kvsplit::server
