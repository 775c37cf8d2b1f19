// `kvsplit perplexity` (as llama.cpp's llama-perplexity): teacher-forced NLL and perplexity of a
// text under a KV policy. --text FILE is one stream cut into windows of --ctx tokens, each from a
// fresh KV cache; --jsonl FILE reads {"text": ...} lines, each its own sequence from BOS (longer
// ones are windowed too). Every token of a window but its first is scored. With a cut or a
// baseline on, a window is fed as it would be generated: a first chunk of --prefill tokens, then
// one token per decode step, the cut acting between steps as in serving.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/common_flags.h"
#include "cli/cut_flags.h"

namespace kvsplit::cli {

struct PerplexityFlags {
  std::string text;
  std::string jsonl;
  int ctx = 0;  // 0: the model's context length
  int block_size = 16;
  int split_chunk = -1;
  bool json = false;
  CutFlags cut;
};

void add_perplexity_options(CLI::App* app, CommonFlags& common, PerplexityFlags& flags);

// Exit status: 0 ok, 2 bad input (file, flags, a JSONL line: the message names it), 1 internal.
// Prints a summary (or, with --json, one line: tokens, nll, ppl, avg/peak_resident_kv_fraction,
// demotions, evictions, recalls and the other counters).
int run_perplexity(const CLI::App& app, CommonFlags& common, const PerplexityFlags& flags);

}  // namespace kvsplit::cli
