// The spatial cut on the CLI path (sched::generate_batch): stories260K's llama2.c goldens, greedy
// and sampled, are token-exact with 2, 3 and 4 CPU shards at small chunk sizes, the whole batch
// at once so decode and prefill rows of spread sequences share steps; a prompt longer than one
// shard's pool runs only with shards; every shard's blocks come back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "e2e_util.h"

namespace kvsplit::testing {
namespace {

struct Case {
  int shards;
  int chunk;
};

class SpatialGolden : public ::testing::TestWithParam<Case> {};

std::unique_ptr<Engine260K> sharded_engine(int shards, int chunk, int blocks_per_shard) {
  auto e = make_engine("llama2c", 2, blocks_per_shard);
  if (e == nullptr || shards == 1) return e;
  std::vector<std::unique_ptr<backend::Backend>> peers;
  for (int s = 1; s < shards; ++s) {
    backend::BackendOptions o;
    o.threads = 1;
    o.device = s;
    o.spin_micros = 0;
    auto be = backend::create_backend("cpu", o);
    EXPECT_TRUE(be.ok());
    peers.push_back(std::move(be).value());
  }
  const Status st = e->pool->add_shards(std::move(peers), chunk);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return e;
}

TEST_P(SpatialGolden, GreedyAndSampledGoldensTokenExact) {
  KVSPLIT_REQUIRE_MODELS();
  const Case& p = GetParam();
  // 24 blocks per shard: the batch needs about 60, so it fills every shard.
  auto e = sharded_engine(p.shards, p.chunk, 24);
  ASSERT_NE(e, nullptr);
  std::vector<sched::GenerationInput> inputs;
  std::vector<std::vector<int32_t>> want;
  for (const auto& c : read_jsonl(model_path("golden/stories260K_greedy.jsonl"))) {
    sched::GenerationInput in;
    in.prompt_ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    in.params = greedy(c["steps"].get<int>() - static_cast<int>(in.prompt_ids.size()) + 1);
    inputs.push_back(in);
    want.push_back(c["output_token_ids"].get<std::vector<int32_t>>());
  }
  for (const auto& c : read_jsonl(model_path("golden/stories260K_sampled.jsonl"))) {
    sched::GenerationInput in;
    in.prompt_ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    in.params.temperature = c["temperature"].get<float>();
    in.params.top_p = c["topp"].get<float>();
    in.params.seed = c["seed"].get<uint64_t>();
    in.params.max_tokens = c["steps"].get<int>() - static_cast<int>(in.prompt_ids.size()) + 1;
    inputs.push_back(in);
    want.push_back(c["output_token_ids"].get<std::vector<int32_t>>());
  }
  sched::BatchOptions bo;
  bo.max_batch_tokens = 48;  // prompts and decode rows share steps
  auto out = sched::generate_batch(*e->model, *e->pool, e->loaded.tokenizer.get(), inputs, bo);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  int spread = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ((*out)[i].output_ids, want[i]) << "input " << i;
    spread += (*out)[i].shards > 1;
  }
  EXPECT_GT(spread, 0);
  const auto st = e->model->sharding_stats();
  EXPECT_GT(st.exchange.bytes, 0);
  EXPECT_EQ(e->pool->used_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(ShardsAndChunks, SpatialGolden,
                         ::testing::Values(Case{2, 16}, Case{3, 32}, Case{4, 16}, Case{4, 48}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.param.shards) + "shards_chunk" +
                                  std::to_string(info.param.chunk);
                         });

// A 300-token prompt with 8 blocks (128 tokens) per pool: RESOURCE_EXHAUSTED alone, served over
// three shards with the tokens of an unsharded pool that holds it.
TEST(SpatialCapacity, PromptLongerThanOneShard) {
  KVSPLIT_REQUIRE_MODELS();
  sched::GenerationInput in;
  for (int i = 0; i < 300; ++i) in.prompt_ids.push_back(1 + (i * 37) % 500);
  in.params.temperature = 0.9f;
  in.params.seed = 7;
  in.params.max_tokens = 20;
  in.params.ignore_eos = true;
  auto small = make_engine("llama2c", 2, 8);
  ASSERT_NE(small, nullptr);
  auto refused = sched::generate_batch(*small->model, *small->pool, nullptr, {in});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted)
      << refused.status().to_string();
  EXPECT_EQ(small->pool->used_blocks(), 0);
  auto big = make_engine("llama2c", 2, 64);
  auto want = sched::generate_batch(*big->model, *big->pool, nullptr, {in});
  ASSERT_TRUE(want.ok());
  auto e = sharded_engine(3, 64, 8);
  auto got = sched::generate_batch(*e->model, *e->pool, nullptr, {in});
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ((*got)[0].output_ids, (*want)[0].output_ids);
  EXPECT_EQ((*got)[0].shards, 3);
  EXPECT_EQ(e->pool->used_blocks(), 0);
}

}  // namespace
}  // namespace kvsplit::testing
