// UTF-8 checks for the gRPC edge: proto3 `string` fields must carry valid UTF-8 in both
// directions, while token text deltas may split a character across tokens.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvsplit::server {

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
// On false, *bad_offset (when given) is the byte offset of the first bad sequence.
bool is_valid_utf8(std::string_view s, size_t* bad_offset = nullptr);

// Joins token text deltas into valid UTF-8. push() appends raw bytes; take() returns the longest
// prefix made of complete characters (invalid sequences become U+FFFD) and keeps an incomplete
// tail (at most 3 bytes) for the next call; take(/*flush=*/true) also emits the tail as U+FFFD.
class Utf8Joiner {
 public:
  void push(std::string_view bytes) { pending_.append(bytes); }
  std::string take(bool flush = false);

 private:
  std::string pending_;
};

}  // namespace kvsplit::server
