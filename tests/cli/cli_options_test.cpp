// strict_options (src/common/cli_options.h): the flag values every kvsplit binary refuses, each
// with a message naming the flag, and the ones it reads.
#include "common/cli_options.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace kvsplit {
namespace {

struct Flags {
  std::optional<uint64_t> seed;
  int64_t offset = 0;
  int port = 0;
  double temperature = 1;
  std::string host = "h", prompt = "p";
};

// Parses `args` into a fresh app; returns the CLI11 error message ("" when it parsed).
std::string parse(std::vector<std::string> args, Flags* f) {
  CLI::App app;
  app.add_option("--seed", f->seed);
  app.add_option("--offset", f->offset);
  app.add_option("--port", f->port)->check(CLI::Range(-1, 65535));
  app.add_option("--temperature", f->temperature)->check(CLI::Range(0.0, 100.0));
  app.add_option("--host", f->host);
  app.add_option("--prompt", f->prompt);
  app.add_option("--gap", f->temperature)->check(kPositive);
  app.add_option("--budget", f->temperature)->check(kNonNegative);
  strict_options(app, {"--prompt"});
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(CliOptions, SixtyFourBitIntegersAreReadWholeOrRefused) {
  Flags f;
  EXPECT_EQ(parse({"--seed", "18446744073709551615"}, &f), "");
  EXPECT_EQ(f.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(parse({"--seed", "9223372036854775808"}, &f), "");  // CLI11 alone saturated it
  EXPECT_EQ(f.seed, uint64_t{1} << 63);
  EXPECT_EQ(parse({"--seed", "0007"}, &f), "");
  EXPECT_EQ(f.seed, 7u);
  EXPECT_EQ(parse({"--offset", "-9223372036854775808"}, &f), "");
  EXPECT_EQ(f.offset, std::numeric_limits<int64_t>::min());
  for (const char* bad : {"18446744073709551616", "99999999999999999999999"}) {
    const std::string err = parse({"--seed", bad}, &f);
    EXPECT_NE(err.find("--seed: is out of range"), std::string::npos) << bad << ": " << err;
  }
  EXPECT_NE(parse({"--offset", "9223372036854775808"}, &f).find("--offset: is out of range"),
            std::string::npos);
  const std::string neg = parse({"--seed", "-1"}, &f);  // was 2^64 - 1
  EXPECT_NE(neg.find("--seed: must not be negative, got '-1'"), std::string::npos) << neg;
  EXPECT_NE(parse({"--port", "0x20"}, &f).find("--port: must be a decimal integer"),
            std::string::npos);
  EXPECT_NE(parse({"--port", "-2"}, &f).find("--port"), std::string::npos);
}

TEST(CliOptions, FloatsMustBeFiniteAndBoundsNameThemselves) {
  Flags f;
  EXPECT_EQ(parse({"--temperature", "0.5"}, &f), "");
  EXPECT_EQ(f.temperature, 0.5);
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "1e39", "-4e38"}) {
    const std::string err = parse({"--temperature", bad}, &f);  // NaN passed CLI::Range
    EXPECT_NE(err.find("--temperature: must be a finite number"), std::string::npos)
        << bad << ": " << err;
  }
  EXPECT_NE(parse({"--gap", "0"}, &f).find("--gap: must be > 0, got 0"), std::string::npos);
  EXPECT_NE(parse({"--budget", "-1"}, &f).find("--budget: must be >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(parse({"--gap", "x"}, &f).find("--gap: must be a number, got 'x'"), std::string::npos);
  EXPECT_EQ(parse({"--budget", "0"}, &f), "");
}

TEST(CliOptions, AnEmptyTextValueIsRefusedUnlessAllowed) {
  Flags f;
  EXPECT_NE(parse({"--host", ""}, &f).find("--host: must not be empty"), std::string::npos);
  EXPECT_EQ(parse({"--prompt", ""}, &f), "");
  EXPECT_EQ(f.prompt, "");
  EXPECT_EQ(parse({"--host", "::1"}, &f), "");
  EXPECT_EQ(f.host, "::1");
}

}  // namespace
}  // namespace kvsplit
