// `kvsplit tokenize`: prints the token ids of texts, as HF tokenizers' encode() gives them by
// default, for inspecting prompts and checking tokenizer vectors.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kvsplit::cli {

struct TokenizeFlags {
  std::string tokenizer;  // tokenizer.json, tokenizer.bin, or an HF model directory
  std::vector<std::string> texts;
  std::string input_jsonl;  // "-" = stdin
  bool json = false;
  bool no_special = false;       // add_special_tokens=False
  bool special_as_text = false;  // special-token text is plain text
};

// Adds the subcommand's options to `cmd`, writing into `flags`.
void add_tokenize_options(CLI::App* cmd, TokenizeFlags& flags);

// Runs it. Returns the exit status: 0 ok, 2 bad input (unreadable or malformed tokenizer, bad
// JSONL line: the message names the line), 1 internal error.
int run_tokenize(const TokenizeFlags& flags);

}  // namespace kvsplit::cli
