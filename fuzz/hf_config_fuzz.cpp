// Fuzzes the HF config.json parser (parse_hf_config_json: architectures, sizes, unsupported
// fields, layer types, sliding windows, both RoPE forms, special token ids) on text. A NUL byte
// (never in JSON text) splits the input: what follows is generation_config.json. Any input must
// end in a config that passes validate_model_config, with finite RoPE frequencies and attention
// factor, or in a kInvalidArgument / kUnimplemented naming the file.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/check.h"
#include "model/hf_config.h"
#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An accepted RoPE scaling logs its context at info: not for every input.
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::warn);
    return true;
  }();
  (void)quiet;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::optional<std::string_view> generation;
  if (nul != std::string_view::npos) generation = in.substr(nul + 1);
  auto c = kvsplit::model::parse_hf_config_json(in.substr(0, nul), "config.json", generation,
                                                "generation_config.json");
  if (!c.ok()) {
    const kvsplit::StatusCode code = c.status().code();
    KVSPLIT_CHECK(code == kvsplit::StatusCode::kInvalidArgument ||
                  code == kvsplit::StatusCode::kUnimplemented);
    const std::string& m = c.status().message();
    KVSPLIT_CHECK_MSG(m.starts_with("config.json: ") || m.starts_with("generation_config.json: "),
                      m.c_str());
    return 0;
  }
  KVSPLIT_CHECK(kvsplit::model::validate_model_config(*c, "config.json").ok());
  KVSPLIT_CHECK(c->layer_window.empty() ||
                c->layer_window.size() == static_cast<size_t>(c->num_layers));
  for (float f : kvsplit::model::rope_inv_freq(*c)) KVSPLIT_CHECK(std::isfinite(f));
  // The attention factor scales cos and sin, the logits by its square.
  const float af = kvsplit::model::rope_attention_factor(*c);
  KVSPLIT_CHECK(af > 0 && std::isfinite(af * af));
  return 0;
}
