// The regex building blocks of json_schema.cpp (and of choice / json_object constraints): JSON
// lexemes and the combinators every schema keyword is written with. Each result can be
// concatenated (alternations are grouped). Internal to the sampling module.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvsplit::sampling::json_rx {

inline constexpr std::string_view kWs = "[ ]?";  // after each ',' and ':', nowhere else
// One unit of a JSON string: a code point other than '"', '\' and controls, or an escape.
inline constexpr std::string_view kStringChar =
    R"re((?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}))re";
inline constexpr std::string_view kNatural = "(?:0|[1-9][0-9]*)";
inline constexpr std::string_view kPositive = "[1-9][0-9]*";
inline constexpr std::string_view kFractionExponent = R"re((?:\.[0-9]+)?(?:[eE][+\-]?[0-9]+)?)re";
inline constexpr std::string_view kBoolean = "(?:true|false)";

inline constexpr std::string_view kDate = "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])";
// RFC 3339 full-time: the UTC offset is required.
inline constexpr std::string_view kTime =
    R"re((?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]+)?(?:Z|[+\-](?:[01][0-9]|2[0-3]):[0-5][0-9]))re";
inline constexpr std::string_view kUuid =
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
// Dot-separated atoms @ a domain of at least two labels (no quoted local parts, no IP literals).
inline constexpr std::string_view kEmail =
    R"re([a-zA-Z0-9_%+\-]+(?:\.[a-zA-Z0-9_%+\-]+)*@[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)+)re";

std::string group(std::string_view rx);
// `atom` (one item or a group) repeated min..max times; max < 0: unbounded.
std::string repeat(std::string_view atom, int min, int max);
// Non-empty `alternatives`, as one alternation.
std::string alternation(const std::vector<std::string>& alternatives);
std::string separator();  // ',' then the whitespace kWs allows
// The inside of a JSON array or object: min..max comma-separated `item`s (max < 0: unbounded).
std::string comma_list(std::string_view item, int min, int max);
std::string any_string_regex();
std::string array_of(std::string_view inside);
std::string object_of_values(std::string_view value);
std::string number_regex();
// Any JSON value whose containers nest at most `depth` levels (0: scalars only).
std::string any_value_regex(int depth);

// One end of a numeric range: an integer value, and whether the end itself is out.
struct NumericBound {
  int64_t value = 0;
  bool exclusive = false;
};
inline constexpr int64_t kMaxNumericBound = 1'000'000'000'000'000;  // 10^15, |bound| at most
// The JSON numbers x with lo <= x <= hi (each end absent: unbounded; exclusive: < instead of <=),
// as a regex. integer: whole numbers only (-?(0|[1-9][0-9]*)); otherwise numbers with an optional
// fraction, and an exponent only where the range is all numbers >= 0 or all numbers (a bounded
// range is written without one: every number has such a spelling). "-0" is never produced. An
// empty range gives "" (the caller refuses it). |values| <= kMaxNumericBound.
std::string numeric_range_regex(std::optional<NumericBound> lo, std::optional<NumericBound> hi,
                                bool integer);

struct Property {
  std::string key_value;  // "name":[ ]?VALUE
  bool required = false;
};
// The inside of an object: `props` in order, each present or (unless required) absent, with the
// commas right for every combination, in size linear in the number of properties.
std::string properties_body(const std::vector<Property>& props);

}  // namespace kvsplit::sampling::json_rx
