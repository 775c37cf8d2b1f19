// API-key authentication and the tenant a call belongs to. Request ids are scoped per tenant
// (Engine::cancel and the duplicate check see only the caller's own requests; docs/server.md).
#pragma once

#include <grpcpp/server_context.h>

#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::server {

// The single tenant of a server without API keys: every client shares it.
inline constexpr std::string_view kAnonymousTenant = "anonymous";

class ApiKeyAuth {
 public:
  // `keys` empty: no authentication.
  explicit ApiKeyAuth(const std::vector<std::string>& keys);

  bool enabled() const { return !keys_.empty(); }
  // The caller's tenant id: kAnonymousTenant without keys; with keys, tenant_id() of the key in
  // "authorization: Bearer <key>" (compared in constant time). kUnauthenticated when the header
  // is missing or the key is not configured. Reads only the call's metadata, never its message.
  StatusOr<std::string> authenticate(const grpc::ServerContextBase& context) const;

  // "key-" + the first 12 hex digits of SHA-256("kvsplit-tenant:" + key): stable across restarts
  // and config reorderings, printable in logs and metrics, and never the key itself.
  static std::string tenant_id(std::string_view key);

 private:
  struct Key {
    std::string secret;
    std::string tenant;
  };
  std::vector<Key> keys_;
};

}  // namespace kvsplit::server
