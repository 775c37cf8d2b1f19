// HF tokenizer.json, byte-level BPE (GPT-2, Llama-3, Qwen2): added tokens are found first, each
// stretch of text between them is normalized (NFC for Qwen2), split into pre-tokens by the
// file's regexes (PCRE2), its bytes mapped to GPT-2's byte-to-unicode characters, and merged by
// rank (bpe::merge_greedy). Decoding maps the characters back to bytes.
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/bpe.h"
#include "model/hf_json.h"
#include "model/pretokenize_regex.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace kvsplit::model::internal {
namespace {

using hf::get;
using hf::json;
using hf::quoted;
using hf::type_of;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte is one visible character of the vocab's pieces.
struct ByteMap {
  std::array<std::string, 256> byte_char;   // UTF-8 of the character standing for each byte
  std::array<int16_t, 256 + 68> char_byte;  // code point -> byte, -1 for others
  ByteMap() {
    char_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      char_byte[cp] = static_cast<int16_t>(b);
      byte_char[b] = cp < 0x80 ? std::string(1, char(cp))
                               : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// One pre-tokenizer step; the last one is ByteLevel.
struct PreStep {
  std::unique_ptr<RegexSplitter>
      split;  // Split (Isolated), or ByteLevel's GPT-2 regex; may be null
  bool byte_level = false;
  bool add_prefix_space = false;  // ByteLevel: prepend " " to a piece not starting with one
};

// Per encode() call: pre-token bytes -> ids, bounded (a text repeats its words a lot).
struct WordCache {
  static constexpr size_t kMaxEntries = 1 << 16;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> where;  // -> [begin, end)
  std::vector<int32_t> ids;
};

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  using Tokenizer::encode;
  StatusOr<std::vector<int32_t>> encode(std::string_view text,
                                        const EncodeOptions& options) const override {
    std::vector<int32_t> out;
    if (options.add_special) out = tmpl_.prefix;
    std::deque<std::string> store;  // normalized text, prefixed pieces
    std::vector<AddedTokenMatcher::Segment> segments;
    added_.extract_and_normalize(text, norm_, options.parse_special, store, segments);
    WordCache cache;
    const bpe::PairLookup lookup = [this](int32_t l, int32_t r) { return model_.lookup(l, r); };
    std::vector<std::string_view> pieces, next;
    for (const AddedTokenMatcher::Segment& s : segments) {
      if (s.id >= 0) {
        out.push_back(s.id);
        continue;
      }
      KVSPLIT_RETURN_IF_ERROR(pre_tokenize(s.text, store, pieces, next));
      for (std::string_view p : pieces) {
        KVSPLIT_RETURN_IF_ERROR(encode_word(p, lookup, cache, out));
      }
    }
    if (options.add_special) out.insert(out.end(), tmpl_.suffix.begin(), tmpl_.suffix.end());
    return out;
  }

  // HF's ByteLevel decoder with skip_special_tokens: special added tokens give "", every other
  // token its bytes (prev is not used: byte-level decoding strips nothing).
  std::string decode_token(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size() || special_[id]) return {};
    return decoded_[id];
  }
  int vocab_size() const override { return static_cast<int>(decoded_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  std::string_view kind() const override { return "hf-byte-level-bpe"; }

  // Splits `text` into pre-tokens (into `pieces`) by each step in turn.
  Status pre_tokenize(std::string_view text, std::deque<std::string>& store,
                      std::vector<std::string_view>& pieces,
                      std::vector<std::string_view>& next) const {
    pieces.assign(1, text);
    for (const PreStep& step : steps_) {
      next.clear();
      for (std::string_view p : pieces) {
        if (step.add_prefix_space && !p.empty() && p[0] != ' ') {
          std::string& prefixed = store.emplace_back(1, ' ');
          prefixed.append(p);
          p = prefixed;
        }
        if (step.split) {
          KVSPLIT_RETURN_IF_ERROR(step.split->split_isolated(p, next));
        } else {
          next.push_back(p);
        }
      }
      pieces.swap(next);
    }
    return ok_status();
  }

  // Appends the ids of one pre-token (raw bytes).
  Status encode_word(std::string_view word, const bpe::PairLookup& lookup, WordCache& cache,
                     std::vector<int32_t>& out) const {
    if (auto it = cache.where.find(word); it != cache.where.end()) {
      out.insert(out.end(), cache.ids.begin() + it->second.first,
                 cache.ids.begin() + it->second.second);
      return ok_status();
    }
    const size_t begin = out.size();
    bool done = false;
    if (model_.ignore_merges) {  // a pre-token that is a piece is taken whole
      std::string mapped;
      for (char c : word) mapped += byte_map().byte_char[static_cast<uint8_t>(c)];
      if (auto it = model_.vocab.find(mapped); it != model_.vocab.end()) {
        out.push_back(it->second);
        done = true;
      }
    }
    if (!done) {
      std::vector<int32_t> ids;
      ids.reserve(word.size());
      bool prev_unk = false;
      for (char c : word) {
        const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
        if (id >= 0) {
          ids.push_back(id);
          prev_unk = false;
          continue;
        }
        if (model_.unk_id < 0) {
          return invalid_argument("tokenizer.json: the text has byte " +
                                  std::to_string(static_cast<uint8_t>(c)) +
                                  ", whose byte-level character is not in the vocab, and the "
                                  "tokenizer has no unk token");
        }
        if (!(model_.fuse_unk && prev_unk)) ids.push_back(model_.unk_id);
        prev_unk = true;
      }
      bpe::merge_greedy(ids, lookup);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (cache.where.size() < WordCache::kMaxEntries) {
      const auto b = static_cast<uint32_t>(cache.ids.size());
      cache.ids.insert(cache.ids.end(), out.begin() + begin, out.end());
      cache.where.emplace(word, std::make_pair(b, static_cast<uint32_t>(cache.ids.size())));
    }
    return ok_status();
  }

  hf::BpeModel model_;
  std::vector<hf::NormOp> norm_;
  hf::AddedVocab added_;
  std::vector<PreStep> steps_;
  hf::Template tmpl_;
  std::array<int32_t, 256> byte_ids_;  // id of each byte's character, -1 when not in the vocab
  std::vector<std::string> decoded_;   // [vocab] raw bytes of each id ("" for holes)
  std::vector<bool> special_;          // [vocab] special added token: decodes to ""
  int32_t bos_id_ = -1, eos_id_ = -1;
};

// ---- loading ----

// A pre-tokenizer, flattened into steps.
Status parse_pre_tokenizer(const hf::Errors& err, const json& p, const std::string& field,
                           std::vector<PreStep>& steps) {
  const std::string type = type_of(&p);
  if (type == "Sequence") {
    const json* list = get(p, "pretokenizers");
    if (!list || !list->is_array()) return err.bad(field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      KVSPLIT_RETURN_IF_ERROR(parse_pre_tokenizer(
          err, (*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", steps));
    }
    return ok_status();
  }
  PreStep step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    bool use_regex = true;  // HF's defaults
    step.add_prefix_space = true;
    for (const char* k : {"add_prefix_space", "use_regex"}) {
      const json* v = get(p, k);
      if (v && !v->is_boolean()) return err.bad(field + "." + k, "expected a bool");
      if (v) (k[0] == 'a' ? step.add_prefix_space : use_regex) = v->get<bool>();
    }
    if (use_regex) {
      KVSPLIT_ASSIGN_OR_RETURN(step.split, RegexSplitter::compile(kGpt2SplitRegex, false));
    }
  } else if (type == "Split") {
    const json* pattern = get(p, "pattern");
    const json* regex = pattern ? get(*pattern, "Regex") : nullptr;
    const json* str = pattern ? get(*pattern, "String") : nullptr;
    const json* pat = regex ? regex : str;
    if (!pat || !pat->is_string()) {
      return err.bad(field + ".pattern", "expected {\"Regex\": string} or {\"String\": string}");
    }
    const json* behavior = get(p, "behavior");
    if (!behavior || *behavior != "Isolated") {
      return err.unsupported(
          field + ".behavior",
          "value " + (behavior ? quoted(*behavior) : "none") + " is not supported (only Isolated)");
    }
    if (const json* inv = get(p, "invert"); inv && *inv != false) {
      return err.unsupported(field + ".invert", "value " + quoted(*inv) + " is not supported");
    }
    auto re = RegexSplitter::compile(pat->get<std::string>(), /*literal=*/regex == nullptr);
    if (!re.ok()) {
      return err.bad(field + ".pattern." + (regex ? "Regex" : "String"), re.status().message());
    }
    step.split = std::move(re).value();
  } else {
    return err.unsupported(field + ".type", "pre-tokenizer type '" + type + "' is not supported");
  }
  if (!steps.empty() && steps.back().byte_level) {
    return err.unsupported(field, "a pre-tokenizer after ByteLevel is not supported");
  }
  steps.push_back(std::move(step));
  return ok_status();
}

// The ids a token's text decodes to: its characters mapped back to bytes, or (a token with a
// character outside the byte map, e.g. an added token) its own UTF-8, as HF's ByteLevel decoder.
std::string byte_level_decode(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    size_t n;
    const char32_t cp = unicode::decode_first(std::string_view(piece).substr(i), n);
    const int b = cp < byte_map().char_byte.size() ? byte_map().char_byte[cp] : -1;
    if (b < 0) return piece;
    out.push_back(static_cast<char>(b));
    i += n;
  }
  return out;
}

}  // namespace

// Loads a byte-level BPE tokenizer.json (`root`, already parsed) from `path`.
StatusOr<std::unique_ptr<Tokenizer>> load_bytelevel_tokenizer(const std::string& path,
                                                              const json& root,
                                                              int expected_vocab) {
  hf::Errors err(path);
  auto t = std::make_unique<ByteLevelBpeTokenizer>();
  KVSPLIT_RETURN_IF_ERROR(hf::parse_bpe_model(err, root, t->model_));
  const json* pre = get(root, "pre_tokenizer");
  if (!pre) return err.unsupported("pre_tokenizer", "a byte-level file needs a ByteLevel one");
  KVSPLIT_RETURN_IF_ERROR(parse_pre_tokenizer(err, *pre, "pre_tokenizer", t->steps_));
  if (t->steps_.empty() || !t->steps_.back().byte_level) {
    return err.unsupported("pre_tokenizer",
                           "a byte-level file needs a ByteLevel pre-tokenizer "
                           "(as its last step)");
  }
  if (t->model_.byte_fallback) {
    return err.unsupported("model.byte_fallback",
                           "true is not supported with a ByteLevel pre-tokenizer");
  }
  const json* dec = get(root, "decoder");
  if (type_of(dec) != "ByteLevel") {
    return err.unsupported("decoder.type", "value '" + type_of(dec) +
                                               "' is not supported with a ByteLevel "
                                               "pre-tokenizer (only ByteLevel)");
  }
  if (const json* n = get(root, "normalizer")) {
    KVSPLIT_RETURN_IF_ERROR(hf::parse_normalizer(err, *n, "normalizer", t->norm_));
  }

  // Ids: the model's vocab, then the added tokens (which may reuse a vocab id).
  std::vector<hf::AddedToken> added;
  KVSPLIT_RETURN_IF_ERROR(hf::parse_added_tokens(err, root, added, t->model_.pieces.size()));
  std::vector<std::string>& pieces = t->model_.pieces;
  t->decoded_.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) t->decoded_[i] = byte_level_decode(pieces[i]);
  std::unordered_map<std::string, int32_t> added_ids;
  for (const hf::AddedToken& a : added) {
    if (a.id >= static_cast<int32_t>(t->decoded_.size())) t->decoded_.resize(a.id + 1);
    t->decoded_[a.id] = byte_level_decode(a.content);
    added_ids.emplace(a.content, a.id);
  }
  t->special_.assign(t->decoded_.size(), false);
  for (const hf::AddedToken& a : added) t->special_[a.id] = a.special;
  if (expected_vocab > 0 && t->decoded_.size() > size_t(expected_vocab)) {
    return invalid_argument("tokenizer.json " + path + ": vocab mismatch: the tokenizer has " +
                            std::to_string(t->decoded_.size()) + " ids, the model " +
                            std::to_string(expected_vocab));
  }
  t->added_ = hf::AddedVocab(added, t->norm_);
  for (int b = 0; b < 256; ++b) {
    auto it = t->model_.vocab.find(byte_map().byte_char[b]);
    t->byte_ids_[b] = it == t->model_.vocab.end() ? -1 : it->second;
  }

  // Special tokens around a text: the post-processor's; with none, or for the tokenizer classes
  // transformers rebuilds (hf::apply_template_flags), tokenizer_config.json's add_bos_token /
  // add_eos_token (what transformers builds). BOS / EOS ids: the config's
  // bos_token / eos_token, else the post-processor's first / last token.
  auto find = [&](const std::string& s) -> int32_t {
    if (auto it = added_ids.find(s); it != added_ids.end()) return it->second;
    auto it = t->model_.vocab.find(s);
    return it == t->model_.vocab.end() ? -1 : it->second;
  };
  KVSPLIT_ASSIGN_OR_RETURN(hf::TokenizerConfig cfg, hf::read_tokenizer_config(path));
  auto config_token = [&](const std::optional<std::string>& name, const char* key,
                          int32_t& id) -> Status {
    if (!name) return ok_status();
    id = find(*name);
    if (id < 0) {
      return invalid_argument("tokenizer_config.json beside " + path + ": field " + key + ": '" +
                              *name + "' is not a token of the tokenizer");
    }
    return ok_status();
  };
  KVSPLIT_RETURN_IF_ERROR(config_token(cfg.bos_token, "bos_token", t->bos_id_));
  KVSPLIT_RETURN_IF_ERROR(config_token(cfg.eos_token, "eos_token", t->eos_id_));
  if (const json* pp = get(root, "post_processor")) {
    KVSPLIT_RETURN_IF_ERROR(
        hf::parse_post_processor(err, *pp, "post_processor", find, t->vocab_size(), t->tmpl_));
  } else {
    if (cfg.add_bos_token.value_or(false) && t->bos_id_ >= 0) t->tmpl_.prefix = {t->bos_id_};
    if (cfg.add_eos_token.value_or(false) && t->eos_id_ >= 0) t->tmpl_.suffix = {t->eos_id_};
  }
  if (t->bos_id_ < 0 && !t->tmpl_.prefix.empty()) t->bos_id_ = t->tmpl_.prefix.front();
  if (t->eos_id_ < 0 && !t->tmpl_.suffix.empty()) t->eos_id_ = t->tmpl_.suffix.back();
  hf::apply_template_flags(cfg, t->bos_id_, t->eos_id_, &t->tmpl_);
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace kvsplit::model::internal
