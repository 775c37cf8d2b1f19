// Flags and model loading shared by the `kvsplit` subcommands that run a model.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "kvsplit/status.h"
#include "model/llama_model.h"
#include "model/loader.h"

namespace kvsplit::cli {

struct CommonFlags {
  std::string model;
  std::string tokenizer;
  std::string backend = "cpu";
  int threads = 0;
  bool verbose = false;
  bool async_copies = false;          // cpu backend: BackendOptions::async_copies
  std::string weight_dtype = "auto";  // auto, f32, bf16, f16 (only where the command offers it)
};

void add_common(CLI::App* app, CommonFlags& f);

// A model loaded and placed on a backend (fields in destruction-safe order).
struct RunModel {
  model::LoadedModel loaded;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<model::LlamaModel> llama;
};

// Fills the default model when none is given (printing the choice to stderr), loads it and
// creates the backend and the model on it.
StatusOr<std::unique_ptr<RunModel>> load_run_model(CommonFlags& flags);

// Prints "kvsplit: error: ..." and returns the exit status for the code (cli/exit_codes.h).
int fail(const Status& st);

}  // namespace kvsplit::cli
