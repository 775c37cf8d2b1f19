// load_model: dispatch on the path (synthetic spec, HF directory, llama2.c file).
#include "model/loader.h"

#include <chrono>
#include <filesystem>

#include "common/log.h"
#include "model/weight_check.h"

namespace kvsplit::model {

StatusOr<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
  if (path.rfind("synthetic:", 0) == 0) return load_synthetic(path, options);
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (path.empty() || ec || !fs::exists(st)) {
    return not_found((path.empty() ? std::string("(empty path)") : path) +
                     ": no such model file or directory");
  }
  StatusOr<LoadedModel> m =
      fs::is_directory(st) ? load_hf_dir(path, options) : load_llama2c(path, options);
  if (!m.ok() || !options.check_weights) return m;
  const auto t0 = std::chrono::steady_clock::now();
  WeightCheckStats stats;
  KVSPLIT_RETURN_IF_ERROR(check_weights_finite(m->weights, m->source, &stats));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  KVSPLIT_LOG_INFO("{}: {} tensors ({:.1f} MiB) checked finite in {:.1f} ms", m->source,
                   stats.tensors, static_cast<double>(stats.bytes) / (1 << 20), ms);
  return m;
}

}  // namespace kvsplit::model
