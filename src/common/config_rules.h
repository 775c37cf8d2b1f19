// Rules for the public API's plain configuration types that several layers check (the YAML
// loader, the Engine at create and at every SIGHUP reload): written once, here, with field-path
// messages ("sla_classes.voice.max_itl_ms: must be > 0, got 0").
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvsplit/engine.h"
#include "kvsplit/status.h"

namespace kvsplit {

// At least one class; names 1..64 characters of [A-Za-z0-9_.-], unique; max_ttft_ms,
// max_itl_ms and queue_timeout_ms finite and > 0; priority in [-1000, 1000]; max_queue in
// [1, 1000000].
Status validate_sla_classes(const std::vector<SlaClass>& classes);

// KV page size: one of 8, 16, 32, 64 tokens (the CUDA kernels ship 16 only; see
// docs/configuration.md). `field` names it in the message.
Status validate_block_size(int32_t block_size, std::string_view field);

}  // namespace kvsplit
