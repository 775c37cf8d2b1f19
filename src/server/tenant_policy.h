// The per-key policy of server.api_keys (config::KeyPolicy; docs/configuration.md "Per-key
// policy") applied to calls: the SLA classes and the request priority a key may ask for, its
// stream limit, and whether it may read the server-wide GetServerStats. A request is checked
// against its key's policy as it is when its message arrives (GenerationService::engine_request):
// a reload that changes a policy applies to every request submitted after it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "kvsplit/engine.h"
#include "kvsplit/status.h"

namespace kvsplit::server {

// Full rights: a plain key's, and every client's without authentication. Shared, immutable.
std::shared_ptr<const config::KeyPolicy> full_rights();

// Applies `policy` to the engine request `r` (built and validated by to_engine_request, so its
// sla_class is a class in force): a request that named no class (`class_given` false) gets the
// key's default class instead of the server's; then kPermissionDenied naming the class when the
// key may not use it, or naming the ceiling when r->priority is above the key's max_priority.
// `known`: the classes in force; a default class not among them (the engine refused a reload's
// classes after the keys were applied) is kFailedPrecondition.
Status apply_key_policy(const config::KeyPolicy& policy, bool class_given,
                        const std::vector<std::string>& known, Request* r);

// The open Generate calls one tenant may hold under `policy`: its max_streams, else
// `server_limit` (server.max_streams_per_tenant); 0: no limit.
int32_t stream_limit(const config::KeyPolicy& policy, int32_t server_limit);
// The RESOURCE_EXHAUSTED of a call of `tenant` over stream_limit(policy, server_limit) open calls;
// it names the setting that limits it.
Status stream_limit_error(const config::KeyPolicy& policy, int32_t server_limit,
                          const std::string& tenant);

// OK when `policy` allows GetServerStats (server-wide figures: other tenants' load), else
// kPermissionDenied.
Status check_server_stats_allowed(const config::KeyPolicy& policy);

}  // namespace kvsplit::server
