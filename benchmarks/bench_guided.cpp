// bench_guided: the cost of guided decoding (structured output) on real tokenizers: Llama 2
// (SentencePiece, 32K ids) and Qwen2 (byte-level BPE, ~151K ids). Per tokenizer it measures
//   - `vocab ms`: building the token byte trie (model::guide_vocabulary), best of repeats;
// and per constraint (a regex, a choice of 20 words, a JSON schema of a 6-property object,
// json_object, a GBNF grammar of any JSON object):
//   - `compile ms`: GuideGrammar::compile (schema -> regex -> NFA; the DFA is built lazily),
//     best of repeats;
//   - simulated generations: `--generations` requests (seeds 1..N) of up to `--max-tokens`
//     tokens each, mid-text (not after BOS), where each step draws random logits (normal, sigma
//     3, fixed seed; a row of a pre-drawn pool rotated by a random offset) for the whole
//     vocabulary and Sampler::sample (temperature 1) with the guide picks the token; a request
//     ends at EOS, when nothing is allowed, or at max-tokens;
//   - cold (each repeat on a fresh GuideCache, so fresh grammars): the DFA states the requests
//     create, the masks they build (one per (DFA state, start) first visited), how many of
//     those are distinct (the grammar keeps one copy of equal masks), and the mean time of one
//     build: the requests' DFA states are mirrored (GuideGrammar::walk over each token's bytes)
//     and GuideGrammar::mask runs, timed, just before the sampler's own mask() call, so the
//     first visit of a state times its build and the sampler's call always hits;
//   - warm (the same seeds again on the last grammar: every mask cached): Sampler::sample per
//     step with the guide, and without one on a copy of the same logits in the same loop, and
//     their ratio (the per-token overhead of guided decoding).
// Thread CPU time, one thread; cold and warm each repeat for at least --min-seconds.
//
//   build/benchmarks/bench_guided [--models DIR] [--tokenizers llama2,qwen2] [--generations N]
//                                 [--max-tokens N] [--min-seconds S] [--quick]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/cli_options.h"
#include "model/guide_vocabulary.h"
#include "model/tokenizer.h"
#include "sampling/guide.h"
#include "sampling/sampler.h"

namespace {

using kvsplit::GuidedDecoding;
using kvsplit::SamplingParams;
using kvsplit::sampling::GuideCache;
using kvsplit::sampling::GuideGrammar;
using kvsplit::sampling::GuideState;
using kvsplit::sampling::Sampler;
using kvsplit::sampling::TokenVocabulary;

// CPU time of the calling thread, in seconds: on a shared machine it does not count the time
// other processes hold the core.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string default_models() {
  if (const char* env = std::getenv("KVSPLIT_MODELS"); env && *env) return env;
  return "../shared/models";
}

struct Setup {
  std::string models = default_models();
  std::vector<std::string> tokenizers = {"llama2", "qwen2"};
  int generations = 4;  // requests per pass, seeds 1..generations
  int max_tokens = 256;
  double min_seconds = 0.3;  // per cold and per warm measurement
  int pool_rows = 16;        // pre-drawn logit rows
};

struct Constraint {
  const char* name;
  GuidedDecoding guided;
};

std::vector<Constraint> constraints() {
  std::vector<Constraint> out;
  GuidedDecoding rx;
  rx.kind = GuidedDecoding::Kind::kRegex;
  rx.spec = "[0-9]{3}-[0-9]{4}";
  out.push_back({"regex phone", rx});
  GuidedDecoding choice;
  choice.kind = GuidedDecoding::Kind::kChoice;
  choice.choices = {"apple",  "banana", "cherry", "orange",   "grape",  "lemon",  "mango",
                    "peach",  "pear",   "plum",   "house",    "horse",  "garden", "window",
                    "yellow", "purple", "river",  "mountain", "summer", "winter"};
  out.push_back({"choice 20 words", choice});
  GuidedDecoding schema;
  schema.kind = GuidedDecoding::Kind::kJsonSchema;
  schema.spec = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 32},
      "age": {"type": "integer", "minimum": 0},
      "active": {"type": "boolean"},
      "role": {"enum": ["admin", "editor", "viewer"]},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
      "address": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24},
                       "zip": {"type": "string", "pattern": "[0-9]{5}"}},
        "required": ["city", "zip"]
      }
    },
    "required": ["name", "age", "active", "role", "tags", "address"],
    "additionalProperties": false
  })";
  out.push_back({"json schema 6 props", schema});
  GuidedDecoding object;
  object.kind = GuidedDecoding::Kind::kJsonObject;
  out.push_back({"json_object", object});
  // The same language as json_object but nested without a bound: a context-free grammar (the
  // DFA runs over stacks of rule calls), written as llama.cpp's json.gbnf is.
  GuidedDecoding gbnf;
  gbnf.kind = GuidedDecoding::Kind::kGrammar;
  gbnf.spec = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}"
array  ::= "[" ws ( value ("," ws value)* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= " "?
)";
  out.push_back({"gbnf json object", gbnf});
  return out;
}

// Random logits [vocab] per (request, step): a row of `rows` pre-drawn ones (normal, sigma 3,
// fixed seed) rotated by an offset, both picked by a hash of (request, step). Drawing 151K normals
// per step would cost more than what is measured; rotating keeps the picks varied.
class LogitSource {
 public:
  LogitSource(int vocab, int rows) : vocab_(vocab), rows_(rows) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    pool_.resize(static_cast<size_t>(vocab) * static_cast<size_t>(rows));
    for (float& x : pool_) x = normal(rng);
  }
  void fill(uint64_t request, int step, float* out) const {
    const uint64_t h = kvsplit::sampling::stream_seed(request, static_cast<uint64_t>(step) + 1);
    const float* row =
        pool_.data() + static_cast<size_t>(h % static_cast<uint64_t>(rows_)) * vocab_;
    const size_t shift = static_cast<size_t>((h >> 32) % static_cast<uint64_t>(vocab_));
    std::copy(row + shift, row + vocab_, out);
    std::copy(row, row + shift, out + (vocab_ - shift));
  }

 private:
  int vocab_;
  int rows_;
  std::vector<float> pool_;  // [rows, vocab]
};

// Totals of one or more passes over the requests.
struct Pass {
  int64_t steps = 0;  // Sampler::sample calls (each with and without the guide)
  int64_t ended = 0;  // requests that ended before max-tokens (EOS, or nothing allowed)
  double guided_s = 0;
  double plain_s = 0;
  int64_t masks_built = 0;  // cold: mask() calls that built their mask (first visits)
  double build_s = 0;
  std::string error;  // the first guide error, if any
};

struct Model {
  std::string name;
  int vocab = 0;
  std::vector<int32_t> eos;
  std::shared_ptr<const TokenVocabulary> tokens;
  std::unique_ptr<LogitSource> logits;
};

// Runs the requests once on `grammar`. cold: each request's DFA state is mirrored and its mask
// asked for (timed) before each sample; a (state, start) key not in `visited` was built by it.
void run_requests(const Setup& s, const Model& m, const GuidedDecoding& guided,
                  const std::shared_ptr<GuideGrammar>& grammar, bool cold,
                  std::unordered_set<int64_t>* visited, Pass* pass) {
  SamplingParams guided_params;  // temperature 1, no filters
  guided_params.guided = guided;
  const SamplingParams plain_params;
  std::vector<float> logits(static_cast<size_t>(m.vocab));
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(s.max_tokens));
  for (int r = 1; r <= s.generations; ++r) {
    const uint64_t seed = static_cast<uint64_t>(r);
    Sampler with(guided_params, seed, m.eos);
    Sampler without(plain_params, seed, m.eos);
    with.reserve(m.vocab);
    without.reserve(m.vocab);
    with.set_guide(std::make_unique<GuideState>(grammar, /*at_start=*/false));
    int32_t state = grammar->start_state();  // the mirror (cold only)
    bool at_start = false;
    out.clear();
    for (int step = 0; step < s.max_tokens; ++step) {
      if (cold) {
        const double t0 = thread_seconds();
        const auto mask = grammar->mask(state, at_start);
        const double dt = thread_seconds() - t0;
        if (!mask.ok()) {
          if (pass->error.empty()) pass->error = mask.status().to_string();
          break;
        }
        if (visited->insert(int64_t{state} * 2 + (at_start ? 1 : 0)).second) {
          pass->build_s += dt;
          ++pass->masks_built;
        }
      }
      m.logits->fill(seed, step, logits.data());
      double t0 = thread_seconds();
      const int32_t id = with.sample(logits.data(), m.vocab, {}, out);
      pass->guided_s += thread_seconds() - t0;
      m.logits->fill(seed, step, logits.data());
      t0 = thread_seconds();
      without.sample(logits.data(), m.vocab, {}, out);
      pass->plain_s += thread_seconds() - t0;
      ++pass->steps;
      if (id == Sampler::kNoAllowedToken) {
        if (!with.guide_status().ok() && pass->error.empty()) {
          pass->error = with.guide_status().to_string();
        }
        ++pass->ended;
        break;
      }
      if (std::find(m.eos.begin(), m.eos.end(), id) != m.eos.end()) {
        ++pass->ended;
        break;
      }
      if (cold) {
        const auto next = grammar->walk(state, m.tokens->bytes(id, at_start));
        if (!next.ok() || *next == GuideGrammar::kDead) {
          if (pass->error.empty()) {
            pass->error =
                next.ok() ? "the mirror walked to the dead state" : next.status().to_string();
          }
          break;
        }
        state = *next;
        at_start = false;
      }
      out.push_back(id);
    }
  }
}

// Best seconds of one call of `f` over repeats until `min_seconds` (at least `min_repeats`).
template <typename F>
double best_seconds(double min_seconds, int min_repeats, F f) {
  double best = 1e300, spent = 0;
  for (int i = 0; i < min_repeats || spent < min_seconds; ++i) {
    const double t0 = thread_seconds();
    f();
    const double t = thread_seconds() - t0;
    best = std::min(best, t);
    spent += t;
  }
  return best;
}

void bench_constraint(const Setup& s, const Model& m, const Constraint& c) {
  std::printf("%-20s", c.name);
  std::fflush(stdout);
  bool compiled = true;
  std::string error;
  const double compile_s = best_seconds(std::min(s.min_seconds, 0.2), 3, [&] {
    auto g = GuideGrammar::compile(c.guided, m.tokens);
    if (!g.ok()) {
      compiled = false;
      error = g.status().to_string();
    }
  });
  if (!compiled) {
    std::printf(" compile failed: %s\n", error.c_str());
    return;
  }
  std::printf(" %8.2f |", compile_s * 1e3);
  std::fflush(stdout);

  // Cold: each repeat on a fresh cache, so a fresh grammar with no DFA states nor masks.
  Pass cold;
  std::shared_ptr<GuideGrammar> grammar;
  size_t states = 0;
  size_t distinct = 0;
  int64_t masks = 0;
  int cold_repeats = 0;
  double spent = 0;
  while (cold_repeats < 1 || spent < s.min_seconds) {
    GuideCache cache(m.tokens);
    auto g = cache.get(c.guided);
    if (!g.ok()) {
      std::printf(" %s\n", g.status().to_string().c_str());
      return;
    }
    grammar = *g;
    std::unordered_set<int64_t> visited;
    const double t0 = thread_seconds();
    const int64_t built_before = cold.masks_built;
    run_requests(s, m, c.guided, grammar, /*cold=*/true, &visited, &cold);
    spent += thread_seconds() - t0;
    states = grammar->num_states();
    distinct = grammar->num_distinct_masks();
    masks = cold.masks_built - built_before;
    ++cold_repeats;
  }

  // Warm: the same requests on the last grammar, every mask already built.
  Pass warm;
  int warm_repeats = 0;
  spent = 0;
  while (warm_repeats < 1 || spent < s.min_seconds) {
    const double t0 = thread_seconds();
    run_requests(s, m, c.guided, grammar, /*cold=*/false, nullptr, &warm);
    spent += thread_seconds() - t0;
    ++warm_repeats;
  }
  const double steps = static_cast<double>(warm.steps);
  const double guided_us = warm.guided_s / steps * 1e6;
  const double plain_us = warm.plain_s / steps * 1e6;
  std::printf(
      " %9.1f %5lld/%-3d | %6zu %6lld %8zu %9.1f | %9.1f %9.1f %7.2fx\n",
      static_cast<double>(warm.steps) / (warm_repeats * s.generations),
      static_cast<long long>(warm.ended / warm_repeats), s.generations, states,
      static_cast<long long>(masks), distinct,
      cold.masks_built > 0 ? cold.build_s / static_cast<double>(cold.masks_built) * 1e6 : 0.0,
      guided_us, plain_us, guided_us / plain_us);
  if (!cold.error.empty() || !warm.error.empty()) {
    std::printf("%20s guide error: %s\n", "",
                (cold.error.empty() ? warm.error : cold.error).c_str());
  }
}

bool bench_tokenizer(const Setup& s, const std::string& name) {
  const std::string path = s.models + "/tokenizers/" + name + "/tokenizer.json";
  const double t0 = thread_seconds();
  auto tok = kvsplit::model::load_tokenizer(path);
  const double load_s = thread_seconds() - t0;
  if (!tok.ok()) {
    std::printf("%s: skipped: %s\n\n", name.c_str(), tok.status().to_string().c_str());
    return false;
  }
  Model m;
  m.name = name;
  m.vocab = (*tok)->vocab_size();
  if ((*tok)->eos_id() >= 0) m.eos.push_back((*tok)->eos_id());
  const double vocab_s = best_seconds(
      s.min_seconds, 1, [&] { m.tokens = kvsplit::model::guide_vocabulary(**tok, m.vocab); });
  m.logits = std::make_unique<LogitSource>(m.vocab, s.pool_rows);
  std::printf("%s (%s, %d ids, eos %d): load %.2f s, vocab %.1f ms\n", name.c_str(),
              std::string((*tok)->kind()).c_str(), m.vocab, (*tok)->eos_id(), load_s,
              vocab_s * 1e3);
  std::printf("%-20s %8s | %9s %9s | %6s %6s %8s %9s | %9s %9s %8s\n", "constraint", "compile",
              "steps/req", "ended", "states", "masks", "distinct", "us/build", "guided", "unguided",
              "ratio");
  std::printf("%-20s %8s | %9s %9s | %6s %6s %8s %9s | %9s %9s %8s\n", "", "ms", "(warm)", "",
              "(cold)", "(cold)", "(cold)", "(cold)", "us/step", "us/step", "");
  for (const Constraint& c : constraints()) bench_constraint(s, m, c);
  std::printf("\n");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  bool quick = false;
  CLI::App app{"bench_guided: guided decoding cost (vocabulary, compile, masks, per token)"};
  app.add_option("--models", s.models,
                 "shared models folder (default $KVSPLIT_MODELS or ../shared/models)");
  app.add_option("--tokenizers", s.tokenizers,
                 "comma-separated folders under <models>/tokenizers (each has tokenizer.json)")
      ->delimiter(',');
  app.add_option("--generations", s.generations, "requests per pass (seeds 1..N)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-tokens", s.max_tokens, "most tokens per request")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--min-seconds", s.min_seconds, "least time per cold and per warm measurement")
      ->check(kvsplit::kPositive);
  app.add_flag("--quick", quick,
               "a smoke run: 1 request of at most 16 tokens, --min-seconds 0.001, 2 logit rows");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (quick) {
    s.generations = 1;
    s.max_tokens = 16;
    s.min_seconds = 0.001;
    s.pool_rows = 2;
  }

  std::printf(
      "guided decoding: %d requests of <= %d tokens per pass, temperature 1, logits N(0, 3); "
      "thread CPU time, >= %.3g s per measurement\n"
      "steps/req: sample calls per request; ended: requests ending before max-tokens (EOS or "
      "nothing allowed); states: DFA states on a fresh grammar after the requests; masks: masks "
      "built (states visited); distinct: masks of different content; us/build: one mask build; "
      "guided / unguided: Sampler::sample with and without the guide on the same logits, all "
      "masks cached\n\n",
      s.generations, s.max_tokens, s.min_seconds);
  int done = 0;
  for (const std::string& name : s.tokenizers) done += bench_tokenizer(s, name) ? 1 : 0;
  if (done == 0) {
    std::fprintf(stderr, "bench_guided: no tokenizer found under %s/tokenizers\n",
                 s.models.c_str());
    return 2;
  }
  return 0;
}
