// JSON schema -> regular expression, for guided decoding (structured output). The regex syntax is
// the one the guide's regex engine accepts (a subset of ECMAScript): literal bytes, escaped
// metacharacters, classes, (?:...) groups, | and greedy quantifiers with counts <= 1000.
//
// Generated JSON has one fixed shape, so that a model cannot loop on whitespace: an optional
// single space ([ ]?) after each ',' and ':', no whitespace anywhere else; object properties in
// the order the schema declares them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::sampling {

// A regex matching exactly `literal` (metacharacters and control bytes escaped; non-ASCII bytes
// kept as they are).
std::string regex_escape(std::string_view literal);

// A regex matching exactly one of `choices` (non-empty; a caller rejects an empty list as bad
// input): an alternation of escaped literals in a (?:...) group.
std::string choice_regex(const std::vector<std::string>& choices);

// A regex of any JSON object whose objects and arrays nest at most `max_depth` (>= 1) levels, the
// top-level object being level 1. Values: strings, numbers, true/false/null and nested containers.
std::string json_object_regex(int max_depth);

// The regex of the JSON texts valid under `schema`, the text of a JSON schema (draft 2020-12 or
// draft-07 spellings; the supported subset is listed in json_schema.cpp). The regex may accept
// fewer texts than the schema does (one canonical shape per value, see above), never more, except
// where json_schema.cpp says so (`pattern`, string lengths).
// Errors (kInvalidArgument, message "json_schema: ..." naming the keyword and its JSON pointer
// path "#/..."): malformed JSON, an unsupported keyword or value, a `false` schema, a $ref that
// does not resolve or only recurses, or a regex longer than max_regex_bytes.
// The same, for schemas whose $refs recur (a tree, a linked list): rules[0] is the text's regex;
// a $ref target met again inside its own expansion becomes rule r >= 1 (names[r]: its "#/..."
// path), whose regex is rules[r], and every reference to it is `(?&r)`. regex::compile_regex_rules
// compiles them, and refuses a target that only recurses (no finite document) or recurs before
// any text. max_regex_bytes bounds all the rules together.
struct SchemaRegexes {
  std::vector<std::string> rules;
  std::vector<std::string> names;
};
StatusOr<SchemaRegexes> json_schema_to_rules(std::string_view schema,
                                             size_t max_regex_bytes = size_t{1} << 20);
// Only for a schema without recursion (tests compare it with std::regex): kInvalidArgument when a
// $ref recurs.
StatusOr<std::string> json_schema_to_regex(std::string_view schema,
                                           size_t max_regex_bytes = size_t{1} << 20);

}  // namespace kvsplit::sampling
