// Strict YAML for config and rules files, and the field-path helpers of their messages.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "kvsplit/status.h"

namespace kvsplit::config {

// Nesting limit of a config (StrictWalk; yaml-cpp's own depth guard reports past it too).
inline constexpr int kMaxYamlDepth = 32;

// kInvalidArgument "<path>: <what>".
Status field_error(const std::string& path, const std::string& what);
// "path.key" ("key" at the top), the key escaped: keys and values from the file are escaped when
// they appear in a message.
std::string join(const std::string& path, const std::string& key);

// Parses `text` as exactly one strict YAML document: mapping keys are scalars and unique at every
// level (yaml-cpp keeps duplicates and returns the first), no explicit tags, nesting at most
// kMaxYamlDepth levels, a bounded number of nodes (aliases cannot multiply the walk). An empty
// text gives a null node. yaml-cpp's exceptions propagate: the caller turns them into a Status.
StatusOr<YAML::Node> load_strict_yaml(const std::string& text);

}  // namespace kvsplit::config
