// Output that cannot be written is an error: every `kvsplit` subcommand whose stdout is full
// (/dev/full) or closed exits 1 and says so on stderr (generate, perplexity and info exited 0).
// A subcommand that writes as it goes (generate, tokenize) stops at the first write that fails,
// and a pipe whose reader has gone is such a write, not a SIGPIPE death.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "cli/cli_run.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

void expect_write_error(const std::string& args, const std::string& redirect) {
  const RunResult r = run(args + " " + redirect);
  EXPECT_EQ(r.exit_code, 1) << args << " " << redirect << ": " << r.err;
  EXPECT_NE(r.err.find("writing the output to stdout failed"), std::string::npos)
      << args << " " << redirect << ": " << r.err;
}

TEST(OutputCli, AFullOrClosedStdoutIsAnError) {
  KVSPLIT_REQUIRE_MODELS();
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  TempDir tmp;
  std::ofstream(tmp.file("t.txt")) << "Once upon a time there was a little dog.";
  std::ofstream(tmp.file("c.yaml")) << "sla_classes:\n  interactive: {max_ttft_ms: 500}\n"
                                       "  batch: {max_ttft_ms: 5000}\n";
  ASSERT_EQ(run("policy make-trace --phased --calm-ms 200 --spike-ms 200 --out " +
                quote(tmp.file("trace.jsonl")))
                .exit_code,
            0);
  const std::string model = stories_model_flags();
  const std::string gen = "generate " + model + " -t 0 -n 4 ";
  const std::string ppl = "perplexity " + model + " --text " + quote(tmp.file("t.txt"));
  const std::string sim = "policy simulate --config " + quote(tmp.file("c.yaml")) + " --trace " +
                          quote(tmp.file("trace.jsonl"));
  for (const std::string& args : {
           gen + "-p Once --json",  // one JSON line
           gen + "-p Once",         // streamed text
           gen + "-p Once -p The",  // a batch's text
           ppl + " --json",
           ppl,
           "info " + model,
           "tokenize --tokenizer " + quote(model_path("tok512.bin")) + " Once",
           sim + " --json",
           sim,
           std::string("--help"),
       }) {
    expect_write_error(args, "> /dev/full");
  }
  expect_write_error(gen + "-p Once", ">&-");
  expect_write_error("info " + model, ">&-");
  // Written in full: exit 0.
  const RunResult ok = run(gen + "-p Once --json");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(json_lines(ok.out).size(), 1u) << ok.out;
}

// "generation stopped there: T tokens generated, C of P prompts cancelled" (kvsplit generate's
// message after a failed write; T and C are generate_batch's outputs): {T, C, P}, or {-1, -1, -1}.
struct Stopped {
  long tokens = -1, cancelled = -1, prompts = -1;
};
Stopped stopped_in(const std::string& err) {
  std::smatch m;
  Stopped s;
  if (std::regex_search(err, m,
                        std::regex("generation stopped there: ([0-9]+) tokens generated, "
                                   "([0-9]+) of ([0-9]+) prompts cancelled"))) {
    s = {std::stol(m[1]), std::stol(m[2]), std::stol(m[3])};
  }
  return s;
}

// The cap `generate` warns of for prompt 0 ("prompt 0 at most R tokens"), or -1.
long cap_of_prompt_0(const std::string& err) {
  std::smatch m;
  return std::regex_search(err, m, std::regex("prompt 0 at most ([0-9]+) tokens")) ? std::stol(m[1])
                                                                                   : -1;
}

// stories260K's context is 512 tokens. One prompt of 400 tokens, or eight whose first (442 prompt
// tokens) leaves room for R = 71 and the seven others (2 or 3 tokens) for about 510: run to the
// end, the batch generates 3643 tokens; stopped when prompt 0's line cannot be written, 8 * R.
std::string one_prompt() {
  return "generate " + stories_model_flags() + " -t 0 --ignore-eos -n 400 -p Once";
}
std::string eight_prompts() {
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "Once upon a time there was a little dog. ";
  std::string args =
      "generate " + stories_model_flags() + " -t 0 --ignore-eos -n 100000 -p " + quote(long_prompt);
  for (const char* p : {"The", "A", "B", "C", "D", "E", "F"}) args += std::string(" -p ") + p;
  return args;
}

// What each case of the two tests below checks: exit 1 with the error, and a run that stopped
// at its first failed write: one token of the streamed prompt (its first text is that write),
// and in a batch every prompt but the first cancelled once the first's line failed.
void expect_stopped_at_first_write(const RunResult& r, const std::string& what,
                                   const std::string& error) {
  EXPECT_EQ(r.exit_code, 1) << what << ": " << r.err;
  EXPECT_NE(r.err.find("writing the output to stdout failed: " + error), std::string::npos)
      << what << ": " << r.err;
  const Stopped s = stopped_in(r.err);
  if (s.prompts == 1) {
    EXPECT_EQ(s.tokens, 1) << what << ": " << r.err;
    EXPECT_EQ(s.cancelled, 1) << what << ": " << r.err;
    return;
  }
  ASSERT_EQ(s.prompts, 8) << what << ": " << r.err;
  EXPECT_EQ(s.cancelled, 7) << what << ": " << r.err;
  const long room = cap_of_prompt_0(r.err);
  ASSERT_GT(room, 0) << what << ": " << r.err;
  EXPECT_LE(s.tokens, 8 * room) << what << ": " << r.err;
}

TEST(OutputCli, AFailedWriteStopsTheGenerationThere) {
  KVSPLIT_REQUIRE_MODELS();
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (const std::string& args :
       {one_prompt(), eight_prompts() + " --json", eight_prompts() /* "[i] ..." lines */}) {
    expect_stopped_at_first_write(run(args + " > /dev/full"), args + " > /dev/full",
                                  "No space left on device");
  }
  expect_stopped_at_first_write(run(one_prompt() + " >&-"), "closed stdout", "Bad file descriptor");
}

// kvsplit ignores SIGPIPE: a closed pipe (`kvsplit generate ... | head -c 10` once head is gone)
// is a failed write like any other. It was a kill by SIGPIPE at the first write, after a batch
// had run to its end (exit_code -1 here).
TEST(OutputCli, AClosedPipeIsAFailedWriteNotASignal) {
  KVSPLIT_REQUIRE_MODELS();
  for (const std::string& args : {one_prompt(), eight_prompts() + " --json"})
    expect_stopped_at_first_write(run_into_closed_pipe(args), args + " | true", "Broken pipe");
  for (const std::string& args :
       {"info " + stories_model_flags(),
        "tokenize --tokenizer " + quote(model_path("tok512.bin")) + " Once"}) {
    const RunResult r = run_into_closed_pipe(args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find("writing the output to stdout failed: Broken pipe"), std::string::npos)
        << args << ": " << r.err;
  }
}

// `tokenize --input-jsonl` writes each line as it reads it and stops at the first failed write
// (a few KiB of output in, when stdio's buffer is written), the rest of the input unread: "stopped
// at FILE:N" with N far below the input's 20000 lines. It tokenized the whole input.
TEST(OutputCli, TokenizeStopsReadingAtTheFirstFailedWrite) {
  KVSPLIT_REQUIRE_MODELS();
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  TempDir tmp;
  {
    std::ofstream f(tmp.file("in.jsonl"));
    for (int i = 0; i < 20000; ++i) f << "{\"text\": \"Once upon a time\"}\n";
  }
  const std::string args = "tokenize --tokenizer " + quote(model_path("tok512.bin")) +
                           " --input-jsonl " + quote(tmp.file("in.jsonl"));
  for (const auto& [r, error] :
       {std::pair{run(args + " > /dev/full"), std::string("No space left on device")},
        std::pair{run_into_closed_pipe(args), std::string("Broken pipe")}}) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("writing the output to stdout failed: " + error), std::string::npos)
        << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, std::regex("stopped at .*in.jsonl:([0-9]+),")))
        << r.err;
    EXPECT_LT(std::stol(m[1]), 1000) << r.err;
  }
}

}  // namespace
}  // namespace kvsplit::testing
