#include "common/escape.h"

#include <algorithm>
#include <cstdint>

#include "common/utf8.h"

namespace kvsplit {
namespace {

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
    const utf8::CharScan c = utf8::scan_char(text.substr(i));
    const size_t len = c.kind == utf8::CharScan::kComplete ? c.len : 0;
    const uint32_t cp = len == 0 ? 0 : utf8::code_point(text.substr(i), len);
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
