// Strict flag values for the command-line binaries (kvsplit, kvsplit-server, kvsplit-client):
// strict_options applies to every option of an app and of its subcommands.
//  - Integers are read base 10. CLI11 (2.1) parses them with strtoll base 0 ("--max-tokens 010"
//    was 8, "--kv-blocks 0x20" 32, "08" refused as not a number) and saturates 64-bit values
//    ("--seed 99999999999999999999" was 2^63 - 1): leading zeros are dropped, anything but an
//    optional sign and digits is refused, and so is a value outside the 64-bit range of the
//    option's type (a sign on an unsigned option included; narrower types CLI11 checks itself).
//  - Floating-point values must be finite and within float's range (most such flags are float,
//    where CLI11 would turn 1e39 into infinity): CLI11's Range lets NaN through (every comparison
//    with it is false).
//  - A text option given an empty value is refused ("--host ''" would otherwise mean "not
//    given" and fall back to a default), except the names in `may_be_empty` and positionals.
// Each refusal names the flag and the value. kPositive and kNonNegative replace CLI11's
// PositiveNumber / NonNegativeNumber, whose message quotes DBL_MAX as the bound.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>

namespace kvsplit {
namespace cli_detail {

inline std::string check_decimal(std::string& s, bool is_unsigned) {
  const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  if (sign == s.size()) return "must be a decimal integer, got '" + s + "'";
  for (size_t k = sign; k < s.size(); ++k) {
    if (s[k] < '0' || s[k] > '9') return "must be a decimal integer, got '" + s + "'";
  }
  size_t z = sign;
  while (z + 1 < s.size() && s[z] == '0') ++z;
  s.erase(sign, z - sign);
  const char* first = s.data() + (s[0] == '+' ? 1 : 0);
  const char* last = s.data() + s.size();
  std::from_chars_result r;
  if (is_unsigned) {
    if (s[0] == '-' && s != "-0") return "must not be negative, got '" + s + "'";
    uint64_t v = 0;
    r = std::from_chars(s[0] == '-' ? last - 1 : first, last, v);
  } else {
    int64_t v = 0;
    r = std::from_chars(first, last, v);
  }
  if (r.ec == std::errc::result_out_of_range)
    return std::string("is out of range: '") + s + "' does not fit " +
           (is_unsigned ? "an unsigned " : "a signed ") + "64-bit integer";
  return {};
}

inline double parse_double(const std::string& s, std::string* error) {
  double v = 0;
  if (!CLI::detail::lexical_cast(s, v)) *error = "must be a number, got '" + s + "'";
  return v;
}

}  // namespace cli_detail

inline const CLI::Validator kPositive(
    [](std::string& s) -> std::string {
      std::string error;
      const double v = cli_detail::parse_double(s, &error);
      if (error.empty() && !(v > 0)) error = "must be > 0, got " + s;
      return error;
    },
    "POSITIVE");

inline const CLI::Validator kNonNegative(
    [](std::string& s) -> std::string {
      std::string error;
      const double v = cli_detail::parse_double(s, &error);
      if (error.empty() && !(v >= 0)) error = "must be >= 0, got " + s;
      return error;
    },
    "NONNEGATIVE");

// A --logit-bias value, "ID=BIAS" (a decimal token id, a finite bias): nullopt when malformed.
// Ranges (the vocabulary, [-100, 100]) are SamplingParams::validate's.
inline std::optional<std::pair<int32_t, float>> parse_logit_bias_entry(const std::string& s) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) return std::nullopt;
  std::string id = s.substr(0, eq);
  if (!cli_detail::check_decimal(id, false).empty()) return std::nullopt;
  int64_t v = 0;
  const auto r = std::from_chars(id.data() + (id[0] == '+' ? 1 : 0), id.data() + id.size(), v);
  if (r.ec != std::errc() || v < std::numeric_limits<int32_t>::min() ||
      v > std::numeric_limits<int32_t>::max())
    return std::nullopt;
  std::string error;
  const double bias = cli_detail::parse_double(s.substr(eq + 1), &error);
  if (!error.empty() || !(std::fabs(bias) <= std::numeric_limits<float>::max()))
    return std::nullopt;
  return std::pair<int32_t, float>(static_cast<int32_t>(v), static_cast<float>(bias));
}

inline const CLI::Validator kLogitBiasEntry(
    [](std::string& s) -> std::string {
      return parse_logit_bias_entry(s)
                 ? ""
                 : "must be ID=BIAS (a token id and a number), got '" + s + "'";
    },
    "ID=BIAS");

inline void strict_options(CLI::App& app, std::initializer_list<const char*> may_be_empty = {}) {
  const CLI::Validator decimal([](std::string& s) { return cli_detail::check_decimal(s, false); },
                               "");
  const CLI::Validator decimal_unsigned(
      [](std::string& s) { return cli_detail::check_decimal(s, true); }, "");
  const CLI::Validator finite(
      [](std::string& s) -> std::string {
        std::string error;
        const double v = cli_detail::parse_double(s, &error);
        if (error.empty() && !(std::fabs(v) <= std::numeric_limits<float>::max()))
          error = "must be a finite number (within float range), got '" + s + "'";
        return error;
      },
      "");
  const CLI::Validator non_empty(
      [](std::string& s) -> std::string { return s.empty() ? "must not be empty" : ""; }, "");
  for (CLI::Option* o : app.get_options()) {
    const std::string t = o->get_type_name();
    if (t.rfind("UINT", 0) == 0) {
      o->transform(decimal_unsigned);
    } else if (t.rfind("INT", 0) == 0) {
      o->transform(decimal);
    } else if (t.rfind("FLOAT", 0) == 0) {
      o->transform(finite);
    } else if (t.rfind("TEXT", 0) == 0 && !o->get_positional()) {
      bool exempt = false;
      for (const char* name : may_be_empty) exempt = exempt || o->check_name(name);
      if (!exempt) o->transform(non_empty);
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    strict_options(*sub, may_be_empty);
}

// The flags among `flags` given on `app`'s command line, comma-separated ("" when none): for a
// warning that they have no effect in the run they were given to. Such flags are accepted, not
// refused, so a script passing one set of flags to every variant of a run (1 shard and 4, full
// KV and the cuts) still runs, and the warning says what the run ignored.
inline std::string given_flags(const CLI::App& app, std::initializer_list<const char*> flags) {
  std::string out;
  for (const char* f : flags)
    if (app.count(f) > 0) out += (out.empty() ? "" : ", ") + std::string(f);
  return out;
}

// Parses the command line with kvsplit's exit codes. nullopt: parsed, go on. Otherwise the exit
// code to return from main: 0 after --help (its text printed), 2 after a bad flag or value (CLI11's
// message printed). CLI11_PARSE would return CLI11's own codes (104-109), which scripts do not
// read as a usage error.
inline std::optional<int> parse_args(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace kvsplit
