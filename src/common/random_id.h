// Unguessable identifiers from the kernel's CSPRNG.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvsplit {

// `prefix` followed by 32 lower-case hex digits: 128 bits from getrandom(2) (std::random_device
// when getrandom is unavailable). Thread-safe. Request ids made this way cannot be predicted
// from earlier ones, so a client cannot aim at another client's request (docs/server.md).
std::string random_id(std::string_view prefix);

// `n` bytes from the same source (secret keys). Thread-safe.
void random_bytes(void* out, size_t n);

}  // namespace kvsplit
