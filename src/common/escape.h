// Escaping of user-supplied text echoed in errors and logs: printable ASCII stays, everything else
// (control bytes, NUL, ESC, DEL, any byte >= 0x80) becomes \xNN, backslash and quote are
// escaped, and the result is capped so a huge value cannot flood a message.
#pragma once

#include <string>
#include <string_view>

namespace kvsplit::common {

// At most `max_bytes` input bytes are shown; a longer input ends in "...(N bytes)".
inline std::string escape_for_message(std::string_view s, size_t max_bytes = 128) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t shown = s.size() < max_bytes ? s.size() : max_bytes;
  out.reserve(shown + 8);
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\\' || c == '\'' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (shown < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace kvsplit::common
