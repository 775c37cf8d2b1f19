// Output that cannot be written is an error: every `kvsplit` subcommand whose stdout is full
// (/dev/full) or closed exits 1 and says so on stderr (generate, perplexity and info exited 0).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

}  // namespace
}  // namespace kvsplit::testing
