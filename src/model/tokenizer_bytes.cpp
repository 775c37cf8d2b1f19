// The byte-level stand-in tokenizer for synthetic models.
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "model/tokenizer.h"

namespace kvsplit::model {
namespace {

constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;
constexpr int kByteIdOffset = 3;  // byte b has id b + 3

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int vocab_size) : vocab_size_(vocab_size) {}

  using Tokenizer::encode;
  // parse_special is ignored: this format has no special-token text (plain text, as run.c).
  StatusOr<std::vector<int32_t>> encode(std::string_view text,
                                        const EncodeOptions& options) const override {
    const bool add_bos = options.add_special;
    std::vector<int32_t> out;
    out.reserve(text.size() + 1);
    if (add_bos) out.push_back(kBosId);
    for (char c : text) {
      const int32_t id = static_cast<uint8_t>(c) + kByteIdOffset;
      if (id >= vocab_size_) {
        return invalid_argument("byte tokenizer: byte " + std::to_string(id - kByteIdOffset) +
                                " has no id in a vocab of " + std::to_string(vocab_size_) +
                                " (bytes need a vocab of at least 259)");
      }
      out.push_back(id);
    }
    return out;
  }

  std::string decode_token(int32_t prev, int32_t id) const override {
    if (id < kByteIdOffset || id >= vocab_size_ || id >= kByteIdOffset + 256) return {};
    return std::string(1, static_cast<char>(id - kByteIdOffset));
  }

  int vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }
  std::string_view kind() const override { return "bytes"; }

 private:
  int vocab_size_;
};

}  // namespace

// vocab_size >= 3 is a precondition (ids 0..2 are fixed). Below 259 the bytes whose id does not
// fit are rejected by encode() with kInvalidArgument; everything else still works.
std::unique_ptr<Tokenizer> make_byte_tokenizer(int vocab_size) {
  KVSPLIT_CHECK_MSG(vocab_size >= 3, "byte tokenizer needs ids 0..2 for <unk>, <s>, </s>");
  return std::make_unique<ByteTokenizer>(vocab_size);
}

}  // namespace kvsplit::model
