// bench_tokenizer: encoding speed of the tokenizers on TinyStories text repeated to 1 KB .. 1 MB,
// one thread, thread CPU time. Prints MB/s per size and the time per byte at 1 MB over that at 10
// KB (about 1 when encoding is linear in the text length; a quadratic loop would give ~100).
//
//   build/benchmarks/bench_tokenizer [--models DIR] [--data FILE] [--min-seconds S]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/cli_options.h"
#include "model/tokenizer.h"

namespace {

using kvsplit::model::Tokenizer;

std::string default_models() {
  if (const char* env = std::getenv("KVSPLIT_MODELS"); env && *env) return env;
  return "../shared/models";
}

// `sample` repeated to `bytes`, cut back to a UTF-8 character boundary.
std::string repeat_to(const std::string& sample, size_t bytes) {
  std::string s;
  while (s.size() < bytes) s += sample;
  size_t n = bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s;
}

struct Result {
  double seconds;  // best time of one encode
  size_t tokens;
};

// CPU time of the calling thread, in seconds: on a shared machine it does not count the time
// other processes hold the core.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Encodes `text` repeatedly for at least `min_seconds` (and 3 times); keeps the best time.
Result measure(const Tokenizer& tok, const std::string& text, double min_seconds) {
  Result r{1e300, 0};
  double total = 0;
  for (int i = 0; i < 3 || total < min_seconds; ++i) {
    const double t0 = thread_seconds();
    auto ids = tok.encode(text, /*add_bos=*/false);
    const double s = thread_seconds() - t0;
    if (!ids.ok()) {
      std::fprintf(stderr, "encode failed: %s\n", ids.status().to_string().c_str());
      std::exit(1);
    }
    r.seconds = std::min(r.seconds, s);
    r.tokens = ids->size();
    total += s;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = default_models();
  std::string data;
  double min_seconds = 0.5;
  CLI::App app{"bench_tokenizer: tokenizer encoding speed, 1 KB .. 1 MB"};
  app.add_option("--models", models,
                 "shared models folder (default $KVSPLIT_MODELS or "
                 "../shared/models)");
  app.add_option("--data", data, "text sample (default <models>/../data/tinystories_sample.txt)");
  app.add_option("--min-seconds", min_seconds, "time spent per (tokenizer, size)");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (data.empty()) data = models + "/../data/tinystories_sample.txt";

  std::ifstream in(data, std::ios::binary);
  const std::string sample(std::istreambuf_iterator<char>(in), {});
  if (sample.empty()) {
    std::fprintf(stderr, "bench_tokenizer: cannot read %s\n", data.c_str());
    return 2;
  }
  const std::vector<std::pair<const char*, std::string>> files = {
      {"gpt2 (tokenizer.json)", models + "/tokenizers/gpt2/tokenizer.json"},
      {"qwen2 (tokenizer.json)", models + "/tokenizers/qwen2/tokenizer.json"},
      {"llama2 (tokenizer.json)", models + "/tokenizers/llama2/tokenizer.json"},
      {"llama2 (tokenizer.bin)", models + "/tokenizers/llama2/tokenizer.bin"},
  };
  const size_t sizes[] = {1000, 10000, 100000, 1000000};

  std::printf("text: %s repeated; one thread, its CPU time; best of >= 3 runs and >= %.1f s\n",
              data.c_str(), min_seconds);
  std::printf("%-24s %9s %9s %9s %9s %13s\n", "tokenizer", "1 KB", "10 KB", "100 KB", "1 MB",
              "1MB/10KB t/B");
  for (const auto& [name, path] : files) {
    const auto t0 = std::chrono::steady_clock::now();
    auto tok = kvsplit::model::load_tokenizer(path);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!tok.ok()) {
      std::printf("%-24s skipped: %s\n", name, tok.status().to_string().c_str());
      continue;
    }
    double per_byte[4];
    std::printf("%-24s", name);
    for (int i = 0; i < 4; ++i) {
      const std::string text = repeat_to(sample, sizes[i]);
      const Result r = measure(**tok, text, min_seconds);
      per_byte[i] = r.seconds / text.size();
      std::printf(" %9.2f", text.size() / r.seconds / 1e6);
      std::fflush(stdout);
    }
    std::printf(" %13.2f   (MB/s; load %.2f s)\n", per_byte[3] / per_byte[1], load_s);
  }
  return 0;
}
