#include "model/pretokenize_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace kvsplit::model {
namespace {

// \s -> \p{White_Space}, \S -> \P{White_Space}; every other escape (and \Q...\E quoting) is
// copied as it is. Works inside character classes too: [^\s\p{L}] -> [^\p{White_Space}\p{L}].
std::string map_whitespace_escapes(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '\\' || i + 1 == p.size()) {
      out += p[i];
      continue;
    }
    const char e = p[i + 1];
    if (e == 's') {
      out += "\\p{White_Space}";
    } else if (e == 'S') {
      out += "\\P{White_Space}";
    } else if (e == 'Q') {  // quoted until \E (or the end)
      const size_t end = p.find("\\E", i + 2);
      const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
      out.append(p.substr(i, stop - i));
      i = stop - 2;  // the loop's ++i and the one below land after it
      if (end == std::string_view::npos) break;
    } else {
      out += p[i];
      out += e;
    }
    ++i;
  }
  return out;
}

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::compile(std::string_view pattern,
                                                                bool literal) {
  const std::string p = literal ? std::string(pattern) : map_whitespace_escapes(pattern);
  // PCRE2 refuses UCP beside LITERAL (which has no classes for it to change).
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), options,
                                   &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof(msg));
    return invalid_argument("regex '" + std::string(pattern) +
                            "': " + reinterpret_cast<const char*>(msg) + " at offset " +
                            std::to_string(offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // on failure pcre2_match interprets
  return std::unique_ptr<RegexSplitter>(new RegexSplitter(code));
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(as_code(code_)); }

Status RegexSplitter::split_isolated(std::string_view text,
                                     std::vector<std::string_view>& out) const {
  if (text.empty()) return ok_status();
  pcre2_code* code = as_code(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t last = 0;  // end of the last emitted piece
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // the rest is one piece
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return resource_exhausted(std::string("pre-tokenizer regex: ") +
                                reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match: dropped; search again one character later
      pos = start + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > last) out.push_back(text.substr(last, start - last));
    out.push_back(text.substr(start, end - start));
    last = pos = end;
  }
  if (last < text.size()) out.push_back(text.substr(last));
  pcre2_match_data_free(md);
  return ok_status();
}

}  // namespace kvsplit::model
