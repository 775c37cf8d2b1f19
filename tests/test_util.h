// Helpers shared by tests: where the shared models live, reading JSONL goldens.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvsplit::testing {

// $KVSPLIT_MODELS, else ../shared/models relative to the source tree.
inline std::string models_dir() {
  if (const char* env = std::getenv("KVSPLIT_MODELS"); env && *env) return env;
  return (std::filesystem::path(KVSPLIT_SOURCE_DIR) / ".." / "shared" / "models")
      .lexically_normal()
      .string();
}
inline std::string model_path(const std::string& rel) { return models_dir() + "/" + rel; }
inline bool have_models() { return std::filesystem::exists(model_path("stories260K.bin")); }
inline std::string data_path(const std::string& rel) {
  return (std::filesystem::path(models_dir()) / ".." / "data" / rel).lexically_normal().string();
}

#define KVSPLIT_REQUIRE_MODELS()                                                         \
  do {                                                                                   \
    if (!::kvsplit::testing::have_models())                                              \
      GTEST_SKIP() << "stories260K not found under " << ::kvsplit::testing::models_dir() \
                   << " (set KVSPLIT_MODELS)";                                           \
  } while (0)

// Skips unless `rel` (a file or folder under models_dir()) exists: for a test that reads a model
// besides stories260K, whose absence KVSPLIT_REQUIRE_MODELS does not see (scripts/gpu-kit.sh
// carries only the models the gpu tests name).
#define KVSPLIT_REQUIRE_MODEL(rel)                                                                 \
  do {                                                                                             \
    if (!std::filesystem::exists(::kvsplit::testing::model_path(rel)))                             \
      GTEST_SKIP() << "model " << (rel) << " not found under " << ::kvsplit::testing::models_dir() \
                   << " (set KVSPLIT_MODELS)";                                                     \
  } while (0)

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// A fresh temporary directory removed at destruction.
class TempDir {
 public:
  TempDir() {
    auto base = std::filesystem::temp_directory_path();
    for (int i = 0;; ++i) {
      path_ = base / ("kvsplit_test_" + std::to_string(::getpid()) + "_" + std::to_string(i) + "_" +
                      std::to_string(std::rand()));
      if (std::filesystem::create_directory(path_)) break;
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kvsplit::testing
