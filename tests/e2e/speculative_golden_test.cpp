// Speculative decoding in generate_batch (`kvsplit generate --speculative ngram`): run.c's greedy
// and sampled goldens token for token, in a batch under every budget, in a pool small enough to
// preempt, with drafts accepted; every block back in the pool.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "e2e_util.h"

namespace kvsplit::testing {
namespace {

sched::BatchOptions speculative(int k, int budget = 512) {
  sched::BatchOptions bo;
  bo.max_batch_tokens = budget;
  bo.speculative.method = SpeculativeMethod::kNgram;
  bo.speculative.num_speculative_tokens = k;
  bo.speculative.prompt_lookup_min = 1;
  bo.speculative.prompt_lookup_max = 3;
  return bo;
}

int accepted(const std::vector<sched::GenerationOutput>& out) {
  int n = 0;
  for (const auto& o : out) {
    n += o.spec_accepted_tokens;
    EXPECT_LE(o.spec_accepted_tokens, o.spec_draft_tokens);
  }
  return n;
}

class SpeculativeGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KVSPLIT_REQUIRE_MODELS();
    engine_ = make_engine(GetParam(), 2, 512);
    ASSERT_NE(engine_, nullptr);
  }
  std::unique_ptr<Engine260K> engine_;
};

TEST_P(SpeculativeGolden, GreedyGoldensAloneAndTogether) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  std::vector<sched::GenerationInput> inputs;
  for (const auto& c : cases) {
    sched::GenerationInput in;
    in.prompt_ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    in.params = greedy(c["steps"].get<int>() - static_cast<int>(in.prompt_ids.size()) + 1);
    inputs.push_back(in);
  }
  int total_accepted = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto out = sched::generate_batch(*engine_->model, *engine_->pool,
                                     engine_->loaded.tokenizer.get(), {inputs[i]}, speculative(5));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].output_ids, cases[i]["output_token_ids"].get<std::vector<int32_t>>())
        << "case " << i;
    total_accepted += accepted(*out);
  }
  EXPECT_GT(total_accepted, 0);
  // Together, under budgets that leave the drafts no room, some room, and all they want.
  for (int budget : {12, 20, 4096}) {
    for (int k : {1, 3, 8}) {
      auto out =
          sched::generate_batch(*engine_->model, *engine_->pool, engine_->loaded.tokenizer.get(),
                                inputs, speculative(k, budget));
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      for (size_t i = 0; i < inputs.size(); ++i) {
        EXPECT_EQ((*out)[i].output_ids, cases[i]["output_token_ids"].get<std::vector<int32_t>>())
            << "budget " << budget << " k " << k << " case " << i;
      }
      if (budget == 4096) EXPECT_GT(accepted(*out), 0) << "k " << k;
      EXPECT_EQ(engine_->pool->allocator().num_free(), engine_->pool->allocator().num_blocks());
    }
  }
}

TEST_P(SpeculativeGolden, SampledGoldens) {
  const auto cases = read_jsonl(model_path("golden/stories260K_sampled.jsonl"));
  ASSERT_FALSE(cases.empty());
  int total_accepted = 0;
  for (const auto& c : cases) {
    sched::GenerationInput in;
    in.prompt_ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    in.params.temperature = c["temperature"].get<float>();
    in.params.top_p = c["topp"].get<float>();
    in.params.seed = c["seed"].get<uint64_t>();
    in.params.max_tokens = c["steps"].get<int>() - static_cast<int>(in.prompt_ids.size()) + 1;
    auto out = sched::generate_batch(*engine_->model, *engine_->pool,
                                     engine_->loaded.tokenizer.get(), {in}, speculative(4));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].output_ids, c["output_token_ids"].get<std::vector<int32_t>>())
        << "seed " << c["seed"] << " t " << c["temperature"] << " p " << c["topp"];
    total_accepted += accepted(*out);
  }
  EXPECT_GT(total_accepted, 0);
}

// A pool of 8 pages for 6 long sequences: preemption by recompute between speculative steps.
TEST_P(SpeculativeGolden, SmallPoolPreemptsAndStillEqualsThePlainRun) {
  auto small = make_engine(GetParam(), 2, 8);
  ASSERT_NE(small, nullptr);
  std::vector<sched::GenerationInput> inputs;
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog",
                           "Tom and his mom",  "The sun was",    "A big red ball"};
  for (int i = 0; i < 6; ++i) {
    sched::GenerationInput in;
    in.prompt_ids = *small->loaded.tokenizer->encode(prompts[i], true);
    in.params = greedy(90);
    in.params.ignore_eos = true;
    if (i % 2) {
      in.params.temperature = 0.9f;
      in.params.seed = 40 + i;
    }
    inputs.push_back(in);
  }
  auto plain = sched::generate_batch(*engine_->model, *engine_->pool,
                                     engine_->loaded.tokenizer.get(), inputs, {});
  ASSERT_TRUE(plain.ok());
  auto spec = sched::generate_batch(*small->model, *small->pool, small->loaded.tokenizer.get(),
                                    inputs, speculative(6));
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  int preemptions = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ((*spec)[i].output_ids, (*plain)[i].output_ids) << i;
    EXPECT_EQ((*spec)[i].text, (*plain)[i].text) << i;
    preemptions += (*spec)[i].preemptions;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(accepted(*spec), 0);
  EXPECT_EQ(small->pool->allocator().num_free(), small->pool->allocator().num_blocks());
}

TEST_P(SpeculativeGolden, BadSettingsAreRefused) {
  sched::BatchOptions bo = speculative(4);
  bo.speculative.prompt_lookup_min = 5;
  sched::GenerationInput in;
  in.prompt_ids = {1, 2, 3};
  in.params = greedy(4);
  auto out = sched::generate_batch(*engine_->model, *engine_->pool, engine_->loaded.tokenizer.get(),
                                   {in}, bo);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("speculative.prompt_lookup_min"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(BothFormats, SpeculativeGolden, ::testing::Values("llama2c", "hf"));

}  // namespace
}  // namespace kvsplit::testing
