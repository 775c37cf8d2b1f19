#include "server/auth.h"

#include <openssl/evp.h>

#include "common/check.h"

namespace kvsplit::server {
namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

ApiKeyAuth::ApiKeyAuth(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) keys_.push_back({k, tenant_id(k)});
}

std::string ApiKeyAuth::tenant_id(std::string_view key) {
  const std::string input = "kvsplit-tenant:" + std::string(key);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KVSPLIT_CHECK(EVP_Digest(input.data(), input.size(), digest, &len, EVP_sha256(), nullptr) == 1);
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "key-";
  for (int i = 0; i < 6; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xF]);
  }
  return out;
}

StatusOr<std::string> ApiKeyAuth::authenticate(const grpc::ServerContextBase& context) const {
  if (keys_.empty()) return std::string(kAnonymousTenant);
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
    const Key* match = nullptr;
    for (const Key& k : keys_) {
      if (constant_time_equal(key, k.secret)) match = &k;  // no early exit: same time for all
    }
    if (match != nullptr) return match->tenant;
  }
  return Status(StatusCode::kUnauthenticated, "invalid API key");
}

}  // namespace kvsplit::server
