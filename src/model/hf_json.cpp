#include "model/hf_json.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "common/json_util.h"
#include "model/unicode.h"

namespace kvsplit::model::hf {

Status Errors::bad(const std::string& field, const std::string& what) const {
  return invalid_argument("tokenizer.json " + path_ + ": field " + field + ": " + what);
}

Status Errors::unsupported(const std::string& field, const std::string& what) const {
  return unimplemented("tokenizer.json " + path_ + ": field " + field + ": " + what);
}

const json* get(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string type_of(const json* j) {
  const json* t = j ? get(*j, "type") : nullptr;
  return t && t->is_string() ? t->get<std::string>() : std::string();
}

std::string quoted(const json& v) {
  std::string s =
      v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return "'" + s + "'";
}

bool has_byte_level(const json* j) {
  if (!j) return false;
  if (type_of(j) == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "decoders", "processors", "normalizers"}) {
    if (const json* l = get(*j, list); l && l->is_array()) {
      for (const json& e : *l) {
        if (has_byte_level(&e)) return true;
      }
    }
  }
  return false;
}

namespace {

Status parse_merges(const Errors& err, const json& merges, BpeModel& m) {
  m.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& e = merges[rank];
    const std::string f = "model.merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return err.bad(f, "expected \"left right\" with exactly one space, got " + quoted(e));
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      return err.bad(f,
                     "expected a \"left right\" string or a [left, right] array, got " + quoted(e));
    }
    auto l = m.vocab.find(left), r = m.vocab.find(right), c = m.vocab.find(left + right);
    if (l == m.vocab.end() || r == m.vocab.end() || c == m.vocab.end()) {
      const std::string& missing = l == m.vocab.end()   ? left
                                   : r == m.vocab.end() ? right
                                                        : left + right;
      return err.bad(f, "'" + missing + "' is not in model.vocab");
    }
    // As in HF, a repeated pair takes the rank of its last occurrence.
    m.merges[BpeModel::pair_key(l->second, r->second)] = {int32_t(rank), c->second};
  }
  return ok_status();
}

}  // namespace

Status parse_bpe_model(const Errors& err, const json& root, BpeModel& m) {
  if (!root.is_object()) return err.bad("(root)", "expected a JSON object");
  const json* model = get(root, "model");
  if (!model || !model->is_object()) return err.bad("model", "missing or not an object");
  if (const json* t = get(*model, "type"); t && !(t->is_string() && *t == "BPE")) {
    return err.unsupported("model.type", "value " + quoted(*t) + " is not supported (only BPE)");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* v = get(*model, k); v && !(v->is_string() && v->get<std::string>().empty())) {
      return err.unsupported(std::string("model.") + k,
                             "value " + quoted(*v) + " is not supported");
    }
  }
  if (const json* d = get(*model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0)) {
    return err.unsupported("model.dropout", "BPE dropout " + quoted(*d) + " is not supported");
  }

  const json* vocab = get(*model, "vocab");
  if (!vocab || !vocab->is_object()) return err.bad("model.vocab", "missing or not an object");
  std::vector<bool> seen;
  m.vocab.reserve(vocab->size());
  const int64_t dense_bound = kDenseIdFactor * static_cast<int64_t>(vocab->size()) + kDenseIdSlack;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const json& v = it.value();
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId) {
      return err.bad("model.vocab[\"" + it.key() + "\"]",
                     "expected an id in [0, 2^24), got " + quoted(v));
    }
    if (v.get<int64_t>() >= dense_bound) {
      return err.bad("model.vocab[\"" + it.key() + "\"]",
                     fmt::format("id {} is far beyond the vocabulary's {} entries (ids must be "
                                 "dense: below {})",
                                 v.get<int64_t>(), vocab->size(), dense_bound));
    }
    const auto id = static_cast<int32_t>(v.get<int64_t>());
    if (id >= static_cast<int32_t>(m.pieces.size())) {
      m.pieces.resize(id + 1);
      seen.resize(id + 1, false);
    }
    if (seen[id]) {
      return err.bad("model.vocab", "id " + std::to_string(id) + " is used twice ('" +
                                        m.pieces[id] + "' and '" + it.key() + "')");
    }
    seen[id] = true;
    m.pieces[id] = it.key();
    m.vocab.emplace(it.key(), id);
  }
  if (m.pieces.empty()) return err.bad("model.vocab", "is empty");

  if (const json* unk = get(*model, "unk_token")) {
    if (!unk->is_string()) return err.bad("model.unk_token", "expected a string or null");
    if (auto it = m.vocab.find(unk->get<std::string>()); it != m.vocab.end()) {
      m.unk_id = it->second;
    }
  }
  for (const char* k : {"byte_fallback", "fuse_unk", "ignore_merges"}) {
    const json* v = get(*model, k);
    if (v && !v->is_boolean()) {
      return err.bad(std::string("model.") + k, "expected a bool, got " + quoted(*v));
    }
    const bool b = v && v->get<bool>();
    (k[0] == 'b' ? m.byte_fallback : k[0] == 'f' ? m.fuse_unk : m.ignore_merges) = b;
  }
  const json* merges = get(*model, "merges");
  if (!merges || !merges->is_array()) return err.bad("model.merges", "missing or not an array");
  return parse_merges(err, *merges, m);
}

Status parse_added_tokens(const Errors& err, const json& root, std::vector<AddedToken>& out,
                          size_t vocab_ids) {
  const json* added = get(root, "added_tokens");
  if (!added) return ok_status();
  if (!added->is_array()) return err.bad("added_tokens", "expected an array");
  const int64_t dense_bound =
      kDenseIdFactor * static_cast<int64_t>(vocab_ids + added->size()) + kDenseIdSlack;
  std::unordered_set<int32_t> ids;
  std::unordered_set<std::string> contents;
  for (size_t i = 0; i < added->size(); ++i) {
    const json& a = (*added)[i];
    const std::string f = "added_tokens[" + std::to_string(i) + "]";
    const json* id = get(a, "id");
    const json* content = get(a, "content");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= kMaxId) {
      return err.bad(f + ".id", "expected an id in [0, 2^24), got " + (id ? quoted(*id) : "none"));
    }
    if (!content || !content->is_string() || content->get<std::string>().empty()) {
      return err.bad(f + ".content", "expected a non-empty string");
    }
    if (id->get<int64_t>() >= dense_bound) {
      return err.bad(f + ".id",
                     fmt::format("id {} is far beyond the {} vocabulary and added ids "
                                 "(ids must be dense: below {})",
                                 id->get<int64_t>(), vocab_ids + added->size(), dense_bound));
    }
    AddedToken t;
    t.id = static_cast<int32_t>(id->get<int64_t>());
    t.content = content->get<std::string>();
    if (!ids.insert(t.id).second) {
      return err.bad(f + ".id", "id " + std::to_string(t.id) + " is used twice");
    }
    if (!contents.insert(t.content).second) {
      return err.bad(f + ".content", "'" + t.content + "' is used twice");
    }
    bool* flags[] = {&t.special, &t.normalized, &t.lstrip, &t.rstrip, &t.single_word};
    const char* names[] = {"special", "normalized", "lstrip", "rstrip", "single_word"};
    for (int k = 0; k < 5; ++k) {
      const json* v = get(a, names[k]);
      if (v && !v->is_boolean()) {
        return err.bad(f + "." + names[k], "expected a bool, got " + quoted(*v));
      }
      if (k == 1 && !v) *flags[k] = !t.special;  // HF: special tokens are not normalized
      if (v) *flags[k] = v->get<bool>();
    }
    out.push_back(std::move(t));
  }
  return ok_status();
}

Status parse_normalizer(const Errors& err, const json& n, const std::string& field,
                        std::vector<NormOp>& ops) {
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
    ops.push_back({NormOp::kPrepend, p->get<std::string>(), {}});
    return ok_status();
  }
  if (type == "Replace") {
    const json* pat = get(n, "pattern");
    const json* str = pat ? get(*pat, "String") : nullptr;
    const json* content = get(n, "content");
    if (pat && get(*pat, "Regex")) {
      return err.unsupported(field + ".pattern.Regex",
                             "a Replace normalizer with a Regex pattern "
                             "is not supported");
    }
    if (!str || !str->is_string()) return err.bad(field + ".pattern.String", "expected a string");
    if (!content || !content->is_string()) return err.bad(field + ".content", "expected a string");
    ops.push_back({NormOp::kReplace, str->get<std::string>(), content->get<std::string>()});
    return ok_status();
  }
  if (type == "NFC") {
    ops.push_back({NormOp::kNfc, {}, {}});
    return ok_status();
  }
  return err.unsupported(field + ".type", "normalizer type '" + type + "' is not supported");
}

std::string normalize(const std::vector<NormOp>& ops, std::string_view text) {
  std::string s(text);
  for (const NormOp& op : ops) {
    switch (op.kind) {
      case NormOp::kPrepend:
        if (!s.empty()) s.insert(0, op.a);
        break;
      case NormOp::kReplace: {
        if (op.a.empty()) break;
        std::string out;
        out.reserve(s.size() + s.size() / 4);
        size_t i = 0;
        for (size_t j; (j = s.find(op.a, i)) != std::string::npos; i = j + op.a.size()) {
          out.append(s, i, j - i).append(op.b);
        }
        out.append(s, i);
        s = std::move(out);
        break;
      }
      case NormOp::kNfc:
        s = unicode::nfc(s);
        break;
    }
  }
  return s;
}

AddedVocab::AddedVocab(const std::vector<AddedToken>& tokens, const std::vector<NormOp>& ops) {
  std::vector<AddedTokenMatcher::Token> raw, normalized;
  for (const AddedToken& t : tokens) {
    AddedTokenMatcher::Token m{t.id, t.content, t.special, t.lstrip, t.rstrip, t.single_word};
    if (t.normalized) {
      m.pattern = normalize(ops, t.content);
      normalized.push_back(std::move(m));
    } else {
      raw.push_back(std::move(m));
    }
  }
  raw_ = AddedTokenMatcher(std::move(raw));
  normalized_ = AddedTokenMatcher(std::move(normalized));
}

void AddedVocab::extract_and_normalize(std::string_view text, const std::vector<NormOp>& ops,
                                       bool parse_special, std::deque<std::string>& store,
                                       std::vector<AddedTokenMatcher::Segment>& out) const {
  std::vector<AddedTokenMatcher::Segment> first;
  if (raw_.empty()) {
    if (!text.empty()) first.push_back({text, -1, 0});
  } else {
    raw_.split(text, parse_special, first);
  }
  for (const AddedTokenMatcher::Segment& s : first) {
    if (s.id >= 0) {
      out.push_back(s);
      continue;
    }
    std::string_view norm = s.text;
    if (!ops.empty()) norm = store.emplace_back(normalize(ops, s.text));
    if (norm.empty()) continue;
    if (normalized_.empty()) {
      out.push_back({norm, -1, s.offset});
      continue;
    }
    const size_t n = out.size();
    normalized_.split(norm, parse_special, out);
    for (size_t i = n; i < out.size(); ++i) out[i].offset += s.offset;
  }
}

namespace {

// A [token, id] pair of RobertaProcessing / BertProcessing.
Status parse_token_pair(const Errors& err, const json& pp, const std::string& field,
                        const char* key, int vocab_size, int32_t& id) {
  const json* v = get(pp, key);
  const std::string f = field + "." + key;
  if (!v || !v->is_array() || v->size() != 2 || !(*v)[0].is_string() ||
      !(*v)[1].is_number_integer()) {
    return err.bad(f, "expected a [token, id] pair");
  }
  const int64_t i = (*v)[1].get<int64_t>();
  if (i < 0 || i >= vocab_size) return err.bad(f, "id " + std::to_string(i) + " is out of range");
  id = static_cast<int32_t>(i);
  return ok_status();
}

Status parse_template(const Errors& err, const json& pp, const std::string& field,
                      const std::function<int32_t(const std::string&)>& find, int vocab_size,
                      Template& out) {
  const json* single = get(pp, "single");
  if (!single || !single->is_array()) return err.bad(field + ".single", "expected an array");
  const json* specials = get(pp, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string f = field + ".single[" + std::to_string(i) + "]";
    if (get(item, "Sequence")) {
      seen_sequence = true;
      continue;
    }
    const json* st = get(item, "SpecialToken");
    const json* name = st ? get(*st, "id") : nullptr;
    if (!name || !name->is_string()) {
      return err.bad(f, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    }
    std::vector<int32_t>& dst = seen_sequence ? out.suffix : out.prefix;
    const json* entry = specials ? get(*specials, name->get<std::string>().c_str()) : nullptr;
    const json* ids = entry ? get(*entry, "ids") : nullptr;
    if (!ids) {  // not listed: look the text up (older files)
      const int32_t id = find(name->get<std::string>());
      if (id < 0) return err.bad(f, "unknown special token " + quoted(*name));
      dst.push_back(id);
      continue;
    }
    if (!ids->is_array() || ids->empty()) {
      return err.bad(field + ".special_tokens." + name->get<std::string>() + ".ids",
                     "expected a non-empty array of ids");
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
        return err.bad(field + ".special_tokens." + name->get<std::string>() + ".ids",
                       "id " + quoted(id) + " is out of range");
      }
      dst.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) return err.bad(field + ".single", "has no {\"Sequence\": ...} item");
  return ok_status();
}

}  // namespace

Status parse_post_processor(const Errors& err, const json& pp, const std::string& field,
                            const std::function<int32_t(const std::string&)>& find, int vocab_size,
                            Template& out) {
  const std::string type = type_of(&pp);
  if (type == "ByteLevel") return ok_status();
  if (type == "TemplateProcessing") return parse_template(err, pp, field, find, vocab_size, out);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    int32_t cls, sep;
    KVSPLIT_RETURN_IF_ERROR(parse_token_pair(err, pp, field, "cls", vocab_size, cls));
    KVSPLIT_RETURN_IF_ERROR(parse_token_pair(err, pp, field, "sep", vocab_size, sep));
    out.prefix.insert(out.prefix.begin(), cls);
    out.suffix.push_back(sep);
    return ok_status();
  }
  if (type == "Sequence") {
    const json* list = get(pp, "processors");
    if (!list || !list->is_array()) return err.bad(field + ".processors", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      // Each processor wraps what the previous ones produced.
      Template t;
      KVSPLIT_RETURN_IF_ERROR(parse_post_processor(
          err, (*list)[i], field + ".processors[" + std::to_string(i) + "]", find, vocab_size, t));
      out.prefix.insert(out.prefix.begin(), t.prefix.begin(), t.prefix.end());
      out.suffix.insert(out.suffix.end(), t.suffix.begin(), t.suffix.end());
    }
    return ok_status();
  }
  return err.unsupported(field + ".type", "post-processor type '" + type + "' is not supported");
}

StatusOr<TokenizerConfig> read_tokenizer_config(const std::string& tokenizer_path) {
  const std::string path =
      (std::filesystem::path(tokenizer_path).parent_path() / "tokenizer_config.json").string();
  TokenizerConfig c;
  auto bad = [&](const std::string& what) {
    return invalid_argument("tokenizer_config.json " + path + " (read for " + tokenizer_path +
                            "): " + what);
  };
  // A regular file of bounded size, parsed strictly (as config.json): a FIFO here used to hang
  // the load and /dev/zero to grow without bound. Absent is fine.
  auto read = common::read_json_file(path);
  if (!read.ok() && read.status().code() == StatusCode::kNotFound) return c;
  if (!read.ok()) return bad(read.status().message());
  const json root = std::move(*read);
  if (!root.is_object()) return bad("expected a JSON object");
  c.present = true;
  for (const char* k : {"add_bos_token", "add_eos_token"}) {
    if (const json* v = get(root, k)) {
      if (!v->is_boolean()) return bad(std::string("field ") + k + ": expected a bool");
      (k[4] == 'b' ? c.add_bos_token : c.add_eos_token) = v->get<bool>();
    }
  }
  if (const json* v = get(root, "tokenizer_class")) {
    if (!v->is_string()) return bad("field tokenizer_class: expected a string");
    c.tokenizer_class = v->get<std::string>();
  }
  for (const char* k : {"bos_token", "eos_token"}) {
    const json* v = get(root, k);
    if (!v) continue;
    // A string, or an AddedToken object {"content": ..., ...}.
    const json* s = v->is_object() ? get(*v, "content") : v;
    if (!s || !s->is_string()) {
      return bad(std::string("field ") + k + ": expected a string or {\"content\": string}");
    }
    (k[0] == 'b' ? c.bos_token : c.eos_token) = s->get<std::string>();
  }
  return c;
}

bool TokenizerConfig::template_from_flags() const {
  if (!tokenizer_class) return false;
  for (const char* c : {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                        "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"}) {
    if (*tokenizer_class == c) return true;
  }
  return false;
}

void apply_template_flags(const TokenizerConfig& cfg, int32_t bos, int32_t eos, Template* tmpl) {
  if (!cfg.template_from_flags()) return;
  tmpl->prefix.clear();
  tmpl->suffix.clear();
  if (cfg.add_bos_token.value_or(true) && bos >= 0) tmpl->prefix = {bos};
  if (cfg.add_eos_token.value_or(false) && eos >= 0) tmpl->suffix = {eos};
}

}  // namespace kvsplit::model::hf
