// Batch invariance (mixed prefill and decode steps give the tokens each prompt gets alone),
// split-K inside the model, context errors and KV accounting.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "kernels/model_golden_check.h"

namespace kvsplit::testing {
namespace {

std::vector<sched::GenerationInput> golden_inputs(const model::Tokenizer& tok) {
  std::vector<sched::GenerationInput> inputs;
  for (const auto& c : read_jsonl(model_path("golden/stories260K_greedy.jsonl"))) {
    sched::GenerationInput in;
    in.prompt_ids = *tok.encode(c["prompt"].get<std::string>(), true);
    in.params = greedy(c["steps"].get<int>() - static_cast<int>(in.prompt_ids.size()) + 1);
    inputs.push_back(in);
  }
  return inputs;
}

class BatchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KVSPLIT_REQUIRE_MODELS();
    engine_ = make_engine(GetParam(), 2, 1024);
    ASSERT_NE(engine_, nullptr);
  }
  std::unique_ptr<Engine260K> engine_;
};

// All golden prompts in one batch, admitted one per step with a small token budget: steps mix
// decode tokens of running sequences with (chunked) prefill tokens of new ones.
TEST_P(BatchTest, GoldenPromptsTogetherEqualAlone) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  const auto inputs = golden_inputs(*engine_->loaded.tokenizer);
  for (int budget : {7, 64, 4096}) {
    sched::BatchOptions bo;
    bo.max_batch_tokens = budget;
    bo.max_new_prompts_per_step = 1;
    auto out = sched::generate_batch(*engine_->model, *engine_->pool,
                                     engine_->loaded.tokenizer.get(), inputs, bo);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ((*out)[i].output_ids, cases[i]["output_token_ids"].get<std::vector<int32_t>>())
          << "budget " << budget << " case " << i;
    }
    EXPECT_EQ(engine_->pool->allocator().num_free(), engine_->pool->allocator().num_blocks());
  }
}

// A pool far smaller than the batch needs: the Scheduler preempts (recompute) instead of failing,
// and every output is still the golden (recompute gives the same KV bit for bit).
TEST_P(BatchTest, SmallPoolPreemptsAndStillMatchesGoldens) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  const auto inputs = golden_inputs(*engine_->loaded.tokenizer);
  auto small = make_engine(GetParam(), 2, /*num_blocks=*/24);  // 384 positions for ~2000 needed
  ASSERT_NE(small, nullptr);
  auto out =
      sched::generate_batch(*small->model, *small->pool, small->loaded.tokenizer.get(), inputs, {});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  int preemptions = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ((*out)[i].output_ids, cases[i]["output_token_ids"].get<std::vector<int32_t>>()) << i;
    preemptions += (*out)[i].preemptions;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_EQ(small->pool->allocator().num_free(), small->pool->allocator().num_blocks());
}

// Logits rows are bitwise identical alone and in a batch (the GEMM's summation order does not
// depend on the batch size).
TEST_P(BatchTest, LogitsBitwiseBatchInvariant) {
  const auto inputs = golden_inputs(*engine_->loaded.tokenizer);
  const int vocab = engine_->model->config().vocab_size;
  kv::KvPool& pool = *engine_->pool;
  std::vector<std::vector<float>> alone;
  for (const auto& in : inputs) {
    kv::BlockTable t;
    ASSERT_TRUE(pool.reserve(t, static_cast<int>(in.prompt_ids.size())));
    model::SeqStep s{in.prompt_ids, 0, &t, model::SeqStep::Logits::kLast};
    std::vector<float> lg;
    ASSERT_TRUE(engine_->model->forward({&s, 1}, pool, &lg).ok());
    alone.push_back(lg);
    pool.release(t);
  }
  std::vector<kv::BlockTable> tables(inputs.size());
  std::vector<model::SeqStep> steps;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(pool.reserve(tables[i], static_cast<int>(inputs[i].prompt_ids.size())));
    steps.push_back({inputs[i].prompt_ids, 0, &tables[i], model::SeqStep::Logits::kLast});
  }
  std::vector<float> together;
  ASSERT_TRUE(engine_->model->forward(steps, pool, &together).ok());
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(together.data() + i * vocab, alone[i].data(), vocab * sizeof(float)))
        << "prompt " << i;
    pool.release(tables[i]);
  }
}

// Host path of SeqStep::Logits::kArgmax (the CPU backend has no sample_tokens): the ids equal the
// argmax of the logits rows they replace, and the other rows come back unchanged.
TEST(ArgmaxRows, CpuHostPathMatchesLogitsRows) {
  KVSPLIT_REQUIRE_MODELS();
  auto be = backend::create_backend("cpu", 2);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  ASSERT_FALSE((*be)->has_sample_tokens());
  auto g = load_golden_model(**be);
  ASSERT_NE(g, nullptr);
  expect_argmax_rows_match_logits(*g, 8);
}

TEST_P(BatchTest, ForcedSplitKGivesSameTokens) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  const auto inputs = golden_inputs(*engine_->loaded.tokenizer);
  for (int chunk : {16, 48}) {
    sched::BatchOptions bo;
    bo.forward.force_chunk_tokens = chunk;
    auto out = sched::generate_batch(*engine_->model, *engine_->pool,
                                     engine_->loaded.tokenizer.get(), inputs, bo);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ((*out)[i].output_ids, cases[i]["output_token_ids"].get<std::vector<int32_t>>())
          << "chunk " << chunk << " case " << i;
    }
  }
}

TEST_P(BatchTest, PromptLongerThanContextIsAnErrorAndLeaksNothing) {
  const int ctx = engine_->model->config().max_seq_len;
  sched::GenerationInput ok_in;
  ok_in.prompt_ids = {1, 403, 407};
  ok_in.params = greedy(8);
  sched::GenerationInput long_in;
  long_in.prompt_ids.assign(ctx + 1, 300);
  long_in.params = greedy(8);
  auto out = sched::generate_batch(*engine_->model, *engine_->pool, nullptr, {ok_in, long_in});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("longer than the context"), std::string::npos)
      << out.status().message();
  EXPECT_EQ(engine_->pool->allocator().num_free(), engine_->pool->allocator().num_blocks());

  sched::GenerationInput empty_in;
  empty_in.params = greedy(8);
  out = sched::generate_batch(*engine_->model, *engine_->pool, nullptr, {empty_in});
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);

  sched::GenerationInput bad_id = ok_in;
  bad_id.prompt_ids.push_back(100000);
  out = sched::generate_batch(*engine_->model, *engine_->pool, nullptr, {bad_id});
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);

  sched::GenerationInput bad_param = ok_in;
  bad_param.params.temperature = -1.f;
  out = sched::generate_batch(*engine_->model, *engine_->pool, nullptr, {bad_param});
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->pool->allocator().num_free(), engine_->pool->allocator().num_blocks());
}

// A prompt that fills the context exactly still yields its one prefill token, then stops.
TEST_P(BatchTest, GenerationStopsAtTheContextLength) {
  const int ctx = engine_->model->config().max_seq_len;
  sched::GenerationInput in;
  in.prompt_ids = {1, 403, 407, 261, 378};
  in.params = greedy(10000);
  in.params.ignore_eos = true;
  auto out = sched::generate_batch(*engine_->model, *engine_->pool, nullptr, {in});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(static_cast<int>((*out)[0].output_ids.size()), ctx - 5 + 1);
  EXPECT_EQ((*out)[0].finish_reason, FinishReason::kLength);
}

TEST_P(BatchTest, TooSmallPoolIsResourceExhaustedAndLeaksNothing) {
  auto small = make_engine(GetParam(), 1, /*num_blocks=*/3);
  ASSERT_NE(small, nullptr);
  sched::GenerationInput in;
  in.prompt_ids = {1, 403, 407, 261, 378};
  in.params = greedy(200);
  auto out = sched::generate_batch(*small->model, *small->pool, nullptr, {in});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(small->pool->allocator().num_free(), small->pool->allocator().num_blocks());
}

INSTANTIATE_TEST_SUITE_P(BothFormats, BatchTest, ::testing::Values("llama2c", "hf"));

}  // namespace
}  // namespace kvsplit::testing
