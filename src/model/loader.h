// Model loading: llama2.c checkpoints, HF directories, synthetic presets.
#pragma once

#include <memory>
#include <string>

#include "kvsplit/status.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace kvsplit::model {

struct LoadOptions {
  // Tokenizer file; empty = beside the model (tokenizer.bin / tok512.bin for llama2.c, the
  // directory's tokenizer.json for HF; a synthetic model's byte-level stand-in).
  std::string tokenizer_path;
  // Load the tokenizer at all (benchmarks of raw forward passes may skip it).
  bool load_tokenizer = true;
  // Scan every weight of a file-backed model for NaN/Inf at load (check_weights_finite): one
  // pass over the weights, which a first forward pass reads anyway. Synthetic weights are
  // generated finite and never scanned.
  bool check_weights = true;
};

struct LoadedModel {
  ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null only when LoadOptions::load_tokenizer is false
  std::string source;                    // what was loaded, for logs ("llama2.c /x/y.bin", ...)
};

// `path`: a llama2.c .bin file, an HF model directory, or "synthetic:<preset>". Every malformed
// input is an error naming the file and the fault (truncated, bad header, shape mismatch, unknown
// architecture, missing tensor, bad JSON), never a crash.
StatusOr<LoadedModel> load_model(const std::string& path, const LoadOptions& options = {});

// Individual loaders (load_model dispatches on the path).
StatusOr<LoadedModel> load_llama2c(const std::string& path, const LoadOptions& options);
StatusOr<LoadedModel> load_hf_dir(const std::string& dir, const LoadOptions& options);
// Presets: stories260k, llama-110m, tinyllama-1.1b, llama3-8b (see docs/models.md). Weights are
// seeded (seed 0 by default; "synthetic:llama-110m@seed=7" picks another); "@ctx=N" (or
// "@seed=7,ctx=N") sets the context length (max_seq_len) instead of the preset's.
StatusOr<LoadedModel> load_synthetic(const std::string& spec, const LoadOptions& options);
// The config a synthetic spec would load, without generating any weights.
StatusOr<ModelConfig> synthetic_config(const std::string& spec);

}  // namespace kvsplit::model
