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
  size_t emitted = 0;  // end of the last token pushed (HF: start_offset); can move back
  size_t pos = 0;      // where the search for the next match starts: the end of the last match
  // The last whitespace run an rstrip found: [ws_from, ws_end) is white space, ws_end is not (or
  // is the end of the text). Reused for matches that end inside it, keeping the cost linear.
  size_t ws_from = 0, ws_end = 0;
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
    pos = stop;  // matches are found in the text as it is, whatever stripping does to them
    if (hit->special && !parse_special) continue;
    if (hit->single_word) {
      size_t n;
      const bool word_before =
          start > 0 && unicode::is_word_char(unicode::decode_last(text.substr(0, start), n));
      const bool word_after =
          stop < text.size() && unicode::is_word_char(unicode::decode_first(text.substr(stop), n));
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {  // take the whitespace before it, but nothing the last token took
      size_t n;
      if (start < emitted) start = emitted;
      while (start > emitted &&
             unicode::is_white_space(unicode::decode_last(text.substr(0, start), n))) {
        start -= n;
      }
    }
    if (hit->rstrip) {
      if (ws_from <= stop && stop <= ws_end &&
          (stop == ws_end || (static_cast<uint8_t>(text[stop]) & 0xC0) != 0x80)) {
        stop = ws_end;  // a character boundary inside the run found before
      } else {
        ws_from = stop;
        size_t n;
        while (stop < text.size() &&
               unicode::is_white_space(unicode::decode_first(text.substr(stop), n))) {
          stop += n;
        }
        ws_end = stop;
      }
    }
    // A match that ends inside the whitespace the last token took (an lstrip one that lost all
    // of its text to it): HF tokenizers 0.23 panics ("AddedVocabulary bad split"); we drop it.
    if (start > stop) continue;
    if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1, emitted});
    // HF drops an empty match (an lstrip token that lost all of its text to the last token).
    if (start < stop) out.push_back({text.substr(start, stop - start), hit->id, start});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1, emitted});
}

}  // namespace kvsplit::model
