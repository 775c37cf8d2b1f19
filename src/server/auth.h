// API-key authentication and the tenant a call belongs to. Request ids are scoped per tenant
// (Engine::cancel and the duplicate check see only the caller's own requests; docs/server.md).
#pragma once

#include <grpcpp/server_context.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "kvsplit/status.h"

namespace kvsplit::server {

// The single tenant of a server without API keys: every client shares it.
inline constexpr std::string_view kAnonymousTenant = "anonymous";

// Who makes a call: its tenant and what its key may do (server/tenant_policy.h).
struct Caller {
  std::string tenant;
  std::shared_ptr<const config::KeyPolicy> policy;  // never null; full rights for a plain key
};

class ApiKeyAuth {
 public:
  // `keys` (distinct; validate_config) empty: no authentication. `previous` (optional, a reload's
  // old key set): the tenant ids of the keys it holds are taken from it rather than derived again
  // (tenant_id is slow); their policies are the new ones.
  explicit ApiKeyAuth(const std::vector<config::ApiKey>& keys,
                      const ApiKeyAuth* previous = nullptr);

  bool enabled() const { return !keys_.empty(); }
  // The caller: kAnonymousTenant with full rights without keys; with keys, tenant_id() and the
  // policy of the key in "authorization: Bearer <key>" (compared in constant time).
  // kUnauthenticated when the header is missing or the key is not configured. Reads only the
  // call's metadata, never its message.
  StatusOr<Caller> authenticate(const grpc::ServerContextBase& context) const;

  // The caller of `key` when it is one of the configured keys, else null. Compares SHA-256
  // digests in constant time (nothing about the key's length or content shows in the time).
  const Caller* caller_of(std::string_view key) const;
  // caller_of(key)'s tenant, or null.
  const std::string* tenant_of(std::string_view key) const {
    const Caller* c = caller_of(key);
    return c ? &c->tenant : nullptr;
  }
  // Whether one of the configured keys has tenant id `tenant` (kAnonymousTenant: when disabled).
  bool has_tenant(std::string_view tenant) const;
  // The policy of the key with tenant id `tenant` (full rights for kAnonymousTenant when
  // disabled), or null when no configured key has it.
  std::shared_ptr<const config::KeyPolicy> policy_of_tenant(std::string_view tenant) const;

  // "key-" + 12 hex digits (48 bits) of PBKDF2-HMAC-SHA256(key, salt "kvsplit-tenant",
  // kTenantIdIterations): stable across restarts and config reorderings, printable in logs and
  // metrics (which are unauthenticated), and never the key itself. The iterations make each
  // guess at a weak key, checked offline against a published id, cost that many hashes; 10,000
  // keep the start of a server with 1,000 keys to a few seconds.
  static constexpr int kTenantIdIterations = 10000;
  static std::string tenant_id(std::string_view key);

 private:
  struct Key {
    std::array<unsigned char, 32> digest;  // SHA-256 of the key
    Caller caller;
  };
  std::vector<Key> keys_;
};

}  // namespace kvsplit::server
