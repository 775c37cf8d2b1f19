// Escaping of untrusted text before it is echoed in an error message or a log line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvsplit {

// Bytes of untrusted input echoed in one message at most (escape_for_message's default cap).
inline constexpr size_t kMaxEchoBytes = 64;

// Returns `text` safe to embed in a message, a log line or a terminal:
//   - valid UTF-8 characters pass through, except controls: C0 (NUL, ESC, newline, ...), DEL, C1
//     (U+0080..U+009F) and the bidi overrides/isolates U+202A..U+202E, U+2066..U+2069;
//   - those controls and every byte of invalid UTF-8 become `\xNN` (two lower-case hex digits per
//     byte), a backslash becomes `\\`, a single quote `\'` and a double quote `\"`;
//   - at most `max_bytes` bytes of input are shown (cut at a character boundary); a longer input
//     ends with `...(N bytes)`, N the input's full size.
// Pure; the output is printable ASCII or valid UTF-8 without controls.
std::string escape_for_message(std::string_view text, size_t max_bytes = kMaxEchoBytes);

}  // namespace kvsplit
