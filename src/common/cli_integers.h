// Decimal integer flags for the command-line binaries. CLI11 (2.1) parses integers with strtoll
// base 0: "--max-tokens 010" was 8, "--kv-blocks 0x20" 32, and "--max-tokens 08" was refused as
// not a number. decimal_integer_options makes every integer option of an app (and of its
// subcommands) read base 10: leading zeros are dropped and anything but an optional sign and
// digits is refused naming the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace kvsplit {

inline void decimal_integer_options(CLI::App& app) {
  const CLI::Validator decimal(
      [](std::string& s) -> std::string {
        const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
        if (sign == s.size()) return "must be a decimal integer, got '" + s + "'";
        for (size_t k = sign; k < s.size(); ++k) {
          if (s[k] < '0' || s[k] > '9') return "must be a decimal integer, got '" + s + "'";
        }
        size_t z = sign;
        while (z + 1 < s.size() && s[z] == '0') ++z;
        s.erase(sign, z - sign);
        return {};
      },
      "");
  for (CLI::Option* o : app.get_options()) {
    const std::string t = o->get_type_name();
    if (t.rfind("INT", 0) == 0 || t.rfind("UINT", 0) == 0) o->transform(decimal);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    decimal_integer_options(*sub);
}

}  // namespace kvsplit
