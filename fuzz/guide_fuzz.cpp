// Fuzzes guided decoding's parsers of client input and the automaton they drive: the first byte
// picks a regex, a JSON schema or a GBNF grammar, the bytes up to the first NUL are the constraint,
// the bytes after it steer a generation over a byte vocabulary (each byte: the allowed token to
// take, by rank). Any constraint validate() passes must compile or be refused with
// INVALID_ARGUMENT; a compiled one must give masks whose tokens walk to live states, and fail only
// at its bounds.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "kvsplit/sampling_params.h"
#include "sampling/guide.h"

using kvsplit::GuidedDecoding;
using kvsplit::StatusCode;
using kvsplit::sampling::GuideGrammar;
using kvsplit::sampling::GuideState;
using kvsplit::sampling::TokenVocabulary;

namespace {

// The 256 bytes, and a few multi-byte tokens so that masks walk the trie below its first level.
std::shared_ptr<const TokenVocabulary> vocab() {
  std::vector<std::string> bytes(256 + 8);
  for (int b = 0; b < 256; ++b)
    bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  const char* more[] = {"\": ", "true", "null", "\\u00", "{\"", "12", "\xC3\xA9", "ab"};
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(256 + i)] = more[i];
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<std::string>{});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const TokenVocabulary> v = vocab();
  if (size < 1) return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  kvsplit::SamplingParams p;
  p.guided.kind = data[0] % 3 == 1   ? GuidedDecoding::Kind::kRegex
                  : data[0] % 3 == 2 ? GuidedDecoding::Kind::kGrammar
                                     : GuidedDecoding::Kind::kJsonSchema;
  p.guided.spec = input.substr(0, nul);
  if (!p.validate().ok()) return 0;
  auto g = GuideGrammar::compile(p.guided, v);
  if (!g.ok()) {
    KVSPLIT_CHECK(g.status().code() == StatusCode::kInvalidArgument &&
                  !g.status().message().empty());
    return 0;
  }
  GuideState state(*g, false);
  const std::string steer = nul == std::string::npos ? std::string() : input.substr(nul + 1);
  for (const char c : steer) {
    auto mask = state.mask();
    if (!mask.ok()) {  // only at the automaton's bounds
      KVSPLIT_CHECK(mask.status().code() == StatusCode::kInvalidArgument &&
                    mask.status().message().find("grew past its bounds") != std::string::npos);
      return 0;
    }
    if ((*mask)->count == 0) {
      KVSPLIT_CHECK(state.accepting());  // every reachable state can still reach the end
      return 0;
    }
    int rank = static_cast<uint8_t>(c) % (*mask)->count;
    int32_t id = 0;
    for (; id < v->size(); ++id)
      if ((*mask)->test(id) && rank-- == 0) break;
    const kvsplit::Status st = state.advance(id);
    if (!st.ok()) {
      KVSPLIT_CHECK(st.code() == StatusCode::kInvalidArgument &&
                    st.message().find("grew past its bounds") != std::string::npos);
      return 0;
    }
  }
  return 0;
}
