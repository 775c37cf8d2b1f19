// Grammars (GBNF) of guided decoding against independent oracles: non-regular languages against
// hand-written recognizers over every short string (whole texts and prefixes: every state the
// automaton reaches must be live), regular grammars against the equivalent regex, refused
// grammars by their message and position, the stack's bounds, and token masks against walking
// every token's bytes.
#include "sampling/guide_grammar.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "sampling/guide.h"
#include "sampling/guide_test_util.h"

namespace kvsplit::sampling {
namespace {

using Kind = GuidedDecoding::Kind;

using testing::byte_vocab;

std::shared_ptr<GuideGrammar> guide(Kind kind, const std::string& spec,
                                    std::shared_ptr<const TokenVocabulary> vocab = byte_vocab()) {
  StatusOr<std::shared_ptr<GuideGrammar>> g =
      GuideGrammar::compile({kind, spec, {}}, std::move(vocab));
  EXPECT_TRUE(g.ok()) << spec << ": " << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

std::shared_ptr<GuideGrammar> gbnf(const std::string& text,
                                   std::shared_ptr<const TokenVocabulary> vocab = byte_vocab()) {
  return guide(Kind::kGrammar, text, std::move(vocab));
}

// What a text is to a language: outside it for good, a proper prefix of one of its strings, or
// one of its strings.
enum class Verdict { kDead, kPrefix, kWhole };

std::ostream& operator<<(std::ostream& os, Verdict v) {
  return os << (v == Verdict::kDead ? "dead" : v == Verdict::kPrefix ? "prefix" : "whole");
}

Verdict verdict(GuideGrammar& g, std::string_view text) {
  StatusOr<int32_t> s = g.walk(g.start_state(), text);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!s.ok() || *s == GuideGrammar::kDead) return Verdict::kDead;
  return g.accepting(*s) ? Verdict::kWhole : Verdict::kPrefix;
}

bool matches(GuideGrammar& g, std::string_view text) { return verdict(g, text) == Verdict::kWhole; }

// Every concatenation of at most max_len units (bytes or whole UTF-8 characters).
std::vector<std::string> all_texts(const std::vector<std::string>& units, size_t max_len) {
  std::vector<std::string> out{""};
  size_t begin = 0;
  for (size_t len = 1; len <= max_len; ++len) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i)
      for (const std::string& u : units) out.push_back(out[i] + u);
    begin = end;
  }
  return out;
}

std::vector<std::string> bytes_of(std::string_view alphabet) {
  std::vector<std::string> units;
  for (const char c : alphabet) units.emplace_back(1, c);
  return units;
}

// The automaton's verdict equals the oracle's on every text, and each verdict occurs (so the
// alphabet exercises the whole language, its prefixes and its dead ends).
template <class Oracle>
void expect_language(GuideGrammar& g, const std::vector<std::string>& texts, Oracle oracle,
                     const std::string& name) {
  int seen[3] = {0, 0, 0};
  for (const std::string& t : texts) {
    const Verdict want = oracle(t);
    ASSERT_EQ(verdict(g, t), want) << name << ": text '" << t << "'";
    ++seen[static_cast<int>(want)];
  }
  EXPECT_GT(seen[0], 0) << name;
  EXPECT_GT(seen[1], 0) << name;
  EXPECT_GT(seen[2], 0) << name;
}

// A recursive-descent reader of an LL(1) language. A rule fails at the end of the text exactly
// when more text could still complete it, so the reader tells a string of the language from a
// proper prefix of one from neither.
struct Cursor {
  std::string_view t;
  size_t i = 0;
  bool ran_out = false;  // failed for want of more text

  // The next byte, which must be in `set`, consumed.
  bool take(std::string_view set) {
    if (i == t.size()) {
      ran_out = true;
      return false;
    }
    if (set.find(t[i]) == std::string_view::npos) return false;
    ++i;
    return true;
  }
  // The next byte consumed when it is in `set`; nothing happens otherwise.
  bool maybe(std::string_view set) {
    if (i == t.size() || set.find(t[i]) == std::string_view::npos) return false;
    ++i;
    return true;
  }
  bool word(std::string_view w) {
    for (const char c : w)
      if (!take(std::string_view(&c, 1))) return false;
    return true;
  }
  Verdict verdict(bool parsed) const {
    if (parsed && i == t.size()) return Verdict::kWhole;
    return ran_out ? Verdict::kPrefix : Verdict::kDead;
  }
};

constexpr std::string_view kDigits = "0123456789";

// expr ::= term (("+"|"-") term)*; term ::= factor ("*" factor)*; factor ::= [0-9]+ | "(" expr ")"
bool expr(Cursor& c);
bool factor(Cursor& c) {
  if (c.maybe("(")) return expr(c) && c.take(")");
  if (!c.take(kDigits)) return false;
  while (c.maybe(kDigits)) {
  }
  return true;
}
bool term(Cursor& c) {
  if (!factor(c)) return false;
  while (c.maybe("*"))
    if (!factor(c)) return false;
  return true;
}
bool expr(Cursor& c) {
  if (!term(c)) return false;
  while (c.maybe("+-"))
    if (!term(c)) return false;
  return true;
}

// JSON (RFC 8259) over ASCII text.
void ws(Cursor& c) {
  while (c.maybe(" \t\n\r")) {
  }
}
bool digits(Cursor& c) {
  if (!c.take(kDigits)) return false;
  while (c.maybe(kDigits)) {
  }
  return true;
}
bool json_string(Cursor& c) {  // after the opening quote
  for (;;) {
    if (c.maybe("\"")) return true;
    if (c.maybe("\\")) {
      if (c.maybe("u")) {
        for (int k = 0; k < 4; ++k)
          if (!c.take("0123456789abcdefABCDEF")) return false;
      } else if (!c.take("\"\\/bfnrt")) {
        return false;
      }
      continue;
    }
    if (c.i == c.t.size()) {
      c.ran_out = true;
      return false;
    }
    if (static_cast<unsigned char>(c.t[c.i]) < 0x20) return false;
    ++c.i;
  }
}
bool json_value(Cursor& c) {
  if (c.maybe("{")) {
    ws(c);
    if (c.maybe("}")) return true;
    for (;;) {
      if (!c.take("\"") || !json_string(c)) return false;
      ws(c);
      if (!c.take(":")) return false;
      ws(c);
      if (!json_value(c)) return false;
      ws(c);
      if (!c.maybe(",")) return c.take("}");
      ws(c);
    }
  }
  if (c.maybe("[")) {
    ws(c);
    if (c.maybe("]")) return true;
    for (;;) {
      if (!json_value(c)) return false;
      ws(c);
      if (!c.maybe(",")) return c.take("]");
      ws(c);
    }
  }
  if (c.maybe("\"")) return json_string(c);
  if (c.maybe("t")) return c.word("rue");
  if (c.maybe("f")) return c.word("alse");
  if (c.maybe("n")) return c.word("ull");
  c.maybe("-");
  if (!c.maybe("0") && !digits(c)) return false;
  if (c.maybe(".") && !digits(c)) return false;
  if (c.maybe("eE")) {
    c.maybe("+-");
    if (!digits(c)) return false;
  }
  return true;
}
Verdict json_oracle(std::string_view t) {
  Cursor c{t};
  ws(c);
  const bool parsed = json_value(c);
  if (parsed) ws(c);
  return c.verdict(parsed);
}

constexpr const char* kJsonGrammar = R"gbnf(
# JSON (RFC 8259), the whole text one value.
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
)gbnf";

// ---------------------------------------------------------------------------------------------
// 1. Non-regular languages, against oracles, whole texts and prefixes.

TEST(GuideGrammarLanguage, BalancedParensMatchTheOracle) {
  auto oracle = [](std::string_view t) {
    int depth = 0;
    for (const char c : t) {
      if (c != '(' && c != ')') return Verdict::kDead;
      depth += c == '(' ? 1 : -1;
      if (depth < 0) return Verdict::kDead;
    }
    return depth == 0 ? Verdict::kWhole : Verdict::kPrefix;
  };
  const std::vector<std::string> texts = all_texts(bytes_of("()x"), 8);
  for (const char* text :
       {R"g(root ::= "" | "(" root ")" root)g", R"g(root ::= ( "(" root ")" )*)g",
        "root ::= pair*\npair ::= \"(\" inner \")\"\ninner ::= root"}) {
    const std::shared_ptr<GuideGrammar> g = gbnf(text);
    ASSERT_NE(g, nullptr);
    expect_language(*g, texts, oracle, text);
  }
}

TEST(GuideGrammarLanguage, AnBnMatchesTheOracle) {
  auto oracle = [](std::string_view t) {
    size_t a = 0;
    while (a < t.size() && t[a] == 'a') ++a;
    const size_t b = t.size() - a;
    if (t.find_first_not_of('b', a) != std::string_view::npos || b > a) return Verdict::kDead;
    return a == b ? Verdict::kWhole : Verdict::kPrefix;
  };
  const std::shared_ptr<GuideGrammar> g = gbnf(R"g(root ::= "a" root "b" | "")g");
  ASSERT_NE(g, nullptr);
  expect_language(*g, all_texts(bytes_of("abc"), 8), oracle, "a^n b^n");
}

TEST(GuideGrammarLanguage, PalindromesMatchTheOracle) {
  // Every string over {a,b} is a prefix of a palindrome (itself, then reversed).
  auto oracle = [](std::string_view t) {
    if (t.find_first_not_of("ab") != std::string_view::npos) return Verdict::kDead;
    return std::equal(t.begin(), t.end(), t.rbegin()) ? Verdict::kWhole : Verdict::kPrefix;
  };
  const std::shared_ptr<GuideGrammar> g =
      gbnf(R"g(root ::= "a" root "a" | "b" root "b" | "a" | "b" | "")g");
  ASSERT_NE(g, nullptr);
  expect_language(*g, all_texts(bytes_of("abc"), 8), oracle, "palindromes");
}

TEST(GuideGrammarLanguage, ArithmeticMatchesARecursiveDescentReader) {
  const std::shared_ptr<GuideGrammar> g = gbnf(R"g(
    root   ::= term (("+" | "-") term)*
    term   ::= factor ("*" factor)*
    factor ::= [0-9]+ | "(" root ")"
  )g");
  ASSERT_NE(g, nullptr);
  auto oracle = [](std::string_view t) {
    Cursor c{t};
    const bool parsed = expr(c);
    return c.verdict(parsed);
  };
  expect_language(*g, all_texts(bytes_of("1+-*()"), 7), oracle, "arithmetic");
  EXPECT_TRUE(matches(*g, "12*(3+(45-6))*7"));
  EXPECT_FALSE(matches(*g, "12*(3+(45-6)*7"));
}

// ---------------------------------------------------------------------------------------------
// 2. Regular grammars describe the same language as the equivalent regex.

TEST(GuideGrammarRegular, AgreesWithTheEquivalentRegex) {
  struct Case {
    std::string gbnf;
    std::string regex;
  };
  const std::vector<Case> ascii = {
      {R"g(root ::= "ab" | "ba")g", "ab|ba"},
      {R"g(root ::= ("a" | "b")* "abb")g", "(a|b)*abb"},
      {R"g(root ::= [a-c]+ "-"?)g", "[a-c]+-?"},
      {R"g(root ::= [^a]*)g", "[^a]*"},
      {R"g(root ::= "a"{2})g", "a{2}"},
      {R"g(root ::= "a"{2,} "b"?)g", "a{2,}b?"},
      {R"g(root ::= [ab]{1,3})g", "[ab]{1,3}"},
      {R"g(root ::= ("ab"){0,2} "c"?)g", "(ab){0,2}c?"},
      {R"g(root ::= "a" "b"? "c"* "-"+)g", "ab?c*-+"},
      {R"g(root ::= "a"{0} "b" | "")g", "b|"},
      {R"g(root ::= [a\-c]{1,2} [-b])g", "[a\\-c]{1,2}[-b]"},
      {R"g(root ::= "a"* * "b"+?)g", "(a*)*(b+)?"},
      {R"g(root ::= ((("a")) ("b" | ("c" | "-"))))g", "a(b|c|-)"},
      {R"g(root ::= x "-" x
          x    ::= [ab] | "c")g",
       "([ab]|c)-([ab]|c)"},
      {"# a list\nroot ::= item # the first\n  ( \"-\" item )*  # then more\n\n"
       "item ::=\n  \"a\"\n  | \"b\" # or b\n",
       "[ab](-[ab])*"},
      {"root::=\"a\"b\nb::=\"b\"|\"c\"", "a(b|c)"},
      {"item ::= \"a\" | \"-\"\nroot ::= item my-item_2\nmy-item_2 ::= item", "[a-][a-]"},
      {"root ::= a* \"b\"\na ::= \"a\"?", "a*b"},  // a nullable rule in a loop
      {"root ::= (a b)* \"-\"\na ::= \"a\"?\nb ::= a | \"c\"", "[ac]*-"},
  };
  const std::vector<Case> unicode = {
      {R"g(root ::= "\x41\u00e9" [\U0001F600\n]*)g", "A\\u00e9[\xF0\x9F\x98\x80\\n]*"},
      {R"g(root ::= "\"" "\\" [\]\t]?)g", "\"\\\\[\\]\\t]?"},
      {R"g(root ::= . .?)g", "(.|\\n)(.|\\n)?"},
      {R"g(root ::= [^a\n]+)g", "[^a\\n]+"},
      {R"g(root ::= [\u00e0-\u00ff]* "😀")g", "[\\u00e0-\\u00ff]*\xF0\x9F\x98\x80"},
      {R"g(root ::= "é😀" | [é-ê\x41])g",
       "\xC3\xA9\xF0\x9F\x98\x80|[\xC3\xA9-\xC3\xAA"
       "A]"},
      {R"g(root ::= [^\u00e9] "\\"?)g", "[^\\u00e9]\\\\?"},
  };
  auto check = [](const std::vector<Case>& cases, const std::vector<std::string>& texts) {
    for (const Case& c : cases) {
      const std::shared_ptr<GuideGrammar> g = gbnf(c.gbnf);
      const std::shared_ptr<GuideGrammar> rx = guide(Kind::kRegex, c.regex);
      ASSERT_TRUE(g != nullptr && rx != nullptr) << c.gbnf;
      int whole = 0;
      for (const std::string& t : texts) {
        const Verdict want = verdict(*rx, t);
        ASSERT_EQ(verdict(*g, t), want) << c.gbnf << " vs /" << c.regex << "/ on '" << t << "'";
        whole += want == Verdict::kWhole;
      }
      EXPECT_GT(whole, 0) << c.gbnf;
    }
  };
  check(ascii, all_texts(bytes_of("abc-"), 6));
  check(unicode, all_texts({"a", "A", "\xC3\xA9", "\xC3\xAA", "\xF0\x9F\x98\x80", "\n", "\t", "\"",
                            "\\", "]", "\xC3", "\xFF"},
                           3));
}

TEST(GuideGrammarRegular, EscapesAndUtf8DecodeToTheirCharacters) {
  const std::shared_ptr<GuideGrammar> g =
      gbnf(R"g(root ::= "\x41\u00e9\U0001F600\n\r\t\"\\\]\#" [\x30-\x32\u4e00])g");
  ASSERT_NE(g, nullptr);
  const std::string head = "A\xC3\xA9\xF0\x9F\x98\x80\n\r\t\"\\]#";
  EXPECT_TRUE(matches(*g, head + "0"));
  EXPECT_TRUE(matches(*g, head + "2"));
  EXPECT_TRUE(matches(*g, head + "\xE4\xB8\x80"));  // U+4E00
  EXPECT_FALSE(matches(*g, head + "3"));
  EXPECT_FALSE(matches(*g, head));
  EXPECT_EQ(verdict(*g, head + "\xE4\xB8"), Verdict::kPrefix);  // a character cut short
  EXPECT_EQ(verdict(*g, "\x41\xE9"), Verdict::kDead);           // Latin-1 é is not UTF-8
  // `.` is any code point, newline included, and never an ill-formed byte sequence.
  const std::shared_ptr<GuideGrammar> any = gbnf("root ::= .");
  for (const char* yes : {"a", "\n", "\xC3\xA9", "\xE4\xB8\x80", "\xF4\x8F\xBF\xBF"})
    EXPECT_TRUE(matches(*any, yes)) << yes;
  for (const char* no : {"\xFF", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "ab"})
    EXPECT_FALSE(matches(*any, no)) << no;
}

// ---------------------------------------------------------------------------------------------
// 3. Refused grammars.

TEST(GuideGrammarErrors, EachIsRefusedNamingTheProblem) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "no rules"},
      {"  # nothing but a comment\n\n", "no rules"},
      {"item ::= \"a\"", "no rule 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "rule 'root' is defined twice at line 2, column 1"},
      {"root ::= \"a\" item", "rule 'item' is used but never defined at line 1, column 14"},
      {"root ::= root \"a\" | \"a\"", "left recursion (root -> root)"},
      {"root ::= a \"x\"\na ::= root \"y\" | \"z\"", "left recursion (root -> a -> root)"},
      {"root ::= b root \"x\" | \"y\"\nb ::= \"b\"?", "left recursion (root -> root)"},
      {"root ::= \"x\" a\na ::= b \"c\" | \"d\"\nb ::= \"\" | a", "left recursion (a -> b -> a)"},
      {"root ::= \"a\" root", "rule 'root' derives no finite string"},
      {"root ::= \"a\" | b\nb ::= \"b\" b", "rule 'b' derives no finite string"},
      {"root \"a\"", "expected '::=' after the rule name at line 1, column 6"},
      {"::= \"a\"", "expected a rule name"},
      {"root ::= \"abc", "unterminated string literal"},
      {"root ::= [abc", "missing ']'"},
      {"root ::= (\"a\" | \"b\"", "missing ')'"},
      {"root ::= \"a\")", "unmatched ')'"},
      {"root ::= \"\\q\"", "unsupported escape \\q"},
      {"root ::= \"a\\", "a trailing backslash"},
      {"root ::= * \"a\"", "a quantifier with nothing to repeat"},
      {"root ::= \"a\" | {2}", "a quantifier with nothing to repeat"},
      {"root ::= \"a\"{3,2}", "{n,m} with m < n"},
      {"root ::= \"a\"{1001}", "repetition count above 1000"},
      {"root ::= \"a\"{2,1001}", "repetition count above 1000"},
      {"root ::= \"a\"{", "'{' must start {n}, {n,} or {n,m}"},
      {"root ::= \"a\"{2", "unterminated {n,m} quantifier"},
      {"root ::= []", "a character class that matches nothing"},
      {"root ::= [^\\x00-\\U0010FFFF]", "a character class that matches nothing"},
      {"root ::= [^\\x00-\\uD7FF\\uE000-\\U0010FFFF]", "a character class that matches nothing"},
      {"root ::= [z-a]", "a class range out of order"},
      {"root ::= \"\\x4g\"", "hex digits"},
      {"root ::= \"\\u12\"", "hex digits"},
      {"root ::= \"\\uD800\"", "a surrogate code point"},
      {"root ::= \"\\U00110000\"", "a code point above U+10FFFF"},
      {"root ::= \"a\xFF\"", "invalid UTF-8"},
      {"root ::= [\xC3]", "invalid UTF-8"},
      {"root ::= \"\xED\xA0\x80\"", "invalid UTF-8"},  // an encoded surrogate
      {"root ::= \"a\" $", "unexpected character '$'"},
      {"root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'), "nested too deep"},
      {R"g(root ::= ("a"{1000}){1000})g", "its automaton would have more than"},
      {R"g(root ::= ((((""){1000}){1000}){1000}){1000})g", "its automaton would have more than"},
  };
  for (const auto& [text, what] : bad) {
    StatusOr<regex::Nfa> nfa = grammar::compile_grammar(text);
    ASSERT_FALSE(nfa.ok()) << text;
    EXPECT_EQ(nfa.status().code(), StatusCode::kInvalidArgument) << text;
    const std::string& m = nfa.status().message();
    EXPECT_NE(m.find(what), std::string::npos) << text << " -> " << m;
    EXPECT_EQ(m.rfind("grammar: ", 0), 0u) << m;
    // Through the guide: the same error, prefixed with the request's field.
    StatusOr<std::shared_ptr<GuideGrammar>> g =
        GuideGrammar::compile({Kind::kGrammar, text, {}}, byte_vocab());
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(g.status().message(), "guided.grammar: " + m);
  }
}

TEST(GuideGrammarErrors, PositionsCountLinesAndColumns) {
  auto message = [](const std::string& text) {
    StatusOr<regex::Nfa> nfa = grammar::compile_grammar(text);
    return nfa.ok() ? std::string("accepted") : nfa.status().message();
  };
  EXPECT_EQ(message("root ::= a\na ::= \"x\"\n  | zz\n"),
            "grammar: rule 'zz' is used but never defined at line 3, column 5");
  EXPECT_EQ(message("root ::= \"a\"\n  | b\nb ::= \"c\" )\n"),
            "grammar: unmatched ')' at line 3, column 11");
  EXPECT_EQ(message("# one\n# two\nroot ::= [ab\n"), "grammar: missing ']' at line 4, column 1");
  EXPECT_EQ(message("root ::= x\n\n\nx ::= \"a\"\n  x ::= \"b\""),
            "grammar: rule 'x' is defined twice at line 5, column 3");
}

// A non-ASCII character where the grammar expects syntax (curly quotes pasted from a document,
// say) is shown whole, so the message stays UTF-8 (the server would otherwise replace all of it
// with "(message not UTF-8)"), and columns count characters, not bytes.
TEST(GuideGrammarErrors, MessagesStayUtf8) {
  for (const char* text : {"root ::= \xE2\x80\x9Cyes\xE2\x80\x9D", "root ::= \"\\\xC3\xA9\"",
                           "root ::= \xFF", "root ::= \"\\\xC3\""}) {
    StatusOr<regex::Nfa> nfa = grammar::compile_grammar(text);
    ASSERT_FALSE(nfa.ok()) << text;
    EXPECT_TRUE(utf8::is_valid(nfa.status().message())) << nfa.status().message();
  }
  EXPECT_EQ(grammar::compile_grammar("root ::= \xE2\x80\x9Cyes\xE2\x80\x9D").status().message(),
            "grammar: unexpected character '\xE2\x80\x9C' at line 1, column 10");
  EXPECT_EQ(grammar::compile_grammar("root ::= \"\xC3\xA9\" \xE2\x80\x9C").status().message(),
            "grammar: unexpected character '\xE2\x80\x9C' at line 1, column 14");
  EXPECT_EQ(grammar::compile_grammar("root ::= \xFF").status().message(),
            "grammar: unexpected character '\\xFF' at line 1, column 10");
}

// Every rule is checked, used or not; a rule chain thousands deep compiles and runs (the checks
// and the closure iterate, they do not recurse), and the rule count is bounded.
TEST(GuideGrammarErrors, LongRuleChainsAreFineUpToTheRuleBound) {
  auto chain = [](int n) {
    std::string text = "root ::= r1 \"y\"\n";
    for (int k = 1; k < n; ++k) text += fmt::format("r{} ::= r{} \"y\"\n", k, k + 1);
    return text + fmt::format("r{} ::= \"x\"\n", n);
  };
  const std::shared_ptr<GuideGrammar> g = gbnf(chain(3000));
  ASSERT_NE(g, nullptr);
  auto x_then_ys = [](size_t n) { return std::string("x").append(n, 'y'); };
  EXPECT_EQ(verdict(*g, x_then_ys(3000)), Verdict::kWhole);
  EXPECT_EQ(verdict(*g, x_then_ys(2999)), Verdict::kPrefix);
  EXPECT_EQ(verdict(*g, x_then_ys(3001)), Verdict::kDead);
  EXPECT_TRUE(grammar::compile_grammar(chain(grammar::kMaxRules - 1)).ok());
  StatusOr<regex::Nfa> too_many = grammar::compile_grammar(chain(grammar::kMaxRules));
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("more than 4096 rules"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// 4. The stack.

TEST(GuideGrammarStack, TailCallsKeepTheStateCountFlat) {
  struct Case {
    std::string grammar, unit, whole;
  };
  const std::vector<Case> cases = {
      {R"g(root ::= "a" root | "")g", "a", "aa"},
      {"root ::= \"a\" more | \"\"\nmore ::= root", "a", "aa"},
      {R"g(root ::= "a" ("," root)?)g", "a,", "a,a"},
      {R"g(root ::= item ( "" | root )
          item ::= "(" ")" | "x")g",
       "()x", "()x()"},
  };
  for (const Case& c : cases) {
    const std::shared_ptr<GuideGrammar> g = gbnf(c.grammar);
    ASSERT_NE(g, nullptr);
    int32_t s = g->start_state();
    for (int i = 0; i < 500; ++i) {
      StatusOr<int32_t> next = g->walk(s, c.unit);
      ASSERT_TRUE(next.ok());
      ASSERT_NE(*next, GuideGrammar::kDead) << c.grammar << " after " << i << " units";
      s = *next;
    }
    EXPECT_EQ(verdict(*g, c.whole), Verdict::kWhole) << c.grammar;
    EXPECT_LT(g->num_states(), 10u) << c.grammar;
  }
}

// The textbook expression grammar, alternatives not left-factored: compiled factored, each '('
// adds one stack, not 9x the stacks (it failed its bounds at the 5th '(' before).
TEST(GuideGrammarStack, UnfactoredAlternativesNestWithoutMultiplying) {
  const std::shared_ptr<GuideGrammar> g = gbnf(
      "root ::= expr\nexpr ::= term \"+\" expr | term \"-\" expr | term\n"
      "term ::= factor \"*\" term | factor \"/\" term | factor\n"
      "factor ::= \"(\" expr \")\" | [0-9]+");
  ASSERT_NE(g, nullptr);
  const std::string text = std::string(40, '(') + "1+2*3" + std::string(40, ')') + "-4/5";
  EXPECT_EQ(verdict(*g, text), Verdict::kWhole);
  EXPECT_EQ(verdict(*g, text.substr(0, 60)), Verdict::kPrefix);
  EXPECT_EQ(verdict(*g, text + ")"), Verdict::kDead);
  EXPECT_EQ(verdict(*g, "1+*2"), Verdict::kDead);
  EXPECT_LT(g->num_states(), 600u);
  // Alternatives led by the same multi-character literal factor too (its characters are spliced
  // into the alternative): "kk" overflowed at depth 9 when the literal was one opaque element.
  const std::shared_ptr<GuideGrammar> kw = gbnf(
      "root ::= e\ne ::= \"kk\" t \"+\" e | \"kk\" t \"-\" e | \"kk\" t\n"
      "t ::= f \"*\" t | f \"/\" t | f\nf ::= \"x\" | \"(\" e \")\"");
  ASSERT_NE(kw, nullptr);
  std::string nested = "kkx";
  for (int k = 0; k < 30; ++k) nested = "kk(" + nested + ")";
  EXPECT_EQ(verdict(*kw, nested), Verdict::kWhole);
  EXPECT_EQ(verdict(*kw, nested + "+kkx*x"), Verdict::kWhole);
  EXPECT_EQ(verdict(*kw, "k" + nested), Verdict::kDead);
  EXPECT_LT(kw->num_states(), 600u);
}

// Factoring's scans count against the compile bound: 170 equal alternatives of 180 characters,
// repeated 700 times, made few nodes but took 4-7 s of key comparisons; now refused at once.
TEST(GuideGrammarErrors, FactoringWorkIsBounded) {
  std::string alts;
  for (int k = 0; k < 170; ++k) alts += (k ? "|" : "") + std::string(180, 'a');
  StatusOr<regex::Nfa> rx = regex::compile_regex("(?:" + alts + "){700}");
  ASSERT_FALSE(rx.ok());
  EXPECT_NE(rx.status().message().find("its automaton would have more than"), std::string::npos)
      << rx.status().message();
  EXPECT_TRUE(regex::compile_regex("(?:" + alts + "){3}").ok());
}

// Quantifiers stack at most kMaxStackedQuantifiers deep on one element (each is a level of the
// compiler's recursion: 32 KiB of '?' overflowed the stack), in grammars and regexes alike.
TEST(GuideGrammarErrors, StackedQuantifiersAreBounded) {
  EXPECT_TRUE(grammar::compile_grammar("root ::= \"a\"*?+{2}").ok());
  StatusOr<regex::Nfa> too_many = grammar::compile_grammar("root ::= \"a\"*?+{2}?");
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("more than 4 quantifiers"), std::string::npos)
      << too_many.status().message();
  too_many = grammar::compile_grammar("root ::= \"a\"" + std::string(30000, '?'));
  ASSERT_FALSE(too_many.ok());
  EXPECT_TRUE(regex::compile_regex("a*?{2}{3}{4}").ok());  // *? is one quantifier (lazy)
  EXPECT_FALSE(regex::compile_regex("a*{2}{3}{4}{5}").ok());
  StatusOr<regex::Nfa> rx = regex::compile_regex("a" + std::string(30000, '*'));
  ASSERT_FALSE(rx.ok());
  EXPECT_NE(rx.status().message().find("more than 4 quantifiers"), std::string::npos)
      << rx.status().message();
}

TEST(GuideGrammarStack, DeepNestingOpensAndClosesExactly) {
  const std::shared_ptr<GuideGrammar> g = gbnf(R"g(root ::= "(" root ")" | "")g");
  ASSERT_NE(g, nullptr);
  const std::string open(200, '('), close(200, ')');
  EXPECT_EQ(verdict(*g, open), Verdict::kPrefix);
  EXPECT_EQ(verdict(*g, open + close.substr(1)), Verdict::kPrefix);
  EXPECT_EQ(verdict(*g, open + close), Verdict::kWhole);
  EXPECT_EQ(verdict(*g, open + close + ")"), Verdict::kDead);
  EXPECT_EQ(verdict(*g, open + close + "("), Verdict::kDead);
  EXPECT_GE(g->num_states(), 200u);  // a state per depth: the stack is really there
}

void expect_failed_for_good(GuideGrammar& g, const Status& failure) {
  EXPECT_EQ(failure.code(), StatusCode::kInvalidArgument) << failure.to_string();
  EXPECT_NE(failure.message().find("simplify the constraint"), std::string::npos);
  EXPECT_TRUE(g.failed());
  EXPECT_EQ(g.num_states(), 0u);
  EXPECT_FALSE(g.accepting(g.start_state()));
  EXPECT_FALSE(g.walk(g.start_state(), "").ok());
  EXPECT_FALSE(g.mask(g.start_state(), false).ok());
}

// Nesting past kMaxDfaStates depths: a state per depth, so the walk, or the mask that looks one
// byte ahead, fails with INVALID_ARGUMENT and the grammar fails for good; nothing crashes.
TEST(GuideGrammarStack, NestingPastTheStateBoundFailsTheGrammar) {
  const std::string text = R"g(root ::= "(" root ")" | "")g";
  const std::shared_ptr<GuideGrammar> walked = gbnf(text);
  ASSERT_NE(walked, nullptr);
  StatusOr<int32_t> s =
      walked->walk(walked->start_state(), std::string(GuideGrammar::kMaxDfaStates, '('));
  ASSERT_FALSE(s.ok());
  expect_failed_for_good(*walked, s.status());

  const std::shared_ptr<GuideGrammar> masked = gbnf(text);
  ASSERT_NE(masked, nullptr);
  s = masked->walk(masked->start_state(), std::string(GuideGrammar::kMaxDfaStates - 1, '('));
  ASSERT_TRUE(s.ok()) << s.status().to_string();  // exactly kMaxDfaStates states
  ASSERT_NE(*s, GuideGrammar::kDead);
  EXPECT_EQ(masked->num_states(), GuideGrammar::kMaxDfaStates);
  StatusOr<std::shared_ptr<const TokenMask>> m = masked->mask(*s, false);
  ASSERT_FALSE(m.ok());  // '(' would need one state more
  expect_failed_for_good(*masked, m.status());
}

// Alternatives that start alike are factored (`"a" root "b" | "a" root "c"` is one stack per 'a'),
// but two rules of one language are not: each 'a' doubles the stacks a state holds (which closer
// each 'a' will get, through x or y), and the sets pass their bounds within a few dozen bytes.
TEST(GuideGrammarStack, ExponentialStackSetsFailTheGrammar) {
  const std::shared_ptr<GuideGrammar> factored =
      gbnf(R"g(root ::= "a" root "b" | "a" root "c" | "")g");
  ASSERT_NE(factored, nullptr);
  StatusOr<int32_t> deep = factored->walk(factored->start_state(), std::string(200, 'a'));
  ASSERT_TRUE(deep.ok()) << deep.status().to_string();
  EXPECT_NE(*deep, GuideGrammar::kDead);
  EXPECT_LT(factored->num_states(), 250u);  // a state per depth, not per stack set
  const std::shared_ptr<GuideGrammar> g =
      gbnf("root ::= x root \"b\" | y root \"c\" | \"\"\nx ::= \"a\"\ny ::= \"a\"");
  ASSERT_NE(g, nullptr);
  Status failure;
  int32_t s = g->start_state();
  int steps = 0;
  for (; steps < 64 && failure.ok(); ++steps) {
    StatusOr<int32_t> next = g->walk(s, "a");
    if (!next.ok()) {
      failure = next.status();
    } else {
      ASSERT_NE(*next, GuideGrammar::kDead);
      s = *next;
    }
  }
  EXPECT_GT(steps, 10);  // small depths work
  expect_failed_for_good(*g, failure);
}

// 2^24 distinct stacks are reachable before the first byte: the start state's closure passes
// kMaxFrames while the grammar is built, and compile() refuses it (it must not return a grammar
// without a state 0, whose first walk would read an empty table).
TEST(GuideGrammarStack, TooManyStacksBeforeTheFirstByteFailCleanly) {
  // p_k and q_k are the same language but two rules, so nothing factors them.
  auto levels = [](int n) {
    std::string text = "root ::= p1 \"x\" | q1 \"y\"\n";
    for (int k = 1; k < n; ++k) {
      text +=
          fmt::format("p{0} ::= r{0}\nq{0} ::= r{0}\nr{0} ::= p{1} \"x\" | q{1} \"y\"\n", k, k + 1);
    }
    return text + fmt::format("p{0} ::= \"z\"\nq{0} ::= \"z\"\n", n);
  };
  std::string text = levels(24);
  StatusOr<std::shared_ptr<GuideGrammar>> g =
      GuideGrammar::compile({Kind::kGrammar, text, {}}, byte_vocab());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message().rfind("guided.grammar: guided decoding: the constraint's "
                                       "automaton grew past its bounds",
                                       0),
            0u)
      << g.status().message();
  // Twelve levels (4,096 stacks, under the frame bound) still compile and run.
  text = levels(12);
  g = GuideGrammar::compile({Kind::kGrammar, text, {}}, byte_vocab());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  StatusOr<int32_t> s = (*g)->walk((*g)->start_state(), std::string("z").append(12, 'y'));
  ASSERT_TRUE(s.ok());
  ASSERT_NE(*s, GuideGrammar::kDead);
  EXPECT_TRUE((*g)->accepting(*s));
}

// ---------------------------------------------------------------------------------------------
// 5. Token masks.

TEST(GuideGrammarMask, EqualsWalkingEveryTokenAndNeverStrands) {
  const std::vector<std::string> bytes = {"",   "(", ")",  "()", "(()", "a",   "ab", "))",
                                          "((", "b", ")(", "x",  "()a", "ba(", "",   "(a"};
  auto vocab = std::make_shared<const TokenVocabulary>(bytes, std::vector<std::string>{});
  std::mt19937 rng(11);
  for (const char* text : {R"g(root ::= "" | "(" root ")" root)g",
                           "root ::= item*\nitem ::= \"(\" root \")\" | \"a\" \"b\"?",
                           R"g(root ::= "(" root ")" | "a" "b"+)g"}) {
    const std::shared_ptr<GuideGrammar> g = gbnf(text, vocab);
    ASSERT_NE(g, nullptr);
    for (int run = 0; run < 30; ++run) {
      GuideState state(g, false);
      int32_t s = g->start_state();
      for (int step = 0; step < 16; ++step) {
        StatusOr<std::shared_ptr<const TokenMask>> m = state.mask();
        ASSERT_TRUE(m.ok());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < static_cast<int32_t>(bytes.size()); ++id) {
          const std::string& b = bytes[static_cast<size_t>(id)];
          StatusOr<int32_t> next = g->walk(s, b);
          ASSERT_TRUE(next.ok());
          const bool want = !b.empty() && *next != GuideGrammar::kDead;
          ASSERT_EQ((*m)->test(id), want) << text << " token '" << b << "' step " << step;
          if (want) allowed.push_back(id);
        }
        EXPECT_EQ((*m)->count, static_cast<int32_t>(allowed.size()));
        // Every state reached has a way on or is a whole text.
        ASSERT_TRUE(!allowed.empty() || state.accepting()) << text << " step " << step;
        if (allowed.empty()) break;
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(state.advance(pick).ok());
        s = *g->walk(s, bytes[static_cast<size_t>(pick)]);
        EXPECT_EQ(state.accepting(), g->accepting(s));
      }
    }
    // A token the mask leaves out is refused by advance.
    GuideState fresh(g, false);
    EXPECT_FALSE(fresh.advance(2).ok());  // ")" first
  }
}

// ---------------------------------------------------------------------------------------------
// 6. JSON in GBNF.

TEST(GuideGrammarJson, MatchesARecursiveDescentReader) {
  const std::shared_ptr<GuideGrammar> g = gbnf(kJsonGrammar);
  ASSERT_NE(g, nullptr);
  expect_language(*g, all_texts(bytes_of("[]{}\":,1 "), 5), json_oracle, "json structure");
  expect_language(*g, all_texts(bytes_of("\"\\u0-.e1+"), 5), json_oracle, "json scalars");
  const std::vector<std::string> valid = {
      "{}",
      "[]",
      " [ 1 , -2.5e+3 , 0.0 , 1E-0 ] ",
      R"g({"a": [true, false, null], "b": {"c": "d\n\"\\\/\u00E9"}})g",
      "\"h\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80\"",
      R"g([[[[[[[[[[{"deep": [[[]]]}]]]]]]]]]])g",
      "-0",
      "\n\t{\r\n \"k\" :\t\"v\" }\n",
      "123456789012345678901234567890",
  };
  for (const std::string& t : valid) {
    EXPECT_TRUE(matches(*g, t)) << t;
    for (size_t n = 0; n < t.size(); ++n)  // every prefix live
      ASSERT_NE(verdict(*g, t.substr(0, n)), Verdict::kDead) << t << " at " << n;
  }
  // Invalid texts: live up to the first bad byte (found by hand from RFC 8259), dead from it.
  const std::vector<std::pair<std::string, size_t>> invalid = {
      {"[1,]", 3},     {"{'a':1}", 1},   {"01", 1},       {"\"\\x\"", 2},          {"tru e", 3},
      {"1.e5", 2},     {"{\"a\" 1}", 5}, {"[1 2]", 3},    {"{\"a\":1,}", 7},       {"\"a\nb\"", 2},
      {"+1", 0},       {"[1]]", 3},      {"\"\xFF\"", 1}, {"\"\xC3\xA9\x80\"", 3}, {"nul", 99},
      {"{\"a\":", 99},
  };
  for (const auto& [t, bad] : invalid) {
    EXPECT_FALSE(matches(*g, t)) << t;
    for (size_t n = 0; n <= t.size(); ++n) {
      const Verdict v = verdict(*g, t.substr(0, n));
      ASSERT_EQ(v == Verdict::kDead, n > bad) << t << " prefix of " << n;
    }
  }
}

}  // namespace
}  // namespace kvsplit::sampling
