#include "model/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include "common/check.h"
#include "model/utf8.h"

namespace kvsplit::model::unicode {

std::string nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);

  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* norm = icu::Normalizer2::getNFCInstance(status);
  KVSPLIT_CHECK(U_SUCCESS(status));  // ICU's built-in data is linked in
  std::string out;
  out.reserve(s.size());
  icu::StringByteSink<std::string> sink(&out);
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;  // [i, j): a well-formed run
    while (j < s.size()) {
      const utf8::CharScan c = utf8::scan_char(s.substr(j));
      if (c.kind != utf8::CharScan::kComplete) break;
      j += c.len;
    }
    if (j > i) {
      status = U_ZERO_ERROR;
      norm->normalizeUTF8(0, icu::StringPiece(s.data() + i, static_cast<int32_t>(j - i)), sink,
                          nullptr, status);
      if (U_FAILURE(status)) out.append(s.substr(i, j - i));  // cannot happen on valid UTF-8
    }
    if (j < s.size()) out.push_back(s[j++]);  // one ill-formed byte, kept
    i = j;
  }
  return out;
}

char32_t decode_first(std::string_view s, size_t& len) {
  len = 1;
  if (s.empty()) return static_cast<char32_t>(-1);
  const utf8::CharScan c = utf8::scan_char(s);
  if (c.kind != utf8::CharScan::kComplete) return static_cast<char32_t>(-1);
  len = c.len;
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (len == 1) return b0;
  char32_t cp = b0 & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[k]) & 0x3F);
  return cp;
}

char32_t decode_last(std::string_view s, size_t& len) {
  len = 1;
  if (s.empty()) return static_cast<char32_t>(-1);
  size_t start = s.size() - 1;
  while (start > 0 && s.size() - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  size_t n;
  const char32_t cp = decode_first(s.substr(start), n);
  if (cp == static_cast<char32_t>(-1) || start + n != s.size()) return static_cast<char32_t>(-1);
  len = n;
  return cp;
}

bool is_white_space(char32_t c) {
  return c != static_cast<char32_t>(-1) && u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool is_word_char(char32_t c) {
  if (c == static_cast<char32_t>(-1)) return false;
  const auto u = static_cast<UChar32>(c);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

}  // namespace kvsplit::model::unicode
