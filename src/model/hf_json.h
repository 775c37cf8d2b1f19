// Reading the parts of an HF tokenizer.json that both tokenizer.json families share (the
// SentencePiece / Llama-2 kind and byte-level BPE): the BPE model (vocab, merges, options), the
// added tokens, the normalizer, the post-processor, and tokenizer_config.json beside the file.
// Every error names the file, the field and the value.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvsplit/status.h"
#include "model/added_tokens.h"
#include "model/bpe.h"

namespace kvsplit::model::hf {

using nlohmann::json;

inline constexpr int32_t kMaxId = 1 << 24;  // sanity bound on token ids in a file

// Error helper: "tokenizer.json <path>: field <field>: <what>".
class Errors {
 public:
  explicit Errors(std::string path) : path_(std::move(path)) {}
  // A malformed file: kInvalidArgument.
  Status bad(const std::string& field, const std::string& what) const;
  // A valid file using something not supported: kUnimplemented.
  Status unsupported(const std::string& field, const std::string& what) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// obj[key] when present and not null, else nullptr.
const json* get(const json& obj, const char* key);
// j["type"] when it is a string, else "".
std::string type_of(const json* j);
// `v` as a short quoted string for messages ('abc', or the JSON text of a non-string).
std::string quoted(const json& v);
// Whether a component (or a Sequence of them, at any depth) is ByteLevel.
bool has_byte_level(const json* j);

// model: {"type": "BPE", ...}.
struct BpeModel {
  std::vector<std::string> pieces;  // [vocab] token text by id ("" for holes)
  bpe::PieceMap vocab;              // piece -> id
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left, right) -> rank, merged id
  int32_t unk_id = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;

  static uint64_t pair_key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  // The merge of (l, r) as a bpe::Merge (lower rank first), or nullopt.
  std::optional<bpe::Merge> lookup(int32_t l, int32_t r) const {
    auto it = merges.find(pair_key(l, r));
    if (it == merges.end()) return std::nullopt;
    return bpe::Merge{it->second.merged, -static_cast<double>(it->second.rank)};
  }
};
// Reads root["model"]: type BPE (or absent), vocab (ids in [0, 2^24), none used twice), merges
// ("left right" strings or [left, right] arrays; parts and concatenation in the vocab; a repeated
// pair keeps its last rank, as HF), unk_token, byte_fallback, fuse_unk, ignore_merges. dropout,
// continuing_subword_prefix and end_of_word_suffix are kUnimplemented.
Status parse_bpe_model(const Errors& err, const json& root, BpeModel& model);

// One entry of added_tokens.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = true;  // matched in the normalized text (HF default: !special)
  bool lstrip = false, rstrip = false, single_word = false;
};
// Reads root["added_tokens"] (absent = none). Ids in [0, 2^24), no id or content twice, content
// not empty.
// `vocab_ids`: the model vocabulary's id count. Ids must be nearly dense (below
// kDenseIdFactor x (vocab_ids + added tokens) + kDenseIdSlack): a few bytes of JSON must not make
// the loader allocate tables for 2^24 ids.
Status parse_added_tokens(const Errors& err, const json& root, std::vector<AddedToken>& out,
                          size_t vocab_ids);
inline constexpr int64_t kDenseIdFactor = 2;
inline constexpr int64_t kDenseIdSlack = 1024;

// One normalization step, applied to the whole text in order.
struct NormOp {
  enum Kind { kPrepend, kReplace, kNfc } kind;
  std::string a;  // kPrepend: the prefix; kReplace: the pattern
  std::string b;  // kReplace: the replacement
};
// normalizer: Prepend, Replace with a String pattern, NFC, and Sequence of these; anything else
// is kUnimplemented naming the field and the type.
Status parse_normalizer(const Errors& err, const json& n, const std::string& field,
                        std::vector<NormOp>& ops);
// Applies `ops` (Prepend does nothing on empty text, as HF).
std::string normalize(const std::vector<NormOp>& ops, std::string_view text);

// The added tokens of a file, ready to find in a text (HF AddedVocabulary).
class AddedVocab {
 public:
  AddedVocab() = default;
  // Tokens with normalized: false are matched in the raw text, the others (their content
  // normalized with `ops`, as HF does) in each normalized stretch between those.
  AddedVocab(const std::vector<AddedToken>& tokens, const std::vector<NormOp>& ops);
  // HF extract_and_normalize: appends to `out` the added tokens of `text` (id >= 0) and the
  // normalized stretches of plain text between them (id -1), in order. Normalized text lives in
  // `store` (Segment::text points into it or into `text`). Plain-text segments have `offset` 0
  // only when they start the text (Metaspace's prepend_scheme "first").
  void extract_and_normalize(std::string_view text, const std::vector<NormOp>& ops,
                             bool parse_special, std::deque<std::string>& store,
                             std::vector<AddedTokenMatcher::Segment>& out) const;

 private:
  AddedTokenMatcher raw_, normalized_;
};

// What the post-processor puts around a single sequence.
struct Template {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};
// post_processor: TemplateProcessing (its `single` template), RobertaProcessing and
// BertProcessing (cls A sep), ByteLevel (adds nothing), and Sequence of these. `find` maps a
// token's text to its id (-1 when absent); `vocab_size` bounds the ids.
Status parse_post_processor(const Errors& err, const json& pp, const std::string& field,
                            const std::function<int32_t(const std::string&)>& find, int vocab_size,
                            Template& out);

// tokenizer_config.json beside a tokenizer.json (transformers' settings).
struct TokenizerConfig {
  bool present = false;
  std::optional<bool> add_bos_token, add_eos_token;
  std::optional<std::string> bos_token, eos_token;  // absent or null: nullopt
  std::optional<std::string> tokenizer_class;
  // transformers' Llama, CodeLlama and Gemma tokenizers rebuild the post-processor from
  // add_bos_token (default true) and add_eos_token (default false) when they load, whatever
  // tokenizer.json holds: true for those classes.
  bool template_from_flags() const;
};
// For a config whose template_from_flags(): sets `tmpl` to BOS and/or EOS as its flags say (an id
// < 0 adds nothing). Otherwise leaves it.
void apply_template_flags(const TokenizerConfig& cfg, int32_t bos, int32_t eos, Template* tmpl);
// Reads the tokenizer_config.json in the directory of `tokenizer_path`; a missing file gives
// present == false. Bad JSON or mistyped fields are kInvalidArgument naming that file.
StatusOr<TokenizerConfig> read_tokenizer_config(const std::string& tokenizer_path);

}  // namespace kvsplit::model::hf
