// Regular expressions of guided decoding (docs/sampling.md, "Guided decoding"), compiled to a
// byte-level Thompson NFA. The language is over UTF-8 text: a character class or `.` matches whole
// code points, each compiled to the byte sequences of its UTF-8 encodings, so the automaton
// accepts only well-formed UTF-8 wherever a class is involved.
//
// Syntax (a subset of ECMAScript / PCRE; what is outside it is refused with its offset, never
// read another way): literals (UTF-8), `.` (any code point but \n), classes `[...]` / `[^...]`
// with ranges, escapes `\d \D \w \W \s \S \n \t \r \f \v \0 \xHH \uHHHH` and escaped punctuation,
// groups `(...)`, `(?:...)`, `(?<name>...)`, `(?P<name>...)`, alternation `|`, quantifiers
// `* + ? {n} {n,} {n,m}` (n, m <= kMaxRepeat; a lazy `?` suffix is accepted: over whole-text
// matching it describes the same language). `^` first and `$` last are accepted and mean
// nothing more: the whole text must match anyway. \s, \w and \d are ASCII.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::sampling::regex {

struct NfaNode {
  enum Kind : uint8_t {
    kByte,     // a byte in [lo, hi], then `out`
    kSplit,    // both `out` and `out2`
    kEpsilon,  // `out` (a loop head before its body is compiled)
    kMatch,    // the rule ends: return to the caller, or (called by nobody) the text may end here
    kCall,     // call the rule whose entry is `out2`; when it ends, continue at `out` (grammars)
  };
  Kind kind = kEpsilon;
  uint8_t lo = 0;
  uint8_t hi = 0;
  int32_t out = -1;
  int32_t out2 = -1;
};

struct Nfa {
  std::vector<NfaNode> nodes;
  int32_t start = -1;
};

inline constexpr int kMaxRepeat = 1000;
inline constexpr size_t kMaxNfaNodes = size_t{1} << 18;
inline constexpr int kMaxNesting = 200;  // groups within groups (the parser recurses)

// kInvalidArgument "regex: <what> at offset <n>" for a syntax error, a class matching nothing, or
// an automaton of more than max_nodes nodes (a large counted repetition).
StatusOr<Nfa> compile_regex(std::string_view pattern, size_t max_nodes = kMaxNfaNodes);

// Regexes that call each other (a recursive JSON schema's definitions): patterns[0] is the text,
// patterns[r] rule r, and `(?&r)` in any of them (PCRE's call syntax; 1 <= r < size) matches
// rule r there. The rules are checked as a grammar's are (check_rules in guide_ast.h: each must
// derive a finite string, none may reach itself before a byte), named by `names` (names[0]: the
// text). kInvalidArgument "<prefix>: ..." otherwise.
StatusOr<Nfa> compile_regex_rules(const std::vector<std::string>& patterns,
                                  const std::vector<std::string>& names, std::string_view prefix,
                                  size_t max_nodes = kMaxNfaNodes);

// A code point range [lo, hi] as its UTF-8 encodings: sequences of byte ranges, each sequence one
// byte range per encoded byte. Surrogates must not be inside the range. Exposed for tests.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace kvsplit::sampling::regex
