// nlohmann::json adapter: parse errors and field type errors become Status values naming the
// source ("…/config.json") and the field. No exception leaves these helpers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/escape.h"
#include "common/file_read.h"
#include "kvsplit/status.h"

namespace kvsplit::common {

using Json = nlohmann::json;

// Deepest nesting of arrays and objects any JSON input may have: the parser builds every level
// (about 90 bytes each), so a file of '[' would take ~90x its size in memory. serde_json, which HF
// tokenizers and safetensors parse with, stops at 128 as well.
inline constexpr int kMaxJsonDepth = 128;

// Whether `text`'s arrays and objects nest at most `limit` deep (brackets inside strings do not
// count). A linear scan, run before the parser allocates anything.
inline bool json_depth_within(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// Parses `text`; `what` names the source in errors: "<what>: bad JSON: <parser message>". A key
// given twice in one object is refused ("<what>: duplicate key 'k'"): the parser would keep the
// last silently (two safetensors entries for one tensor, two arrival times in a trace line).
// Without `what` the message starts at "bad JSON" / "duplicate key".
inline StatusOr<Json> parse_json(std::string_view text, const std::string& what) {
  const std::string prefix = what.empty() ? std::string() : what + ": ";
  // The parser takes a NUL byte for the end of the input and accepted what came after it unread
  // ("{...}\0junk"); JSON text has no place for one (a string escapes it as \u0000).
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return invalid_argument(prefix + "bad JSON: a NUL byte at offset " + std::to_string(nul));
  if (!json_depth_within(text, kMaxJsonDepth)) {
    return invalid_argument(prefix + "bad JSON: nested deeper than " +
                            std::to_string(kMaxJsonDepth) + " levels");
  }
  std::vector<std::set<std::string>> keys;  // one set per object being read
  std::string duplicate;
  bool found = false;
  auto check = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == Json::parse_event_t::key && !found &&
               !keys.back().insert(parsed.get<std::string>()).second) {
      found = true;
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), check);
    if (found)
      return invalid_argument(prefix + "duplicate key '" + escape_for_message(duplicate) + "'");
    return j;
  } catch (const Json::exception& e) {
    return invalid_argument(prefix + "bad JSON: " + e.what());
  }
}

// Reads and parses a JSON side file (config.json, an index, generation_config.json...): a regular
// file of at most `max_bytes` (common::read_regular_file's errors; kNotFound when missing).
inline StatusOr<Json> read_json_file(const std::string& path,
                                     size_t max_bytes = kMaxJsonSideFileBytes) {
  KVSPLIT_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, max_bytes, "JSON file"));
  return parse_json(text, path);
}

// `obj[key]` as an integer in [lo, hi]. Absent or null: `fallback`, or an error when none.
inline StatusOr<int64_t> json_int(const Json& obj, const char* key, std::optional<int64_t> fallback,
                                  const std::string& what,
                                  int64_t lo = std::numeric_limits<int64_t>::min(),
                                  int64_t hi = std::numeric_limits<int64_t>::max()) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_argument(what + ": missing field '" + key + "'");
  }
  if (!it->is_number_integer()) {
    return invalid_argument(what + ": field '" + key + "' must be an integer, got " + it->dump());
  }
  int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)
                  ? INT64_MAX
                  : it->get<int64_t>();
  if (v < lo || v > hi) {
    return invalid_argument(what + ": field '" + key + "' = " + std::to_string(v) +
                            " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "]");
  }
  return v;
}

// `obj[key]` as a number (integer or float). Absent or null: `fallback`, or an error when none.
inline StatusOr<double> json_number(const Json& obj, const char* key,
                                    std::optional<double> fallback, const std::string& what) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_argument(what + ": missing field '" + key + "'");
  }
  if (!it->is_number()) {
    return invalid_argument(what + ": field '" + key + "' must be a number, got " + it->dump());
  }
  return it->get<double>();
}

// `v` (a field read as a double) as a float: an error naming `field` when it is outside float's
// finite range (the conversion is undefined behaviour there, and the value is meaningless).
inline StatusOr<float> to_float_field(double v, const std::string& field, const std::string& what) {
  if (std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.10g", v);
    return invalid_argument(what + ": " + field + " = " + text +
                            " is outside the range of a float");
  }
  return static_cast<float>(v);
}

// `obj[key]` as a bool. Absent or null: `fallback`.
inline StatusOr<bool> json_bool(const Json& obj, const char* key, bool fallback,
                                const std::string& what) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return invalid_argument(what + ": field '" + key + "' must be true or false, got " +
                            it->dump());
  }
  return it->get<bool>();
}

// `obj[key]` as a string. Absent or null: `fallback`, or an error when none.
inline StatusOr<std::string> json_string(const Json& obj, const char* key,
                                         std::optional<std::string> fallback,
                                         const std::string& what) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_argument(what + ": missing field '" + key + "'");
  }
  if (!it->is_string()) {
    return invalid_argument(what + ": field '" + key + "' must be a string, got " + it->dump());
  }
  return it->get<std::string>();
}

}  // namespace kvsplit::common
