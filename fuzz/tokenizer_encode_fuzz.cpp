// Fuzzes encoding with the real shared tokenizers (GPT-2, Qwen2, Llama-2; from $KVSPLIT_MODELS
// or ../shared/models beside the source tree): any bytes encode to in-vocabulary ids, and GPT-2's
// byte-level BPE decodes them back to exactly the input (special-token text as plain text).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "model/tokenizer.h"

namespace {

using kvsplit::model::Tokenizer;

struct Loaded {
  std::unique_ptr<Tokenizer> gpt2;
  std::vector<std::unique_ptr<Tokenizer>> others;
};

const Loaded& tokenizers() {
  static const Loaded loaded = [] {
    const char* env = std::getenv("KVSPLIT_MODELS");
    const std::string dir =
        (env && *env) ? env : std::string(KVSPLIT_SOURCE_DIR "/../shared/models");
    Loaded l;
    auto g = kvsplit::model::load_tokenizer(dir + "/tokenizers/gpt2/tokenizer.json");
    KVSPLIT_CHECK_MSG(g.ok(), "GPT-2 tokenizer.json not found (set KVSPLIT_MODELS)");
    l.gpt2 = std::move(*g);
    for (const char* name :
         {"tokenizers/qwen2/tokenizer.json", "tokenizers/llama2/tokenizer.json", "tok512.bin"}) {
      auto t = kvsplit::model::load_tokenizer(dir + "/" + name);
      KVSPLIT_CHECK_MSG(t.ok(), name);
      l.others.push_back(std::move(*t));
    }
    return l;
  }();
  return loaded;
}

void check_ids(const Tokenizer& t, std::string_view text, bool special) {
  auto ids = t.encode(text, kvsplit::model::EncodeOptions{special, special});
  KVSPLIT_CHECK(ids.ok());
  for (int32_t id : *ids) KVSPLIT_CHECK(id >= 0 && id < t.vocab_size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Loaded& l = tokenizers();
  auto ids = l.gpt2->encode(text, kvsplit::model::EncodeOptions{false, false});
  KVSPLIT_CHECK(ids.ok());
  std::string back;
  int32_t prev = -1;
  for (int32_t id : *ids) {
    back += l.gpt2->decode_token(prev, id);
    prev = id;
  }
  KVSPLIT_CHECK_MSG(back == text, "GPT-2 byte-level BPE did not round-trip");
  check_ids(*l.gpt2, text, true);
  for (const auto& t : l.others) {
    check_ids(*t, text, false);
    check_ids(*t, text, true);
  }
  return 0;
}
