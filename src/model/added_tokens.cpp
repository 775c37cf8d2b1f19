#include "model/added_tokens.h"

#include <algorithm>

#include "model/unicode.h"

namespace kvsplit::model {

AddedTokenMatcher::AddedTokenMatcher(std::vector<Token> tokens) : tokens_(std::move(tokens)) {
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].pattern.empty()) continue;
    by_first_byte_[static_cast<uint8_t>(tokens_[i].pattern[0])].push_back(i);
  }
  for (auto& v : by_first_byte_) {
    std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].pattern.size() > tokens_[b].pattern.size();
    });
  }
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special,
                              std::vector<Segment>& out) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;      // where the search for the next match starts
  while (pos < text.size()) {
    // The leftmost position where some token matches, and the longest token there.
    const Token* hit = nullptr;
    size_t start = pos;
    for (; start < text.size() && !hit; ++start) {
      for (uint32_t i : by_first_byte_[static_cast<uint8_t>(text[start])]) {
        if (text.compare(start, tokens_[i].pattern.size(), tokens_[i].pattern) == 0) {
          hit = &tokens_[i];
          break;
        }
      }
    }
    if (!hit) break;
    --start;
    size_t stop = start + hit->pattern.size();
    pos = stop;  // the next search starts after this match, whether it is used or not
    if (hit->special && !parse_special) continue;
    if (hit->single_word) {
      size_t n;
      const bool word_before =
          start > 0 && unicode::is_word_char(unicode::decode_last(text.substr(0, start), n));
      const bool word_after =
          stop < text.size() && unicode::is_word_char(unicode::decode_first(text.substr(stop), n));
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {  // take the whitespace before it, down to the previous segment
      size_t n;
      while (start > emitted &&
             unicode::is_white_space(unicode::decode_last(text.substr(0, start), n))) {
        start -= n;
      }
    }
    if (hit->rstrip) {
      size_t n;
      while (stop < text.size() &&
             unicode::is_white_space(unicode::decode_first(text.substr(stop), n))) {
        stop += n;
      }
      pos = stop;
    }
    if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1, emitted});
    out.push_back({text.substr(start, stop - start), hit->id, start});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1, emitted});
}

}  // namespace kvsplit::model
