// load_tokenizer (dispatch by file content) and StreamDecoder.
#include "model/tokenizer.h"

#include <cerrno>
#include <cstring>

#include "common/file_read.h"
#include "model/utf8.h"

namespace kvsplit::model {
namespace internal {
// Defined in tokenizer_llama2c.cpp and tokenizer_hf.cpp. `data` is the whole file.
StatusOr<std::unique_ptr<Tokenizer>> load_llama2c_tokenizer(const std::string& path,
                                                            std::string_view data,
                                                            int expected_vocab);
StatusOr<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path,
                                                       std::string_view data, int expected_vocab);
}  // namespace internal

namespace {

StatusOr<std::string> read_file(const std::string& path) {
  return common::read_regular_file(path, common::kMaxTokenizerFileBytes, "tokenizer");
}

// An HF tokenizer.json is a JSON object; a llama2.c tokenizer.bin starts with a small uint32.
bool looks_like_json(std::string_view data) {
  for (char c : data) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path, int expected_vocab) {
  if (expected_vocab < 0) {
    return invalid_argument("tokenizer " + path + ": expected_vocab " +
                            std::to_string(expected_vocab) + " is negative");
  }
  KVSPLIT_ASSIGN_OR_RETURN(std::string data, read_file(path));
  return load_tokenizer_from_bytes(data, path, expected_vocab);
}

StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer_from_bytes(std::string_view data,
                                                               const std::string& path,
                                                               int expected_vocab) {
  if (expected_vocab < 0) {
    return invalid_argument("tokenizer " + path + ": expected_vocab " +
                            std::to_string(expected_vocab) + " is negative");
  }
  // A file named *.json is an HF tokenizer whatever it holds (an empty or broken one is reported
  // as such, not as a llama2.c tokenizer.bin).
  const bool json_name = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (json_name) return internal::load_hf_tokenizer(path, data, expected_vocab);
  if (looks_like_json(data)) {
    auto hf = internal::load_hf_tokenizer(path, data, expected_vocab);
    if (hf.ok()) return hf;
    // A llama2.c tokenizer.bin whose max_token_length has '{' (0x7B) as its low byte, e.g. 123,
    // starts with '{' too: it is one when it parses as one. Otherwise the JSON error stands.
    auto bin = internal::load_llama2c_tokenizer(path, data, expected_vocab);
    if (bin.ok()) return bin;
    return hf.status();
  }
  return internal::load_llama2c_tokenizer(path, data, expected_vocab);
}

Status check_no_dropped_text(const Tokenizer& tok, std::string_view text, std::string_view what) {
  const size_t nul = text.find('\0');
  if (!tok.text_ends_at_nul() || nul == std::string_view::npos) return ok_status();
  return invalid_argument(std::string(what) + ": a NUL byte at offset " + std::to_string(nul) +
                          "; the " + std::string(tok.kind()) +
                          " tokenizer ends text there (as llama2.c's run.c), so it is refused "
                          "rather than cut");
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_.decode_token(prev_, id);
  prev_ = id;
  std::string out;
  const size_t used = utf8::append_valid(pending_, /*final=*/false, out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_valid(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace kvsplit::model
