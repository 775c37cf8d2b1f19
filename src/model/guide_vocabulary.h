// The token byte strings guided decoding walks (sampling/guide.h), read from a tokenizer.
#pragma once

#include <memory>

#include "model/tokenizer.h"
#include "sampling/guide.h"

namespace kvsplit::model {

// Every id in [0, vocab_size) with the bytes it adds to the text mid-text and at the start (after
// BOS); ids the tokenizer does not have, and special tokens, add none (never allowed as text).
std::shared_ptr<const sampling::TokenVocabulary> guide_vocabulary(const Tokenizer& tokenizer,
                                                                  int vocab_size);

}  // namespace kvsplit::model
