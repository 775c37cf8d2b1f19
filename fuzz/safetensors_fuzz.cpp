// Fuzzes the safetensors header parser and its layout checks (SafetensorsFile::parse_bytes), then
// reads every tensor it accepted: any accepted view must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = kvsplit::model::SafetensorsFile::parse_bytes(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  for (const auto& [name, e] : f->entries()) {
    KVSPLIT_CHECK(e.data >= data && e.data + e.nbytes <= data + size);
    auto t = f->tensor(name);
    if (!t.ok()) continue;
    volatile uint8_t sink = 0;
    const auto* p = static_cast<const uint8_t*>(t->data);
    for (uint64_t i = 0; i < e.nbytes; i += 64) sink = sink + p[i];  // touch each cache line
  }
  return 0;
}
