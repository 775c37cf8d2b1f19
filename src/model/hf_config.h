// Hugging Face `config.json` -> ModelConfig. docs/models.md lists every field read, its default,
// and the errors; a field that would change the math and is not implemented is an error naming
// the file, the field and the value, never silently ignored.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_util.h"
#include "kvsplit/status.h"
#include "model/model_config.h"

namespace kvsplit::model {

// Reads `dir`/config.json (and generation_config.json when present). Errors:
// kInvalidArgument for malformed or out-of-range values, kUnimplemented for valid settings this
// engine does not run (an unknown architecture is kInvalidArgument); messages start with the path.
// Both files are read before either is parsed.
StatusOr<ModelConfig> parse_hf_config(const std::string& dir);

// The same from the texts of config.json and, when the model has one, generation_config.json
// (parse_hf_config reads the files and calls this). `what` and `generation_what` name the two in
// errors. Errors: kInvalidArgument and kUnimplemented as above; no I/O.
StatusOr<ModelConfig> parse_hf_config_json(
    std::string_view text, const std::string& what,
    std::optional<std::string_view> generation_text = std::nullopt,
    const std::string& generation_what = "generation_config.json");

// The RoPE part of config.json, in either form: `rope_parameters` (transformers >= 5; flat, or
// keyed by layer type) or `rope_theta` + `rope_scaling` (earlier; `type` or `rope_type`). Values
// given in both forms must agree. Sets config->rope_theta, config->rope_scaling and the context
// length config->max_seq_len, which must hold max_position_embeddings on entry; reads head_dim.
// `layer_types` [num_layers] selects the entry of a per-layer-type `rope_parameters`. `what` is
// the file name for errors.
Status parse_hf_rope(const common::Json& config_json, const std::string& what,
                     const std::vector<std::string>& layer_types, ModelConfig* config);

}  // namespace kvsplit::model
