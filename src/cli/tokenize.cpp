#include "cli/tokenize.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/exit_codes.h"
#include "cli/stdout_writer.h"
#include "common/json_util.h"
#include "model/tokenizer.h"

namespace kvsplit::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

int fail(const Status& st) {
  std::fprintf(stderr, "kvsplit tokenize: error: %s\n", st.to_string().c_str());
  return exit_code_for(st.code());
}

// A directory means the HF model directory's tokenizer.json (else its tokenizer.bin).
std::string resolve(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  const auto dir = std::filesystem::path(path);
  for (const char* name : {"tokenizer.json", "tokenizer.bin"}) {
    if (std::filesystem::exists(dir / name, ec)) return (dir / name).string();
  }
  return (dir / "tokenizer.json").string();  // load_tokenizer reports it missing
}

// A JSONL line longer than this is refused (a file with no newline, /dev/zero), as
// `kvsplit perplexity` caps its input.
constexpr size_t kMaxLineBytes = size_t{256} << 20;

// The next line of `in` (without its '\n') into *line; false at the end of the input. A line
// over kMaxLineBytes stops there with *too_long set.
bool next_line(std::istream& in, std::string* line, bool* too_long) {
  std::streambuf* sb = in.rdbuf();
  line->clear();
  for (bool any = false;; any = true) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) return any;
    if (c == '\n') return true;
    if (line->size() >= kMaxLineBytes) {
      *too_long = true;
      return true;
    }
    line->push_back(static_cast<char>(c));
  }
}

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace

void add_tokenize_options(CLI::App* cmd, TokenizeFlags& f) {
  cmd->add_option("--tokenizer", f.tokenizer,
                  "tokenizer.json, llama2.c tokenizer.bin, or an HF model directory")
      ->required();
  cmd->add_option("text", f.texts, "texts to encode (one output line each)");
  cmd->add_option("--input-jsonl", f.input_jsonl,
                  "read {\"text\": ...} lines from FILE (- = stdin) and write each object back "
                  "with \"ids\" set (other fields kept)");
  cmd->add_flag("--json", f.json, "print one {\"text\": ..., \"ids\": [...]} line per text");
  cmd->add_flag("--no-special", f.no_special,
                "do not add the tokens the tokenizer adds around a text (BOS); "
                "HF add_special_tokens=False");
  cmd->add_flag("--special-as-text", f.special_as_text,
                "encode special-token text (<s>, <|endoftext|>) as plain text instead of the "
                "special ids");
}

int run_tokenize(const TokenizeFlags& f) {
  if (!f.input_jsonl.empty() && !f.texts.empty()) {
    return fail(invalid_argument("give texts or --input-jsonl, not both"));
  }
  if (f.input_jsonl.empty() && f.texts.empty()) {
    return fail(invalid_argument("nothing to encode: give texts or --input-jsonl FILE"));
  }
  auto tok = model::load_tokenizer(resolve(f.tokenizer));
  if (!tok.ok()) return fail(tok.status());
  model::EncodeOptions opt;
  opt.add_special = !f.no_special;
  opt.parse_special = !f.special_as_text;

  // Each line is written as it is encoded; the first write that fails (stdout full, or a pipe
  // whose reader has gone) stops the run there (exit 1), the rest of the input not read.
  StdoutWriter writer;
  auto stopped = [&](const std::string& at) {
    return fail(internal_error(writer.status().message() + "; stopped at " + at +
                               ", the input after it not encoded"));
  };
  if (f.input_jsonl.empty()) {
    for (size_t n = 0; n < f.texts.size(); ++n) {
      const std::string& text = f.texts[n];
      auto ids = (*tok)->encode(text, opt);
      if (!ids.ok()) return fail(ids.status());
      std::string line;
      if (f.json) {
        ordered_json j;
        j["text"] = text;
        j["ids"] = *ids;
        line = dump(j);
      } else {
        for (size_t i = 0; i < ids->size(); ++i) line += (i ? " " : "") + std::to_string((*ids)[i]);
      }
      if (!writer.write(line + "\n", /*flush=*/false))
        return stopped("text " + std::to_string(n + 1) + " of " + std::to_string(f.texts.size()));
    }
    Status st = flush_stdout();
    return st.ok() ? 0 : fail(st);
  }

  std::ifstream file;
  if (f.input_jsonl != "-") {
    file.open(f.input_jsonl, std::ios::binary);
    if (!file) return fail(not_found(f.input_jsonl + ": cannot open"));
  }
  std::istream& in = f.input_jsonl == "-" ? std::cin : file;
  std::string line;
  bool too_long = false;
  for (size_t n = 1; next_line(in, &line, &too_long); ++n) {
    const std::string where = f.input_jsonl + ":" + std::to_string(n) + ": ";
    if (too_long) {
      return fail(invalid_argument(where + "line longer than " +
                                   std::to_string(kMaxLineBytes >> 20) + " MiB"));
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    // The shared parser's limits first (nesting depth, duplicate keys: writing a deeply nested
    // object back recursed until the stack ran out), then the order-keeping parse for output.
    const StatusOr<common::Json> checked = common::parse_json(line, "");
    if (!checked.ok()) return fail(invalid_argument(where + checked.status().message()));
    ordered_json j = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return fail(invalid_argument(where + "not a JSON value"));
    if (!j.is_object()) return fail(invalid_argument(where + "expected a JSON object"));
    auto text = j.find("text");
    if (text == j.end() || !text->is_string()) {
      return fail(invalid_argument(where + "expected a string field \"text\""));
    }
    auto ids = (*tok)->encode(text->get<std::string>(), opt);
    if (!ids.ok()) return fail(invalid_argument(where + ids.status().message()));
    j["ids"] = *ids;
    if (!writer.write(dump(j) + "\n", /*flush=*/false))
      return stopped(f.input_jsonl + ":" + std::to_string(n));
  }
  if (in.bad()) return fail(data_loss(f.input_jsonl + ": read error"));
  Status st = flush_stdout();
  return st.ok() ? 0 : fail(st);
}

}  // namespace kvsplit::cli
