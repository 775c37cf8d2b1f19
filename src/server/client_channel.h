// Client-side channel setup shared by kvsplit-client and kvsplit-bench-serving.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "kvsplit/status.h"

namespace kvsplit::server {

struct ClientOptions {
  std::string server = "127.0.0.1:50051";  // host:port
  std::string tls_ca;                      // PEM CA (or the server's self-signed cert): TLS on
  std::string tls_server_name;             // overrides the name checked against the cert
  std::string api_key;                     // sent as "authorization: Bearer <key>"
};

// kInvalidArgument when the CA file cannot be read.
StatusOr<std::shared_ptr<grpc::Channel>> make_channel(const ClientOptions& options);
// Adds the bearer metadata (when an API key is set) to a call's context.
void add_auth(const ClientOptions& options, grpc::ClientContext* context);

}  // namespace kvsplit::server
