#include "server/tenant_policy.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/escape.h"

namespace kvsplit::server {
namespace {

Status permission_denied(std::string message) {
  return Status(StatusCode::kPermissionDenied, std::move(message));
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::shared_ptr<const config::KeyPolicy> full_rights() {
  static const auto* const kFull =
      new std::shared_ptr<const config::KeyPolicy>(std::make_shared<config::KeyPolicy>());
  return *kFull;
}

Status apply_key_policy(const config::KeyPolicy& policy, bool class_given,
                        const std::vector<std::string>& known, Request* r) {
  if (!policy.sla_classes.empty()) {
    const std::vector<std::string>& allowed = policy.sla_classes;
    if (!class_given) {
      r->sla_class = allowed.front();
      if (std::find(known.begin(), known.end(), r->sla_class) == known.end())
        return failed_precondition("sla_class: this API key's default class '" + r->sla_class +
                                   "' is not configured (known: " + joined(known) + ")");
    } else if (std::find(allowed.begin(), allowed.end(), r->sla_class) == allowed.end()) {
      return permission_denied("sla_class: class '" + escape_for_message(r->sla_class) +
                               "' is not allowed for this API key (allowed: " + joined(allowed) +
                               ")");
    }
  }
  if (policy.max_priority && r->priority > *policy.max_priority) {
    return permission_denied(fmt::format("priority: {} is above this API key's ceiling of {}",
                                         r->priority, *policy.max_priority));
  }
  return ok_status();
}

int32_t stream_limit(const config::KeyPolicy& policy, int32_t server_limit) {
  return policy.max_streams ? *policy.max_streams : server_limit;
}

Status stream_limit_error(const config::KeyPolicy& policy, int32_t server_limit,
                          const std::string& tenant) {
  return resource_exhausted(fmt::format("tenant {} is at its limit of {} concurrent streams ({})",
                                        tenant, stream_limit(policy, server_limit),
                                        policy.max_streams
                                            ? "its key's max_streams in server.api_keys"
                                            : "server.max_streams_per_tenant"));
}

Status check_server_stats_allowed(const config::KeyPolicy& policy) {
  if (policy.server_stats) return ok_status();
  return permission_denied(
      "GetServerStats: not allowed for this API key (server_stats: false in server.api_keys)");
}

}  // namespace kvsplit::server
