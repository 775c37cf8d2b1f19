// Context-free grammars of guided decoding (docs/sampling.md, "Grammars"), in the GBNF notation
// of llama.cpp (which vLLM's xgrammar backend also reads), compiled to the byte-level NFA of
// guide_regex.h with rule calls: each rule is an NFA fragment, a reference to a rule is an
// NfaNode::kCall, and GuideGrammar runs the calls on a stack.
//
// Syntax: rules `name ::= alternatives`, one after another (a rule's text runs until the next
// `name ::=` or the end; `#` starts a comment to the end of the line). Names are letters, digits,
// `-` and `_`. Elements: string literals "..." (UTF-8), character classes `[...]` / `[^...]`
// with ranges, `.` (any code point), rule names, groups `(...)`, alternatives `|`, quantifiers
// `* + ? {n} {n,} {n,m}` (n, m <= regex::kMaxRepeat). Escapes in literals and classes: `\n \r \t
// \xHH \uHHHH \UHHHHHHHH` and backslash before any ASCII punctuation. The text is a string of rule
// `root`.
//
// Refused, with the line and column: syntax errors, a rule defined twice, a name used but never
// defined, no `root`, a class that matches nothing, left recursion (a rule that can reach itself
// without consuming a byte: a stack machine would loop), and a rule that derives no finite string
// (it could trap a text that can never end).
#pragma once

#include <string_view>

#include "kvsplit/status.h"
#include "sampling/guide_regex.h"

namespace kvsplit::sampling::grammar {

inline constexpr int kMaxRules = 4096;

// kInvalidArgument "grammar: <what> at line L, column C" (or naming the rule).
StatusOr<regex::Nfa> compile_grammar(std::string_view text, size_t max_nodes = regex::kMaxNfaNodes);

}  // namespace kvsplit::sampling::grammar
