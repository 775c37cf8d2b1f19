// json_regex.h's building blocks, and the regexes of choice and json_object constraints.
#include "sampling/json_regex.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "sampling/json_schema.h"

namespace kvsplit::sampling {
namespace json_rx {

std::string group(std::string_view rx) { return fmt::format("(?:{})", rx); }

// `atom` (one item or a group) repeated min..max times; max < 0: unbounded.
std::string repeat(std::string_view atom, int min, int max) {
  if (max == 0) return "";
  if (min == 1 && max == 1) return std::string(atom);
  if (max < 0) {
    if (min <= 1) return fmt::format("{}{}", atom, min == 0 ? "*" : "+");
    return fmt::format("{}{{{},}}", atom, min);
  }
  if (min == 0 && max == 1) return fmt::format("{}?", atom);
  if (min == max) return fmt::format("{}{{{}}}", atom, min);
  return fmt::format("{}{{{},{}}}", atom, min, max);
}

// Non-empty `alternatives`, as one alternation.
std::string alternation(const std::vector<std::string>& alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "(?:";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    if (i > 0) out += '|';
    out += alternatives[i];
  }
  return out + ")";
}

std::string separator() { return fmt::format(",{}", kWs); }

// The inside of a JSON array or object: min..max comma-separated `item`s (max < 0: unbounded).
std::string comma_list(std::string_view item, int min, int max) {
  if (max == 0) return "";
  const std::string rest =
      repeat(group(separator() + std::string(item)), std::max(min - 1, 0), max < 0 ? -1 : max - 1);
  const std::string list = std::string(item) + rest;
  return min == 0 ? group(list) + "?" : list;
}

std::string any_string_regex() { return fmt::format("\"{}*\"", kStringChar); }

std::string array_of(std::string_view inside) { return fmt::format("\\[{}\\]", inside); }

std::string object_of_values(std::string_view value) {
  return fmt::format("\\{{{}\\}}",
                     comma_list(fmt::format("{}:{}{}", any_string_regex(), kWs, value), 0, -1));
}

std::string number_regex() { return fmt::format("-?{}{}", kNatural, kFractionExponent); }

// Any JSON value whose containers nest at most `depth` levels (0: scalars only).
std::string any_value_regex(int depth) {
  std::vector<std::string> alternatives = {any_string_regex(), number_regex(), "true", "false",
                                           "null"};
  if (depth > 0) {
    const std::string inner = any_value_regex(depth - 1);
    alternatives.push_back(object_of_values(inner));
    alternatives.push_back(array_of(comma_list(inner, 0, -1)));
  }
  return alternation(alternatives);
}

// The inside of an object: `props` in order, each present or (unless required) absent, with the
// commas right for every combination. Each property's regex appears at most twice, so the size
// stays linear in the number of properties (alternating over the first present property, written
// out, is quadratic).
std::string properties_body(const std::vector<Property>& props) {
  if (props.empty()) return "";
  const std::string sep = separator();
  auto first_required =
      std::find_if(props.begin(), props.end(), [](const Property& p) { return p.required; });
  if (first_required != props.end()) {
    // Optional ones before the first required property carry their comma after, later ones before.
    std::string out;
    for (auto it = props.begin(); it != first_required; ++it) {
      out += group(it->key_value + sep) + "?";
    }
    out += first_required->key_value;
    for (auto it = first_required + 1; it != props.end(); ++it) {
      out += it->required ? sep + it->key_value : group(sep + it->key_value) + "?";
    }
    return out;
  }
  // All optional. A non-empty ordered subset of props[i..] is props[i] alone, or props[i] (present
  // or not) followed by a non-empty subset of props[i+1..]: each key_value twice, the tail once.
  std::string tail = props.back().key_value;
  for (size_t i = props.size() - 1; i-- > 0;) {
    const std::string& kv = props[i].key_value;
    tail = fmt::format("(?:{}|{}?{})", kv, group(kv + sep), tail);
  }
  return (props.size() == 1 ? group(tail) : tail) + "?";
}

}  // namespace json_rx

using json_rx::alternation;
using json_rx::group;

std::string regex_escape(std::string_view literal) {
  static constexpr std::string_view kMeta = "\\.*+?()[]{}|^$";
  static constexpr std::string_view kControls = "\n\t\r\f\v";
  static constexpr std::string_view kControlEscapes = "ntrfv";
  std::string out;
  out.reserve(literal.size());
  for (char c : literal) {
    const auto byte = static_cast<unsigned char>(c);
    if (const size_t i = kControls.find(c); i != std::string_view::npos) {
      out += '\\';
      out += kControlEscapes[i];
    } else if (byte < 0x20 || byte == 0x7F) {
      out += fmt::format("\\x{:02X}", byte);
    } else {
      if (kMeta.find(c) != std::string_view::npos) out += '\\';
      out += c;
    }
  }
  return out;
}

std::string choice_regex(const std::vector<std::string>& choices) {
  KVSPLIT_CHECK_MSG(!choices.empty(), "choice_regex: no choices");
  std::vector<std::string> escaped;
  escaped.reserve(choices.size());
  for (const std::string& choice : choices) escaped.push_back(regex_escape(choice));
  return escaped.size() == 1 ? group(escaped[0]) : alternation(escaped);
}

std::string json_object_regex(int max_depth) {
  KVSPLIT_CHECK_MSG(max_depth >= 1, "json_object_regex: max_depth must be >= 1");
  return json_rx::object_of_values(json_rx::any_value_regex(max_depth - 1));
}

}  // namespace kvsplit::sampling
