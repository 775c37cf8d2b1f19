#include "common/escape.h"

#include <algorithm>
#include <cstdint>

namespace kvsplit {
namespace {

// Length of the valid UTF-8 sequence starting at text[i] and its code point; 0 when invalid
// (bad lead byte, bad or missing continuation, overlong, surrogate, above U+10FFFF).
size_t utf8_sequence(std::string_view text, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  size_t len;
  uint32_t min;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, *cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, *cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, *cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (byte(i + k) & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return len;
}

bool is_control(uint32_t cp) {
  return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

void append_hex(std::string* out, unsigned char b) {
  constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[b >> 4]);
  out->push_back(kHex[b & 0xF]);
}

}  // namespace

std::string escape_for_message(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t len = utf8_sequence(text, i, &cp);
    const size_t step = len == 0 ? 1 : len;
    if (i + step > max_bytes) break;
    if (len == 0 || is_control(cp)) {
      for (size_t k = 0; k < step; ++k) append_hex(&out, static_cast<unsigned char>(text[i + k]));
    } else if (cp == '\\' || cp == '\'' || cp == '"') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else {
      out.append(text.substr(i, len));
    }
    i += step;
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace kvsplit
