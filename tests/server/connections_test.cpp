// Connections and file descriptors (docs/server.md, "File descriptors and connections"): idle
// connections are closed after server.max_connection_idle_ms; the soft open-file limit is raised
// to the hard one; and a server whose gRPC port stopped accepting (out of descriptors: gRPC 1.51
// never accepts on it again) drains and exits 1 instead of looking alive while refusing clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Opens `n` plain TCP connections to the port (each takes one of the server's descriptors once
// gRPC accepts it) and returns them.
std::vector<int> open_connections(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = connect_to(port);
    if (fd >= 0) fds.push_back(fd);
  }
  return fds;
}

void close_all(std::vector<int>* fds) {
  for (int fd : *fds) ::close(fd);
  fds->clear();
}

grpc::Status model_info(const std::string& address) {
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetModelInfoRequest req;
  v1::GetModelInfoResponse resp;
  return stub->GetModelInfo(&ctx, req, &resp);
}

// Reads HTTP/2 frames from `fd` for up to `within`; true when a GOAWAY (type 7) came.
bool goaway_within(int fd, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  std::string buf;
  size_t at = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n <= 0) return false;  // closed without a GOAWAY
    buf.append(chunk, static_cast<size_t>(n));
    while (buf.size() >= at + 9) {  // frame header: 24-bit length, type, flags, stream id
      const size_t len = (static_cast<size_t>(static_cast<uint8_t>(buf[at])) << 16) |
                         (static_cast<size_t>(static_cast<uint8_t>(buf[at + 1])) << 8) |
                         static_cast<uint8_t>(buf[at + 2]);
      if (buf[at + 3] == 7) return true;
      if (buf.size() < at + 9 + len) break;
      at += 9 + len;
    }
  }
  return false;
}

// An HTTP/2 client that sends its preface and SETTINGS and then nothing: a connection with no
// call open. It gets a GOAWAY after max_connection_idle_ms, not before; a gRPC channel idle that
// long reconnects at its next call.
TEST(Connections, AConnectionWithNoCallIsClosedAfterTheIdleLimit) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  std::ofstream(dir.file("c.yaml")) << "server: {max_connection_idle_ms: 1000}\n";
  ServerProcess server({"--config", dir.file("c.yaml"), "--model", model_path("stories260K.bin")},
                       dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  const int fd = connect_to(server.port());
  ASSERT_GE(fd, 0);
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  const char settings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};  // an empty SETTINGS frame
  ASSERT_EQ(::write(fd, kPreface, sizeof(kPreface) - 1),
            static_cast<ssize_t>(sizeof(kPreface) - 1));
  ASSERT_EQ(::write(fd, settings, sizeof(settings)), 9);
  EXPECT_FALSE(goaway_within(fd, std::chrono::milliseconds(300))) << "closed before the limit";
  EXPECT_TRUE(goaway_within(fd, std::chrono::seconds(10))) << server.log();
  ::close(fd);

  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // closed by then
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetModelInfoResponse resp;
    const grpc::Status st = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &resp);
    EXPECT_TRUE(st.ok()) << "call " << i << ": " << st.error_message();
  }
}

// A soft limit below the hard one is raised at start: 300 connections do not run a server with
// a soft limit of 64 out of descriptors.
TEST(Connections, TheSoftOpenFileLimitIsRaisedToTheHardOne) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  const rlimit nofile{64, 4096};
  ServerProcess server({"--model", model_path("stories260K.bin")}, dir.file("server.log"),
                       "127.0.0.1", &nofile);
  ASSERT_TRUE(server.started()) << server.log();
  EXPECT_NE(server.log().find("open-file limit raised from 64 to 4096"), std::string::npos)
      << server.log();
  std::vector<int> fds = open_connections(server.port(), 300);
  EXPECT_EQ(fds.size(), 300u);
  const grpc::Status st = model_info(server.address());
  EXPECT_TRUE(st.ok()) << st.error_message() << "\n" << server.log();
  close_all(&fds);
  EXPECT_TRUE(server.alive());
  EXPECT_EQ(server.log().find("Failed accept4"), std::string::npos) << server.log();
}

// Out of descriptors for good (hard limit 128): gRPC's accept fails and its port never accepts
// again, even with gRPC's own log turned off (GRPC_VERBOSITY=NONE). The server says so, drains, and
// exits 1 for a supervisor to restart it; before, it kept running and every new client timed out.
TEST(Connections, AServerWhosePortStopsAcceptingDrainsAndExits1) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  const rlimit nofile{128, 128};
  // GRPC_VERBOSITY=NONE would hide gRPC's error, and the failure with it: errors stay on.
  setenv("GRPC_VERBOSITY", "NONE", 1);
  ServerProcess server({"--model", model_path("stories260K.bin")}, dir.file("server.log"),
                       "127.0.0.1", &nofile);
  unsetenv("GRPC_VERBOSITY");
  ASSERT_TRUE(server.started()) << server.log();
  std::vector<int> fds = open_connections(server.port(), 300);
  const int status = server.exit_status_within(std::chrono::seconds(30));
  close_all(&fds);
  EXPECT_EQ(status, 1) << server.log();
  const std::string log = server.log();
  EXPECT_NE(log.find("grpc: Failed accept4"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped accepting connections"), std::string::npos) << log;
  EXPECT_NE(log.find("draining"), std::string::npos) << log;
}

}  // namespace
}  // namespace kvsplit::testing
