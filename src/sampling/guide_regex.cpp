// Regex parser (to the syntax tree of guide_ast.h, which compiles it to a byte-level NFA).
#include "sampling/guide_regex.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "sampling/guide_ast.h"

namespace kvsplit::sampling::regex {
namespace {

Ranges digit() { return {{'0', '9'}}; }
Ranges word() { return normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
Ranges space() { return normalize({{'\t', '\r'}, {' ', ' '}}); }  // \t \n \v \f \r and space

class Parser {
 public:
  // Appends to `ast`. num_rules > 0: `(?&N)` calls rule N, for 1 <= N < num_rules.
  Parser(std::string_view p, std::vector<Ast>& ast, int num_rules = 0)
      : p_(p), ast_(ast), num_rules_(num_rules) {}

  Status parse(int* root) {
    if (!p_.empty() && p_[0] == '^') ++i_;  // the whole text is matched anyway
    end_ = p_.size();
    if (end_ > i_ && p_[end_ - 1] == '$' && !escaped(end_ - 1)) --end_;
    KVSPLIT_ASSIGN_OR_RETURN(*root, alternation(0));
    if (i_ != end_) return error(p_[i_] == ')' ? "unmatched ')'" : "unexpected character");
    return ok_status();
  }

 private:
  // Whether the byte at `pos` is preceded by an odd number of backslashes.
  bool escaped(size_t pos) const {
    size_t n = 0;
    while (pos > n && p_[pos - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  Status error(std::string_view what) const {
    return invalid_argument(fmt::format("regex: {} at offset {}", what, i_));
  }
  bool more() const { return i_ < end_; }
  int add(Ast a) {
    ast_.push_back(std::move(a));
    return static_cast<int>(ast_.size()) - 1;
  }

  StatusOr<int> alternation(int depth) {
    if (depth > kMaxNesting) return error("groups nested too deep");
    Ast alt = ast_node(Ast::kAlt);
    for (;;) {
      KVSPLIT_ASSIGN_OR_RETURN(int c, concatenation(depth));
      alt.kids.push_back(c);
      if (!more() || p_[i_] != '|') break;
      ++i_;
    }
    return alt.kids.size() == 1 ? alt.kids[0] : add(std::move(alt));
  }

  StatusOr<int> concatenation(int depth) {
    Ast cat = ast_node(Ast::kConcat);
    while (more() && p_[i_] != '|' && p_[i_] != ')') {
      KVSPLIT_ASSIGN_OR_RETURN(const int atom_id, atom(depth));
      KVSPLIT_ASSIGN_OR_RETURN(const int a, quantified(atom_id));
      splice(ast_, cat, a, a == atom_id);
    }
    if (cat.kids.empty()) return add(ast_node(Ast::kEmpty));
    return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
  }

  StatusOr<int> quantified(int a) {
    for (int stacked = 0; more(); ++stacked) {
      int lo = 0;
      int hi = 0;
      const char c = p_[i_];
      if (c == '*') {
        lo = 0, hi = kUnbounded, ++i_;
      } else if (c == '+') {
        lo = 1, hi = kUnbounded, ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (c == '{') {
        KVSPLIT_RETURN_IF_ERROR(counted(&lo, &hi));
      } else {
        return a;
      }
      if (stacked == kMaxStackedQuantifiers)
        return error(
            fmt::format("more than {} quantifiers on one element", kMaxStackedQuantifiers));
      if (more() && p_[i_] == '?') ++i_;  // lazy: the same language
      if (more() && p_[i_] == '+') return error("possessive quantifiers are not supported");
      a = add(repeat_node(a, lo, hi));
    }
    return a;
  }

  Status number(int* v) {
    const size_t start = i_;
    long n = 0;
    while (more() && p_[i_] >= '0' && p_[i_] <= '9') {
      n = n * 10 + (p_[i_++] - '0');
      if (n > kMaxRepeat) return error(fmt::format("repetition count above {}", kMaxRepeat));
    }
    if (i_ == start) return error("'{' must start {n}, {n,} or {n,m} (escape a literal as \\{)");
    *v = static_cast<int>(n);
    return ok_status();
  }

  Status counted(int* lo, int* hi) {
    ++i_;  // '{'
    KVSPLIT_RETURN_IF_ERROR(number(lo));
    *hi = *lo;
    if (more() && p_[i_] == ',') {
      ++i_;
      *hi = kUnbounded;
      if (more() && p_[i_] != '}') {
        KVSPLIT_RETURN_IF_ERROR(number(hi));
      }
    }
    if (!more() || p_[i_] != '}') return error("unterminated {n,m} quantifier");
    ++i_;
    if (*hi != kUnbounded && *hi < *lo) return error("{n,m} with m < n");
    return ok_status();
  }

  StatusOr<int> atom(int depth) {
    const char c = p_[i_];
    switch (c) {
      case '(':
        return group(depth);
      case '[':
        return set_atom(cls());
      case '.':
        ++i_;
        return add(set_node(complement({{'\n', '\n'}})));
      case '\\':
        return set_atom(escape(false));
      case '*':
      case '+':
      case '?':
      case '{':
        return error("quantifier without anything to repeat");
      case '^':
      case '$':
        return error("anchors are only accepted at the start (^) and end ($)");
      default:
        return set_atom(literal());
    }
  }

  StatusOr<int> set_atom(StatusOr<Ranges> r) {
    if (!r.ok()) return r.status();
    if (r->empty()) return error("a character class that matches nothing");
    return add(set_node(std::move(*r)));
  }

  StatusOr<int> group(int depth) {
    ++i_;  // '('
    if (p_.substr(i_, 2) == "?:") {
      i_ += 2;
    } else if (p_.substr(i_, 3) == "?P<" || p_.substr(i_, 2) == "?<") {
      if (p_.substr(i_, 3) == "?<=" || p_.substr(i_, 3) == "?<!")
        return error("lookbehind is not supported");
      const size_t close = p_.find('>', i_);
      if (close == std::string_view::npos || close >= end_) return error("unterminated group name");
      i_ = close + 1;
    } else if (num_rules_ > 0 && p_.substr(i_, 2) == "?&") {
      return call(i_ + 2);
    } else if (more() && p_[i_] == '?') {
      return error("this group kind (lookaround, flags) is not supported");
    }
    KVSPLIT_ASSIGN_OR_RETURN(int inner, alternation(depth + 1));
    if (!more() || p_[i_] != ')') return error("missing ')'");
    ++i_;
    return inner;
  }

  // `(?&N)` from the N: a call of rule N.
  StatusOr<int> call(size_t at) {
    i_ = at;
    long n = 0;
    while (more() && p_[i_] >= '0' && p_[i_] <= '9' && n < num_rules_)
      n = n * 10 + (p_[i_++] - '0');
    if (i_ == at || n < 1 || n >= num_rules_ || !more() || p_[i_] != ')')
      return error(fmt::format("(?&N) needs a rule number from 1 to {}", num_rules_ - 1));
    ++i_;
    return add(call_node(static_cast<int>(n)));
  }

  StatusOr<uint32_t> code_point() {
    uint32_t cp = 0;
    size_t len = 0;
    if (!decode_code_point(p_.substr(i_, end_ - i_), &cp, &len)) return error("invalid UTF-8");
    i_ += len;
    return cp;
  }

  StatusOr<Ranges> literal() {
    KVSPLIT_ASSIGN_OR_RETURN(uint32_t cp, code_point());
    return Ranges{{cp, cp}};
  }

  StatusOr<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      const int d = hex_digit(more() ? p_[i_] : '\0');
      if (d < 0) return error(fmt::format("\\x takes 2 hex digits, \\u 4"));
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v >= kSurrogateLo && v <= kSurrogateHi) return error("a surrogate code point");
    return v;
  }

  // After a backslash. In a class, the set escapes are accepted too (they join the class).
  StatusOr<Ranges> escape(bool in_class) {
    ++i_;  // '\\'
    if (!more()) return error("a trailing backslash");
    const char c = p_[i_++];
    auto one = [](uint32_t cp) { return Ranges{{cp, cp}}; };
    switch (c) {
      case 'd':
        return digit();
      case 'D':
        return complement(digit());
      case 'w':
        return word();
      case 'W':
        return complement(word());
      case 's':
        return space();
      case 'S':
        return complement(space());
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0':
        // PCRE and ECMAScript read \012 as octal or a backreference: refused, not read as NUL.
        if (more() && p_[i_] >= '0' && p_[i_] <= '9') return error("\\0 followed by a digit");
        return one(0);
      case 'x': {
        KVSPLIT_ASSIGN_OR_RETURN(uint32_t v, hex(2));
        return one(v);
      }
      case 'u': {
        KVSPLIT_ASSIGN_OR_RETURN(uint32_t v, hex(4));
        return one(v);
      }
      default:
        break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) return one(u);  // escaped punctuation: itself
    --i_;
    (void)in_class;
    return error(fmt::format("unsupported escape \\{}", c));
  }

  StatusOr<Ranges> cls() {
    ++i_;  // '['
    const bool negate = more() && p_[i_] == '^';
    if (negate) ++i_;
    Ranges r;
    bool first = true;
    while (more() && (p_[i_] != ']' || first)) {
      if (p_[i_] == ']') return error("an empty class []");
      first = false;
      KVSPLIT_ASSIGN_OR_RETURN(Ranges lo, class_item());
      const bool range = lo.size() == 1 && lo[0].first == lo[0].second && i_ + 1 < end_ &&
                         p_[i_] == '-' && p_[i_ + 1] != ']';
      if (!range) {
        r.insert(r.end(), lo.begin(), lo.end());
        continue;
      }
      ++i_;  // '-'
      KVSPLIT_ASSIGN_OR_RETURN(Ranges hi, class_item());
      if (hi.size() != 1 || hi[0].first != hi[0].second)
        return error("a class range must end in one character");
      if (hi[0].first < lo[0].first) return error("a class range out of order");
      r.emplace_back(lo[0].first, hi[0].first);
    }
    if (!more()) return error("missing ']'");
    ++i_;
    r = normalize(std::move(r));
    return negate ? complement(r) : complement(complement(r));  // both drop surrogates
  }

  StatusOr<Ranges> class_item() {
    if (p_[i_] == '\\') return escape(true);
    if (p_[i_] == '[' && i_ + 1 < end_ && p_[i_ + 1] == ':')
      return error("POSIX classes [:name:] are not supported");
    return literal();
  }

  std::string_view p_;
  size_t i_ = 0;
  size_t end_ = 0;
  std::vector<Ast>& ast_;
  int num_rules_ = 0;
};

}  // namespace

StatusOr<Nfa> compile_regex(std::string_view pattern, size_t max_nodes) {
  std::vector<Ast> ast;
  int root = -1;
  KVSPLIT_RETURN_IF_ERROR(Parser(pattern, ast).parse(&root));
  return compile_ast(ast, {root}, max_nodes, "regex");
}

StatusOr<Nfa> compile_regex_rules(const std::vector<std::string>& patterns,
                                  const std::vector<std::string>& names, std::string_view prefix,
                                  size_t max_nodes) {
  std::vector<Ast> ast;
  std::vector<int> roots(patterns.size(), -1);
  for (size_t r = 0; r < patterns.size(); ++r) {
    Status st = Parser(patterns[r], ast, static_cast<int>(patterns.size())).parse(&roots[r]);
    if (!st.ok()) return st.with_prefix(fmt::format("{}: {}", prefix, names[r]));
  }
  std::vector<int32_t> entries;
  KVSPLIT_ASSIGN_OR_RETURN(Nfa nfa, compile_ast(ast, roots, max_nodes, prefix, &entries));
  KVSPLIT_RETURN_IF_ERROR(check_rules(nfa, entries, names, prefix, "$ref", ""));
  return nfa;
}

}  // namespace kvsplit::sampling::regex
