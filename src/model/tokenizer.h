// Tokenizers: llama2.c tokenizer.bin, HF tokenizer.json (SentencePiece/Llama-2 kind), and a
// byte-level stand-in for synthetic models. Byte-level BPE (GPT-2 / Llama-3 / Qwen2) plugs in
// behind the same interface later.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`; with add_bos the BOS id comes first. Any byte string encodes (byte
  // fallback); kInvalidArgument only when the tokenizer cannot represent it at all.
  virtual StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_bos) const = 0;
  // Raw bytes that token `id` contributes to the text when it follows token `prev`
  // (-1 at the start of a generation). Byte tokens give their byte; special tokens give "".
  // May end in the middle of a UTF-8 character.
  virtual std::string decode_token(int32_t prev, int32_t id) const = 0;
  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;  // -1 when none
  virtual std::string_view kind() const = 0;  // "llama2c", "hf-sentencepiece-bpe", "bytes"
};

// Loads `path`: a llama2.c tokenizer.bin, or an HF tokenizer.json (by content, not by name).
// `expected_vocab` (> 0) is checked against the file. Errors name the file and the fault.
StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path, int expected_vocab = 0);

// Stand-in tokenizer for synthetic models: ids 0..2 are <unk>, <s>, </s>, ids 3..258 the bytes
// 0x00..0xFF; ids past 258 decode as "" (never produced by encode).
std::unique_ptr<Tokenizer> make_byte_tokenizer(int vocab_size);

// Streams text out of token ids: a token that ends inside a UTF-8 character emits nothing until
// the character is complete; invalid sequences become U+FFFD.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, int32_t prev = -1)
      : tokenizer_(tokenizer), prev_(prev) {}
  // Appends token `id`; returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Returns what is still buffered (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_;
  std::string pending_;
};

}  // namespace kvsplit::model
