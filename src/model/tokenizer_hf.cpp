// HF tokenizer.json of the SentencePiece / Llama-2 kind: BPE over characters with merge ranks,
// byte fallback, unk (optionally fused), U+2581 as the space marker.
//
// Accepted layouts:
//  - Llama-2 form: normalizer Sequence[Prepend "▁", Replace " " -> "▁"], pre_tokenizer null.
//  - legacy form: normalizer null, pre_tokenizer Metaspace (add_prefix_space / prepend_scheme,
//    split).
// Byte-level BPE files (GPT-2 / Llama-3 / Qwen2: a ByteLevel pre-tokenizer, decoder or
// post-processor) return kUnimplemented: that family plugs in here later.
// Special-token text in the input ("<s>") is encoded as plain text, as run.c and SentencePiece
// do (HF tokenizers would map it to the special id).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/bpe.h"
#include "model/tokenizer.h"
#include "model/utf8.h"

namespace kvsplit::model::internal {
namespace {

using nlohmann::json;

constexpr int32_t kMaxId = 1 << 24;  // sanity bound on token ids in the file

// One normalization step applied to the whole input, in order.
struct TextOp {
  enum Kind { kPrepend, kReplace } kind;
  std::string a;  // kPrepend: the prefix; kReplace: the pattern
  std::string b;  // kReplace: the replacement
};

// The Metaspace pre-tokenizer (legacy layout).
struct Metaspace {
  bool enabled = false;
  std::string replacement = std::string(utf8::kSpaceMarker);
  bool prepend = true;  // add_prefix_space / prepend_scheme != "never"
  bool split = true;    // split into words, each starting at the replacement
};

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string_view::npos; i = j + from.size()) {
    out.append(s.substr(i, j - i)).append(to);
  }
  out.append(s.substr(i));
  return out;
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    std::string s(text);
    for (const TextOp& op : ops_) {
      if (op.kind == TextOp::kPrepend) {
        if (!s.empty()) s.insert(0, op.a);
      } else {
        s = replace_all(s, op.a, op.b);
      }
    }
    if (metaspace_.enabled) {
      const std::string& rep = metaspace_.replacement;
      s = replace_all(s, " ", rep);
      if (metaspace_.prepend && !s.empty() && s.compare(0, rep.size(), rep) != 0) s.insert(0, rep);
    }
    std::vector<int32_t> word_ids;
    auto encode_word = [&](std::string_view word) -> Status {
      if (word.empty()) return ok_status();
      word_ids.clear();
      KVSPLIT_RETURN_IF_ERROR(word_symbols(word, word_ids));
      bpe::merge_greedy(word_ids, [this](int32_t l, int32_t r) -> std::optional<bpe::Merge> {
        auto it = merges_.find(pair_key(l, r));
        if (it == merges_.end()) return std::nullopt;
        return bpe::Merge{it->second.merged, -static_cast<double>(it->second.rank)};
      });
      out.insert(out.end(), word_ids.begin(), word_ids.end());
      return ok_status();
    };
    if (metaspace_.enabled && metaspace_.split) {
      // MergedWithNext: each occurrence of the replacement starts a new word.
      const std::string& rep = metaspace_.replacement;
      size_t start = 0;
      for (size_t j = s.find(rep, 1); j != std::string::npos; j = s.find(rep, j + rep.size())) {
        KVSPLIT_RETURN_IF_ERROR(encode_word(std::string_view(s).substr(start, j - start)));
        start = j;
      }
      KVSPLIT_RETURN_IF_ERROR(encode_word(std::string_view(s).substr(start)));
    } else {
      KVSPLIT_RETURN_IF_ERROR(encode_word(s));
    }
    return out;
  }

  // HF's Llama decoder, one token at a time: "▁" -> " ", "<0xNN>" -> the byte, special tokens
  // -> "" (skip_special_tokens), and the first token of the text (prev -1 or BOS) loses one
  // leading space (the Strip decoder).
  std::string decode_token(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size() || special_[id]) return {};
    std::string text;
    if (const int b = utf8::parse_byte_piece(pieces_[id]); b >= 0 && !added_[id]) {
      text.assign(1, static_cast<char>(b));
    } else {
      text = replace_all(pieces_[id], space_marker_, " ");
    }
    if ((prev == -1 || (prev >= 0 && prev == bos_id_)) && !text.empty() && text[0] == ' ') {
      text.erase(0, 1);
    }
    return text;
  }

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  std::string_view kind() const override { return "hf-sentencepiece-bpe"; }

  // Internal to this file: filled in by parse_hf() below.
  struct MergeInfo {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }

  // Initial symbols of one word: each character's piece, else its bytes as <0xNN> tokens (byte
  // fallback), else <unk> (consecutive unks fused into one with fuse_unk).
  Status word_symbols(std::string_view word, std::vector<int32_t>& ids) const {
    if (ignore_merges_) {
      if (auto it = vocab_.find(word); it != vocab_.end()) {
        ids.push_back(it->second);
        return ok_status();
      }
    }
    Status st;
    bool prev_unk = false;
    utf8::for_each_char(word, [&](std::string_view ch) {
      if (!st.ok()) return;
      if (auto it = vocab_.find(ch); it != vocab_.end()) {
        ids.push_back(it->second);
        prev_unk = false;
        return;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : ch) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
          prev_unk = false;
          return;
        }
      }
      if (unk_id_ < 0) {
        st = invalid_argument(
            "tokenizer.json: text has a character outside the vocab and the "
            "tokenizer has neither byte fallback nor an unk token");
        return;
      }
      if (!(fuse_unk_ && prev_unk)) ids.push_back(unk_id_);
      prev_unk = true;
    });
    return st;
  }

  std::vector<std::string> pieces_;                 // [vocab] token text by id ("" for holes)
  std::vector<bool> special_;                       // [vocab] decodes to ""
  std::vector<bool> added_;                         // [vocab] an added token (never a byte token)
  bpe::PieceMap vocab_;                             // model vocab: piece -> id
  std::unordered_map<uint64_t, MergeInfo> merges_;  // (left id, right id) -> rank, merged id
  int32_t byte_ids_[256];                           // <0xNN> ids, -1 when absent
  std::vector<TextOp> ops_;
  Metaspace metaspace_;
  std::string space_marker_ = std::string(utf8::kSpaceMarker);
  int32_t unk_id_ = -1, bos_id_ = -1, eos_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

// ---- loading ----

// Error helper: "tokenizer.json <path>: field <field>: <what>".
class Errors {
 public:
  explicit Errors(const std::string& path) : path_(path) {}
  Status bad(const std::string& field, const std::string& what) const {
    return invalid_argument("tokenizer.json " + path_ + ": field " + field + ": " + what);
  }
  Status unsupported(const std::string& what) const {
    return unimplemented("tokenizer.json " + path_ + ": " + what);
  }

 private:
  const std::string& path_;
};

// obj[key] when present and not null, else nullptr.
const json* get(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string type_of(const json* j) {
  const json* t = j ? get(*j, "type") : nullptr;
  return t && t->is_string() ? t->get<std::string>() : std::string();
}

// Whether a component (or a Sequence of them, at any depth) is ByteLevel.
bool has_byte_level(const json* j) {
  if (!j) return false;
  if (type_of(j) == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "decoders", "processors", "normalizers"}) {
    if (const json* l = get(*j, list); l && l->is_array()) {
      for (const json& e : *l)
        if (has_byte_level(&e)) return true;
    }
  }
  return false;
}

Status parse_normalizer(const Errors& err, const json& n, const std::string& field,
                        std::vector<TextOp>& ops) {
  const std::string type = type_of(&n);
  if (type == "Sequence") {
    const json* list = get(n, "normalizers");
    if (!list || !list->is_array()) return err.bad(field + ".normalizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      KVSPLIT_RETURN_IF_ERROR(parse_normalizer(
          err, (*list)[i], field + ".normalizers[" + std::to_string(i) + "]", ops));
    }
    return ok_status();
  }
  if (type == "Prepend") {
    const json* p = get(n, "prepend");
    if (!p || !p->is_string()) return err.bad(field + ".prepend", "expected a string");
    ops.push_back({TextOp::kPrepend, p->get<std::string>(), {}});
    return ok_status();
  }
  if (type == "Replace") {
    const json* pat = get(n, "pattern");
    const json* str = pat ? get(*pat, "String") : nullptr;
    const json* content = get(n, "content");
    if (pat && get(*pat, "Regex"))
      return err.unsupported("normalizer Replace with a Regex pattern");
    if (!str || !str->is_string()) return err.bad(field + ".pattern.String", "expected a string");
    if (!content || !content->is_string()) return err.bad(field + ".content", "expected a string");
    ops.push_back({TextOp::kReplace, str->get<std::string>(), content->get<std::string>()});
    return ok_status();
  }
  return err.unsupported("normalizer type '" + type + "' is not supported (" + field + ")");
}

Status parse_pre_tokenizer(const Errors& err, const json& p, Metaspace& ms) {
  const std::string type = type_of(&p);
  if (type != "Metaspace") {
    return err.unsupported("pre_tokenizer type '" + type + "' is not supported");
  }
  ms.enabled = true;
  if (const json* r = get(p, "replacement")) {
    if (!r->is_string() || r->get<std::string>().empty()) {
      return err.bad("pre_tokenizer.replacement", "expected a non-empty string");
    }
    ms.replacement = r->get<std::string>();
  }
  if (const json* a = get(p, "add_prefix_space")) {
    if (!a->is_boolean()) return err.bad("pre_tokenizer.add_prefix_space", "expected a bool");
    ms.prepend = a->get<bool>();
  }
  if (const json* s = get(p, "prepend_scheme")) {
    const std::string v = s->is_string() ? s->get<std::string>() : "";
    if (v != "always" && v != "first" && v != "never") {
      return err.bad("pre_tokenizer.prepend_scheme", "expected always, first or never");
    }
    ms.prepend = v != "never";  // special tokens are plain text here: "first" == "always"
  }
  if (const json* s = get(p, "split")) {
    if (!s->is_boolean()) return err.bad("pre_tokenizer.split", "expected a bool");
    ms.split = s->get<bool>();
  }
  return ok_status();
}

// Merges come as "left right" strings or ["left", "right"] arrays.
Status parse_merges(const Errors& err, const json& merges, HfBpeTokenizer& t);

StatusOr<std::unique_ptr<Tokenizer>> parse_hf(const std::string& path, const json& root,
                                              int expected_vocab) {
  Errors err(path);
  if (!root.is_object()) return err.bad("(root)", "expected a JSON object");
  const json* model = get(root, "model");
  if (!model || !model->is_object()) return err.bad("model", "missing or not an object");
  if (has_byte_level(get(root, "pre_tokenizer")) || has_byte_level(get(root, "decoder")) ||
      has_byte_level(get(root, "post_processor"))) {
    return err.unsupported("byte-level BPE tokenizers are not supported yet");
  }
  const json* mtype = get(*model, "type");
  if (mtype && (!mtype->is_string() || mtype->get<std::string>() != "BPE")) {
    return err.unsupported("model.type '" + (mtype->is_string() ? mtype->get<std::string>() : "?") +
                           "' is not supported (only BPE)");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* v = get(*model, k); v && !(v->is_string() && v->get<std::string>().empty())) {
      return err.unsupported(std::string("model.") + k + " is not supported");
    }
  }
  if (const json* d = get(*model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0)) {
    return err.unsupported("BPE dropout is not supported");
  }

  auto t = std::make_unique<HfBpeTokenizer>();
  const json* vocab = get(*model, "vocab");
  if (!vocab || !vocab->is_object()) return err.bad("model.vocab", "missing or not an object");
  std::vector<bool> seen;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= kMaxId) {
      return err.bad("model.vocab[\"" + it.key() + "\"]", "expected an id in [0, 2^24)");
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    if (id >= static_cast<int32_t>(t->pieces_.size())) {
      t->pieces_.resize(id + 1);
      seen.resize(id + 1, false);
    }
    if (seen[id]) return err.bad("model.vocab", "id " + std::to_string(id) + " is used twice");
    seen[id] = true;
    t->pieces_[id] = it.key();
    t->vocab_.emplace(it.key(), id);
  }
  const size_t model_vocab = t->pieces_.size();
  if (model_vocab == 0) return err.bad("model.vocab", "is empty");

  if (const json* added = get(root, "added_tokens")) {
    if (!added->is_array()) return err.bad("added_tokens", "expected an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string f = "added_tokens[" + std::to_string(i) + "]";
      const json* id = get(a, "id");
      const json* content = get(a, "content");
      if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() >= kMaxId) {
        return err.bad(f + ".id", "expected an id in [0, 2^24)");
      }
      if (!content || !content->is_string()) return err.bad(f + ".content", "expected a string");
      const auto tid = static_cast<int32_t>(id->get<int64_t>());
      if (tid >= static_cast<int32_t>(t->pieces_.size())) t->pieces_.resize(tid + 1);
      t->pieces_[tid] = content->get<std::string>();
      t->special_.resize(t->pieces_.size(), false);
      t->added_.resize(t->pieces_.size(), false);
      const json* special = get(a, "special");
      t->special_[tid] = special && special->is_boolean() && special->get<bool>();
      t->added_[tid] = true;
    }
  }
  t->special_.resize(t->pieces_.size(), false);
  t->added_.resize(t->pieces_.size(), false);
  if (expected_vocab > 0 && t->pieces_.size() > size_t(expected_vocab)) {
    return invalid_argument("tokenizer.json " + path + ": vocab mismatch: the tokenizer has " +
                            std::to_string(t->pieces_.size()) + " ids, the model " +
                            std::to_string(expected_vocab));
  }

  if (const json* unk = get(*model, "unk_token")) {
    if (!unk->is_string()) return err.bad("model.unk_token", "expected a string or null");
    if (auto it = t->vocab_.find(unk->get<std::string>()); it != t->vocab_.end()) {
      t->unk_id_ = it->second;
      t->special_[t->unk_id_] = true;
    }
  }
  for (const char* k : {"byte_fallback", "fuse_unk", "ignore_merges"}) {
    const json* v = get(*model, k);
    if (v && !v->is_boolean()) return err.bad(std::string("model.") + k, "expected a bool");
    const bool b = v && v->get<bool>();
    (k[0] == 'b' ? t->byte_fallback_ : k[0] == 'f' ? t->fuse_unk_ : t->ignore_merges_) = b;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab_.find(utf8::byte_piece(static_cast<uint8_t>(b)));
    t->byte_ids_[b] = it == t->vocab_.end() ? -1 : it->second;
  }
  const json* merges = get(*model, "merges");
  if (!merges || !merges->is_array()) return err.bad("model.merges", "missing or not an array");
  KVSPLIT_RETURN_IF_ERROR(parse_merges(err, *merges, *t));

  if (const json* n = get(root, "normalizer")) {
    KVSPLIT_RETURN_IF_ERROR(parse_normalizer(err, *n, "normalizer", t->ops_));
  }
  if (const json* p = get(root, "pre_tokenizer")) {
    KVSPLIT_RETURN_IF_ERROR(parse_pre_tokenizer(err, *p, t->metaspace_));
    t->space_marker_ = t->metaspace_.replacement;
  }

  // BOS: the special token the TemplateProcessing post-processor puts first, else "<s>".
  auto find_id = [&](const std::string& s) -> int32_t {
    for (size_t i = 0; i < t->pieces_.size(); ++i) {
      if (t->pieces_[i] == s && (t->added_[i] || t->vocab_.count(s))) return int32_t(i);
    }
    return -1;
  };
  t->bos_id_ = find_id("<s>");
  if (const json* pp = get(root, "post_processor"); pp && type_of(pp) == "TemplateProcessing") {
    const json* single = get(*pp, "single");
    const json* first = single && single->is_array() && !single->empty() ? &(*single)[0] : nullptr;
    const json* st = first ? get(*first, "SpecialToken") : nullptr;
    const json* name = st ? get(*st, "id") : nullptr;
    if (name && name->is_string()) {
      const json* specials = get(*pp, "special_tokens");
      const json* entry = specials ? get(*specials, name->get<std::string>().c_str()) : nullptr;
      const json* ids = entry ? get(*entry, "ids") : nullptr;
      if (ids && ids->is_array() && ids->size() == 1 && (*ids)[0].is_number_integer() &&
          (*ids)[0].get<int64_t>() >= 0 && (*ids)[0].get<int64_t>() < int64_t(t->pieces_.size())) {
        t->bos_id_ = static_cast<int32_t>((*ids)[0].get<int64_t>());
      } else {
        const int32_t id = find_id(name->get<std::string>());
        if (id < 0) return err.bad("post_processor.single[0]", "unknown special token");
        t->bos_id_ = id;
      }
    }
  }
  t->eos_id_ = find_id("</s>");
  if (t->bos_id_ >= 0) t->special_[t->bos_id_] = true;
  if (t->eos_id_ >= 0) t->special_[t->eos_id_] = true;
  return std::unique_ptr<Tokenizer>(std::move(t));
}

Status parse_merges(const Errors& err, const json& merges, HfBpeTokenizer& t) {
  t.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    const std::string f = "model.merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return err.bad(f, "expected \"left right\" with exactly one space");
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return err.bad(f, "expected a \"left right\" string or a [left, right] array");
    }
    auto l = t.vocab_.find(left), r = t.vocab_.find(right), c = t.vocab_.find(left + right);
    if (l == t.vocab_.end() || r == t.vocab_.end() || c == t.vocab_.end()) {
      const std::string& missing = l == t.vocab_.end()   ? left
                                   : r == t.vocab_.end() ? right
                                                         : left + right;
      return err.bad(f, "'" + missing + "' is not in model.vocab");
    }
    // As in HF, a repeated pair takes the rank of its last occurrence.
    t.merges_[HfBpeTokenizer::pair_key(l->second, r->second)] = {int32_t(rank), c->second};
  }
  return ok_status();
}

}  // namespace

// `data` is the whole file. Errors name `path` and the fault.
StatusOr<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path,
                                                       std::string_view data, int expected_vocab) {
  try {
    const json root = json::parse(data);
    return parse_hf(path, root, expected_vocab);
  } catch (const json::exception& e) {
    return invalid_argument("tokenizer.json " + path + ": bad JSON: " + e.what());
  }
}

}  // namespace kvsplit::model::internal
