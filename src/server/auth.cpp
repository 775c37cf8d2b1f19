#include "server/auth.h"

#include <openssl/evp.h>

#include <array>

#include "common/check.h"
#include "server/tenant_policy.h"

namespace kvsplit::server {
namespace {

constexpr char kTenantSalt[] = "kvsplit-tenant";

std::array<unsigned char, 32> sha256(std::string_view data) {
  std::array<unsigned char, 32> digest{};
  unsigned int len = 0;
  KVSPLIT_CHECK(EVP_Digest(data.data(), data.size(), digest.data(), &len, EVP_sha256(), nullptr) ==
                1);
  KVSPLIT_CHECK(len == digest.size());
  return digest;
}

}  // namespace

ApiKeyAuth::ApiKeyAuth(const std::vector<config::ApiKey>& keys, const ApiKeyAuth* previous) {
  for (const config::ApiKey& k : keys) {
    const std::array<unsigned char, 32> digest = sha256(k.key);
    const std::string* known = nullptr;
    if (previous) {
      for (const Key& old : previous->keys_) {
        if (old.digest == digest) known = &old.caller.tenant;
      }
    }
    keys_.push_back({digest, Caller{known ? *known : tenant_id(k.key),
                                    std::make_shared<const config::KeyPolicy>(k.policy)}});
  }
}

bool ApiKeyAuth::has_tenant(std::string_view tenant) const {
  return policy_of_tenant(tenant) != nullptr;
}

std::shared_ptr<const config::KeyPolicy> ApiKeyAuth::policy_of_tenant(
    std::string_view tenant) const {
  if (keys_.empty()) return tenant == kAnonymousTenant ? full_rights() : nullptr;
  for (const Key& k : keys_) {
    if (k.caller.tenant == tenant) return k.caller.policy;
  }
  return nullptr;
}

std::string ApiKeyAuth::tenant_id(std::string_view key) {
  unsigned char digest[6];
  KVSPLIT_CHECK(PKCS5_PBKDF2_HMAC(key.data(), static_cast<int>(key.size()),
                                  reinterpret_cast<const unsigned char*>(kTenantSalt),
                                  sizeof(kTenantSalt) - 1, kTenantIdIterations, EVP_sha256(),
                                  sizeof(digest), digest) == 1);
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "key-";
  for (int i = 0; i < 6; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xF]);
  }
  return out;
}

StatusOr<Caller> ApiKeyAuth::authenticate(const grpc::ServerContextBase& context) const {
  if (keys_.empty()) return Caller{std::string(kAnonymousTenant), full_rights()};
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return Status(StatusCode::kUnauthenticated, "missing 'authorization: Bearer <key>' metadata");
  }
  // Exactly one: with two (a proxy that appends its own), which one is meant is ambiguous, and
  // the first is not necessarily the caller's.
  if (md.count("authorization") != 1) {
    return Status(StatusCode::kUnauthenticated, "more than one 'authorization' metadata entry");
  }
  const std::string_view value(it->second.data(), it->second.size());
  // The scheme is case-insensitive (RFC 9110 11.1); one or more spaces (11.4), then the key.
  constexpr std::string_view kPrefix = "bearer ";
  auto scheme_matches = [&] {
    if (value.size() < kPrefix.size()) return false;
    for (size_t i = 0; i < kPrefix.size(); ++i) {
      const char c = value[i];
      if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != kPrefix[i]) return false;
    }
    return true;
  };
  if (scheme_matches()) {
    std::string_view key = value.substr(kPrefix.size());
    while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
    if (const Caller* caller = caller_of(key)) return *caller;
  }
  return Status(StatusCode::kUnauthenticated, "invalid API key");
}

const Caller* ApiKeyAuth::caller_of(std::string_view key) const {
  // Digests of a fixed length, compared in full against every key: the time depends on neither
  // the key's length nor where it differs, nor on which key matched.
  const std::array<unsigned char, 32> digest = sha256(key);
  const Caller* match = nullptr;
  for (const Key& k : keys_) {
    unsigned char diff = 0;
    for (size_t i = 0; i < digest.size(); ++i) diff |= digest[i] ^ k.digest[i];
    if (diff == 0) match = &k.caller;
  }
  return match;
}

}  // namespace kvsplit::server
