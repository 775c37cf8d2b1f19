#include "server/utf8.h"

#include <cstdint>

namespace kvsplit::server {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence at s[i], 0 when malformed, -1 when it is a valid prefix
// cut short by the end of the input.
int sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c == 0xE0) {
    len = 3;
    lo = 0xA0;
  } else if (c >= 0xE1 && c <= 0xEC)
    len = 3;
  else if (c == 0xED) {
    len = 3;
    hi = 0x9F;
  }  // no surrogates
  else if (c >= 0xEE && c <= 0xEF)
    len = 3;
  else if (c == 0xF0) {
    len = 4;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3)
    len = 4;
  else if (c == 0xF4) {
    len = 4;
    hi = 0x8F;
  } else
    return 0;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    const uint8_t t = b(i + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (t < l || t > h) return 0;
  }
  return len;
}

}  // namespace

bool is_valid_utf8(std::string_view s, size_t* bad_offset) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = sequence_length(s, i);
    if (n <= 0) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string Utf8Joiner::take(bool flush) {
  std::string out;
  out.reserve(pending_.size());
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = sequence_length(pending_, i);
    if (n > 0) {
      out.append(pending_, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else if (n < 0 && !flush) {
      break;  // incomplete tail: keep it
    } else {
      out.append(kReplacement);
      i += 1;
      if (n < 0) i = pending_.size();  // flushing a cut-short tail: one replacement for it
    }
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace kvsplit::server
