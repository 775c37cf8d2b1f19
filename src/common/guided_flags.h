// `--guided-regex | --guided-choice | --guided-json | --json-object | --guided-grammar`: guided
// decoding (SamplingParams::guided; docs/sampling.md "Guided decoding") from the command line,
// the same five flags for `kvsplit generate` and `kvsplit-client`. Header-only so that tests/cli
// parses the flags in-process (the tools' sources are not a library).
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvsplit/sampling_params.h"
#include "kvsplit/status.h"

namespace kvsplit {

struct GuidedFlags {
  std::string regex;                 // --guided-regex R
  std::vector<std::string> choices;  // --guided-choice S, one choice per use
  std::string json;                  // --guided-json SCHEMA, or @PATH: the schema is that file
  bool json_object = false;          // --json-object
  std::string grammar;               // --guided-grammar GBNF, or @PATH: the grammar is that file
};

// The bytes of the file a `--guided-json @path` (or `--guided-grammar @path`) names. kNotFound
// naming the flag and the path when it cannot be opened or read; kInvalidArgument when it holds
// more than kMaxGuidedSpecBytes (read no further: "@/dev/zero" must not fill memory).
inline StatusOr<std::string> read_guided_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return invalid_argument(flag + ": @ needs a file name (@schema.json)");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) {
    return not_found(flag + ": cannot open '" + path + "': " + std::strerror(errno));
  }
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) {
    text.append(buf, n);
    if (text.size() > kMaxGuidedSpecBytes) {
      return invalid_argument(flag + ": '" + path + "' is larger than " +
                              std::to_string(kMaxGuidedSpecBytes) +
                              " bytes, the limit of a schema or grammar");
    }
  }
  if (std::ferror(f.get())) {
    return not_found(flag + ": cannot read '" + path + "': " + std::strerror(errno));
  }
  return text;
}

// A flag's value as given, or the file it names after '@'.
inline StatusOr<std::string> guided_text(const std::string& flag, const std::string& value) {
  if (value.rfind('@', 0) == 0) return read_guided_file(flag, value.substr(1));
  return value;
}

// Adds the five flags to `app`; at most one of them may be given (CLI11: "--guided-regex excludes
// --guided-choice").
inline void add_guided_options(CLI::App* app, GuidedFlags& f) {
  CLI::Option* regex = app->add_option(
      "--guided-regex", f.regex,
      "guided decoding: the whole text matches this regular expression (docs/sampling.md)");
  // One value per use: `--guided-choice yes no` must not read `no` as a second choice (or eat a
  // positional argument after it).
  CLI::Option* choice = app->add_option("--guided-choice", f.choices,
                                        "guided decoding: the text is exactly one of these "
                                        "strings (repeatable: --guided-choice a --guided-choice b)")
                            ->allow_extra_args(false);
  CLI::Option* json = app->add_option(
      "--guided-json", f.json,
      "guided decoding: the text is JSON valid under this JSON schema (its text, or @PATH: "
      "the schema is that file)");
  CLI::Option* object =
      app->add_flag("--json-object", f.json_object, "guided decoding: the text is a JSON object");
  CLI::Option* grammar = app->add_option(
      "--guided-grammar", f.grammar,
      "guided decoding: the text is a string of this GBNF grammar's rule root (its text, or "
      "@PATH: the grammar is that file; docs/sampling.md)");
  regex->excludes(choice)->excludes(json)->excludes(object)->excludes(grammar);
  choice->excludes(json)->excludes(object)->excludes(grammar);
  json->excludes(object)->excludes(grammar);
  object->excludes(grammar);
}

// The constraint the flags of `app` ask for (kind kNone without any), the @PATH of --guided-json
// read. Sizes and syntax are SamplingParams::validate's to check.
inline StatusOr<GuidedDecoding> guided_from_flags(const CLI::App& app, const GuidedFlags& f) {
  using Kind = GuidedDecoding::Kind;
  GuidedDecoding g;
  if (app.count("--guided-regex") > 0) {
    g.kind = Kind::kRegex;
    g.spec = f.regex;
  } else if (app.count("--guided-choice") > 0) {
    g.kind = Kind::kChoice;
    g.choices = f.choices;
  } else if (app.count("--guided-json") > 0) {
    g.kind = Kind::kJsonSchema;
    auto text = guided_text("--guided-json", f.json);
    if (!text.ok()) return text.status();
    g.spec = std::move(text).value();
  } else if (app.count("--guided-grammar") > 0) {
    g.kind = Kind::kGrammar;
    auto text = guided_text("--guided-grammar", f.grammar);
    if (!text.ok()) return text.status();
    g.spec = std::move(text).value();
  } else if (f.json_object) {
    g.kind = Kind::kJsonObject;
  }
  return g;
}

}  // namespace kvsplit
