// The spatial cut on the CUDA kernel sources: stories260K through sched::generate_batch with the
// KV of each sequence spread over 2 and 3 shards, every shard an emulated kernel backend
// (tests/kernels/emulated_backend.h), so the partial attention (lse), the merge kernel and the
// sharded scoring (head_max, scoring-only calls) run the kernels CudaBackend launches. Mirrors the
// CPU tests tests/e2e/spatial_golden_test.cpp (goldens token-exact over shards) and
// tests/engine/engine_spatial_test.cpp EngineSpatialSemantic (scored goldens; a ladder that
// demotes, evicts and recalls gives the unsharded tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "emulated_backend.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/batch_generate.h"
#include "sched/sequence_cut.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

// stories260K on an emulated home backend whose pool has `shards - 1` emulated peers (chunks of
// `chunk` tokens). With `cut`, the pools get the semantic cut's tiers for `tier_pages` pages.
struct ShardedModel {
  EmulatedKernelBackend home;
  std::vector<EmulatedKernelBackend*> peers;  // owned by the pool's shard group
  model::LoadedModel loaded;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<kv::KvPool> pool;

  int decode_calls() const {
    int n = home.decode_calls();
    for (const auto* p : peers) n += p->decode_calls();
    return n;
  }
  int head_max_calls() const {
    int n = home.head_max_calls();
    for (const auto* p : peers) n += p->head_max_calls();
    return n;
  }
  int score_only_calls() const {
    int n = home.score_only_calls();
    for (const auto* p : peers) n += p->score_only_calls();
    return n;
  }
};

std::unique_ptr<ShardedModel> load_sharded(int shards, int chunk, int blocks_per_shard,
                                           const SemanticCutConfig* cut, int host_pages = 0) {
  auto m = std::make_unique<ShardedModel>();
  model::LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  auto loaded = model::load_model(model_path("stories260K.bin"), lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return nullptr;
  m->loaded = std::move(loaded).value();
  auto model = model::LlamaModel::create(m->loaded, m->home);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return nullptr;
  m->model = std::move(model).value();
  kv::KvPoolConfig pc;
  pc.num_blocks = blocks_per_shard;
  pc.block_size = 16;
  if (cut != nullptr) {
    sched::SequenceCut::size_tiers(cuts::semantic::KvPolicy::kSemantic, *cut, 64,
                                   m->model->kv_shape(), &pc);
    pc.host_bytes *= shards;  // every shard's originals go to the home host tier (as the engine)
  }
  if (host_pages > 0)
    pc.host_bytes = host_pages * kv::KvPool::block_bytes(pc, m->model->kv_shape());
  auto pool = kv::KvPool::create(m->home, pc, m->model->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  m->pool = std::move(pool).value();
  if (shards > 1) {
    std::vector<std::unique_ptr<backend::Backend>> peers;
    for (int s = 1; s < shards; ++s) {
      auto be = std::make_unique<EmulatedKernelBackend>();
      m->peers.push_back(be.get());
      peers.push_back(std::move(be));
    }
    const Status st = m->pool->add_shards(std::move(peers), chunk);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return nullptr;
  }
  return m;
}

struct Golden {
  sched::GenerationInput input;
  std::vector<int32_t> want;
};

// The first `greedy` greedy goldens and `sampled` sampled ones, each cut to `max_new` tokens.
std::vector<Golden> goldens(size_t greedy, size_t sampled, int max_new) {
  std::vector<Golden> out;
  const auto g = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  for (size_t i = 0; i < greedy && i < g.size(); ++i) {
    Golden x;
    x.input.prompt_ids = g[i]["prompt_token_ids"].get<std::vector<int32_t>>();
    x.input.params.temperature = 0.f;
    x.want = g[i]["output_token_ids"].get<std::vector<int32_t>>();
    out.push_back(std::move(x));
  }
  const auto s = read_jsonl(model_path("golden/stories260K_sampled.jsonl"));
  for (size_t i = 0; i < sampled && i < s.size(); ++i) {
    Golden x;
    x.input.prompt_ids = s[i]["prompt_token_ids"].get<std::vector<int32_t>>();
    x.input.params.temperature = s[i]["temperature"].get<float>();
    x.input.params.top_p = s[i]["topp"].get<float>();
    x.input.params.seed = s[i]["seed"].get<uint64_t>();
    x.want = s[i]["output_token_ids"].get<std::vector<int32_t>>();
    out.push_back(std::move(x));
  }
  for (Golden& x : out) {
    x.want.resize(std::min<size_t>(x.want.size(), max_new));
    x.input.params.max_tokens = static_cast<int>(x.want.size());
  }
  return out;
}

// Greedy and sampled goldens as one batch (prompt and decode rows share steps) over 2 and 3 shards
// with chunks of one page, so every sequence past its first page is spread.
TEST(EmulatedSharded, GoldensTokenExactOverTwoAndThreeShards) {
  KVSPLIT_REQUIRE_MODELS();
  for (int shards : {2, 3}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    auto m = load_sharded(shards, /*chunk=*/16, /*blocks_per_shard=*/12, nullptr);
    ASSERT_NE(m, nullptr);
    const std::vector<Golden> cases = goldens(2, 1, 40);
    std::vector<sched::GenerationInput> inputs;
    for (const Golden& c : cases) inputs.push_back(c.input);
    sched::BatchOptions bo;
    bo.max_batch_tokens = 12;
    auto out = sched::generate_batch(*m->model, *m->pool, m->loaded.tokenizer.get(), inputs, bo);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    int spread = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ((*out)[i].output_ids, cases[i].want) << "input " << i;
      spread += (*out)[i].shards == shards;
    }
    EXPECT_GT(spread, 0);
    EXPECT_GT(m->model->sharding_stats().exchange.bytes, 0);
    for (const auto* p : m->peers) EXPECT_GT(p->decode_calls(), 0);
    EXPECT_EQ(m->pool->used_blocks(), 0);
  }
}

std::vector<std::vector<int32_t>> generate_cut(ShardedModel& m, const SemanticCutConfig& sc,
                                               const std::vector<Golden>& cases,
                                               sched::SequenceCutStats* stats) {
  std::vector<sched::GenerationInput> inputs;
  for (const Golden& c : cases) {
    inputs.push_back(c.input);
    inputs.back().params.ignore_eos = true;
  }
  sched::BatchOptions bo;
  bo.kv_policy = cuts::semantic::KvPolicy::kSemantic;
  bo.semantic = sc;
  bo.cut_stats = stats;
  auto out = sched::generate_batch(*m.model, *m.pool, m.loaded.tokenizer.get(), inputs, bo);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  std::vector<std::vector<int32_t>> ids;
  if (out.ok())
    for (const auto& o : *out) ids.push_back(o.output_ids);
  return ids;
}

void expect_every_shard_free(const kv::KvPool& pool) {
  for (int s = 0; s < pool.num_shards(); ++s) {
    const kv::KvPool& z = pool.shard(s);
    EXPECT_EQ(z.allocator().num_used(), 0) << "shard " << s;
    EXPECT_EQ(z.arena_allocator(kernels::KvPrecision::kInt8).num_used(), 0) << "shard " << s;
    EXPECT_EQ(z.arena_allocator(kernels::KvPrecision::kInt4).num_used(), 0) << "shard " << s;
    EXPECT_EQ(z.summary_allocator().num_used(), 0) << "shard " << s;
  }
  EXPECT_EQ(pool.host_allocator().num_used(), 0);
}

// The prefix cache over two emulated shards: a 64-token prompt spread in chunks of one page is
// cached on both shards; three other prompts then push its pages off the devices, the peer's into
// the home host tier through the peer's backend (the copy kernel, across backends); the prompt
// again takes every whole page but the last, back onto the shards that cached them, with the
// tokens of the first run.
TEST(EmulatedSharded, PrefixCacheServesAPromptSpilledFromEveryShard) {
  KVSPLIT_REQUIRE_MODELS();
  auto m = load_sharded(2, /*chunk=*/16, /*blocks_per_shard=*/8, nullptr, /*host_pages=*/32);
  ASSERT_NE(m, nullptr);
  m->pool->enable_prefix_cache();
  auto prompt = [](int salt) {
    sched::GenerationInput in;
    for (int t = 0; t < 64; ++t) in.prompt_ids.push_back(3 + (t * 7 + salt * 131) % 480);
    in.params.temperature = 0.f;
    in.params.max_tokens = 8;
    in.params.ignore_eos = true;
    return in;
  };
  auto run = [&](std::vector<sched::GenerationInput> inputs) {
    sched::BatchOptions bo;
    bo.max_batch_tokens = 32;
    auto out = sched::generate_batch(*m->model, *m->pool, m->loaded.tokenizer.get(), inputs, bo);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return out.ok() ? std::move(out).value() : std::vector<sched::GenerationOutput>{};
  };
  const auto first = run({prompt(0)});
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].cached_tokens, 0);
  EXPECT_EQ(first[0].shards, 2);
  ASSERT_GT(m->pool->shard_prefix_cache(1)->size(), 0);
  // 15 pages for three other prompts, 12 free beside the cached ones: both shards evict.
  const auto others = run({prompt(1), prompt(2), prompt(3)});
  ASSERT_EQ(others.size(), 3u);
  EXPECT_GT(m->pool->shard_prefix_cache(1)->stats().spilled_host, 0);  // the peer's, to home
  const auto again = run({prompt(0)});
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].output_ids, first[0].output_ids);
  EXPECT_EQ(again[0].cached_tokens, 48);  // 3 of the prompt's 4 pages (not its last token's)
  EXPECT_GT(m->pool->shard_prefix_cache(1)->stats().hit_pages_host, 0);
  EXPECT_EQ(m->pool->prefix_stats().spill_faults + m->pool->prefix_stats().restore_faults, 0);
  m->pool->shard_prefix_cache(0)->clear(m->pool->shard(0).allocator());
  m->pool->shard_prefix_cache(1)->clear(m->pool->shard(1).allocator());
  expect_every_shard_free(*m->pool);
}

// Every decode step scored (thresholds 0: no page moves) over 3 shards: the goldens stay
// token-exact, and the scoring ran the sharded way (each shard's head_max, then scoring-only calls
// against the merged maxima).
TEST(EmulatedSharded, ScoredGoldensTokenExactOverThreeShards) {
  KVSPLIT_REQUIRE_MODELS();
  SemanticCutConfig sc;
  sc.semantic_threshold = 0.f;
  sc.evict_threshold = 0.f;
  sc.score_interval = 1;
  auto m = load_sharded(3, 16, 16, &sc);
  ASSERT_NE(m, nullptr);
  const std::vector<Golden> cases = goldens(2, 0, 40);
  sched::SequenceCutStats stats;
  const auto ids = generate_cut(*m, sc, cases, &stats);
  ASSERT_EQ(ids.size(), cases.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], cases[i].want) << "golden " << i;
  EXPECT_GT(stats.scored_steps, 10);
  EXPECT_EQ(stats.ops.demoted_to_int8 + stats.ops.demoted_to_int4 + stats.ops.evicted, 0);
  EXPECT_GT(m->head_max_calls(), 0);
  EXPECT_GT(m->score_only_calls(), 0);
  for (const auto* p : m->peers) EXPECT_GT(p->score_only_calls(), 0);
  expect_every_shard_free(*m->pool);
}

// A ladder that demotes, evicts and recalls from the first steps: 2 and 3 shards give the tokens
// of the unsharded run on the same kernels. The merged attention equals the unsharded one within
// fp32 rounding, so the transition counts agree within 2% (as in EngineSpatialSemantic).
TEST(EmulatedSharded, ForcedLadderSameTokensAsUnsharded) {
  KVSPLIT_REQUIRE_MODELS();
  SemanticCutConfig sc;
  sc.semantic_threshold = 0.99f;
  sc.evict_threshold = 0.9f;
  sc.recall_threshold = 0.95f;
  sc.demote_after_steps = 1;
  sc.evict_after_steps = 1;
  sc.score_interval = 1;
  sc.sink_tokens = 4;
  sc.recent_tokens = 16;
  std::vector<Golden> cases = goldens(2, 0, 64);
  for (Golden& c : cases) c.input.params.max_tokens = 64;
  sched::SequenceCutStats want_stats;
  std::vector<std::vector<int32_t>> want;
  {
    auto m = load_sharded(1, 16, 32, &sc);
    ASSERT_NE(m, nullptr);
    want = generate_cut(*m, sc, cases, &want_stats);
    ASSERT_EQ(want.size(), cases.size());
    expect_every_shard_free(*m->pool);
  }
  std::printf("unsharded ladder: %lld to int8, %lld to int4, %lld evicted, %lld restored\n",
              static_cast<long long>(want_stats.ops.demoted_to_int8),
              static_cast<long long>(want_stats.ops.demoted_to_int4),
              static_cast<long long>(want_stats.ops.evicted),
              static_cast<long long>(want_stats.ops.restored));
  EXPECT_GT(want_stats.ops.demoted_to_int8 + want_stats.ops.demoted_to_int4, 0);
  EXPECT_GT(want_stats.ops.evicted, 0);
  EXPECT_GT(want_stats.ops.restored, 0);
  EXPECT_EQ(want_stats.ops.refused(), 0);  // transitions depend on relevance only
  const auto near = [](int64_t a, int64_t b) {
    return std::llabs(a - b) <= std::max<int64_t>(2, b / 50);
  };
  for (int shards : {2, 3}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    auto m = load_sharded(shards, 16, 32, &sc);
    ASSERT_NE(m, nullptr);
    sched::SequenceCutStats stats;
    const auto got = generate_cut(*m, sc, cases, &stats);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "sequence " << i;
    std::printf("%d shards: %lld to int8, %lld to int4, %lld evicted, %lld restored\n", shards,
                static_cast<long long>(stats.ops.demoted_to_int8),
                static_cast<long long>(stats.ops.demoted_to_int4),
                static_cast<long long>(stats.ops.evicted),
                static_cast<long long>(stats.ops.restored));
    EXPECT_EQ(stats.ops.refused(), 0);
    const int64_t demoted = stats.ops.demoted_to_int8 + stats.ops.demoted_to_int4;
    const int64_t want_demoted = want_stats.ops.demoted_to_int8 + want_stats.ops.demoted_to_int4;
    EXPECT_TRUE(near(demoted, want_demoted)) << demoted << " vs " << want_demoted;
    EXPECT_TRUE(near(stats.ops.evicted, want_stats.ops.evicted))
        << stats.ops.evicted << " vs " << want_stats.ops.evicted;
    EXPECT_TRUE(near(stats.ops.restored, want_stats.ops.restored))
        << stats.ops.restored << " vs " << want_stats.ops.restored;
    EXPECT_GT(m->model->sharding_stats().exchange.bytes, 0);
    EXPECT_GT(m->score_only_calls(), 0);
    expect_every_shard_free(*m->pool);
  }
}

}  // namespace
}  // namespace kvsplit::testing
