// Speculative decoding (n-gram prompt lookup, docs/serving.md "Speculative decoding"): output
// tokens/s of one colocated worker with drafts against the same engine without, in the same
// process, taking turns (--reps rounds; which runs first alternates), on:
//   - story:  TinyStories openings (../shared/data/tinystories_sample.txt), greedy and seeded
//             sampling (every other request at temperature 0.8), EOS ends them;
//   - copy:   a whole TinyStories paragraph, then its first sentence again (the pattern prompt
//             lookup is for: an answer that quotes its context, a code edit, an extraction);
//   - recall: recall-llama (a trained 0.4M-parameter Llama, ../shared/models/recall-llama) on the
//             first --recall-words words of its evaluation documents (word pairs, then a filler
//             that cycles through a fixed list: the continuation repeats the context, as in
//             extraction or templated output); only for a model whose path names recall-llama,
//             which runs this load alone;
// per model (--models: stories260K, a 1 MB model whose CPU step is compute-bound, recall-llama,
// and synthetic:llama-110m, 440 MB of f32 weights whose decode step reads them all:
// memory-bound, as decode on a GPU is; its random weights fall into loops, so its drafts are
// nearly always accepted: an upper bound, not a workload) and batch size (--batches). Per row:
// draft tokens per decode row, acceptance (accepted / drafted), tokens per forward pass of a
// request (1 + accepted per row), tokens/s off and on (median of the rounds) and their ratio, and
// whether every request's tokens were the same with and without drafts (they must be: greedy and
// seeded sampling are exact).
//
//   build/benchmarks/bench_speculative [--models M1,M2] [--batches 1,8] [--max-tokens N]
//       [--num-speculative-tokens K] [--reps R] [--threads T] [--data FILE]
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_options.h"
#include "kvsplit/engine.h"
#include "sampling/ngram_draft.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvsplit::EngineConfig;

struct Options {
  std::vector<std::string> models;
  std::vector<int> batches = {1, 8};
  int max_tokens = 128;
  int k = 5;
  int reps = 3;
  int threads = 2;
  std::string data;
  std::string recall_docs;
  size_t copy_chars = 600;
  int recall_words = 120;
};

std::string shared_dir() {
  if (const char* env = std::getenv("KVSPLIT_MODELS"); env && *env) return env;
  return "../shared/models";
}

// The sample's paragraphs (blank-line separated, or one per line), trimmed.
std::vector<std::string> paragraphs(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line, cur;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      continue;
    }
    if (line.rfind("Once upon", 0) == 0 && !cur.empty()) {  // a new story starts
      out.push_back(cur);
      cur.clear();
    }
    cur += (cur.empty() ? "" : " ") + line;
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string first_sentence(const std::string& p) {
  const size_t dot = p.find_first_of(".!?");
  return dot == std::string::npos ? p : p.substr(0, dot + 1);
}

// The first `words` words of each {"text": ...} line of `path` (recall-llama's documents).
std::vector<std::string> recall_prompts(const std::string& path, int words) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) continue;
    std::istringstream ws(j["text"].get<std::string>());
    std::string w, prompt;
    for (int i = 0; i < words && ws >> w; ++i) prompt += (i ? " " : "") + w;
    if (!prompt.empty()) out.push_back(prompt);
  }
  return out;
}

// The paragraph's whole sentences within `chars` characters (at least its first).
std::string leading_sentences(const std::string& p, size_t chars) {
  size_t end = 0;
  for (size_t at = p.find_first_of(".!?"); at != std::string::npos && at < chars;
       at = p.find_first_of(".!?", at + 1))
    end = at + 1;
  return end == 0 ? first_sentence(p) : p.substr(0, end);
}

struct Run {
  double seconds = 0;
  int64_t tokens = 0, rows = 0, drafts = 0, accepted = 0;
  std::vector<std::vector<int32_t>> outputs;
};

kvsplit::StatusOr<Run> run(kvsplit::Engine& engine, const std::vector<kvsplit::Request>& reqs) {
  const kvsplit::EngineStats before = engine.stats();
  Run r;
  const auto t0 = Clock::now();
  std::vector<kvsplit::RequestHandle> handles;
  for (const kvsplit::Request& q : reqs) {
    auto h = engine.submit(q);
    if (!h.ok()) return h.status();
    handles.push_back(*h);
  }
  for (kvsplit::RequestHandle& h : handles) {
    std::vector<int32_t> ids;
    for (;;) {
      kvsplit::TokenEvent ev;
      if (!h.next(&ev, std::chrono::seconds(600))) return kvsplit::internal_error("timed out");
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (!ev.final) continue;
      if (!ev.status.ok()) return ev.status;
      break;
    }
    r.tokens += static_cast<int64_t>(ids.size());
    r.outputs.push_back(std::move(ids));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const kvsplit::EngineStats after = engine.stats();
  for (size_t p = 0; p < after.pools.size(); ++p) {
    r.rows += after.pools[p].spec_rows - before.pools[p].spec_rows;
    r.drafts += after.pools[p].spec_draft_tokens - before.pools[p].spec_draft_tokens;
    r.accepted += after.pools[p].spec_accepted_tokens - before.pools[p].spec_accepted_tokens;
  }
  return r;
}

// The draft lookup's cost against the context length (the worst case: random tokens over a
// 32K vocabulary, where the last token recurs but longer suffixes do not, so the whole sequence is
// scanned), against one std::count pass of the last token over the same tokens in the same run.
void lookup_costs(int k) {
  std::printf(
      "\ndraft lookup (propose_ngram_draft, prompt_lookup 1..4): worst case, random tokens\n");
  std::printf("%9s | %12s %12s %6s\n", "context", "lookup us", "count us", "ratio");
  std::mt19937 rng(7);
  for (int len : {2048, 32768, 131072}) {
    std::vector<int32_t> t(static_cast<size_t>(len));
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 32000);
    std::vector<int32_t> out;
    const kvsplit::sampling::NgramDraftConfig cfg{k, 1, 4};
    double best_lookup = 1e30, best_count = 1e30;
    int64_t sink = 0;
    for (int rep = 0; rep < 20; ++rep) {
      auto a = Clock::now();
      kvsplit::sampling::propose_ngram_draft(t, cfg, &out);
      auto b = Clock::now();
      sink += std::count(t.begin(), t.end() - 1, t.back());
      auto c = Clock::now();
      sink += static_cast<int64_t>(out.size());
      best_lookup = std::min(best_lookup, std::chrono::duration<double, std::micro>(b - a).count());
      best_count = std::min(best_count, std::chrono::duration<double, std::micro>(c - b).count());
    }
    std::printf("%9d | %12.1f %12.1f %5.2fx%s\n", len, best_lookup, best_count,
                best_count > 0 ? best_lookup / best_count : 0.0, sink < 0 ? " " : "");
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_speculative: n-gram speculative decoding against plain decoding"};
  Options o;
  o.models = {shared_dir() + "/stories260K.bin", shared_dir() + "/recall-llama",
              "synthetic:llama-110m"};
  o.data = shared_dir() + "/../data/tinystories_sample.txt";
  o.recall_docs = shared_dir() + "/../data/recall_eval_docs.jsonl";
  app.add_option("--models", o.models, "models (paths or synthetic:<preset>)")->delimiter(',');
  app.add_option("--batches", o.batches, "requests submitted at once")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  app.add_option("--max-tokens", o.max_tokens, "tokens per request")->check(CLI::Range(2, 4096));
  app.add_option("--num-speculative-tokens", o.k, "draft tokens per row at most")
      ->check(CLI::Range(1, 16));
  app.add_option("--reps", o.reps, "rounds (median)")->check(CLI::Range(1, 100));
  app.add_option("--threads", o.threads, "CPU threads of the worker")->check(CLI::Range(1, 256));
  app.add_option("--data", o.data, "TinyStories sample text");
  app.add_option("--copy-chars", o.copy_chars, "copy load: characters of context at most")
      ->check(CLI::Range(1, 100000));
  app.add_option("--recall-docs", o.recall_docs, "recall load: recall-llama's documents (jsonl)");
  app.add_option("--recall-words", o.recall_words, "recall load: words of each document")
      ->check(CLI::Range(1, 400));
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  spdlog::set_level(spdlog::level::warn);

  std::vector<std::string> paras = paragraphs(o.data);
  if (paras.empty()) {  // no shared data here: two stories of its kind
    std::fprintf(stderr, "bench_speculative: no text in %s: using built-in stories\n",
                 o.data.c_str());
    paras = {
        "Once upon a time there was a little girl named Lily. She liked to play in the park "
        "with her dog. One day the dog ran away, and Lily looked for him everywhere.",
        "Tom had a big red ball. He played with it in the garden every day. His mom said, "
        "\"Tom, be careful with the ball!\" Tom smiled and threw the ball high."};
  }
  std::printf("%-28s %-6s %5s | %6s %6s %6s | %9s %9s %6s | %s\n", "model", "load", "batch",
              "drafts", "accept", "tok/row", "off tok/s", "on tok/s", "ratio", "same tokens");
  for (const std::string& model : o.models) {
    EngineConfig base;
    base.model = model;
    base.mode = kvsplit::ServingMode::kColocated;
    base.num_decode_workers = 1;
    base.threads_per_worker = o.threads;
    base.kv_blocks_per_worker = 2048;
    base.max_batch_tokens = 1024;
    EngineConfig spec = base;
    spec.speculative.method = kvsplit::SpeculativeMethod::kNgram;
    spec.speculative.num_speculative_tokens = o.k;
    auto off = kvsplit::Engine::create(base);
    auto on = kvsplit::Engine::create(spec);
    if (!off.ok() || !on.ok()) {
      std::fprintf(stderr, "bench_speculative: %s: %s\n", model.c_str(),
                   (!off.ok() ? off.status() : on.status()).to_string().c_str());
      return 1;
    }
    const bool recall_model = model.find("recall-llama") != std::string::npos;
    const std::vector<std::string> recall =
        recall_model ? recall_prompts(o.recall_docs, o.recall_words) : std::vector<std::string>{};
    if (recall_model && recall.empty()) {
      std::fprintf(stderr, "bench_speculative: no documents in %s: %s skipped\n",
                   o.recall_docs.c_str(), model.c_str());
      continue;
    }
    const std::vector<const char*> loads = recall_model ? std::vector<const char*>{"recall"}
                                                        : std::vector<const char*>{"story", "copy"};
    for (const char* load : loads) {
      for (int batch : o.batches) {
        std::vector<kvsplit::Request> reqs;
        for (int i = 0; i < batch; ++i) {
          const std::string& p = paras[static_cast<size_t>(i) % paras.size()];
          kvsplit::Request r;
          // copy: sentences up to --copy-chars (within stories260K's 512-token context), then
          // the first again.
          r.prompt = std::string(load) == "recall" ? recall[static_cast<size_t>(i) % recall.size()]
                     : std::string(load) == "story"
                         ? first_sentence(p)
                         : leading_sentences(p, o.copy_chars) + "\n" + first_sentence(p);
          r.sampling.max_tokens = o.max_tokens;
          r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
          r.sampling.seed = 100 + static_cast<uint64_t>(i);
          reqs.push_back(r);
        }
        std::vector<double> tps_off, tps_on;
        Run last_on;
        bool same = true;
        for (int rep = 0; rep < o.reps; ++rep) {
          kvsplit::StatusOr<Run> a = kvsplit::internal_error("unset"), b = a;
          if (rep % 2 == 0) {
            a = run(**off, reqs);
            b = run(**on, reqs);
          } else {
            b = run(**on, reqs);
            a = run(**off, reqs);
          }
          if (!a.ok() || !b.ok()) {
            std::fprintf(stderr, "bench_speculative: %s\n",
                         (!a.ok() ? a.status() : b.status()).to_string().c_str());
            return 1;
          }
          tps_off.push_back(static_cast<double>(a->tokens) / a->seconds);
          tps_on.push_back(static_cast<double>(b->tokens) / b->seconds);
          same = same && a->outputs == b->outputs;
          last_on = *b;
        }
        const double m_off = median(tps_off), m_on = median(tps_on);
        const double decode_rows_tokens = static_cast<double>(last_on.rows + last_on.accepted);
        std::printf("%-28s %-6s %5d | %6.2f %5.1f%% %6.2f | %9.1f %9.1f %5.2fx | %s\n",
                    model.substr(model.find_last_of('/') + 1).substr(0, 28).c_str(), load, batch,
                    last_on.rows > 0 ? static_cast<double>(last_on.drafts) / last_on.rows : 0.0,
                    last_on.drafts > 0 ? 100.0 * last_on.accepted / last_on.drafts : 0.0,
                    last_on.rows > 0 ? decode_rows_tokens / last_on.rows : 1.0, m_off, m_on,
                    m_off > 0 ? m_on / m_off : 0.0, same ? "yes" : "NO");
        std::fflush(stdout);
        if (!same) return 1;
      }
    }
  }
  lookup_costs(o.k);
  return 0;
}
