// Fuzzes the tokenizer.json loader (both kinds: SentencePiece-style and byte-level BPE, added
// tokens, normalizers, pre-tokenizer regexes, post-processors) and llama2.c tokenizer.bin files;
// every tokenizer it accepts then encodes and stream-decodes a fixed set of texts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/check.h"
#include "model/tokenizer.h"

namespace {

constexpr std::string_view kTexts[] = {"",
                                       "Hello world",
                                       " leading and  double  spaces\t\ttabs\r\n",
                                       "it's 1234567 o'clock!",
                                       "<|endoftext|><s></s><|im_start|>user",
                                       "h\xc3\xa9llo \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82",
                                       "\xff\xfe invalid \xc3",
                                       std::string_view("nul\0byte", 8)};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A name without ".json": the loader sniffs the bytes, so JSON inputs reach the tokenizer.json
  // loader and the others the tokenizer.bin one (a ".json" name sent everything to the first, and
  // the tok512.bin seed never reached the second).
  auto tok = kvsplit::model::load_tokenizer_from_bytes(
      std::string_view(reinterpret_cast<const char*>(data), size), "/nonexistent/tokenizer");
  if (!tok.ok()) return 0;
  const kvsplit::model::Tokenizer& t = **tok;
  for (std::string_view text : kTexts) {
    for (bool special : {false, true}) {
      auto ids = t.encode(text, kvsplit::model::EncodeOptions{special, special});
      if (!ids.ok()) continue;
      kvsplit::model::StreamDecoder dec(t);
      for (int32_t id : *ids) {
        KVSPLIT_CHECK(id >= 0 && id < t.vocab_size());
        (void)dec.push(id);
      }
      (void)dec.flush();
    }
  }
  return 0;
}
