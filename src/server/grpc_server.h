// Builds and starts the gRPC server: kvsplit.v1.Generation, grpc.health.v1.Health (default
// service; "" and "kvsplit.v1.Generation" report SERVING until drain), server reflection, TLS
// when configured, message-size and per-connection stream limits.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "config/config.h"
#include "kvsplit/status.h"
#include "server/generation_service.h"

namespace kvsplit::server {

// HTTP/2 streams one connection may open beyond server.max_concurrent_streams (Abort, stats and
// health calls, and Generate calls the server refuses itself with RESOURCE_EXHAUSTED).
inline constexpr int32_t kStreamHeadroom = 64;

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (resolves port 0)
};

// kInvalidArgument naming server.tls.* when the cert/key cannot be read, kUnavailable when the
// address cannot be bound. `service` must outlive the returned server.
// The TLS certificate and key files exist and are readable PEM-sized regular files: checked
// before the engine starts (loading a model can take minutes), so a typo fails at once.
Status check_tls_files(const config::ServerConfig& config);

StatusOr<RunningServer> start_grpc_server(const config::ServerConfig& config,
                                          GenerationService* service);

// Sends gRPC's own log lines to the server's log (spdlog, prefixed "grpc:"), and calls
// `on_listener_failure` (once, from gRPC's thread) when gRPC reports that a listening port failed
// to accept ("Failed accept4", e.g. out of file descriptors): gRPC 1.51 then never accepts on
// that port again, so the server would look alive while refusing every new connection. The
// callback runs inside gRPC's poller, holding its listener's lock: it must not call into gRPC.
// gRPC's errors stay on even under GRPC_VERBOSITY=NONE, since the detection reads them.
void route_grpc_log(void (*on_listener_failure)());

// Marks the health service NOT_SERVING (drain) or SERVING.
void set_serving(grpc::Server* server, bool serving);

// Cancels every call in progress at once and closes the connections, as grpc::Server::Shutdown
// does when its deadline passes (the clients get UNAVAILABLE "Cancelling all calls"); a Shutdown
// waiting in another thread then returns. Thread-safe; `server` started, not yet destroyed.
void cancel_all_calls(grpc::Server* server);

}  // namespace kvsplit::server
