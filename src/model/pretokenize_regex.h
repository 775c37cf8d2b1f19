// The split regexes of HF pre-tokenizers (ByteLevel's GPT-2 regex, Split with a Regex pattern),
// run by PCRE2 with Unicode properties. No regex logic is written here: the only change made to a
// pattern is that \s and \S become \p{White_Space} and \P{White_Space}, because PCRE2's \s also
// matches U+180E, which HF tokenizers' engine (Oniguruma) and Python's `regex` do not.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::model {

// The pre-tokenization regex of GPT-2 (HF ByteLevel with use_regex: true).
inline constexpr std::string_view kGpt2SplitRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled pattern. Immutable after compile(): split() may be called from many threads.
class RegexSplitter {
 public:
  // `pattern`: a regex (Oniguruma/PCRE syntax as HF files use it), or with `literal` a plain
  // string to split on. Compiled with UTF, UCP (Unicode \p, \w, \d, case folding; not with
  // `literal`) and MATCH_INVALID_UTF, JIT-compiled when PCRE2 has a JIT. kInvalidArgument names the
  // fault and its offset in the pattern.
  static StatusOr<std::unique_ptr<RegexSplitter>> compile(std::string_view pattern, bool literal);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // HF's Split with behavior Isolated: appends to `out` every match and every stretch between
  // two matches, in order, so that the pieces cover `text` exactly; empty matches are dropped.
  // Ill-formed UTF-8 never matches, so such bytes end up in the stretches between matches.
  // kResourceExhausted when PCRE2 gives up (match or memory limit; not seen with HF's patterns).
  Status split_isolated(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  explicit RegexSplitter(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*, owned
};

}  // namespace kvsplit::model
