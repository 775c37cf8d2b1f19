// A client that vanishes without closing its connection (a dropped network, a host powered off)
// must not hold its requests' KV for gRPC's default two hours: the server's keepalive pings go
// unanswered and it closes the connection, cancelling the calls (server.keepalive_ms). The
// vanishing is played by a TCP proxy between client and server that stops moving bytes both ways
// while keeping both sockets open.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

class FreezingProxy {
 public:
  explicit FreezingProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_fd_, 8) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FreezingProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();  // no pump is added after this
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  int port() const { return port_; }
  // From now on no byte moves either way; the sockets stay open (no FIN, no RST).
  void freeze() { frozen_ = true; }

 private:
  static bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 20) > 0;
  }
  void accept_loop() {
    while (!stop_) {
      if (!readable(listen_fd_)) continue;
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { pump(client, server); });
      pumps_.emplace_back([this, client, server] { pump(server, client); });
    }
  }
  void pump(int from, int to) {
    char buf[16384];
    while (!stop_) {
      if (frozen_ || !readable(from)) {
        if (frozen_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      const ssize_t n = ::read(from, buf, sizeof(buf));
      if (n <= 0) return;
      for (ssize_t off = 0; off < n;) {
        const ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) return;
        off += w;
      }
    }
  }

  int target_port_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false}, stop_{false};
  std::mutex mu_;
  std::vector<int> fds_;  // accept_loop adds them (under mu_) while it runs
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
};

TEST(Keepalive, AClientThatVanishesWithoutClosingIsCutOffAndItsKvFreed) {
  TempDir dir;
  std::ofstream(dir.file("k.yaml")) << "server: {keepalive_ms: 500, keepalive_timeout_ms: 500}\n";
  ServerProcess server({"--config", dir.file("k.yaml"), "--model", "synthetic:llama-110m"},
                       dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  FreezingProxy proxy(server.port());
  ASSERT_GT(proxy.port(), 0);
  auto via_proxy = grpc::CreateChannel("127.0.0.1:" + std::to_string(proxy.port()),
                                       grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(via_proxy);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::GenerateRequest r;
  r.set_prompt("Once upon a time");
  r.set_max_tokens(1000);
  r.set_ignore_eos(true);
  auto reader = stub->Generate(&ctx, r);
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first)) << server.log();
  proxy.freeze();
  auto direct = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  // The request needs tens of seconds of decoding; the keepalive ends it within about a second.
  auto direct_stub = v1::Generation::NewStub(direct);
  EXPECT_TRUE(wait_server_idle(direct_stub.get(), std::chrono::seconds(15)))
      << "the vanished client's call still holds the server\n"
      << server.log();
  ctx.TryCancel();
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  (void)reader->Finish();
}

}  // namespace
}  // namespace kvsplit::testing
