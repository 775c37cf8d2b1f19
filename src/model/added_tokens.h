// Finding added tokens (<|endoftext|>, <|im_start|>, <s>, ...) in a text before it is split into
// words, with HF tokenizers' semantics (AddedVocabulary::find_matches): leftmost-longest,
// non-overlapping matches; `single_word` tokens only between non-word characters; `lstrip` /
// `rstrip` tokens take the whitespace before / after them into their match, after the matches
// are found.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvsplit::model {

class AddedTokenMatcher {
 public:
  struct Token {
    int32_t id;
    std::string pattern;  // the text to find (HF: the content, normalized for normalized tokens)
    bool special = false;
    bool lstrip = false, rstrip = false, single_word = false;
  };
  // A piece of the text: an added token (id >= 0; `text` is its match including stripped
  // whitespace) or plain text (id -1). `offset` is where `text` starts in the split text.
  struct Segment {
    std::string_view text;
    int32_t id;
    size_t offset;
  };

  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<Token> tokens);
  bool empty() const { return tokens_.empty(); }

  // Appends the segments of non-empty `text` to `out`, in order, as HF's find_matches: the
  // matches are found in `text` as it is, then each takes its stripped whitespace, so a token
  // that starts in the whitespace an rstrip token took is still found and overlaps it (both
  // hold that whitespace, and plain text after it starts where that token ends); an lstrip
  // token takes no whitespace that the token before it took. Without overlaps the segments
  // cover `text` exactly. A match of a special token is left as plain text unless
  // `parse_special`; as in HF (with split_special_tokens), it still hides any token that
  // overlaps it. Cost: O(len(text)) plus one comparison per token that starts with a byte found
  // in the text.
  void split(std::string_view text, bool parse_special, std::vector<Segment>& out) const;

 private:
  std::vector<Token> tokens_;
  // Token indices by the first byte of the pattern, longest pattern first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace kvsplit::model
