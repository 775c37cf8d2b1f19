// load_model: dispatch on the path (synthetic spec, HF directory, llama2.c file).
#include "model/loader.h"

#include <filesystem>

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
  if (fs::is_directory(st)) return load_hf_dir(path, options);
  return load_llama2c(path, options);
}

}  // namespace kvsplit::model
