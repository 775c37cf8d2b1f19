// The syntax tree's helpers and its compilation to a byte-level NFA (guide_ast.h).
#include "sampling/guide_ast.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

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

void splice(const std::vector<Ast>& ast, Ast& cat, int a, bool unquantified) {
  const Ast& n = ast[static_cast<size_t>(a)];
  if (unquantified && n.kind == Ast::kConcat) {
    cat.kids.insert(cat.kids.end(), n.kids.begin(), n.kids.end());
  } else {
    cat.kids.push_back(a);
  }
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
        std::vector<Seq> seqs;
        for (const int& k : n.kids) {
          const Ast& kid = ast_[static_cast<size_t>(k)];
          seqs.push_back(kid.kind == Ast::kConcat ? Seq(kid.kids) : Seq(&k, 1));
        }
        return factored(seqs, next);
      }
      case Ast::kRepeat:
        return repeat(n, next);
      case Ast::kCall:
        return node(
            {.kind = NfaNode::kCall, .out = next, .out2 = entries_[static_cast<size_t>(n.rule)]});
    }
    return next;
  }

  // Alternatives (each a sequence of nodes) with their common first elements factored out:
  // `t "+" e | t "-" e | t` compiles as `t ("+" e | "-" e | "")`. The language is the same; for a
  // grammar it matters, since each call of a rule with its own continuation is a stack of its own,
  // and unfactored alternatives multiply the stacks at every level of nesting.
  // Sequences are views into the tree's kids lists (a rest is a shorter view, never a copy), and
  // a common prefix is compiled in one loop: cost and recursion grow with the branch points, not
  // with the prefix length (two 16,000-byte literals sharing all but one byte).
  using Seq = std::span<const int>;
  int32_t factored(const std::vector<Seq>& seqs, int32_t next) {
    if (!charge(seqs.size())) return 0;
    std::unordered_map<std::string, size_t> group_of;  // first element's key -> group
    std::vector<std::vector<Seq>> groups;
    for (const Seq& seq : seqs) {
      const std::string key = seq.empty() ? "" : key_of(seq[0]);
      if (!key.empty()) {
        auto [it, fresh] = group_of.emplace(key, groups.size());
        if (!fresh) {
          groups[it->second].push_back(seq);
          continue;
        }
      }
      groups.push_back({seq});
    }
    int32_t entry = -1;
    for (size_t g = groups.size(); g-- > 0 && !too_large_;) {
      const std::vector<Seq>& group = groups[g];
      int32_t alt = 0;
      if (group.size() == 1) {
        alt = sequence(group[0], next);
      } else {
        // The longest prefix every member shares (at least the first element).
        size_t common = 1;
        for (bool same = true; same && charge(group.size()); common += same ? 1 : 0) {
          for (const Seq& seq : group) {
            same = same && common < seq.size() && !key_of(seq[common]).empty() &&
                   key_of(seq[common]) == key_of(group[0][common]);
          }
        }
        std::vector<Seq> rests;
        for (const Seq& seq : group) rests.push_back(seq.subspan(common));
        alt = sequence(group[0].first(common), factored(rests, next));
      }
      entry = entry < 0 ? alt : split(alt, entry);
    }
    return entry;
  }

  // The elements of `seq` in order, then `next`.
  int32_t sequence(Seq seq, int32_t next) {
    for (size_t k = seq.size(); k-- > 0 && !too_large_;) next = compile(seq[k], next);
    return next;
  }

  // Alternatives that start with equal elements of these kinds are factored: a rule's call (the
  // case that matters) or a code point set.
  // Made once per tree node (a repetition compiles its body again: its keys are not remade).
  const std::string& key_of(int a) {
    if (keys_.empty()) keys_.resize(ast_.size());
    std::optional<std::string>& key = keys_[static_cast<size_t>(a)];
    if (key) return *key;
    const Ast& n = ast_[static_cast<size_t>(a)];
    key.emplace();
    if (n.kind == Ast::kCall) {
      *key = fmt::format("c{}", n.rule);
    } else if (n.kind == Ast::kSet) {
      *key = "s";
      for (const auto& [lo, hi] : n.set) *key += fmt::format("{}-{},", lo, hi);
    }
    return *key;
  }

  // Factoring's scans count against the same bound as compile() calls: a repetition of a large
  // alternation factors it once per copy while making few nodes.
  bool charge(size_t units) {
    calls_ += units;
    if (calls_ > 4 * max_nodes_) too_large_ = true;
    return !too_large_;
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
  std::vector<std::optional<std::string>> keys_;  // key_of's, per tree node
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

// Per-rule facts on the compiled NFA. Each rule's body is its own set of nodes, reached from its
// entry without entering a callee, so a rule is examined on its nodes alone.
class Checker {
 public:
  Checker(const Nfa& nfa, const std::vector<int32_t>& entries,
          const std::vector<std::string>& names, std::string_view prefix, std::string_view kind,
          std::string_view hint)
      : nfa_(nfa), entries_(entries), names_(names), prefix_(prefix), kind_(kind), hint_(hint) {
    for (size_t r = 0; r < entries.size(); ++r) rule_of_.emplace(entries[r], static_cast<int>(r));
  }

  Status run() {
    // Nullable (derives the empty string), then productive (derives some finite string): least
    // fixed points, each rule re-examined while a rule it calls changes.
    nullable_ = fixed_point(/*through_bytes=*/false);
    productive_ = fixed_point(/*through_bytes=*/true);
    // Rule 0 (the text) last: when it cannot end because a rule it calls cannot, that rule is
    // the one to name.
    for (size_t k = 1; k <= names_.size(); ++k) {
      const size_t r = k % names_.size();
      if (!productive_[r]) {
        return invalid_argument(
            fmt::format("{}: {} '{}' derives no finite string (every alternative recurses)",
                        prefix_, kind_, names_[r]));
      }
    }
    return left_recursion();
  }

 private:
  int callee(const NfaNode& n) const { return rule_of_.at(n.out2); }

  // Walks rule r's body from its entry: split and epsilon always, a byte when through_bytes, a
  // call when `pass(callee)`. Calls `on_call(callee)` at each call reached; true when the rule's
  // end is reached.
  template <class Pass, class OnCall>
  bool walk(int r, bool through_bytes, Pass pass, OnCall on_call) {
    ++stamp_;
    std::vector<int32_t> stack{entries_[static_cast<size_t>(r)]};
    bool end = false;
    while (!stack.empty()) {
      const int32_t id = stack.back();
      stack.pop_back();
      if (seen_[static_cast<size_t>(id)] == stamp_) continue;
      seen_[static_cast<size_t>(id)] = stamp_;
      const NfaNode& n = nfa_.nodes[static_cast<size_t>(id)];
      switch (n.kind) {
        case NfaNode::kMatch:
          end = true;
          break;
        case NfaNode::kByte:
          if (through_bytes) stack.push_back(n.out);
          break;
        case NfaNode::kSplit:
          stack.push_back(n.out2);
          stack.push_back(n.out);
          break;
        case NfaNode::kEpsilon:
          stack.push_back(n.out);
          break;
        case NfaNode::kCall:
          on_call(callee(n));
          if (pass(callee(n))) stack.push_back(n.out);
          break;
      }
    }
    return end;
  }

  // One pass over the NFA: every rule is walked from its entry at once; a call whose callee is
  // not (yet) known to end waits under it, and resumes when the callee is found to. Rule bodies
  // share no node (but the one end node), so each node is visited once: linear in the NFA.
  std::vector<bool> fixed_point(bool through_bytes) {
    const size_t n = names_.size();
    std::vector<bool> yes(n, false);
    std::vector<uint8_t> reached(nfa_.nodes.size(), 0);
    std::vector<std::vector<std::pair<int32_t, int>>> parked(n);  // (continuation, rule)
    std::vector<std::pair<int32_t, int>> stack;
    for (size_t r = n; r-- > 0;) stack.emplace_back(entries_[r], static_cast<int>(r));
    while (!stack.empty()) {
      const auto [id, r] = stack.back();
      stack.pop_back();
      const NfaNode& node = nfa_.nodes[static_cast<size_t>(id)];
      if (node.kind == NfaNode::kMatch) {  // rule r can end
        if (yes[static_cast<size_t>(r)]) continue;
        yes[static_cast<size_t>(r)] = true;
        for (const auto& p : parked[static_cast<size_t>(r)]) stack.push_back(p);
        parked[static_cast<size_t>(r)] = {};
        continue;
      }
      if (reached[static_cast<size_t>(id)] != 0) continue;
      reached[static_cast<size_t>(id)] = 1;
      switch (node.kind) {
        case NfaNode::kByte:
          if (through_bytes) stack.emplace_back(node.out, r);
          break;
        case NfaNode::kSplit:
          stack.emplace_back(node.out2, r);
          stack.emplace_back(node.out, r);
          break;
        case NfaNode::kEpsilon:
          stack.emplace_back(node.out, r);
          break;
        case NfaNode::kCall: {
          const int c = callee(node);
          if (yes[static_cast<size_t>(c)]) {
            stack.emplace_back(node.out, r);
          } else {
            parked[static_cast<size_t>(c)].emplace_back(node.out, r);
          }
          break;
        }
        case NfaNode::kMatch:
          break;
      }
    }
    return yes;
  }

  // The rules each rule calls before consuming a byte; a cycle among them is left recursion.
  Status left_recursion() {
    const size_t n = names_.size();
    std::vector<std::vector<int>> left(n);
    for (size_t r = 0; r < n; ++r) {
      walk(
          static_cast<int>(r), false,
          [&](int c) { return bool(nullable_[static_cast<size_t>(c)]); },
          [&](int c) { left[r].push_back(c); });
    }
    // Iterative depth-first search: 0 unvisited, 1 on the path, 2 done.
    std::vector<uint8_t> color(n, 0);
    for (size_t s = 0; s < n; ++s) {
      if (color[s] != 0) continue;
      std::vector<std::pair<int, size_t>> path{{static_cast<int>(s), 0}};
      color[s] = 1;
      while (!path.empty()) {
        auto& [r, k] = path.back();
        if (k == left[static_cast<size_t>(r)].size()) {
          color[static_cast<size_t>(r)] = 2;
          path.pop_back();
          continue;
        }
        const int c = left[static_cast<size_t>(r)][k++];
        if (color[static_cast<size_t>(c)] == 1) {
          std::string cycle;
          bool on = false;
          for (const auto& [p, unused] : path) {
            on = on || p == c;
            if (on) cycle += names_[static_cast<size_t>(p)] + " -> ";
          }
          return invalid_argument(fmt::format(
              "{}: left recursion ({}{}): a {} reaches itself before any byte{}{}", prefix_, cycle,
              names_[static_cast<size_t>(c)], kind_, hint_.empty() ? "" : "; ", hint_));
        }
        if (color[static_cast<size_t>(c)] == 0) {
          color[static_cast<size_t>(c)] = 1;
          path.emplace_back(c, 0);
        }
      }
    }
    return ok_status();
  }

  const Nfa& nfa_;
  const std::vector<int32_t>& entries_;
  const std::vector<std::string>& names_;
  std::string_view prefix_;
  std::string_view kind_;
  std::string_view hint_;
  std::unordered_map<int32_t, int> rule_of_;
  std::vector<uint32_t> seen_ = std::vector<uint32_t>(nfa_.nodes.size(), 0);
  uint32_t stamp_ = 0;
  std::vector<bool> nullable_;
  std::vector<bool> productive_;
};

}  // namespace

Status check_rules(const Nfa& nfa, const std::vector<int32_t>& entries,
                   const std::vector<std::string>& names, std::string_view prefix,
                   std::string_view kind, std::string_view hint) {
  return Checker(nfa, entries, names, prefix, kind, hint).run();
}

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
