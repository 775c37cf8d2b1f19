// UTF-8 scanning, the one implementation (tokenizers, the streaming decoder, the gRPC edge,
// escaping): well-formedness by Unicode Table 3-7, ill-formed input split into maximal subparts.
// Header-only, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvsplit::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Result of inspecting the bytes at the start of `s`.
struct CharScan {
  enum Kind { kComplete, kIncomplete, kInvalid } kind;
  // kComplete: bytes in the character (1..4). kIncomplete: bytes seen (all valid so far).
  // kInvalid: length of the maximal ill-formed subpart to replace with one U+FFFD (>= 1).
  size_t len;
};

// Classifies the well-formed UTF-8 character (Unicode Table 3-7) at the start of non-empty `s`.
// Ill-formed input is split into "maximal subparts" as in the Unicode standard (§3.9), which is
// also what WHATWG decoders and Python's errors="replace" do.
inline CharScan scan_char(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return {CharScan::kComplete, 1};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {CharScan::kInvalid, 1};  // stray continuation byte, C0/C1, F5..FF
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return {CharScan::kIncomplete, i};
    const auto b = static_cast<uint8_t>(s[i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {CharScan::kInvalid, i};
  }
  return {CharScan::kComplete, need};
}

// Appends to `out` the longest prefix of `in` that ends on a character boundary, with every
// ill-formed subpart replaced by U+FFFD. Returns the number of bytes of `in` consumed; the rest
// is an incomplete character. With `final`, an incomplete tail becomes one U+FFFD as well and
// everything is consumed.
inline size_t append_valid(std::string_view in, bool final, std::string& out) {
  size_t i = 0;
  while (i < in.size()) {
    const CharScan c = scan_char(in.substr(i));
    if (c.kind == CharScan::kComplete) {
      out.append(in.substr(i, c.len));
    } else if (c.kind == CharScan::kInvalid) {
      out.append(kReplacement);
    } else {  // incomplete: only possible at the end of `in`
      if (!final) return i;
      out.append(kReplacement);
    }
    i += c.len;
  }
  return i;
}

// Splits `s` into the units the tokenizers look up: well-formed characters, and each byte of
// ill-formed input on its own. Calls f(std::string_view unit) in order.
template <typename F>
void for_each_char(std::string_view s, F&& f) {
  size_t i = 0;
  while (i < s.size()) {
    const CharScan c = scan_char(s.substr(i));
    const size_t n = c.kind == CharScan::kComplete ? c.len : 1;
    f(s.substr(i, n));
    i += n;
  }
}

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF, no
// truncated character). On false, *bad_offset (when given) is the byte offset of the first bad
// or truncated sequence.
inline bool is_valid(std::string_view s, size_t* bad_offset = nullptr) {
  size_t i = 0;
  while (i < s.size()) {
    const CharScan c = scan_char(s.substr(i));
    if (c.kind != CharScan::kComplete) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += c.len;
  }
  return true;
}

// The code point of the complete character of `len` bytes (scan_char's kComplete) at `s`.
inline uint32_t code_point(std::string_view s, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    case 3:
      return ((b(0) & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    default:
      return ((b(0) & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) |
             (b(3) & 0x3Fu);
  }
}

}  // namespace kvsplit::utf8
