#include "cli/common_flags.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/exit_codes.h"
#include "model/default_model.h"

namespace kvsplit::cli {

void add_common(CLI::App* app, CommonFlags& f) {
  app->add_option("--model", f.model,
                  "model: llama2.c .bin, HF directory or synthetic:<preset> "
                  "(default: stories260K from $KVSPLIT_MODELS, ./models or ../shared/models)");
  app->add_option("--tokenizer", f.tokenizer, "tokenizer file (default: beside the model)");
  app->add_option("--backend", f.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app->add_option("--threads", f.threads, "CPU threads (0: all; at most 1024)")
      ->check(CLI::Range(0, 1024));
  app->add_flag("--async-copies", f.async_copies,
                "cpu backend: recalls copy on a copy thread beside the compute threads, as on a "
                "GPU's second stream (bounded by --recall-wait-ms)");
  app->add_flag("-v,--verbose", f.verbose, "log progress to stderr");
}

StatusOr<std::unique_ptr<RunModel>> load_run_model(CommonFlags& f) {
  if (f.model.empty()) {
    model::DefaultModel d = model::resolve_default_model();
    f.model = d.model;
    if (f.tokenizer.empty()) f.tokenizer = d.tokenizer;
    std::fprintf(stderr, "%s\n", d.note.c_str());
  }
  auto run = std::make_unique<RunModel>();
  model::LoadOptions lo;
  lo.tokenizer_path = f.tokenizer;
  KVSPLIT_ASSIGN_OR_RETURN(run->loaded, model::load_model(f.model, lo));
  backend::BackendOptions bopt;
  bopt.threads = f.threads;
  bopt.async_copies = f.async_copies;
  if (f.weight_dtype == "f32") bopt.weight_dtype = backend::DType::kF32;
  if (f.weight_dtype == "bf16") bopt.weight_dtype = backend::DType::kBF16;
  if (f.weight_dtype == "f16") bopt.weight_dtype = backend::DType::kF16;
  KVSPLIT_ASSIGN_OR_RETURN(run->backend, backend::create_backend(f.backend, bopt));
  KVSPLIT_ASSIGN_OR_RETURN(run->llama, model::LlamaModel::create(run->loaded, *run->backend));
  if (f.verbose) {
    const model::ModelConfig& cfg = run->loaded.config;
    spdlog::info("model {} ({} layers, dim {}, vocab {}), backend {}", run->loaded.source,
                 cfg.num_layers, cfg.dim, cfg.vocab_size, run->backend->name());
  }
  return run;
}

int fail(const Status& st) {
  std::fprintf(stderr, "kvsplit: error: %s\n", st.to_string().c_str());
  return exit_code_for(st.code());
}

}  // namespace kvsplit::cli
