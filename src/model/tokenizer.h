// Tokenizers: llama2.c tokenizer.bin, HF tokenizer.json (SentencePiece/Llama-2 kind and byte-level
// BPE: GPT-2 / Llama-3 / Qwen2), and a byte stand-in for synthetic models.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::model {

// How encode() treats special tokens.
struct EncodeOptions {
  // Add the special tokens the tokenizer adds around a text (HF add_special_tokens): BOS for
  // llama2.c, Llama-2 and Llama-3, nothing for GPT-2 and Qwen2 (their post-processors add none).
  bool add_special = true;
  // Special-token text in the input ("<s>", "<|endoftext|>", "<|im_start|>") becomes the special
  // id, as HF tokenizers does by default. false: it is encoded as plain text (SentencePiece,
  // run.c, OpenAI's GPT-2 encoder, llama.cpp parse_special=false), so a user prompt cannot inject
  // control tokens. Non-special added tokens are matched either way (as HF does). llama2.c
  // tokenizer.bin files have no special-token text and always encode it as plain text.
  bool parse_special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`. Any byte string encodes (byte fallback, or byte-level BPE, where
  // ill-formed UTF-8 bytes are pre-tokens of their own); kInvalidArgument only when the
  // tokenizer cannot represent it at all.
  virtual StatusOr<std::vector<int32_t>> encode(std::string_view text,
                                                const EncodeOptions& options) const = 0;
  // encode(text, {.add_special = add_bos, .parse_special = false}): special-token text is plain
  // text; add_bos adds what the tokenizer adds (BOS, or nothing for GPT-2 / Qwen2).
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_bos) const {
    return encode(text, EncodeOptions{.add_special = add_bos, .parse_special = false});
  }
  // Raw bytes that token `id` contributes to the text when it follows token `prev`
  // (-1 at the start of a generation). Byte tokens give their byte; special tokens give "".
  // May end in the middle of a UTF-8 character.
  virtual std::string decode_token(int32_t prev, int32_t id) const = 0;
  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;  // -1 when none
  // "llama2c", "hf-sentencepiece-bpe", "hf-byte-level-bpe", "bytes"
  virtual std::string_view kind() const = 0;
  // Whether encode() ends the text at its first NUL byte (llama2.c's format, as run.c does with
  // its C string) instead of encoding NUL.
  virtual bool text_ends_at_nul() const { return false; }
};

// For text a request or a file gives (not `kvsplit tokenize`, which shows what encode() does):
// kInvalidArgument naming `what` and the offset when `tok` would drop the text after a NUL byte,
// so that nothing is cut silently.
Status check_no_dropped_text(const Tokenizer& tok, std::string_view text, std::string_view what);

// Loads `path`: a llama2.c tokenizer.bin, or an HF tokenizer.json (by content, not by name; a
// tokenizer_config.json beside a tokenizer.json is read too). `expected_vocab` (> 0) is checked
// against the file. Errors name the file and the fault (kNotFound, kInvalidArgument for a
// malformed file, kUnimplemented for a valid file using a component not supported).
StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path,
                                                    int expected_vocab = 0);
// The same from the file's bytes in memory; `path` names it in errors and locates side files
// (tokenizer_config.json beside it, read when present). For the fuzz targets and tests.
StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer_from_bytes(std::string_view data,
                                                               const std::string& path,
                                                               int expected_vocab = 0);

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
