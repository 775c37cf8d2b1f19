// JSON schema -> regex. Each keyword either narrows the regex exactly or the schema is rejected:
// a constraint dropped silently would let the model produce output the schema rejects.
//
// Supported keywords:
//   type (a name, or an array of names: their alternation), enum, const, anyOf, oneOf (as anyOf: a
//   regex cannot say "exactly one"; schemas meant for generation use disjoint alternatives),
//   allOf with one schema, $ref ("#" + a JSON pointer into the root schema, usually
//   #/$defs/NAME or #/definitions/NAME; a recursive one becomes a rule, see json_schema_to_rules);
//   string: minLength, maxLength, pattern, format (date, time, date-time, uuid, email);
//   integer and number: minimum, maximum, exclusiveMinimum, exclusiveMaximum (see numeric_regex);
//   object: properties, required, additionalProperties (see object_regex);
//   array: items, prefixItems, minItems, maxItems (see array_regex).
// Ignored: the annotations title, description, $schema, $id, default, examples, $comment,
// deprecated, readOnly, writeOnly, and $defs / definitions (read through $ref only).
// Keywords of a type the schema's `type` excludes do not apply and are ignored, as in JSON schema.
// Without `type`, the types whose keywords appear are assumed (any value when there are none).
//
// The regex may accept less than the schema does (one JSON shape per value; see the header), never
// more, with two exceptions a regex over JSON text cannot avoid: a `pattern` is embedded as is, so
// a pattern whose '.' or class admits '"' or '\' can produce invalid JSON; and string lengths count
// JSON string units (a code point or one escape), so "\uD83D\uDE00" counts 2 against minLength.
#include "sampling/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "sampling/guide_regex.h"
#include "sampling/json_regex.h"

namespace kvsplit::sampling {
namespace {

// The regex building blocks (json_regex.h).
using json_rx::alternation;
using json_rx::any_value_regex;
using json_rx::array_of;
using json_rx::comma_list;
using json_rx::group;
using json_rx::kBoolean;
using json_rx::kDate;
using json_rx::kEmail;
using json_rx::kFractionExponent;
using json_rx::kNatural;
using json_rx::kPositive;
using json_rx::kStringChar;
using json_rx::kTime;
using json_rx::kUuid;
using json_rx::kWs;
using json_rx::object_of_values;
using json_rx::properties_body;
using json_rx::Property;
using json_rx::repeat;
using json_rx::separator;

// Ordered: properties are emitted in the order the schema declares them.
using Json = nlohmann::ordered_json;
// A converted (sub)schema. nullopt: it matches nothing; the enclosing schema drops that alternative
// (or optional property, or array item). A $ref no longer yields it (recursion became rules).
using Rx = std::optional<std::string>;

constexpr int kAnyValueDepth = 3;       // container levels of a value the schema leaves open
constexpr int kMaxSchemaNesting = 128;  // bounds the converter's recursion on hostile schemas
// Bounds the converter's work: $ref fan-out (definitions each referring to the next one twice, or
// each an anyOf of refs to all the others) expands exponentially, since a $ref that does not
// recur is written out where it is used (measured: 5 such definitions would take minutes). A real
// schema converts in a few hundred calls.
constexpr size_t kMaxConvertCalls = 100000;
constexpr int kMaxJsonNesting = 128;  // arrays / objects in the schema text (nlohmann recurses)
constexpr int kMaxCount = 1000;       // the largest {n,m} count the regex engine takes

enum class Family { kAnnotation, kCombinator, kType, kString, kNumber, kObject, kArray };

std::optional<Family> keyword_family(std::string_view keyword) {
  static const std::pair<Family, std::vector<std::string_view>> kFamilies[] = {
      {Family::kAnnotation,
       {"title", "description", "$schema", "$id", "default", "examples", "$comment", "deprecated",
        "readOnly", "writeOnly", "$defs", "definitions"}},
      {Family::kCombinator, {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"}},
      {Family::kType, {"type"}},
      {Family::kString, {"minLength", "maxLength", "pattern", "format"}},
      {Family::kNumber,
       {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
      {Family::kObject, {"properties", "required", "additionalProperties"}},
      {Family::kArray, {"items", "prefixItems", "minItems", "maxItems"}}};
  for (const auto& [family, keywords] : kFamilies) {
    if (std::find(keywords.begin(), keywords.end(), keyword) != keywords.end()) return family;
  }
  return std::nullopt;
}

// ---- JSON pointers and errors ----

std::string pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string child(const std::string& path, std::string_view key) {
  return path + "/" + pointer_token(key);
}

// The value at RFC 6901 `pointer` ("" or "/a/0/~1b") in `root`; nullptr when there is none.
const Json* resolve_pointer(const Json& root, std::string_view pointer) {
  if (pointer.empty()) return &root;
  if (pointer.front() != '/') return nullptr;
  const Json* node = &root;
  size_t start = 1;
  while (true) {
    const size_t end = std::min(pointer.find('/', start), pointer.size());
    std::string token;
    for (size_t i = start; i < end; ++i) {
      const bool escape = pointer[i] == '~' && i + 1 < end;
      token += escape ? (pointer[i + 1] == '1' ? '/' : '~') : pointer[i];
      i += escape ? 1 : 0;
    }
    if (node->is_object()) {
      auto it = node->find(token);
      if (it == node->end()) return nullptr;
      node = &*it;
    } else if (node->is_array() && !token.empty() &&
               std::all_of(token.begin(), token.end(),
                           [](char c) { return c >= '0' && c <= '9'; }) &&
               token.size() < 10 && std::stoul(token) < node->size()) {
      node = &(*node)[std::stoul(token)];
    } else {
      return nullptr;
    }
    if (end == pointer.size()) return node;
    start = end + 1;
  }
}

Status keyword_error(std::string_view keyword, const std::string& path, std::string_view what) {
  return invalid_argument(fmt::format("json_schema: keyword '{}' at {} {}", keyword, path, what));
}

Status unsupported(std::string_view keyword, const std::string& path, std::string_view why = "") {
  return keyword_error(
      keyword, child(path, keyword),
      why.empty() ? "is not supported" : fmt::format("is not supported ({})", why));
}

Status cannot_combine(std::string_view a, std::string_view b, const std::string& path) {
  return invalid_argument(
      fmt::format("json_schema: keywords '{}' and '{}' at {} cannot be combined", a, b, path));
}

const Json* find(const Json& schema, std::string_view keyword) {
  auto it = schema.find(std::string(keyword));
  return it == schema.end() ? nullptr : &*it;
}

std::string compact_dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// ---- keyword values ----

struct Bounds {
  int min = 0;
  int max = -1;  // unbounded
};

// `min_key` / `max_key` (each absent, or an integer 0..kMaxCount) of `schema`.
StatusOr<Bounds> count_bounds(const Json& schema, std::string_view min_key,
                              std::string_view max_key, const std::string& path) {
  Bounds bounds;
  for (std::string_view key : {min_key, max_key}) {
    const Json* value = find(schema, key);
    if (value == nullptr) continue;
    if (!value->is_number_integer() || *value < 0 || *value > kMaxCount) {
      return keyword_error(key, child(path, key),
                           fmt::format("must be an integer from 0 to {}", kMaxCount));
    }
    (key == min_key ? bounds.min : bounds.max) = value->get<int>();
  }
  if (bounds.max >= 0 && bounds.min > bounds.max) {
    return keyword_error(min_key, child(path, min_key), fmt::format("exceeds '{}'", max_key));
  }
  return bounds;
}

constexpr std::array<std::string_view, 7> kTypeNames = {"string", "integer", "number", "boolean",
                                                        "null",   "object",  "array"};

// The types `schema` allows: its `type`, else those whose keywords it has (empty: any value).
StatusOr<std::vector<std::string>> schema_types(const Json& schema, const std::string& path) {
  const Json* type = find(schema, "type");
  std::vector<std::string> types;
  if (type == nullptr) {
    const std::pair<Family, std::string_view> kInferred[] = {{Family::kObject, "object"},
                                                             {Family::kArray, "array"},
                                                             {Family::kString, "string"},
                                                             {Family::kNumber, "number"}};
    for (const auto& [family, name] : kInferred) {
      bool present = false;
      for (const auto& item : schema.items()) present |= keyword_family(item.key()) == family;
      if (present) types.emplace_back(name);
    }
    return types;
  }
  const Json names = type->is_array() ? *type : Json::array({*type});
  for (const Json& name : names) {
    const bool known =
        name.is_string() && std::find(kTypeNames.begin(), kTypeNames.end(),
                                      name.get_ref<const std::string&>()) != kTypeNames.end();
    if (!known) {
      return keyword_error("type", child(path, "type"),
                           "must be a type name (string, integer, number, boolean, null, object, "
                           "array) or a non-empty array of them");
    }
    types.push_back(name.get<std::string>());
  }
  if (types.empty()) return keyword_error("type", child(path, "type"), "must not be empty");
  return types;
}

bool has_type(const Json& value, std::string_view type) {
  if (type == "string") return value.is_string();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::isfinite(value.get<double>()) &&
            std::floor(value.get<double>()) == value.get<double>());
  }
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "object") return value.is_object();
  return value.is_array();
}

// ---- scalar types ----

std::optional<std::string> format_regex(std::string_view format) {
  if (format == "date") return std::string(kDate);
  if (format == "time") return std::string(kTime);
  if (format == "date-time") return fmt::format("{}T{}", kDate, kTime);
  if (format == "uuid") return std::string(kUuid);
  if (format == "email") return std::string(kEmail);
  return std::nullopt;
}

// A user pattern matched against the whole string: one leading '^' and trailing '$' go.
std::string strip_anchors(std::string pattern) {
  if (!pattern.empty() && pattern.front() == '^') pattern.erase(0, 1);
  size_t backslashes = 0;  // before a trailing '$': an odd count escapes it
  while (pattern.size() >= backslashes + 2 && pattern[pattern.size() - 2 - backslashes] == '\\') {
    ++backslashes;
  }
  if (!pattern.empty() && pattern.back() == '$' && backslashes % 2 == 0) pattern.pop_back();
  return pattern;
}

StatusOr<std::string> string_regex(const Json& schema, const std::string& path) {
  std::vector<std::string_view> used;  // at most one of format, pattern, lengths
  for (std::string_view key : {"format", "pattern", "minLength", "maxLength"}) {
    if (find(schema, key) != nullptr) used.push_back(key);
  }
  const bool lengths_only = used.size() == 2 && used[0] == "minLength";
  if (used.size() > 1 && !lengths_only) return cannot_combine(used[0], used[1], path);
  if (const Json* format = find(schema, "format")) {
    std::optional<std::string> rx;
    if (format->is_string()) rx = format_regex(format->get_ref<const std::string&>());
    if (!rx) {
      return unsupported(
          "format", path,
          fmt::format("{}; supported: date, time, date-time, uuid, email", compact_dump(*format)));
    }
    return fmt::format("\"{}\"", *rx);
  }
  if (const Json* pattern = find(schema, "pattern")) {
    if (!pattern->is_string())
      return keyword_error("pattern", child(path, "pattern"), "must be a string");
    std::string rx = strip_anchors(pattern->get<std::string>());
    // Checked alone: inside the string's group an unbalanced ')' would close it and let the
    // rest of the pattern match anything outside the JSON text.
    if (Status st = regex::compile_regex(rx).status(); !st.ok())
      return keyword_error("pattern", child(path, "pattern"), st.message());
    return fmt::format("\"(?:{})\"", rx);
  }
  KVSPLIT_ASSIGN_OR_RETURN(Bounds bounds, count_bounds(schema, "minLength", "maxLength", path));
  return fmt::format("\"{}\"", repeat(kStringChar, bounds.min, bounds.max));
}

// Numeric bounds: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, as draft 6 on;
// the tighter of two at one end wins), |bound| <= kMaxNumericBound. For an integer any finite bound
// is rounded inward (minimum 1.5 is 2); for a number a bound must be a whole value. multipleOf is
// refused, as is a range with nothing in it.
StatusOr<std::string> numeric_regex(std::string_view type, const Json& schema,
                                    const std::string& path) {
  const bool integer = type == "integer";
  std::optional<json_rx::NumericBound> lo;
  std::optional<json_rx::NumericBound> hi;
  for (const auto& item : schema.items()) {
    if (keyword_family(item.key()) != Family::kNumber) continue;
    const std::string& key = item.key();
    if (key == "multipleOf") return unsupported(key, path);
    const Json& value = item.value();
    if (!value.is_number()) {
      return keyword_error(key, child(path, key),
                           "must be a number (a boolean exclusiveMinimum / exclusiveMaximum is "
                           "draft 4, not supported)");
    }
    const double v = value.get<double>();
    if (!(std::fabs(v) <= static_cast<double>(json_rx::kMaxNumericBound))) {
      return unsupported(key, path,
                         fmt::format("bounds up to {} in magnitude", json_rx::kMaxNumericBound));
    }
    const bool lower = key == "minimum" || key == "exclusiveMinimum";
    const bool exclusive = key == "exclusiveMinimum" || key == "exclusiveMaximum";
    json_rx::NumericBound b;
    if (integer) {  // the nearest whole value inside, inclusive
      const double inside = lower ? (exclusive ? std::floor(v) + 1 : std::ceil(v))
                                  : (exclusive ? std::ceil(v) - 1 : std::floor(v));
      b = {static_cast<int64_t>(inside), false};
    } else {
      if (v != std::floor(v)) {
        return unsupported(key, path, "a number's bounds must be whole values");
      }
      b = {static_cast<int64_t>(v), exclusive};
    }
    auto tighter = [&](const json_rx::NumericBound& x, const json_rx::NumericBound& y) {
      if (x.value != y.value) return lower ? x.value > y.value : x.value < y.value;
      return x.exclusive && !y.exclusive;
    };
    std::optional<json_rx::NumericBound>& end = lower ? lo : hi;
    if (!end || tighter(b, *end)) end = b;
  }
  if (!lo && !hi) {
    return integer ? fmt::format("-?{}", kNatural) : json_rx::number_regex();
  }
  std::string rx = json_rx::numeric_range_regex(lo, hi, integer);
  if (rx.empty()) {
    return invalid_argument(fmt::format("json_schema: the bounds at {} leave no {} in range", path,
                                        integer ? "integer" : "number"));
  }
  return rx;
}

// `required` (absent: none): names that `props` (may be null) all declare.
StatusOr<std::vector<std::string>> required_names(const Json& schema, const Json* props,
                                                  const std::string& path) {
  const Json* required = find(schema, "required");
  std::vector<std::string> names;
  if (required == nullptr) return names;
  if (!required->is_array()) {
    return keyword_error("required", child(path, "required"), "must be an array of strings");
  }
  for (const Json& name : *required) {
    if (!name.is_string()) {
      return keyword_error("required", child(path, "required"), "must be an array of strings");
    }
    if (props == nullptr || !props->contains(name.get_ref<const std::string&>())) {
      return keyword_error(
          "required", child(path, "required"),
          fmt::format("names {}, which is not in 'properties'", compact_dump(name)));
    }
    names.push_back(name.get<std::string>());
  }
  return names;
}

// ---- the converter: schemas that contain schemas ----

class Converter {
 public:
  Converter(const Json& root, size_t max_bytes) : root_(root), max_bytes_(max_bytes) {}

  StatusOr<Rx> convert(const Json& schema, const std::string& path);
  // Rule r >= 1: the regex of a $ref target that refers to itself (directly or through others),
  // called as (?&r) wherever the target is referred to; [0] is left for the text's own regex.
  std::vector<std::string>& rules() { return rules_; }
  const std::vector<std::string>& rule_names() const { return rule_names_; }

 private:
  StatusOr<Rx> convert_keywords(const Json& schema, const std::string& path);
  StatusOr<Rx> combinator_regex(const Json& schema, std::string_view keyword,
                                const std::string& path);
  StatusOr<Rx> ref_regex(const Json& ref, const std::string& path);
  StatusOr<Rx> any_of_regex(const Json& schemas, const std::string& path);
  StatusOr<Rx> enum_regex(const Json& schema, std::string_view keyword, const std::string& path);
  StatusOr<Rx> typed_regex(const Json& schema, const std::string& path);
  StatusOr<Rx> type_regex(std::string_view type, const Json& schema, const std::string& path);
  StatusOr<Rx> object_regex(const Json& schema, const std::string& path);
  StatusOr<Rx> free_object_regex(const Json& schema, const std::string& path);
  StatusOr<Rx> array_regex(const Json& schema, const std::string& path);
  Status check_size(size_t bytes, const std::string& path) const;

  const Json& root_;
  size_t max_bytes_;
  int nesting_ = 0;                                  // convert() calls in progress
  size_t calls_ = 0;                                 // convert() calls in all
  std::unordered_map<std::string, int> expansions_;  // $ref target -> expansions in progress
  std::unordered_map<std::string, int> rule_of_;     // recursive $ref target -> its rule
  std::vector<std::string> rules_{""};
  std::vector<std::string> rule_names_{"#"};
};

Status Converter::check_size(size_t bytes, const std::string& path) const {
  if (bytes <= max_bytes_) return ok_status();
  return invalid_argument(fmt::format(
      "json_schema: the regex would be larger than max_regex_bytes ({}) at {}", max_bytes_, path));
}

StatusOr<Rx> Converter::convert(const Json& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return Rx(any_value_regex(kAnyValueDepth));
    return invalid_argument(
        fmt::format("json_schema: schema at {} is false (matches nothing)", path));
  }
  if (!schema.is_object()) {
    return invalid_argument(
        fmt::format("json_schema: schema at {} must be an object or a boolean", path));
  }
  if (++calls_ > kMaxConvertCalls) {
    return invalid_argument(fmt::format(
        "json_schema: too complex to convert (more than {} sub-schemas expanded; $ref fan-out?) "
        "at {}",
        kMaxConvertCalls, path));
  }
  if (nesting_ >= kMaxSchemaNesting) {
    return invalid_argument(fmt::format("json_schema: schema at {} nests more than {} levels deep",
                                        path, kMaxSchemaNesting));
  }
  ++nesting_;
  StatusOr<Rx> rx = convert_keywords(schema, path);
  --nesting_;
  if (rx.ok() && rx->has_value()) KVSPLIT_RETURN_IF_ERROR(check_size((*rx)->size(), path));
  return rx;
}

// At most one combinator ($ref, anyOf, oneOf, allOf, enum, const), alone (enum / const: with
// `type`), or else type keywords: a regex cannot intersect two constraints.
StatusOr<Rx> Converter::convert_keywords(const Json& schema, const std::string& path) {
  std::vector<std::string> combinators, typed;
  for (const auto& item : schema.items()) {
    const std::optional<Family> family = keyword_family(item.key());
    if (!family) return unsupported(item.key(), path);
    if (*family == Family::kCombinator) {
      combinators.push_back(item.key());
    } else if (*family != Family::kAnnotation) {
      typed.push_back(item.key());
    }
  }
  if (combinators.empty()) return typed_regex(schema, path);
  if (combinators.size() > 1) return cannot_combine(combinators[0], combinators[1], path);
  const std::string& combinator = combinators[0];
  const bool enum_like = combinator == "enum" || combinator == "const";
  for (const std::string& key : typed) {
    if (!(enum_like && key == "type")) return cannot_combine(combinator, key, path);
  }
  return combinator_regex(schema, combinator, path);
}

StatusOr<Rx> Converter::combinator_regex(const Json& schema, std::string_view keyword,
                                         const std::string& path) {
  const Json& value = *find(schema, keyword);
  const std::string value_path = child(path, keyword);
  if (keyword == "$ref") return ref_regex(value, path);
  // oneOf is treated as anyOf: "exactly one" is not a regular constraint over alternatives.
  if (keyword == "anyOf" || keyword == "oneOf") {
    if (!value.is_array() || value.empty()) {
      return keyword_error(keyword, value_path, "must be a non-empty array of schemas");
    }
    return any_of_regex(value, value_path);
  }
  if (keyword == "allOf") {
    if (!value.is_array() || value.size() != 1)
      return unsupported("allOf", path, "only one schema");
    return convert(value[0], child(value_path, "0"));
  }
  return enum_regex(schema, keyword, path);
}

StatusOr<Rx> Converter::ref_regex(const Json& ref, const std::string& path) {
  const std::string ref_path = child(path, "$ref");
  if (!ref.is_string() || ref.get_ref<const std::string&>().rfind('#', 0) != 0) {
    return keyword_error("$ref", ref_path,
                         "must be '#' followed by a JSON pointer into this schema, e.g. "
                         "#/$defs/NAME");
  }
  const std::string& target_path = ref.get_ref<const std::string&>();
  const Json* target = resolve_pointer(root_, std::string_view(target_path).substr(1));
  if (target == nullptr) {
    return keyword_error("$ref", ref_path, fmt::format("'{}' does not resolve", target_path));
  }
  // A target met again inside its own expansion becomes a rule, called where it recurs; once it
  // is a rule, every other reference calls it too (its regex is written once).
  auto call = [](int r) { return Rx(fmt::format("(?&{})", r)); };
  if (auto it = rule_of_.find(target_path); it != rule_of_.end()) return call(it->second);
  if (expansions_[target_path] > 0) {
    const auto r = static_cast<int>(rules_.size());
    rules_.emplace_back();
    rule_names_.push_back(target_path);
    rule_of_.emplace(target_path, r);
    return call(r);
  }
  ++expansions_[target_path];
  StatusOr<Rx> rx = convert(*target, target_path);
  --expansions_[target_path];
  if (!rx.ok() || !rx->has_value()) return rx;
  if (auto it = rule_of_.find(target_path); it != rule_of_.end()) {
    rules_[static_cast<size_t>(it->second)] = std::move(**rx);
    return call(it->second);
  }
  return rx;
}

// `schemas`: a non-empty array.
StatusOr<Rx> Converter::any_of_regex(const Json& schemas, const std::string& path) {
  std::vector<std::string> alternatives;
  size_t bytes = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    KVSPLIT_ASSIGN_OR_RETURN(Rx rx, convert(schemas[i], child(path, std::to_string(i))));
    if (!rx) continue;
    bytes += rx->size() + 1;
    KVSPLIT_RETURN_IF_ERROR(check_size(bytes, path));
    alternatives.push_back(std::move(*rx));
  }
  if (alternatives.empty()) return Rx();
  return Rx(alternation(alternatives));
}

// Each value serialized compactly (an object's keys in the given order).
StatusOr<Rx> Converter::enum_regex(const Json& schema, std::string_view keyword,
                                   const std::string& path) {
  const Json& value = *find(schema, keyword);
  if (keyword == "enum" && (!value.is_array() || value.empty())) {
    return keyword_error("enum", child(path, "enum"), "must be a non-empty array");
  }
  const Json values = keyword == "enum" ? value : Json::array({value});
  std::vector<std::string> types;
  if (find(schema, "type") != nullptr) {
    KVSPLIT_ASSIGN_OR_RETURN(types, schema_types(schema, path));
  }
  std::vector<std::string> literals;
  for (const Json& v : values) {
    const bool typed =
        types.empty() || std::any_of(types.begin(), types.end(),
                                     [&](const std::string& t) { return has_type(v, t); });
    if (typed) literals.push_back(compact_dump(v));
  }
  if (literals.empty()) {
    return keyword_error(keyword, child(path, keyword), "has no value of the schema's 'type'");
  }
  return Rx(literals.size() == 1 ? regex_escape(literals[0]) : choice_regex(literals));
}

StatusOr<Rx> Converter::typed_regex(const Json& schema, const std::string& path) {
  KVSPLIT_ASSIGN_OR_RETURN(std::vector<std::string> types, schema_types(schema, path));
  if (types.empty()) return Rx(any_value_regex(kAnyValueDepth));
  std::vector<std::string> alternatives;
  for (const std::string& type : types) {
    KVSPLIT_ASSIGN_OR_RETURN(Rx rx, type_regex(type, schema, path));
    if (rx) alternatives.push_back(std::move(*rx));
  }
  if (alternatives.empty()) return Rx();
  return Rx(alternation(alternatives));
}

StatusOr<Rx> Converter::type_regex(std::string_view type, const Json& schema,
                                   const std::string& path) {
  if (type == "string" || type == "integer" || type == "number") {
    KVSPLIT_ASSIGN_OR_RETURN(std::string rx, type == "string" ? string_regex(schema, path)
                                                              : numeric_regex(type, schema, path));
    return Rx(std::move(rx));
  }
  if (type == "boolean") return Rx(std::string(kBoolean));
  if (type == "null") return Rx("null");
  if (type == "object") return object_regex(schema, path);
  return array_regex(schema, path);
}

// With `properties`: exactly those keys, in declaration order; `required` ones always present.
// additionalProperties must be false or absent (absent is read as false, as outlines does: a model
// asked for an object of given properties should not invent others). Without `properties`, a
// free-form object (free_object_regex).
StatusOr<Rx> Converter::object_regex(const Json& schema, const std::string& path) {
  const Json* props = find(schema, "properties");
  if (props != nullptr && !props->is_object()) {
    return keyword_error("properties", child(path, "properties"), "must be an object");
  }
  KVSPLIT_ASSIGN_OR_RETURN(std::vector<std::string> required, required_names(schema, props, path));
  if (props == nullptr || props->empty()) return free_object_regex(schema, path);
  const Json* extra = find(schema, "additionalProperties");
  if (extra != nullptr && *extra != false) {
    return unsupported("additionalProperties", path, "only false, when 'properties' is given");
  }
  std::vector<Property> list;
  size_t bytes = 0;
  const std::string props_path = child(path, "properties");
  for (const auto& item : props->items()) {
    KVSPLIT_ASSIGN_OR_RETURN(Rx value, convert(item.value(), child(props_path, item.key())));
    const bool is_required =
        std::find(required.begin(), required.end(), item.key()) != required.end();
    if (!value) {
      if (is_required) return Rx();
      continue;  // an optional property whose recursion was cut off stays absent
    }
    Property p{fmt::format("{}:{}{}", regex_escape(compact_dump(item.key())), kWs, *value),
               is_required};
    bytes += 2 * p.key_value.size() + 16;
    KVSPLIT_RETURN_IF_ERROR(check_size(bytes, path));
    list.push_back(std::move(p));
  }
  return Rx(fmt::format("\\{{{}\\}}", properties_body(list)));
}

// Any keys; values of additionalProperties (absent or true: any value, false: none).
StatusOr<Rx> Converter::free_object_regex(const Json& schema, const std::string& path) {
  const Json* extra = find(schema, "additionalProperties");
  Rx value;
  if (extra == nullptr || *extra == true) {
    value = any_value_regex(kAnyValueDepth - 1);
  } else if (*extra != false) {
    KVSPLIT_ASSIGN_OR_RETURN(value, convert(*extra, child(path, "additionalProperties")));
  }
  return Rx(value ? object_of_values(*value) : "\\{\\}");
}

// items: the schema of every item, or of those after prefixItems. prefixItems: a tuple, emitted
// in full (up to maxItems); with prefixItems, absent items is read as false (no items beyond the
// tuple). The draft-04 tuple form (items: [...]) is rejected.
StatusOr<Rx> Converter::array_regex(const Json& schema, const std::string& path) {
  KVSPLIT_ASSIGN_OR_RETURN(Bounds bounds, count_bounds(schema, "minItems", "maxItems", path));
  const Json* prefix = find(schema, "prefixItems");
  const Json* items = find(schema, "items");
  if (prefix != nullptr && !prefix->is_array()) {
    return keyword_error("prefixItems", child(path, "prefixItems"), "must be an array of schemas");
  }
  if (items != nullptr && items->is_array())
    return unsupported("items", path, "use prefixItems for tuples");
  const bool has_prefix = prefix != nullptr && !prefix->empty();
  std::vector<std::string> tuple;
  size_t tuple_bytes = 0;
  const size_t tuple_size = has_prefix ? prefix->size() : 0;
  for (size_t i = 0; i < tuple_size && (bounds.max < 0 || static_cast<int>(i) < bounds.max); ++i) {
    KVSPLIT_ASSIGN_OR_RETURN(
        Rx rx, convert((*prefix)[i], child(child(path, "prefixItems"), std::to_string(i))));
    if (!rx) return Rx();
    tuple_bytes += rx->size();
    KVSPLIT_RETURN_IF_ERROR(check_size(tuple_bytes, path));
    tuple.push_back(std::move(*rx));
  }
  const int used = static_cast<int>(tuple.size());
  Bounds extra{std::max(bounds.min - used, 0), bounds.max < 0 ? -1 : bounds.max - used};
  Rx item;
  if (items == nullptr && !has_prefix) {
    item = any_value_regex(kAnyValueDepth - 1);
  } else if (items != nullptr && *items != false) {
    KVSPLIT_ASSIGN_OR_RETURN(item, convert(*items, child(path, "items")));
    if (!item && extra.min > 0) return Rx();
  }
  if (!item) {
    if (extra.min > 0) {
      return keyword_error("minItems", child(path, "minItems"),
                           "asks for more items than prefixItems / items allow");
    }
    extra.max = 0;
  }
  if (tuple.empty()) return Rx(array_of(comma_list(item.value_or(""), extra.min, extra.max)));
  std::string inside = tuple[0];
  for (size_t i = 1; i < tuple.size(); ++i) inside += separator() + tuple[i];
  if (item) inside += repeat(group(separator() + *item), extra.min, extra.max);
  return Rx(array_of(inside));
}

}  // namespace

namespace {

// nlohmann copies and dumps values recursively: a deep `const` would overflow a small thread
// stack. Brackets outside strings are counted before parsing.
Status check_json_nesting(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonNesting) {
        return invalid_argument(
            fmt::format("json_schema: arrays and objects nest more than {} deep at byte {}",
                        kMaxJsonNesting, i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return ok_status();
}

}  // namespace

StatusOr<SchemaRegexes> json_schema_to_rules(std::string_view schema, size_t max_regex_bytes) {
  KVSPLIT_RETURN_IF_ERROR(check_json_nesting(schema));
  Json root;
  try {
    root = Json::parse(schema);
  } catch (const Json::exception& e) {  // a syntax error, or a number out of double's range
    return invalid_argument(fmt::format("json_schema: malformed JSON: {}", e.what()));
  }
  Converter converter(root, max_regex_bytes);
  KVSPLIT_ASSIGN_OR_RETURN(Rx rx, converter.convert(root, "#"));
  KVSPLIT_CHECK(rx.has_value());  // only a cut $ref matched nothing, and none is cut
  SchemaRegexes out;
  out.rules = std::move(converter.rules());
  out.rules[0] = std::move(*rx);
  out.names = converter.rule_names();
  size_t bytes = 0;
  for (const std::string& r : out.rules) bytes += r.size();
  if (bytes > max_regex_bytes) {
    return invalid_argument(fmt::format(
        "json_schema: the regex would be larger than max_regex_bytes ({})", max_regex_bytes));
  }
  return out;
}

StatusOr<std::string> json_schema_to_regex(std::string_view schema, size_t max_regex_bytes) {
  KVSPLIT_ASSIGN_OR_RETURN(SchemaRegexes rx, json_schema_to_rules(schema, max_regex_bytes));
  if (rx.rules.size() > 1) {
    return invalid_argument(fmt::format(
        "json_schema: $ref '{}' is recursive: its language is not regular (json_schema_to_rules)",
        rx.names[1]));
  }
  return std::move(rx.rules[0]);
}

}  // namespace kvsplit::sampling
