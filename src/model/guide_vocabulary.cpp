// guide_vocabulary: decode_token of every id in both contexts.
#include "model/guide_vocabulary.h"

#include <string>
#include <vector>

namespace kvsplit::model {

std::shared_ptr<const sampling::TokenVocabulary> guide_vocabulary(const Tokenizer& tokenizer,
                                                                  int vocab_size) {
  // decode_token's context is only "at the start" (prev -1 or BOS) or not: any id other than BOS
  // stands for mid-text.
  const int32_t mid = tokenizer.bos_id() == 0 ? 1 : 0;
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  std::vector<std::string> start(static_cast<size_t>(vocab_size));
  for (int32_t id = 0; id < vocab_size && id < tokenizer.vocab_size(); ++id) {
    bytes[static_cast<size_t>(id)] = tokenizer.decode_token(mid, id);
    start[static_cast<size_t>(id)] = tokenizer.decode_token(-1, id);
  }
  return std::make_shared<const sampling::TokenVocabulary>(std::move(bytes), std::move(start));
}

}  // namespace kvsplit::model
