// The syntax tree's helpers and its compilation to a byte-level NFA (guide_ast.h).
#include "sampling/guide_ast.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/utf8.h"

namespace kvsplit::sampling::regex {

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

Ast call_node(int rule) {
  Ast a = ast_node(Ast::kCall);
  a.rule = rule;
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

bool decode_code_point(std::string_view s, uint32_t* cp, size_t* len) {
  const utf8::CharScan scan = utf8::scan_char(s);
  if (scan.kind != utf8::CharScan::kComplete) return false;
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  uint32_t v = scan.len == 1 ? b[0] : b[0] & (0x7F >> scan.len);
  for (size_t k = 1; k < scan.len; ++k) v = (v << 6) | (b[k] & 0x3F);
  *cp = v;
  *len = scan.len;
  return true;
}

int hex_digit(char h) {
  return h >= '0' && h <= '9'   ? h - '0'
         : h >= 'a' && h <= 'f' ? h - 'a' + 10
         : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                : -1;
}

namespace {

class Compiler {
 public:
  Compiler(const std::vector<Ast>& ast, size_t max_nodes) : ast_(ast), max_nodes_(max_nodes) {}

  // Every rule's entry is made first (a kEpsilon patched once its body is compiled), so that a
  // call can name a rule compiled later, or the rule it is in.
  StatusOr<Nfa> run(const std::vector<int>& roots, std::string_view prefix,
                    std::vector<int32_t>* entries) {
    const int32_t match = node(NfaNode{.kind = NfaNode::kMatch});
    for (size_t r = 0; r < roots.size(); ++r) entries_.push_back(node({.kind = NfaNode::kEpsilon}));
    for (size_t r = 0; r < roots.size() && !too_large_; ++r) {
      const int32_t body = compile(roots[r], match);
      if (!too_large_) nfa_.nodes[static_cast<size_t>(entries_[r])].out = body;
    }
    if (too_large_) {
      return invalid_argument(fmt::format(
          "{}: its automaton would have more than {} nodes (a large counted repetition?)", prefix,
          max_nodes_));
    }
    nfa_.start = roots.empty() ? match : entries_[0];
    if (entries != nullptr) *entries = entries_;
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
      case Ast::kCall:
        return node(
            {.kind = NfaNode::kCall, .out = next, .out2 = entries_[static_cast<size_t>(n.rule)]});
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
  std::vector<int32_t> entries_;
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

StatusOr<Nfa> compile_ast(const std::vector<Ast>& ast, const std::vector<int>& roots,
                          size_t max_nodes, std::string_view prefix,
                          std::vector<int32_t>* entries) {
  return Compiler(ast, max_nodes).run(roots, prefix, entries);
}

}  // namespace kvsplit::sampling::regex
