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

namespace {

// The digits of the whole numbers in [lo, hi] (0 <= lo <= hi, both with `digits` digits, no
// leading zero unless the number is 0): a prefix tree of digit ranges.
std::string same_length_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return "";
  if (lo[0] == hi[0]) return lo.substr(0, 1) + same_length_range(lo.substr(1), hi.substr(1));
  const std::string lo_rest = lo.substr(1);
  const std::string hi_rest = hi.substr(1);
  const size_t n = lo_rest.size();
  auto digits = [](char a, char b) {
    return a == b ? std::string(1, a) : fmt::format("[{}-{}]", a, b);
  };
  auto any = [](size_t k) {
    return k == 0 ? std::string() : k == 1 ? std::string("[0-9]") : fmt::format("[0-9]{{{}}}", k);
  };
  // A digit, then the rest (alternation() groups what it joins, so nothing else is needed).
  auto after = [](char d, const std::string& rest) { return std::string(1, d) + rest; };
  std::vector<std::string> alts;
  char first = lo[0];
  if (lo_rest.find_first_not_of('0') != std::string::npos) {  // lo's first digit, partly
    alts.push_back(after(lo[0], same_length_range(lo_rest, std::string(n, '9'))));
    ++first;
  }
  char last = hi[0];
  const bool hi_partial = hi_rest.find_first_not_of('9') != std::string::npos;
  if (hi_partial) --last;
  if (first <= last) alts.push_back(digits(first, last) + any(n));
  if (hi_partial) alts.push_back(after(hi[0], same_length_range(std::string(n, '0'), hi_rest)));
  return alternation(alts);
}

// The whole numbers in [lo, hi] (0 <= lo; hi < 0: unbounded), "" when none.
std::string natural_range(int64_t lo, int64_t hi) {
  if (hi >= 0 && lo > hi) return "";
  std::vector<std::string> alts;
  int64_t low = lo;
  int64_t top = 9;  // the largest number of `digits` digits
  for (size_t digits = 1; digits <= 19; ++digits, top = top * 10 + 9) {
    if (low > top) continue;
    const int64_t high = hi >= 0 ? std::min(hi, top) : top;
    alts.push_back(same_length_range(std::to_string(low), std::to_string(high)));
    if (hi >= 0 && hi <= top) break;
    if (hi < 0) {  // every number with more digits
      alts.push_back(fmt::format("[1-9][0-9]{{{},}}", digits));
      break;
    }
    low = top + 1;
  }
  return alts.empty() ? "" : alternation(alts);
}

constexpr std::string_view kFraction = R"re((?:\.[0-9]+)?)re";
constexpr std::string_view kZeroFraction = R"re((?:\.0+)?)re";
constexpr std::string_view kNonZeroFraction = R"re(\.[0-9]*[1-9][0-9]*)re";

// Magnitudes m >= 0 (a number's digits, without its sign) with a <= m (a.exclusive: a < m) and,
// with b, m <= b (b->exclusive: m < b); a.value >= 0. "" when none.
std::string magnitude_range(NumericBound a, std::optional<NumericBound> b, bool integer) {
  if (integer) {
    const int64_t lo = a.value + (a.exclusive ? 1 : 0);
    const int64_t hi = !b ? -1 : b->value - (b->exclusive ? 1 : 0);
    if (b && hi < lo) return "";
    return natural_range(lo, hi);
  }
  if (!b && a.value == 0 && !a.exclusive) return fmt::format("{}{}", kNatural, kFractionExponent);
  if (b && (b->value < a.value || (b->value == a.value && (a.exclusive || b->exclusive))))
    return "";
  std::vector<std::string> alts;
  // Integer part in [a', b - 1] (or unbounded): any fraction keeps m in range.
  const int64_t first = a.value + (a.exclusive ? 1 : 0);
  const std::string free = natural_range(first, b ? b->value - 1 : -1);
  if (!free.empty()) alts.push_back(group(free) + std::string(kFraction));
  // a < m with integer part a: a fraction that is not all zeros.
  if (a.exclusive && (!b || b->value > a.value))
    alts.push_back(std::to_string(a.value) + std::string(kNonZeroFraction));
  // m <= b with integer part b: b itself, maybe with zeros after the point.
  if (b && !b->exclusive && (b->value > a.value || !a.exclusive))
    alts.push_back(std::to_string(b->value) + std::string(kZeroFraction));
  return alts.empty() ? "" : alternation(alts);
}

}  // namespace

std::string numeric_range_regex(std::optional<NumericBound> lo, std::optional<NumericBound> hi,
                                bool integer) {
  std::vector<std::string> alts;
  // x >= 0: magnitudes from max(lo, 0) to hi.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const NumericBound from = lo && lo->value >= 0 ? *lo : NumericBound{0, false};
    if (std::string m = magnitude_range(from, hi, integer); !m.empty()) alts.push_back(m);
  }
  // x < 0: magnitudes above max(-hi, 0) (0 itself out) up to -lo.
  if (!lo || lo->value < 0) {
    const NumericBound from =
        hi && hi->value < 0 ? NumericBound{-hi->value, hi->exclusive} : NumericBound{0, true};
    const std::optional<NumericBound> to =
        lo ? std::optional<NumericBound>(NumericBound{-lo->value, lo->exclusive}) : std::nullopt;
    if (std::string m = magnitude_range(from, to, integer); !m.empty())
      alts.push_back("-" + group(m));
  }
  return alts.empty() ? "" : alternation(alts);
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
