// Helpers of the guided-decoding tests: a vocabulary of the 256 single bytes (a token per byte, so
// walking a string is walking its bytes) and whole-text matching through a compiled guide.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/guide.h"

namespace kvsplit::sampling::testing {

inline std::shared_ptr<const TokenVocabulary> byte_vocab() {
  std::vector<std::string> bytes(256);
  for (int b = 0; b < 256; ++b)
    bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<std::string>{});
}

// Whether `text` is a whole string of g's language.
inline bool whole_match(GuideGrammar& g, std::string_view text) {
  StatusOr<int32_t> s = g.walk(g.start_state(), text);
  return s.ok() && *s != GuideGrammar::kDead && g.accepting(*s);
}

// Whether `text` is a prefix of some string of g's language.
inline bool live_prefix(GuideGrammar& g, std::string_view text) {
  StatusOr<int32_t> s = g.walk(g.start_state(), text);
  return s.ok() && *s != GuideGrammar::kDead;
}

}  // namespace kvsplit::sampling::testing
