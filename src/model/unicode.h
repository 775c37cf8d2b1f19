// Unicode services the tokenizers need beyond UTF-8 framing (utf8.h): NFC normalization and the
// character properties HF tokenizers' added-token matching uses. Backed by ICU; stateless and
// thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvsplit::model::unicode {

// NFC of `s`. Well-formed runs are normalized; ill-formed UTF-8 bytes are kept as they are and
// separate the runs around them. ASCII text is returned unchanged without calling ICU.
std::string nfc(std::string_view s);

// The code point of the well-formed character at the start of `s` (and its length in bytes), or
// of the one that ends `s`; -1 (length 1) when `s` starts / ends with an ill-formed byte.
char32_t decode_first(std::string_view s, size_t& len);
char32_t decode_last(std::string_view s, size_t& len);

// The White_Space property (\s of Rust's regex, Oniguruma and Python's regex module).
bool is_white_space(char32_t c);
// \w of Rust's regex: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool is_word_char(char32_t c);

}  // namespace kvsplit::model::unicode
