// changed_settings: the settings two versions of a config file's text set differently, for
// SIGHUP's report of what it does not apply (docs/server.md, Signals).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"

namespace kvsplit::config {
namespace {

std::vector<std::string> changed(const std::string& before, const std::string& after) {
  auto c = changed_settings(before, after);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : std::vector<std::string>{};
}

using Paths = std::vector<std::string>;

TEST(ChangedSettings, LeavesByPathInTheNewFilesOrder) {
  const std::string before =
      "model: a.bin\nkv: {capacity_mb: 16, policy: full}\nserver: {api_keys: [k1], port: 1}\n"
      "seed: 3\n";
  EXPECT_EQ(changed(before, before), Paths{});
  // Block style, another key order, quotes and comments: the same values.
  EXPECT_EQ(changed(before,
                    "# edited\nseed: '3'\nserver:\n  port: 1\n  api_keys:\n    - k1\n"
                    "kv:\n  policy: \"full\"\n  capacity_mb: 16\nmodel: a.bin\n"),
            Paths{});
  EXPECT_EQ(changed(before,
                    "kv: {capacity_mb: 32, policy: full}\nserver: {api_keys: [k1, k2]}\n"
                    "model: {path: a.bin}\npools: {decode_workers: 2}\n"),
            (Paths{"kv.capacity_mb", "server.api_keys", "server.port", "model",
                   "pools.decode_workers", "seed"}));
  // Unset: absent, null, an empty mapping and an empty list alike; a value written differently
  // differs.
  EXPECT_EQ(changed("kv:\n", "kv: {}\nserver:\n"), Paths{});
  EXPECT_EQ(changed("server: {api_keys: []}\n", "server: {}\n"), Paths{});
  EXPECT_EQ(changed("server: {api_keys: []}\n", "server: {api_keys: [k]}\n"),
            Paths{"server.api_keys"});
  EXPECT_EQ(changed("kv: {capacity_mb: 16}\n", "kv: {capacity_mb: 16.0}\n"),
            Paths{"kv.capacity_mb"});
  EXPECT_EQ(changed("", "seed: 1\n"), Paths{"seed"});
  EXPECT_EQ(changed("kv: {capacity_mb: 16}\n", "kv: 16\n"), Paths{"kv"});
}

TEST(ChangedSettings, NotStrictYamlIsAnError) {
  for (const auto& [a, b] : {std::pair<std::string, std::string>{"kv: {", "kv: {}"},
                             {"kv: {}", "kv: {a: 1, a: 2}"},
                             {"kv: {}", "kv: !!int 3"}}) {
    auto c = changed_settings(a, b);
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << a << " / " << b;
  }
}

}  // namespace
}  // namespace kvsplit::config
