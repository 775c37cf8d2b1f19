// The syntax tree both languages of guided decoding parse to (regular expressions, guide_regex.h;
// grammars, guide_grammar.h), and its compilation to the byte-level NFA of guide_regex.h. Sets
// are of code points; the compiler turns each into the byte sequences of its UTF-8 encodings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvsplit/status.h"
#include "sampling/guide_regex.h"

namespace kvsplit::sampling::regex {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint code point ranges

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr uint32_t kSurrogateLo = 0xD800;
inline constexpr uint32_t kSurrogateHi = 0xDFFF;
inline constexpr int kUnbounded = -1;
// Quantifiers one element may carry (`a*?` is one, `(a{2}){3}` a group): each stacked one is a
// level of the compiler's recursion, and a spec of 32 KiB of `?` would overflow the stack.
inline constexpr int kMaxStackedQuantifiers = 4;

struct Ast {
  enum Kind : uint8_t { kEmpty, kSet, kConcat, kAlt, kRepeat, kCall };
  Kind kind = kEmpty;
  Ranges set;             // kSet
  std::vector<int> kids;  // kConcat, kAlt; kRepeat: one
  int min = 0;            // kRepeat
  int max = 0;            // kRepeat; kUnbounded for no upper bound
  int rule = -1;          // kCall: the rule's index
};

Ast ast_node(Ast::Kind kind);
Ast set_node(Ranges set);
Ast repeat_node(int kid, int min, int max);
Ast call_node(int rule);
// Appends node `a` to sequence `cat`; an unquantified sequence (a multi-character literal, a
// group) is spliced in element by element, so that alternatives starting with the same literal
// can be factored by their first characters.
void splice(const std::vector<Ast>& ast, Ast& cat, int a, bool unquantified);

Ranges normalize(Ranges r);
// Every code point (surrogates excluded: they are not characters UTF-8 can carry) not in `r`.
Ranges complement(const Ranges& r);

// The code point UTF-8 encodes at the start of `s` (*len: its bytes); false when `s` does not
// start with a whole, well-formed character.
bool decode_code_point(std::string_view s, uint32_t* cp, size_t* len);
// 0-15 for a hex digit, -1 otherwise.
int hex_digit(char c);

// Compiles rule r's tree, rooted at ast[roots[r]], for every rule into one NFA whose start is rule
// 0's entry. A kCall node becomes an NfaNode::kCall of the rule's entry; every rule ends in the
// one kMatch node. `entries` (optional) receives each rule's entry node. kInvalidArgument
// "<prefix>: its automaton would have more than N nodes ..." past max_nodes.
StatusOr<Nfa> compile_ast(const std::vector<Ast>& ast, const std::vector<int>& roots,
                          size_t max_nodes, std::string_view prefix,
                          std::vector<int32_t>* entries = nullptr);

// The checks that make rules safe to run on a stack (GuideGrammar): every rule derives some
// finite string (else "<prefix>: <kind> '<name>' derives no finite string ..."), and no rule
// reaches itself before a byte, directly, through other rules or after nullable ones (else
// "<prefix>: left recursion (a -> b -> a): ..., <hint>"). One pass over the NFA per property.
Status check_rules(const Nfa& nfa, const std::vector<int32_t>& entries,
                   const std::vector<std::string>& names, std::string_view prefix,
                   std::string_view kind, std::string_view hint);

}  // namespace kvsplit::sampling::regex
