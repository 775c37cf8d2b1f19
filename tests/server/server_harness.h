// Runs the real kvsplit-server binary for a test: fork/exec on 127.0.0.1 with --port 0, reads
// the bound ports from its stdout, keeps its stderr (the log) in a file, SIGTERMs it at the end.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvsplit/v1/generation.grpc.pb.h"
#include "test_util.h"

namespace kvsplit::testing {

class ServerProcess {
 public:
  // Starts `kvsplit-server --host HOST --port 0 --metrics-port 0 ARGS...` and waits (up to 60 s)
  // for its "listening on" lines. started() is false when it exited instead. `nofile`: the
  // server's open-file limits (RLIMIT_NOFILE), when given.
  ServerProcess(std::vector<std::string> args, std::string log_path,
                const std::string& host = "127.0.0.1", const rlimit* nofile = nullptr)
      : log_path_(std::move(log_path)) {
    std::vector<std::string> argv = {KVSPLIT_SERVER_BIN, "--host", host, "--port", "0",
                                     "--metrics-port",   "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(log, 2);
      close(out[0]);
      if (nofile != nullptr) setrlimit(RLIMIT_NOFILE, nofile);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    close(out[1]);
    out_fd_ = out[0];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::string buf;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char chunk[512];
      ssize_t n = read(out_fd_, chunk, sizeof(chunk));
      if (n <= 0) break;  // exited
      buf.append(chunk, static_cast<size_t>(n));
      const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
      port_ = parse_port(buf, "listening on " + shown + ":");
      parse_metrics_line(buf);
      if (port_ > 0 && metrics_port_ > 0) return;
    }
  }
  ~ServerProcess() { stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  // The host of the "metrics on http://HOST:PORT/metrics" line.
  const std::string& metrics_host() const { return metrics_host_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
    if (sig == SIGTERM || sig == SIGINT) terminating_ = true;
  }
  bool alive() const {
    return pid_ > 0 && kill(pid_, 0) == 0 && waitpid(pid_, nullptr, WNOHANG) == 0;
  }
  // The exit status once the server exits by itself within `timeout`; -1 while it still runs.
  int exit_status_within(std::chrono::seconds timeout) {
    if (pid_ <= 0) return exit_status_;
    const int status = wait_exit(timeout);
    if (status == -1) return -1;
    exit_status_ = status;
    pid_ = -1;
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
    return status;
  }
  // SIGTERM (unless signal() already sent one: a second one would force the exit) and wait up to
  // `timeout`; returns the exit status (-1 on timeout, then SIGKILL).
  int stop(std::chrono::seconds timeout = std::chrono::seconds(20)) {
    if (pid_ <= 0) return exit_status_;
    if (!terminating_) kill(pid_, SIGTERM);
    exit_status_ = wait_exit(timeout);
    if (exit_status_ == -1) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
    return exit_status_;
  }

 private:
  int wait_exit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_)
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  void parse_metrics_line(const std::string& buf) {
    const std::string key = "metrics on http://";
    const auto at = buf.find(key);
    const auto end = at == std::string::npos ? at : buf.find("/metrics\n", at);
    if (end == std::string::npos) return;
    const std::string hostport = buf.substr(at + key.size(), end - at - key.size());
    const auto colon = hostport.rfind(':');
    if (colon == std::string::npos) return;
    metrics_host_ = hostport.substr(0, colon);
    if (metrics_host_.size() > 2 && metrics_host_.front() == '[')  // an IPv6 literal
      metrics_host_ = metrics_host_.substr(1, metrics_host_.size() - 2);
    metrics_port_ = std::atoi(hostport.substr(colon + 1).c_str());
  }
  static int parse_port(const std::string& buf, const std::string& key) {
    auto at = buf.find(key);
    if (at == std::string::npos) return 0;
    auto end = buf.find_first_of(" \n", at + key.size());
    if (end == std::string::npos) return 0;
    return std::atoi(buf.substr(at + key.size(), end - at - key.size()).c_str());
  }

  std::string log_path_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string metrics_host_;
  int exit_status_ = -1;
  bool terminating_ = false;
};

// Runs a shell command line; returns {exit code, stdout + stderr}.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// A unary call with raw request bytes (health checks, malformed messages).
// `bearer` non-empty: sent as "authorization: Bearer <bearer>".
inline grpc::Status raw_unary(const std::shared_ptr<grpc::Channel>& ch, const std::string& method,
                              const std::string& request_bytes, std::string* response_bytes,
                              std::chrono::milliseconds timeout = std::chrono::milliseconds(5000),
                              const std::string& bearer = "") {
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!bearer.empty()) ctx.AddMetadata("authorization", "Bearer " + bearer);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer req(&slice, 1), resp;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status st = done.get_future().get();
  if (st.ok() && response_bytes) {
    std::vector<grpc::Slice> slices;
    (void)resp.Dump(&slices);
    response_bytes->clear();
    for (auto& s : slices)
      response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return st;
}

// GET /metrics from 127.0.0.1:`port`; the body, or "" when the connection fails.
inline std::string scrape_metrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// The value of the sample `series` (name with its labels, e.g. `x_total{code="OK"}`) in a
// Prometheus text body; -1 when absent.
inline double metric_value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ')
      return std::atof(line.c_str() + series.size() + 1);
  }
  return -1;
}

// Lines of `text` that contain `needle`.
inline int count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

// Whether, within `within`, the server shows no open call and no running request, and every
// pool's blocks free (GetServerStats, as `bearer` when set).
inline bool wait_server_idle(kvsplit::v1::Generation::Stub* stub, std::chrono::milliseconds within,
                             const std::string& bearer = "") {
  const auto deadline = std::chrono::steady_clock::now() + within;
  do {
    grpc::ClientContext ctx;
    if (!bearer.empty()) ctx.AddMetadata("authorization", "Bearer " + bearer);
    kvsplit::v1::GetServerStatsResponse s;
    if (stub->GetServerStats(&ctx, {}, &s).ok()) {
      bool idle = s.pools_size() > 0 && s.num_running() == 0 && s.active_streams() == 0;
      for (const auto& p : s.pools()) idle = idle && p.kv_blocks_free() == p.kv_blocks_total();
      if (idle) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

}  // namespace kvsplit::testing
