// HF tokenizer.json of the SentencePiece / Llama-2 kind: BPE over characters with merge ranks,
// byte fallback, unk (optionally fused), U+2581 as the space marker. Byte-level files (a
// ByteLevel pre-tokenizer, decoder or post-processor) are handed to tokenizer_bytelevel.cpp.
//
// Accepted layouts:
//  - Llama-2 form: normalizer Sequence[Prepend "▁", Replace " " -> "▁"], pre_tokenizer null.
//  - legacy form: normalizer null, pre_tokenizer Metaspace (add_prefix_space / prepend_scheme,
//    split).
// Added tokens are found before normalization (EncodeOptions::parse_special decides whether
// special ones count), as HF tokenizers does.
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/json_util.h"
#include "model/bpe.h"
#include "model/hf_json.h"
#include "model/tokenizer.h"
#include "model/utf8.h"

namespace kvsplit::model::internal {

StatusOr<std::unique_ptr<Tokenizer>> load_bytelevel_tokenizer(const std::string& path,
                                                              const hf::json& root,
                                                              int expected_vocab);

namespace {

using hf::get;
using hf::json;
using hf::type_of;

// The Metaspace pre-tokenizer (legacy layout).
struct Metaspace {
  bool enabled = false;
  std::string replacement = std::string(utf8::kSpaceMarker);
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;  // split into words, each starting at the replacement
};

// The decoder: what becomes of the space marker, and how many leading spaces the text loses
// (HF's Strip step after Fuse, or a Metaspace decoder's prepend scheme).
struct Decoder {
  std::string marker = std::string(utf8::kSpaceMarker);  // decodes to " "
  int strip_leading = 1;  // leading spaces dropped from the text's first token
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
  using Tokenizer::encode;
  StatusOr<std::vector<int32_t>> encode(std::string_view text,
                                        const EncodeOptions& options) const override {
    std::vector<int32_t> out;
    if (options.add_special) out = tmpl_.prefix;
    std::deque<std::string> store;
    std::vector<AddedTokenMatcher::Segment> segments;
    added_.extract_and_normalize(text, ops_, options.parse_special, store, segments);
    for (const AddedTokenMatcher::Segment& seg : segments) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
      } else {
        KVSPLIT_RETURN_IF_ERROR(encode_text(seg.text, seg.offset == 0, out));
      }
    }
    if (options.add_special) out.insert(out.end(), tmpl_.suffix.begin(), tmpl_.suffix.end());
    return out;
  }

  // HF's Llama decoder, one token at a time: "▁" -> " ", "<0xNN>" -> the byte, special tokens
  // -> "" (skip_special_tokens), and the first token of the text (prev -1 or BOS) loses the
  // leading spaces the file's decoder strips (Strip after Fuse, or a Metaspace decoder: one;
  // none without either, as transformers' add_prefix_space=False files).
  std::string decode_token(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size() || special_[id]) return {};
    std::string text;
    if (const int b = utf8::parse_byte_piece(pieces_[id]); b >= 0 && !added_id_[id]) {
      text.assign(1, static_cast<char>(b));
    } else {
      text = replace_all(pieces_[id], decoder_.marker, " ");
    }
    if (prev == -1 || (prev >= 0 && prev == bos_id_)) {
      size_t n = 0;
      while (n < text.size() && n < static_cast<size_t>(decoder_.strip_leading) && text[n] == ' ')
        ++n;
      text.erase(0, n);
    }
    return text;
  }

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  std::string_view kind() const override { return "hf-sentencepiece-bpe"; }

  // One stretch of normalized text between added tokens; `first`: it starts the input.
  Status encode_text(std::string_view text, bool first, std::vector<int32_t>& out) const {
    std::string s(text);
    if (metaspace_.enabled) {
      const std::string& rep = metaspace_.replacement;
      s = replace_all(s, " ", rep);
      const bool prepend = metaspace_.prepend == Metaspace::kAlways ||
                           (metaspace_.prepend == Metaspace::kFirst && first);
      if (prepend && !s.empty() && s.compare(0, rep.size(), rep) != 0) s.insert(0, rep);
    }
    const std::string& rep = metaspace_.replacement;
    if (!(metaspace_.enabled && metaspace_.split)) {
      if (!split_at_marker_) return encode_word(s, out);
      // No merge can join across "x▁" (see split_at_marker_), so each word merges alone:
      // the same ids, in O(word) memory instead of a heap over the whole text.
      size_t start = 0, run_end = std::string::npos;
      for (size_t j = s.find(rep); j != std::string::npos; j = s.find(rep, j + rep.size())) {
        if (j > 0 && j != run_end) {
          KVSPLIT_RETURN_IF_ERROR(encode_word(std::string_view(s).substr(start, j - start), out));
          start = j;
        }
        run_end = j + rep.size();
      }
      return encode_word(std::string_view(s).substr(start), out);
    }
    // MergedWithNext: each occurrence of the replacement starts a new word.
    size_t start = 0;
    for (size_t j = s.find(rep, 1); j != std::string::npos; j = s.find(rep, j + rep.size())) {
      KVSPLIT_RETURN_IF_ERROR(encode_word(std::string_view(s).substr(start, j - start), out));
      start = j;
    }
    return encode_word(std::string_view(s).substr(start), out);
  }

  Status encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return ok_status();
    std::vector<int32_t> ids;
    KVSPLIT_RETURN_IF_ERROR(word_symbols(word, ids));
    bpe::merge_greedy(ids, [this](int32_t l, int32_t r) { return model_.lookup(l, r); });
    out.insert(out.end(), ids.begin(), ids.end());
    return ok_status();
  }

  // Initial symbols of one word: each character's piece, else its bytes as <0xNN> tokens (byte
  // fallback), else <unk> (consecutive unks fused into one with fuse_unk).
  Status word_symbols(std::string_view word, std::vector<int32_t>& ids) const {
    if (model_.ignore_merges) {
      if (auto it = model_.vocab.find(word); it != model_.vocab.end()) {
        ids.push_back(it->second);
        return ok_status();
      }
    }
    Status st;
    bool prev_unk = false;
    utf8::for_each_char(word, [&](std::string_view ch) {
      if (!st.ok()) return;
      if (auto it = model_.vocab.find(ch); it != model_.vocab.end()) {
        ids.push_back(it->second);
        prev_unk = false;
        return;
      }
      if (model_.byte_fallback) {
        bool all = true;
        for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : ch) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
          prev_unk = false;
          return;
        }
      }
      if (model_.unk_id < 0) {
        st = invalid_argument(
            "tokenizer.json: text has a character outside the vocab and the "
            "tokenizer has neither byte fallback nor an unk token");
        return;
      }
      if (!(model_.fuse_unk && prev_unk)) ids.push_back(model_.unk_id);
      prev_unk = true;
    });
    return st;
  }

  hf::BpeModel model_;
  std::vector<std::string> pieces_;  // [vocab] token text by id, added tokens included
  std::vector<bool> special_;        // [vocab] decodes to ""
  std::vector<bool> added_id_;       // [vocab] an added token (never a byte token)
  int32_t byte_ids_[256];            // <0xNN> ids, -1 when absent
  std::vector<hf::NormOp> ops_;
  hf::AddedVocab added_;
  Metaspace metaspace_;
  Decoder decoder_;
  hf::Template tmpl_;
  int32_t bos_id_ = -1, eos_id_ = -1;
  // The text may be cut into words before each space marker that follows another character:
  // the marker is a piece, no merge (l, r) has r starting with the marker and l not ending with
  // it (so no merge joins "x" to "▁..."), and ignore_merges is off (it looks at whole words).
  bool split_at_marker_ = false;
};

bool can_split_at_marker(const hf::BpeModel& m, const std::string& marker) {
  if (m.ignore_merges || !m.vocab.count(marker)) return false;
  for (const auto& [key, merge] : m.merges) {
    const std::string& l = m.pieces[static_cast<uint32_t>(key >> 32)];
    const std::string& r = m.pieces[static_cast<uint32_t>(key)];
    if (r.starts_with(marker) && !l.ends_with(marker)) return false;
  }
  return true;
}

// ---- loading ----

// The decoders transformers writes for SentencePiece-kind files: Sequence[Replace marker -> " ",
// ByteFallback, Fuse, Strip " " (start n, stop 0)] (Strip absent with add_prefix_space=False),
// or Metaspace (its prepend scheme: "never" strips nothing, else one space). Absent: the Llama
// decoder (one space stripped). Anything else is refused rather than decoded another way.
Status parse_decoder(const hf::Errors& err, const json* d, Decoder& out) {
  if (d == nullptr) return ok_status();
  const std::string type = type_of(d);
  if (type == "Metaspace") {
    if (const json* r = get(*d, "replacement")) {
      if (!r->is_string() || r->get<std::string>().empty())
        return err.bad("decoder.replacement", "expected a non-empty string");
      out.marker = r->get<std::string>();
    }
    bool prepend = true;
    if (const json* a = get(*d, "add_prefix_space"); a && a->is_boolean()) prepend = a->get<bool>();
    if (const json* s = get(*d, "prepend_scheme"); s && s->is_string())
      prepend = s->get<std::string>() != "never";
    out.strip_leading = prepend ? 1 : 0;
    return ok_status();
  }
  if (type != "Sequence") {
    return err.unsupported("decoder.type", "decoder type '" + type + "' is not supported");
  }
  const json* steps = get(*d, "decoders");
  if (steps == nullptr || !steps->is_array())
    return err.bad("decoder.decoders", "expected an array");
  out.strip_leading = 0;
  bool fused = false;
  for (size_t i = 0; i < steps->size(); ++i) {
    const json& st = (*steps)[i];
    const std::string f = "decoder.decoders[" + std::to_string(i) + "]";
    const std::string t = type_of(&st);
    if (t == "ByteFallback") continue;
    if (t == "Fuse") {
      fused = true;
      continue;
    }
    if (t == "Replace") {
      const json* pat = get(st, "pattern");
      const json* str = pat ? get(*pat, "String") : nullptr;
      const json* content = get(st, "content");
      if (str == nullptr || !str->is_string() || str->get<std::string>().empty() ||
          content == nullptr || !content->is_string() || content->get<std::string>() != " ") {
        return err.unsupported(f, "only Replace of a string marker by \" \" is supported");
      }
      out.marker = str->get<std::string>();
      continue;
    }
    if (t == "Strip") {
      const json* content = get(st, "content");
      const json* start = get(st, "start");
      const json* stop = get(st, "stop");
      // Before Fuse, Strip cuts every token; after it, the start of the whole text.
      if (!fused || content == nullptr || !content->is_string() ||
          content->get<std::string>() != " " || start == nullptr || !start->is_number_unsigned() ||
          start->get<uint64_t>() > 64 ||
          (stop != nullptr && !(stop->is_number_integer() && stop->get<int64_t>() == 0))) {
        return err.unsupported(f, "only Strip \" \" (start n, stop 0) after Fuse is supported");
      }
      out.strip_leading = static_cast<int>(start->get<uint64_t>());
      continue;
    }
    return err.unsupported(f + ".type", "decoder step '" + t + "' is not supported");
  }
  return ok_status();
}

Status parse_pre_tokenizer(const hf::Errors& err, const json& p, Metaspace& ms) {
  const std::string type = type_of(&p);
  if (type != "Metaspace") {
    return err.unsupported("pre_tokenizer.type",
                           "pre-tokenizer type '" + type + "' is not supported");
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
    ms.prepend = a->get<bool>() ? Metaspace::kAlways : Metaspace::kNever;
  }
  if (const json* s = get(p, "prepend_scheme")) {
    const std::string v = s->is_string() ? s->get<std::string>() : "";
    if (v != "always" && v != "first" && v != "never") {
      return err.bad("pre_tokenizer.prepend_scheme",
                     "expected always, first or never, got " + hf::quoted(*s));
    }
    ms.prepend = v == "always"  ? Metaspace::kAlways
                 : v == "first" ? Metaspace::kFirst
                                : Metaspace::kNever;
  }
  if (const json* s = get(p, "split")) {
    if (!s->is_boolean()) return err.bad("pre_tokenizer.split", "expected a bool");
    ms.split = s->get<bool>();
  }
  return ok_status();
}

StatusOr<std::unique_ptr<Tokenizer>> parse_hf(const std::string& path, const json& root,
                                              int expected_vocab) {
  hf::Errors err(path);
  if (!root.is_object()) return err.bad("(root)", "expected a JSON object");
  if (hf::has_byte_level(get(root, "pre_tokenizer")) || hf::has_byte_level(get(root, "decoder")) ||
      hf::has_byte_level(get(root, "post_processor"))) {
    return load_bytelevel_tokenizer(path, root, expected_vocab);
  }
  auto t = std::make_unique<HfBpeTokenizer>();
  KVSPLIT_RETURN_IF_ERROR(hf::parse_bpe_model(err, root, t->model_));
  std::vector<hf::AddedToken> added;
  KVSPLIT_RETURN_IF_ERROR(hf::parse_added_tokens(err, root, added, t->model_.pieces.size()));
  t->pieces_ = t->model_.pieces;
  std::unordered_map<std::string, int32_t> added_ids;
  for (const hf::AddedToken& a : added) {
    if (a.id >= static_cast<int32_t>(t->pieces_.size())) t->pieces_.resize(a.id + 1);
    t->pieces_[a.id] = a.content;
    added_ids.emplace(a.content, a.id);
  }
  t->special_.assign(t->pieces_.size(), false);
  t->added_id_.assign(t->pieces_.size(), false);
  for (const hf::AddedToken& a : added) {
    t->special_[a.id] = a.special;
    t->added_id_[a.id] = true;
  }
  if (expected_vocab > 0 && t->pieces_.size() > size_t(expected_vocab)) {
    return invalid_argument("tokenizer.json " + path + ": vocab mismatch: the tokenizer has " +
                            std::to_string(t->pieces_.size()) + " ids, the model " +
                            std::to_string(expected_vocab));
  }
  if (t->model_.unk_id >= 0) t->special_[t->model_.unk_id] = true;
  for (int b = 0; b < 256; ++b) {
    auto it = t->model_.vocab.find(utf8::byte_piece(static_cast<uint8_t>(b)));
    t->byte_ids_[b] = it == t->model_.vocab.end() ? -1 : it->second;
  }
  if (const json* n = get(root, "normalizer")) {
    KVSPLIT_RETURN_IF_ERROR(hf::parse_normalizer(err, *n, "normalizer", t->ops_));
  }
  if (const json* p = get(root, "pre_tokenizer")) {
    KVSPLIT_RETURN_IF_ERROR(parse_pre_tokenizer(err, *p, t->metaspace_));
  }
  t->decoder_.marker = t->metaspace_.replacement;
  KVSPLIT_RETURN_IF_ERROR(parse_decoder(err, get(root, "decoder"), t->decoder_));
  t->added_ = hf::AddedVocab(added, t->ops_);
  t->split_at_marker_ = can_split_at_marker(t->model_, t->metaspace_.replacement);

  // BOS / EOS: tokenizer_config.json's bos_token / eos_token, else the post-processor's first
  // token / "<s>", and "</s>". What encode adds: the post-processor's template, else BOS; for
  // the tokenizer classes transformers rebuilds (hf::apply_template_flags), the config's
  // add_bos_token / add_eos_token.
  auto find = [&](const std::string& s) -> int32_t {
    if (auto it = added_ids.find(s); it != added_ids.end()) return it->second;
    auto it = t->model_.vocab.find(s);
    return it == t->model_.vocab.end() ? -1 : it->second;
  };
  KVSPLIT_ASSIGN_OR_RETURN(hf::TokenizerConfig cfg, hf::read_tokenizer_config(path));
  const json* pp = get(root, "post_processor");
  if (pp) {
    KVSPLIT_RETURN_IF_ERROR(
        hf::parse_post_processor(err, *pp, "post_processor", find, t->vocab_size(), t->tmpl_));
  }
  t->bos_id_ = !t->tmpl_.prefix.empty() ? t->tmpl_.prefix.front() : find("<s>");
  t->eos_id_ = find("</s>");
  for (auto [name, key, id] : {std::tuple{&cfg.bos_token, "bos_token", &t->bos_id_},
                               std::tuple{&cfg.eos_token, "eos_token", &t->eos_id_}}) {
    if (!*name) continue;
    *id = find(**name);
    if (*id < 0) {
      return invalid_argument("tokenizer_config.json beside " + path + ": field " + key + ": '" +
                              **name + "' is not a token of the tokenizer");
    }
  }
  if (!pp && t->bos_id_ >= 0) t->tmpl_.prefix = {t->bos_id_};
  hf::apply_template_flags(cfg, t->bos_id_, t->eos_id_, &t->tmpl_);
  if (t->bos_id_ >= 0) t->special_[t->bos_id_] = true;
  if (t->eos_id_ >= 0) t->special_[t->eos_id_] = true;
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace

// `data` is the whole file. Errors name `path` and the fault.
StatusOr<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& path,
                                                       std::string_view data, int expected_vocab) {
  if (!common::json_depth_within(data, common::kMaxJsonDepth)) {
    return invalid_argument("tokenizer.json " + path + ": bad JSON: nested deeper than " +
                            std::to_string(common::kMaxJsonDepth) + " levels");
  }
  try {
    const json root = json::parse(data);
    return parse_hf(path, root, expected_vocab);
  } catch (const json::exception& e) {
    return invalid_argument("tokenizer.json " + path + ": bad JSON: " + e.what());
  }
}

}  // namespace kvsplit::model::internal
