// Regex parser (to an AST of code point sets) and its compilation to a byte-level NFA.
#include "sampling/guide_regex.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "common/utf8.h"

namespace kvsplit::sampling::regex {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint code point ranges

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;
constexpr int kUnbounded = -1;

struct Ast {
  enum Kind : uint8_t { kEmpty, kSet, kConcat, kAlt, kRepeat };
  Kind kind = kEmpty;
  Ranges set;             // kSet
  std::vector<int> kids;  // kConcat, kAlt; kRepeat: one
  int min = 0;            // kRepeat
  int max = 0;            // kRepeat; kUnbounded for no upper bound
};

Ast ast_node(Ast::Kind kind) {
  Ast a;
  a.kind = kind;
  return a;
}

Ast set_node(Ranges set) {
  Ast a = ast_node(Ast::kSet);
  a.set = std::move(set);
  return a;
}

Ast repeat_node(int kid, int min, int max) {
  Ast a = ast_node(Ast::kRepeat);
  a.kids = {kid};
  a.min = min;
  a.max = max;
  return a;
}

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

// Every code point (surrogates excluded: they are not characters UTF-8 can carry) not in `r`.
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  Ranges cut;
  for (const auto& [lo, hi] : out) {  // take the surrogates out
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      cut.emplace_back(lo, hi);
      continue;
    }
    if (lo < kSurrogateLo) cut.emplace_back(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) cut.emplace_back(kSurrogateHi + 1, hi);
  }
  return cut;
}

Ranges digit() { return {{'0', '9'}}; }
Ranges word() { return normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
Ranges space() { return normalize({{'\t', '\r'}, {' ', ' '}}); }  // \t \n \v \f \r and space

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  StatusOr<std::vector<Ast>> parse(int* root) {
    if (!p_.empty() && p_[0] == '^') ++i_;  // the whole text is matched anyway
    end_ = p_.size();
    if (end_ > i_ && p_[end_ - 1] == '$' && !escaped(end_ - 1)) --end_;
    KVSPLIT_ASSIGN_OR_RETURN(*root, alternation(0));
    if (i_ != end_) return error(p_[i_] == ')' ? "unmatched ')'" : "unexpected character");
    return std::move(ast_);
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
      KVSPLIT_ASSIGN_OR_RETURN(int a, atom(depth));
      KVSPLIT_ASSIGN_OR_RETURN(a, quantified(a));
      cat.kids.push_back(a);
    }
    if (cat.kids.empty()) return add(ast_node(Ast::kEmpty));
    return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
  }

  StatusOr<int> quantified(int a) {
    while (more()) {
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
    } else if (more() && p_[i_] == '?') {
      return error("this group kind (lookaround, flags) is not supported");
    }
    KVSPLIT_ASSIGN_OR_RETURN(int inner, alternation(depth + 1));
    if (!more() || p_[i_] != ')') return error("missing ')'");
    ++i_;
    return inner;
  }

  StatusOr<uint32_t> code_point() {
    const utf8::CharScan s = utf8::scan_char(p_.substr(i_, end_ - i_));
    if (s.kind != utf8::CharScan::kComplete) return error("invalid UTF-8");
    const auto* b = reinterpret_cast<const uint8_t*>(p_.data() + i_);
    uint32_t cp = s.len == 1 ? b[0] : b[0] & (0x7F >> s.len);
    for (size_t k = 1; k < s.len; ++k) cp = (cp << 6) | (b[k] & 0x3F);
    i_ += s.len;
    return cp;
  }

  StatusOr<Ranges> literal() {
    KVSPLIT_ASSIGN_OR_RETURN(uint32_t cp, code_point());
    return Ranges{{cp, cp}};
  }

  StatusOr<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      const char h = more() ? p_[i_] : '\0';
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
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
  std::vector<Ast> ast_;
};

class Compiler {
 public:
  Compiler(const std::vector<Ast>& ast, size_t max_nodes) : ast_(ast), max_nodes_(max_nodes) {}

  StatusOr<Nfa> run(int root) {
    const int32_t match = node(NfaNode{.kind = NfaNode::kMatch});
    nfa_.start = compile(root, match);
    if (too_large_) {
      return invalid_argument(fmt::format(
          "regex: its automaton would have more than {} nodes (a large counted repetition?)",
          max_nodes_));
    }
    return std::move(nfa_);
  }

 private:
  int32_t node(NfaNode n) {
    if (nfa_.nodes.size() >= max_nodes_) {
      too_large_ = true;
      return 0;
    }
    nfa_.nodes.push_back(n);
    return static_cast<int32_t>(nfa_.nodes.size()) - 1;
  }
  int32_t split(int32_t a, int32_t b) {
    return node({.kind = NfaNode::kSplit, .out = a, .out2 = b});
  }

  // Compiles ast node `a` so that it continues at `next`; returns its entry. Built back to front,
  // so nothing is patched afterwards (except a loop head).
  int32_t compile(int a, int32_t next) {
    // Calls are bounded too, not only nodes: a body that makes no node ((?:), x{0}) under
    // nested counted repetitions would otherwise be compiled 1000^k times.
    if (too_large_ || ++calls_ > 4 * max_nodes_) {
      too_large_ = true;
      return 0;
    }
    const Ast& n = ast_[static_cast<size_t>(a)];
    switch (n.kind) {
      case Ast::kEmpty:
        return next;
      case Ast::kSet:
        return set(n.set, next);
      case Ast::kConcat:
        for (auto it = n.kids.rbegin(); it != n.kids.rend(); ++it) next = compile(*it, next);
        return next;
      case Ast::kAlt: {
        int32_t entry = compile(n.kids.back(), next);
        for (size_t k = n.kids.size() - 1; k-- > 0;) entry = split(compile(n.kids[k], next), entry);
        return entry;
      }
      case Ast::kRepeat:
        return repeat(n, next);
    }
    return next;
  }

  int32_t repeat(const Ast& n, int32_t next) {
    const int body = n.kids[0];
    int32_t cur = next;
    if (n.max == kUnbounded) {
      const int32_t loop = node({.kind = NfaNode::kSplit, .out = -1, .out2 = next});
      const int32_t entry = compile(body, loop);
      if (too_large_) return 0;
      nfa_.nodes[static_cast<size_t>(loop)].out = entry;
      cur = loop;
    } else {
      for (int k = n.min; k < n.max && !too_large_; ++k) cur = split(compile(body, cur), next);
    }
    for (int k = 0; k < n.min && !too_large_; ++k) cur = compile(body, cur);
    return cur;
  }

  int32_t set(const Ranges& ranges, int32_t next) {
    int32_t entry = -1;
    for (const auto& [lo, hi] : ranges) {
      for (const auto& seq : utf8_sequences(lo, hi)) {
        int32_t cur = next;
        for (auto it = seq.rbegin(); it != seq.rend(); ++it)
          cur = node({.kind = NfaNode::kByte, .lo = it->first, .hi = it->second, .out = cur});
        entry = entry < 0 ? cur : split(cur, entry);
      }
    }
    return entry;
  }

  const std::vector<Ast>& ast_;
  size_t max_nodes_;
  Nfa nfa_;
  bool too_large_ = false;
  size_t calls_ = 0;
};

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, uint8_t* out) {
  const int n = utf8_length(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  for (int k = n - 1; k > 0; --k, cp >>= 6) out[k] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  out[0] = static_cast<uint8_t>((0xF00 >> n) | cp);
}

void split_sequences(uint32_t lo, uint32_t hi,
                     std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (const uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // one encoded length per piece
    if (lo <= edge && hi > edge) {
      split_sequences(lo, edge, out);
      split_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int k = 1; k < n; ++k) {  // until every byte position spans a plain range
    const uint32_t m = (1u << (6 * k)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      split_sequences(lo, lo | m, out);
      split_sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      split_sequences(lo, (hi & ~m) - 1, out);
      split_sequences(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int k = 0; k < n; ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

}  // namespace

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  split_sequences(lo, hi, out);
  return out;
}

StatusOr<Nfa> compile_regex(std::string_view pattern, size_t max_nodes) {
  Parser parser(pattern);
  int root = -1;
  KVSPLIT_ASSIGN_OR_RETURN(std::vector<Ast> ast, parser.parse(&root));
  return Compiler(ast, max_nodes).run(root);
}

}  // namespace kvsplit::sampling::regex
