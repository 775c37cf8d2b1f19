#include "model/default_model.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace kvsplit::model {

DefaultModel resolve_default_model() {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KVSPLIT_MODELS"); env && *env) dirs.emplace_back(env);
  dirs.emplace_back("./models");
  dirs.emplace_back("../shared/models");
  for (const std::string& d : dirs) {
    const fs::path bin = fs::path(d) / "stories260K.bin";
    const fs::path tok = fs::path(d) / "tok512.bin";
    std::error_code ec;
    if (fs::is_regular_file(bin, ec) && fs::is_regular_file(tok, ec)) {
      return DefaultModel{bin.string(), tok.string(), "default model: stories260K from " + d,
                          false};
    }
  }
  return DefaultModel{"synthetic:stories260k", "",
                      "default model: stories260K not found in $KVSPLIT_MODELS, ./models or "
                      "../shared/models (scripts/download_models.sh fetches it); using "
                      "synthetic:stories260k (random weights: output is noise)",
                      true};
}

}  // namespace kvsplit::model
