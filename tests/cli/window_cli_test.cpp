// `kvsplit generate` on a model whose layers all slide (synthetic stories260K shape, window 32):
// pages behind the window are dropped ("window_dropped_pages"), and with --prefix-cache on a
// prompt longer than a prefill chunk takes the cached pages of the prompt before it, holding only
// the window's, with the tokens of the run without the cache.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_run.h"

namespace kvsplit::testing {
namespace {

TEST(CliWindow, ALongPromptTakesCachedPagesUnderASlidingWindow) {
  KVSPLIT_REQUIRE_MODELS();
  // ~140 tokens of the stories tokenizer each, sharing all but the last word; chunks of 64.
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sunshine. One day, she saw a big dog in the park and she ran to him. The dog wagged its "
      "tail and licked her hand. Lily laughed and threw a stick for the dog to fetch. They played "
      "together until the sun went down, and then Lily went home to tell her mom about her new "
      "friend";
  const std::string cmd = "generate --model 'synthetic:stories260k@seed=3,window=32' --tokenizer " +
                          quote(model_path("tok512.bin")) + " --prompt '" + shared +
                          " fast' --prompt '" + shared +
                          " slowly' --max-tokens 12 --temperature 0 --json --block-size 8"
                          " --max-batch-tokens 64";
  RunResult off = run(cmd);
  RunResult on = run(cmd + " --prefix-cache on");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  ASSERT_EQ(on.exit_code, 0) << on.err;
  const std::vector<nlohmann::json> a = json_lines(off.out), b = json_lines(on.out);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["output_token_ids"], a[i]["output_token_ids"]) << i;
    EXPECT_EQ(a[i]["cached_tokens"], 0);
    EXPECT_GT(a[i]["window_dropped_pages"].get<int>(), 0) << i;
  }
  EXPECT_EQ(b[0]["cached_tokens"], 0);
  // The second prompt is admitted a step after the first (one new prompt per step with the
  // cache): it takes what the first had computed then, its first chunk's whole pages at least.
  EXPECT_GE(b[1]["cached_tokens"].get<int>(), 64);
  EXPECT_EQ(b[1]["cached_tokens"].get<int>() % 8, 0);
}

}  // namespace
}  // namespace kvsplit::testing
