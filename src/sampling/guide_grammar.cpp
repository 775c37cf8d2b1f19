// GBNF parser (to the syntax tree of guide_ast.h) and the checks that make its rules safe to run
// on a stack: no left recursion, every rule able to end.
#include "sampling/guide_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <unordered_map>
#include <vector>

#include "sampling/guide_ast.h"

namespace kvsplit::sampling::grammar {
namespace {

using regex::Ast;
using regex::Ranges;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  // The tree, each rule's root (roots[0]: `root`) and names.
  Status parse() {
    skip();
    while (more()) {
      const size_t at = i_;
      const std::string_view name = ident();
      if (name.empty()) return error("expected a rule name");
      skip();
      if (s_.substr(i_, 3) != "::=") return error("expected '::=' after the rule name");
      i_ += 3;
      KVSPLIT_ASSIGN_OR_RETURN(int body, alternatives(0));
      if (more() && s_[i_] == ')') return error("unmatched ')'");
      const int r = rule(name, at);
      if (roots_[static_cast<size_t>(r)] >= 0) {
        i_ = at;
        return error(fmt::format("rule '{}' is defined twice", name));
      }
      if (num_rules_ > kMaxRules) return error(fmt::format("more than {} rules", kMaxRules));
      roots_[static_cast<size_t>(r)] = body;
      skip();
    }
    if (names_.empty())
      return invalid_argument("grammar: no rules (the text is a string of rule root)");
    for (size_t r = 0; r < names_.size(); ++r) {
      if (roots_[r] >= 0) continue;
      if (r == 0 && first_use_[0] == std::string::npos) {
        return invalid_argument("grammar: no rule 'root' (the text is a string of rule root)");
      }
      i_ = first_use_[r];
      return error(fmt::format("rule '{}' is used but never defined", names_[r]));
    }
    return ok_status();
  }

  std::vector<Ast>& ast() { return ast_; }
  const std::vector<int>& roots() const { return roots_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  bool more() const { return i_ < s_.size(); }
  // Line and column (in characters: a UTF-8 continuation byte does not count).
  Status error(std::string_view what) const {
    size_t line = 1;
    size_t col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<uint8_t>(s_[k]) & 0xC0) != 0x80) {
        ++col;
      }
    }
    return invalid_argument(fmt::format("grammar: {} at line {}, column {}", what, line, col));
  }
  // The character at `at` for a message: itself when it is whole UTF-8, its first byte in hex
  // otherwise (a message must stay UTF-8 to reach a gRPC client).
  std::string shown(size_t at) const {
    uint32_t cp = 0;
    size_t len = 0;
    if (regex::decode_code_point(s_.substr(at), &cp, &len) && cp >= 0x20 && cp != 0x7F)
      return std::string(s_.substr(at, len));
    return fmt::format("\\x{:02X}", static_cast<uint8_t>(s_[at]));
  }
  int add(Ast a) {
    ast_.push_back(std::move(a));
    return static_cast<int>(ast_.size()) - 1;
  }

  // Spaces, newlines and comments.
  void skip() {
    while (more()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (more() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  std::string_view ident() {
    const size_t start = i_;
    while (more() && name_char(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }

  // Whether a rule definition (`name ::=`) starts at i_.
  bool at_definition() {
    const size_t save = i_;
    const bool name = !ident().empty();
    skip();
    const bool def = name && s_.substr(i_, 3) == "::=";
    i_ = save;
    return def;
  }

  // The index of rule `name` (registered at its first mention, `root` is always 0).
  int rule(std::string_view name, size_t at) {
    if (names_.empty()) {
      names_.emplace_back("root");
      roots_.push_back(-1);
      first_use_.push_back(std::string::npos);
      index_.emplace("root", 0);
    }
    auto it = index_.find(std::string(name));
    if (it != index_.end()) return it->second;
    const auto r = static_cast<int>(names_.size());
    names_.emplace_back(name);
    roots_.push_back(-1);
    first_use_.push_back(at);
    index_.emplace(std::string(name), r);
    ++num_rules_;
    return r;
  }

  StatusOr<int> alternatives(int depth) {
    if (depth > regex::kMaxNesting) return error("groups nested too deep");
    Ast alt = regex::ast_node(Ast::kAlt);
    for (;;) {
      KVSPLIT_ASSIGN_OR_RETURN(int c, sequence(depth));
      alt.kids.push_back(c);
      skip();
      if (!more() || s_[i_] != '|') break;
      ++i_;
    }
    return alt.kids.size() == 1 ? alt.kids[0] : add(std::move(alt));
  }

  StatusOr<int> sequence(int depth) {
    Ast cat = regex::ast_node(Ast::kConcat);
    for (;;) {
      skip();
      if (!more() || s_[i_] == '|' || s_[i_] == ')' || at_definition()) break;
      KVSPLIT_ASSIGN_OR_RETURN(const int element_id, element(depth));
      KVSPLIT_ASSIGN_OR_RETURN(const int a, quantified(element_id));
      regex::splice(ast_, cat, a, a == element_id);
    }
    if (cat.kids.empty()) return add(regex::ast_node(Ast::kEmpty));
    return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
  }

  StatusOr<int> element(int depth) {
    const char c = s_[i_];
    if (c == '"') return literal();
    if (c == '[') {
      const size_t at = i_;
      KVSPLIT_ASSIGN_OR_RETURN(Ranges r, cls());
      if (r.empty()) {
        i_ = at;
        return error("a character class that matches nothing");
      }
      return add(regex::set_node(std::move(r)));
    }
    if (c == '.') {
      ++i_;
      return add(regex::set_node(regex::complement({})));
    }
    if (c == '(') {
      ++i_;
      KVSPLIT_ASSIGN_OR_RETURN(int inner, alternatives(depth + 1));
      if (!more() || s_[i_] != ')') return error("missing ')'");
      ++i_;
      return inner;
    }
    if (name_char(c)) {
      const size_t at = i_;
      const std::string_view name = ident();
      return add(regex::call_node(rule(name, at)));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
      return error("a quantifier with nothing to repeat");
    return error(fmt::format("unexpected character '{}'", shown(i_)));
  }

  StatusOr<int> quantified(int a) {
    for (int stacked = 0;; ++stacked) {
      const size_t save = i_;
      skip();
      if (!more()) break;
      int lo = 0;
      int hi = 0;
      const char c = s_[i_];
      if (c == '*') {
        lo = 0, hi = regex::kUnbounded, ++i_;
      } else if (c == '+') {
        lo = 1, hi = regex::kUnbounded, ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (c == '{') {
        KVSPLIT_RETURN_IF_ERROR(counted(&lo, &hi));
      } else {
        i_ = save;
        break;
      }
      if (stacked == regex::kMaxStackedQuantifiers) {
        i_ = save;
        return error(
            fmt::format("more than {} quantifiers on one element", regex::kMaxStackedQuantifiers));
      }
      a = add(regex::repeat_node(a, lo, hi));
    }
    return a;
  }

  Status number(int* v) {
    skip();
    const size_t start = i_;
    long n = 0;
    while (more() && s_[i_] >= '0' && s_[i_] <= '9') {
      n = n * 10 + (s_[i_++] - '0');
      if (n > regex::kMaxRepeat)
        return error(fmt::format("repetition count above {}", regex::kMaxRepeat));
    }
    if (i_ == start) return error("'{' must start {n}, {n,} or {n,m}");
    *v = static_cast<int>(n);
    skip();
    return ok_status();
  }

  Status counted(int* lo, int* hi) {
    ++i_;  // '{'
    KVSPLIT_RETURN_IF_ERROR(number(lo));
    *hi = *lo;
    if (more() && s_[i_] == ',') {
      ++i_;
      skip();
      *hi = regex::kUnbounded;
      if (more() && s_[i_] != '}') {
        KVSPLIT_RETURN_IF_ERROR(number(hi));
      }
    }
    if (!more() || s_[i_] != '}') return error("unterminated {n,m} quantifier");
    ++i_;
    if (*hi != regex::kUnbounded && *hi < *lo) return error("{n,m} with m < n");
    return ok_status();
  }

  StatusOr<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      const int d = regex::hex_digit(more() ? s_[i_] : '\0');
      if (d < 0) return error("\\x takes 2 hex digits, \\u 4, \\U 8");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v > regex::kMaxCodePoint) return error("a code point above U+10FFFF");
    if (v >= regex::kSurrogateLo && v <= regex::kSurrogateHi)
      return error("a surrogate code point");
    return v;
  }

  // One character of a literal or a class, escapes decoded.
  StatusOr<uint32_t> character() {
    if (!more()) return error("unterminated literal or class");
    if (s_[i_] != '\\') {
      uint32_t cp = 0;
      size_t len = 0;
      if (!regex::decode_code_point(s_.substr(i_), &cp, &len)) return error("invalid UTF-8");
      i_ += len;
      return cp;
    }
    ++i_;
    if (!more()) return error("a trailing backslash");
    const char c = s_[i_++];
    switch (c) {
      case 'n':
        return uint32_t{'\n'};
      case 'r':
        return uint32_t{'\r'};
      case 't':
        return uint32_t{'\t'};
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      default:
        break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u) && u > 0x20) return uint32_t{u};  // escaped punctuation
    --i_;
    return error(fmt::format("unsupported escape \\{}", shown(i_)));
  }

  StatusOr<int> literal() {
    ++i_;  // '"'
    Ast cat = regex::ast_node(Ast::kConcat);
    while (more() && s_[i_] != '"') {
      KVSPLIT_ASSIGN_OR_RETURN(uint32_t cp, character());
      cat.kids.push_back(add(regex::set_node({{cp, cp}})));
    }
    if (!more()) return error("unterminated string literal");
    ++i_;
    if (cat.kids.empty()) return add(regex::ast_node(Ast::kEmpty));
    return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
  }

  StatusOr<Ranges> cls() {
    ++i_;  // '['
    const bool negate = more() && s_[i_] == '^';
    if (negate) ++i_;
    Ranges r;
    while (more() && s_[i_] != ']') {
      KVSPLIT_ASSIGN_OR_RETURN(uint32_t lo, character());
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        KVSPLIT_ASSIGN_OR_RETURN(uint32_t hi, character());
        if (hi < lo) return error("a class range out of order");
        r.emplace_back(lo, hi);
      } else {
        r.emplace_back(lo, lo);
      }
    }
    if (!more()) return error("missing ']'");
    ++i_;
    r = regex::normalize(std::move(r));
    return negate ? regex::complement(r) : regex::complement(regex::complement(r));
  }

  std::string_view s_;
  size_t i_ = 0;
  std::vector<Ast> ast_;
  std::vector<std::string> names_;
  std::vector<int> roots_;
  std::vector<size_t> first_use_;
  std::unordered_map<std::string, int> index_;
  int num_rules_ = 1;
};

}  // namespace

StatusOr<regex::Nfa> compile_grammar(std::string_view text, size_t max_nodes) {
  Parser parser(text);
  KVSPLIT_RETURN_IF_ERROR(parser.parse());
  std::vector<int32_t> entries;
  KVSPLIT_ASSIGN_OR_RETURN(regex::Nfa nfa, regex::compile_ast(parser.ast(), parser.roots(),
                                                              max_nodes, "grammar", &entries));
  KVSPLIT_RETURN_IF_ERROR(
      regex::check_rules(nfa, entries, parser.names(), "grammar", "rule",
                         "write it with repetition instead (a ::= b (\"x\" b)*)"));
  return nfa;
}

}  // namespace kvsplit::sampling::grammar
