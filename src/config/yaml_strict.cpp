// Strict YAML for config and rules files (yaml_strict.h): one document, scalar unique keys, no
// tags, bounded depth and size, checked on the whole tree before any field is read.
#include "config/yaml_strict.h"

#include <yaml-cpp/eventhandler.h>

#include <map>
#include <sstream>

#include "common/escape.h"

namespace kvsplit::config {

Status field_error(const std::string& path, const std::string& what) {
  return invalid_argument(path + ": " + what);
}

std::string join(const std::string& path, const std::string& key) {
  const std::string k = escape_for_message(key, 64);
  return path.empty() ? k : path + "." + k;
}

namespace {

// Strict YAML, checked on the whole tree before any field is read: mapping keys are scalars and
// unique at every level (yaml-cpp keeps duplicates and returns the first), no explicit tags
// (`!!python/object`, `!!int`...: none is meaningful in a kvsplit config), nesting at most
// kMaxYamlDepth levels (yaml_strict.h), at most kMaxYamlNodes nodes visited (aliases cannot
// multiply the walk).
constexpr int64_t kMaxYamlNodes = 1 << 20;

std::string line_of(const YAML::Node& n) { return "line " + std::to_string(n.Mark().line + 1); }

struct StrictWalk {
  int64_t nodes = 0;

  Status check(const YAML::Node& n, const std::string& path, int depth) {
    const std::string where = path.empty() ? "(top level)" : path;
    if (++nodes > kMaxYamlNodes) {
      return field_error(where, "more than " + std::to_string(kMaxYamlNodes) +
                                    " YAML nodes (alias expansion?); a config is far smaller");
    }
    if (depth > kMaxYamlDepth) {
      return field_error(where, "nested deeper than " + std::to_string(kMaxYamlDepth) +
                                    " levels (the limit) at " + line_of(n));
    }
    const std::string& tag = n.Tag();
    if (!tag.empty() && tag != "?" && tag != "!") {
      return field_error(where, "YAML tag '" + tag + "' at " + line_of(n) +
                                    " is not supported (kvsplit configs use no tags)");
    }
    if (n.IsSequence()) {
      for (size_t i = 0; i < n.size(); ++i) {
        KVSPLIT_RETURN_IF_ERROR(check(n[i], path + "[" + std::to_string(i) + "]", depth + 1));
      }
    } else if (n.IsMap()) {
      std::map<std::string, YAML::Mark> keys;
      for (const auto& kv : n) {
        if (!kv.first.IsScalar()) {
          return field_error(where, "mapping key at " + line_of(kv.first) + " is not a scalar");
        }
        const std::string& key = kv.first.Scalar();
        const std::string child = join(path, key);
        const auto [it, fresh] = keys.emplace(key, kv.first.Mark());
        if (!fresh) {
          return field_error(child, "duplicate key (lines " + std::to_string(it->second.line + 1) +
                                        " and " + std::to_string(kv.first.Mark().line + 1) + ")");
        }
        KVSPLIT_RETURN_IF_ERROR(check(kv.first, child, depth + 1));
        KVSPLIT_RETURN_IF_ERROR(check(kv.second, child, depth + 1));
      }
    }
    return ok_status();
  }
};

// Counts the documents of a YAML text (stopping at two) without building nodes. yaml-cpp 0.7's
// LoadAll loops forever on some malformed inputs (e.g. "   ,"): the parser keeps reporting an empty
// document at the same position. A document that starts where the previous one started and holds
// no events is that stuck state, reported as a syntax error at that position.
class DocumentCounter final : public YAML::EventHandler {
 public:
  // Number of documents (0, 1 or 2 = "more than one"); the second's start in *second.
  static StatusOr<int> count(const std::string& text, YAML::Mark* second) {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentCounter h;
    int docs = 0;
    while (docs < 2 && parser.HandleNextDocument(h)) {
      const bool stuck = docs > 0 && h.events_ == 0 && h.start_.pos == h.prev_start_.pos;
      if (stuck) {
        return invalid_argument("YAML error at line " + std::to_string(h.start_.line + 1) +
                                ", column " + std::to_string(h.start_.column + 1) +
                                ": unexpected '" +
                                escape_for_message(text.substr(h.start_.pos, 1)) + "'");
      }
      if (++docs == 2) *second = h.start_;
    }
    return docs;
  }

  void OnDocumentStart(const YAML::Mark& mark) override {
    prev_start_ = start_;
    start_ = mark;
    events_ = 0;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}  // the stuck parser emits these
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { ++events_; }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    ++events_;
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    ++events_;
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    ++events_;
  }
  void OnMapEnd() override {}

 private:
  YAML::Mark start_ = YAML::Mark::null_mark();
  YAML::Mark prev_start_ = YAML::Mark::null_mark();
  int64_t events_ = 0;  // events other than nulls in the current document
};

}  // namespace

StatusOr<YAML::Node> load_strict_yaml(const std::string& text) {
  YAML::Mark second;
  KVSPLIT_ASSIGN_OR_RETURN(const int docs, DocumentCounter::count(text, &second));
  if (docs > 1) {
    return invalid_argument(
        "the file holds more than one YAML document (the second starts at line " +
        std::to_string(second.line + 1) + "); a config is exactly one document");
  }
  const YAML::Node root = docs == 0 ? YAML::Node() : YAML::Load(text);
  StrictWalk walk;
  KVSPLIT_RETURN_IF_ERROR(walk.check(root, "", 0));
  return root;
}

}  // namespace kvsplit::config
