// changed_settings (config.h): which settings of a config file differ from another version of it,
// compared on the strict YAML trees (yaml_strict.h), for a reload's report of what it does not
// apply.
#include <yaml-cpp/yaml.h>

#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/escape.h"
#include "config/config.h"
#include "config/yaml_strict.h"

namespace kvsplit::config {

namespace {

// Absent, null and mappings: compared key by key (absent and null hold no keys).
bool map_like(const YAML::Node& n) { return !n || n.IsNull() || n.IsMap(); }

// The values of a mapping by key (keys are unique scalars: load_strict_yaml); empty otherwise.
std::unordered_map<std::string, YAML::Node> by_key(const YAML::Node& map) {
  std::unordered_map<std::string, YAML::Node> out;
  if (map && map.IsMap()) {
    for (const auto& kv : map) out.emplace(kv.first.Scalar(), kv.second);
  }
  return out;
}

// Two values written the same: scalars as written, lists element by element, mappings key by
// key whatever their order. Absent, null and an empty list are the same (no values).
bool unset(const YAML::Node& n) { return !n || n.IsNull() || (n.IsSequence() && n.size() == 0); }

bool same(const YAML::Node& a, const YAML::Node& b) {
  const bool a_unset = unset(a), b_unset = unset(b);
  if (a_unset || b_unset) return a_unset == b_unset;
  if (a.Type() != b.Type()) return false;
  if (a.IsScalar()) return a.Scalar() == b.Scalar();
  if (a.size() != b.size()) return false;
  if (a.IsSequence()) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same(a[i], b[i])) return false;
    }
    return true;
  }
  const auto a_keys = by_key(a);
  for (const auto& kv : b) {
    const auto it = a_keys.find(kv.first.Scalar());
    if (it == a_keys.end() || !same(it->second, kv.second)) return false;
  }
  return true;
}

// Appends to `out` the paths under `path` whose values differ: mappings (or absent / null) on
// both sides key by key, in `after`'s order and then the keys only `before` has; anything else as
// one value.
void diff(const YAML::Node& before, const YAML::Node& after, const std::string& path,
          std::vector<std::string>* out) {
  if (!map_like(before) || !map_like(after)) {
    if (!same(before, after)) out->push_back(path.empty() ? "(top level)" : path);
    return;
  }
  const YAML::Node absent(YAML::NodeType::Undefined);
  const auto before_keys = by_key(before), after_keys = by_key(after);
  if (after && after.IsMap()) {
    for (const auto& kv : after) {
      const std::string& key = kv.first.Scalar();
      const auto it = before_keys.find(key);
      diff(it == before_keys.end() ? absent : it->second, kv.second, join(path, key), out);
    }
  }
  if (before && before.IsMap()) {
    for (const auto& kv : before) {
      const std::string& key = kv.first.Scalar();
      if (!after_keys.contains(key)) diff(kv.second, absent, join(path, key), out);
    }
  }
}

}  // namespace

StatusOr<std::vector<std::string>> changed_settings(const std::string& old_text,
                                                    const std::string& new_text) {
  try {
    KVSPLIT_ASSIGN_OR_RETURN(const YAML::Node before, load_strict_yaml(old_text));
    KVSPLIT_ASSIGN_OR_RETURN(const YAML::Node after, load_strict_yaml(new_text));
    std::vector<std::string> changed;
    diff(before, after, "", &changed);
    return changed;
  } catch (const YAML::Exception& e) {
    return invalid_argument("YAML error at line " + std::to_string(e.mark.line + 1) + ", column " +
                            std::to_string(e.mark.column + 1) + ": " + escape_for_message(e.msg));
  } catch (const std::exception& e) {
    return invalid_argument(std::string("YAML error: ") + escape_for_message(e.what()));
  }
}

}  // namespace kvsplit::config
