// UTF-8 helpers of the tokenizers: the generic scanning (common/utf8.h) plus SentencePiece's
// space marker and byte-token names. Header-only, no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace kvsplit::model::utf8 {

using ::kvsplit::utf8::append_valid;
using ::kvsplit::utf8::CharScan;
using ::kvsplit::utf8::for_each_char;
using ::kvsplit::utf8::kReplacement;
using ::kvsplit::utf8::scan_char;

inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// "<0xNN>" (uppercase hex) -> NN; -1 when `piece` is not exactly a byte-token name.
inline int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int h = hex(piece[3]), l = hex(piece[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

// The byte-token name of `b`: "<0x0A>".
inline std::string byte_piece(uint8_t b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

}  // namespace kvsplit::model::utf8
