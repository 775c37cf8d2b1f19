// Fuzzes the server's YAML config loader (strict YAML checks, field parsing, validation). Any
// input must end in a Config or a Status, never a crash, a hang or an uncaught exception.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c =
      kvsplit::config::parse_config(std::string_view(reinterpret_cast<const char*>(data), size));
  if (c.ok()) (void)kvsplit::config::describe(*c);
  return 0;
}
