// `kvsplit generate --min-p`, `--repetition-penalty` and `--logit-bias` on stories260K, each
// generated token checked against the model's own logits: the tokens the CLI printed are fed back
// through the model in one teacher-forced pass (the same weights on the CPU backend), and every row
// is the distribution that token was drawn from. min-p: each token has p >= min_p * p_max (min_p 1
// is greedy whatever the seed; min_p 0 draws below that bound for the seeds used). Repetition
// penalty (HF): each greedy token is the argmax of the row with every distinct token of the
// prompt and the output so far divided (logit > 0) or multiplied (logit <= 0) by the penalty.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "e2e/e2e_util.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

// Teacher-forced and incremental logits of stories260K differ by < 1e-4 (golden_test); a check
// of a token against its row allows this much in logit space.
constexpr float kLogitSlack = 1e-3f;

struct Generated {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

Generated generate(const std::string& flags) {
  const RunResult r =
      run("generate " + stories_model_flags() +
          " --prompt 'Once upon a time' --max-tokens 40 --ignore-eos --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.err;
  const auto lines = json_lines(r.out);
  EXPECT_EQ(lines.size(), 1u) << r.out;
  if (r.exit_code != 0 || lines.size() != 1) return {};
  Generated g{lines[0]["prompt_token_ids"].get<std::vector<int32_t>>(),
              lines[0]["output_token_ids"].get<std::vector<int32_t>>()};
  EXPECT_EQ(g.output.size(), 40u) << flags;
  return g;
}

// rows[k]: the logits (vocab) the model gives for output token k after prompt + output[0, k).
std::vector<std::vector<float>> rows_of(const Generated& g) {
  if (g.prompt.empty() || g.output.empty()) return {};
  auto e = make_engine("llama2c", 1);
  EXPECT_NE(e, nullptr);
  if (e == nullptr) return {};
  std::vector<int32_t> ids = g.prompt;
  ids.insert(ids.end(), g.output.begin(), g.output.end() - 1);
  kv::BlockTable table;
  EXPECT_TRUE(e->pool->reserve(table, static_cast<int>(ids.size())));
  model::SeqStep s;
  s.tokens = ids;
  s.table = &table;
  s.logits = model::SeqStep::Logits::kAll;
  std::vector<float> all;
  EXPECT_TRUE(e->model->forward({&s, 1}, *e->pool, &all).ok());
  e->pool->release(table);
  const size_t vocab = static_cast<size_t>(e->model->config().vocab_size);
  EXPECT_EQ(all.size(), ids.size() * vocab);
  std::vector<std::vector<float>> rows;
  for (size_t k = 0; k < g.output.size() && all.size() == ids.size() * vocab; ++k) {
    const float* row = all.data() + (g.prompt.size() - 1 + k) * vocab;
    rows.emplace_back(row, row + vocab);
  }
  return rows;
}

// The smallest log(p_token / p_max) over the output at temperature 1.
float min_log_ratio(const Generated& g) {
  float lowest = 0.0f;
  const auto rows = rows_of(g);
  EXPECT_EQ(rows.size(), g.output.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const float mx = *std::max_element(rows[k].begin(), rows[k].end());
    lowest = std::min(lowest, rows[k][g.output[k]] - mx);
  }
  return lowest;
}

TEST(SamplingFlagsCli, MinPKeepsEveryTokenAboveItsShareOfTheMostLikely) {
  KVSPLIT_REQUIRE_MODELS();
  const Generated greedy = generate("--temperature 0");
  ASSERT_EQ(greedy.output.size(), 40u);
  bool below_half = false;
  for (int seed : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const std::string sampled = "--temperature 1 --top-p 1 --seed " + std::to_string(seed);
    // min_p 1 keeps only the most likely token: the greedy tokens, whatever the seed.
    EXPECT_EQ(generate(sampled + " --min-p 1").output, greedy.output);
    // min_p 0.5: every token has p >= 0.5 * p_max.
    const Generated half = generate(sampled + " --min-p 0.5");
    EXPECT_GE(min_log_ratio(half), std::log(0.5f) - kLogitSlack);
    // min_p 0 (off): these seeds draw other tokens than the greedy ones, and some below the bound
    // (the check above is not true of any sampled output).
    const Generated off = generate(sampled + " --min-p 0");
    EXPECT_NE(off.output, greedy.output);
    below_half = below_half || min_log_ratio(off) < std::log(0.5f) - kLogitSlack;
  }
  EXPECT_TRUE(below_half) << "no seed drew a token below 0.5 * p_max with min_p off";
}

// llama2.c's run treats -p 0 as no nucleus cut (plain multinomial sampling); so does --top-p 0,
// which was refused as out of (0, 1]. A top-p of 0.5 does cut, so it draws other tokens.
TEST(SamplingFlagsCli, TopPZeroIsNoCutAsInLlama2c) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string sampled = "--temperature 1 --seed 5 --top-p ";
  const Generated off = generate(sampled + "1");
  ASSERT_EQ(off.output.size(), 40u);
  EXPECT_EQ(generate(sampled + "0").output, off.output);
  EXPECT_NE(generate(sampled + "0.5").output, off.output);
  const RunResult r = run("generate " + stories_model_flags() + " --prompt 'x' --top-p -0.1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;
}

TEST(SamplingFlagsCli, RepetitionPenaltyPicksTheArgmaxOfThePenalisedLogits) {
  KVSPLIT_REQUIRE_MODELS();
  const Generated plain = generate("--temperature 0");
  const Generated penalised = generate("--temperature 0 --repetition-penalty 10");
  ASSERT_EQ(plain.output.size(), 40u);
  ASSERT_EQ(penalised.output.size(), 40u);
  EXPECT_NE(penalised.output, plain.output);
  const auto rows = rows_of(penalised);
  ASSERT_EQ(rows.size(), penalised.output.size());
  std::set<int32_t> seen(penalised.prompt.begin(), penalised.prompt.end());
  int penalised_rows = 0;  // rows where a seen token would have won without the penalty
  for (size_t k = 0; k < rows.size(); ++k) {
    std::vector<float> row = rows[k];
    const int32_t unpenalised_best =
        static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    for (int32_t t : seen) row[t] = row[t] > 0.0f ? row[t] / 10.0f : row[t] * 10.0f;
    const float best = *std::max_element(row.begin(), row.end());
    EXPECT_GE(row[penalised.output[k]], best - kLogitSlack)
        << "token " << k << " (" << penalised.output[k] << ") is not the penalised argmax";
    if (seen.count(unpenalised_best) && row[unpenalised_best] < best - kLogitSlack)
      ++penalised_rows;
    seen.insert(penalised.output[k]);
  }
  EXPECT_GT(penalised_rows, 0);  // the penalty decided some tokens
}

// --logit-bias ID=-100 on the greedy text's first token: every greedy token is the argmax of its
// row with that token's logit lowered by 100, and the token never appears.
TEST(SamplingFlagsCli, LogitBiasPicksTheArgmaxOfTheBiasedLogits) {
  KVSPLIT_REQUIRE_MODELS();
  const Generated plain = generate("--temperature 0");
  ASSERT_EQ(plain.output.size(), 40u);
  const int32_t banned = plain.output[0];
  const Generated biased =
      generate("--temperature 0 --logit-bias " + std::to_string(banned) + "=-100");
  ASSERT_EQ(biased.output.size(), 40u);
  const auto rows = rows_of(biased);
  ASSERT_EQ(rows.size(), biased.output.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    std::vector<float> row = rows[k];
    row[banned] -= 100.0f;
    EXPECT_NE(biased.output[k], banned);
    EXPECT_GE(row[biased.output[k]], *std::max_element(row.begin(), row.end()) - kLogitSlack)
        << "token " << k;
  }
}

// --min-tokens: a stop string ends generation only once that many tokens are out; bad flag
// values exit 2 naming the flag.
TEST(SamplingFlagsCli, MinTokensDelaysAStopString) {
  KVSPLIT_REQUIRE_MODELS();
  const std::string base =
      "generate " + stories_model_flags() +
      " --prompt 'Once upon a time' --max-tokens 60 --temperature 0 --stop . --json";
  const RunResult early = run(base);
  const RunResult late = run(base + " --min-tokens 20");
  ASSERT_EQ(early.exit_code, 0) << early.err;
  ASSERT_EQ(late.exit_code, 0) << late.err;
  const auto e = json_lines(early.out), l = json_lines(late.out);
  ASSERT_EQ(e.size(), 1u);
  ASSERT_EQ(l.size(), 1u);
  const auto early_ids = e[0]["output_token_ids"].get<std::vector<int32_t>>();
  const auto late_ids = l[0]["output_token_ids"].get<std::vector<int32_t>>();
  ASSERT_LT(early_ids.size(), 20u);  // the greedy story has a "." before token 20
  EXPECT_GE(late_ids.size(), 20u);
  const std::string text = l[0]["text"].get<std::string>();
  EXPECT_NE(text.find('.'), std::string::npos) << text;  // the early "." is text now
  EXPECT_EQ(text.rfind(e[0]["text"].get<std::string>(), 0), 0u) << text;

  for (const char* bad :
       {"--logit-bias 5", "--logit-bias x=1", "--logit-bias 5=nan", "--min-tokens -1"}) {
    const RunResult r = run(base + " " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(bad).substr(0, std::string(bad).find(' '))), std::string::npos)
        << bad << ": " << r.err;
  }
  // An explicit --max-tokens below --min-tokens is refused; the default one is raised to it.
  const RunResult below = run("generate " + stories_model_flags() +
                              " --prompt 'Once upon a time' --max-tokens 5 --min-tokens 10");
  EXPECT_EQ(below.exit_code, 2) << below.err;
  EXPECT_NE(below.err.find("--min-tokens 10 exceeds --max-tokens 5"), std::string::npos)
      << below.err;
  const RunResult raised =
      run("generate " + stories_model_flags() +
          " --prompt 'Once upon a time' --temperature 0 --ignore-eos --json --min-tokens 300");
  ASSERT_EQ(raised.exit_code, 0) << raised.err;
  const auto r = json_lines(raised.out);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0]["output_token_ids"].size(), 300u);  // the default 256 raised to 300

  const RunResult range = run(base + " --logit-bias 512=1");
  EXPECT_EQ(range.exit_code, 2) << range.err;
  EXPECT_NE(range.err.find("logit_bias: token id 512 is not in [0, 512)"), std::string::npos)
      << range.err;
}

}  // namespace
}  // namespace kvsplit::testing
