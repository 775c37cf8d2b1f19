// The spatial cut's shards compute their partial attention at once, each peer on its own job
// thread and backend (model/sharded_attention.h): the output is bit-identical to the shards taking
// turns, the exchange is counted the same, an error on one shard comes back only after every
// shard finished, and sequences preempted and finished on a shard group leave every shard's
// blocks free. Labelled `concurrency`: CI runs it under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "forwarding_backend.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "model/shard_test_util.h"
#include "model/sharded_attention.h"
#include "sched/batch_generate.h"
#include "test_util.h"

namespace kvsplit::testing {
namespace {

// A CPU backend whose attention calls can be made to fail or to take longer (to check that an
// error on one shard is returned only after the others finished). Everything else forwards.
class FaultyBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::atomic<bool> fail{false};
  std::atomic<int> delay_ms{0};
  std::atomic<int> attention_calls{0}, attention_done{0};

  std::string name() const override { return "faulty " + ForwardingBackend::name(); }
  Status attention_prefill(const backend::AttentionArgs& a) override {
    return attention([&] { return ForwardingBackend::attention_prefill(a); });
  }
  Status attention_decode(const backend::AttentionArgs& a, const backend::SplitPlan& p) override {
    return attention([&] { return ForwardingBackend::attention_decode(a, p); });
  }

 private:
  template <typename F>
  Status attention(F f) {
    ++attention_calls;
    if (const int ms = delay_ms.load(); ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    Status st =
        fail.load()
            ? internal_error("injected attention failure on device " + std::to_string(device()))
            : f();
    ++attention_done;
    return st;
  }
};

// A shard group: `shards` CPU backends (peers wrapped in FaultyBackend), `blocks` blocks each.
struct Group {
  std::unique_ptr<backend::Backend> home;
  std::unique_ptr<kv::KvPool> pool;
  std::vector<FaultyBackend*> peers;  // owned by the pool
  std::unique_ptr<backend::Communicator> comm = backend::make_in_process_communicator();
};

Group make_group(int shards, int blocks, int block_size, int chunk, const kv::KvShape& shape) {
  Group g;
  g.home = shard_cpu(0);
  g.pool = sharded_pool(*g.home, shards, blocks, block_size, chunk, shape, [&](int s) {
    auto f = std::make_unique<FaultyBackend>(shard_cpu(s));
    g.peers.push_back(f.get());
    return f;
  });
  return g;
}

struct Shape {
  int heads, kv_heads, head_dim, block_size, layers;
};

// Two identical shard groups, one computing the shards at once and one in turns, fed the same
// steps (a prefill of every prompt spanning shards, then decode steps, then a step mixing decode
// rows with a new prompt's chunk), every layer: the outputs are equal bit for bit, and so are the
// exchange counters.
void compare_modes(const Shape& sh, int num_shards, int chunk, const std::vector<int>& prompts,
                   int decode_steps, uint32_t seed) {
  SCOPED_TRACE("heads " + std::to_string(sh.heads) + "/" + std::to_string(sh.kv_heads) + " d " +
               std::to_string(sh.head_dim) + " shards " + std::to_string(num_shards) + " chunk " +
               std::to_string(chunk) + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const kv::KvShape shape{sh.layers, sh.kv_heads, sh.head_dim};
  Group g[2] = {make_group(num_shards, 128, sh.block_size, chunk, shape),
                make_group(num_shards, 128, sh.block_size, chunk, shape)};
  model::ShardedAttention sa[2];
  sa[0].set_concurrent(true);
  sa[1].set_concurrent(false);
  const int n = static_cast<int>(prompts.size()) + 1;  // the last one arrives in the last step
  std::vector<kv::BlockTable> tables[2] = {std::vector<kv::BlockTable>(n),
                                           std::vector<kv::BlockTable>(n)};
  for (auto& ts : tables)
    for (auto& t : ts) t.spread = true;
  std::vector<int> len(n, 0);
  const int H = sh.heads, Hkv = sh.kv_heads, d = sh.head_dim;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));

  auto step = [&](const std::vector<int>& feed) {
    std::vector<int> order;  // decode rows first
    for (int i = 0; i < n; ++i)
      if (feed[i] == 1 && len[i] > 0) order.push_back(i);
    for (int i = 0; i < n; ++i)
      if (feed[i] > 0 && !(feed[i] == 1 && len[i] > 0)) order.push_back(i);
    int rows = 0;
    std::vector<model::ShardedSeq> seqs[2];
    for (int m = 0; m < 2; ++m) {
      for (int i : order) {
        ASSERT_TRUE(g[m].pool->reserve(tables[m][i], len[i] + feed[i]));
        seqs[m].push_back({&tables[m][i], len[i], feed[i], feed[i] == 1 && len[i] > 0});
      }
    }
    for (int i : order) rows += feed[i];
    for (int m = 0; m < 2; ++m)
      ASSERT_TRUE(sa[m].prepare(seqs[m], *g[m].pool, {H, Hkv, d, scale}, {}, *g[m].comm).ok());
    for (int l = 0; l < sh.layers; ++l) {
      const std::vector<float> q = randn(rng, size_t(rows) * H * d);
      const std::vector<float> k = randn(rng, size_t(rows) * Hkv * d);
      const std::vector<float> v = randn(rng, size_t(rows) * Hkv * d);
      std::vector<float> out[2] = {std::vector<float>(q.size(), NAN),
                                   std::vector<float>(q.size(), NAN)};
      for (int m = 0; m < 2; ++m) {
        const Status st = sa[m].run_layer(l, q.data(), k.data(), v.data(), out[m].data());
        ASSERT_TRUE(st.ok()) << st.to_string();
      }
      for (float x : out[0]) ASSERT_FALSE(std::isnan(x));
      ASSERT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0)
          << "layer " << l << ", rows " << rows;
    }
    EXPECT_EQ(g[0].comm->stats().bytes, g[1].comm->stats().bytes);
    EXPECT_EQ(g[0].comm->stats().transfers, g[1].comm->stats().transfers);
    for (int i : order) len[i] += feed[i];
  };

  std::vector<int> feed(prompts);
  feed.push_back(0);
  step(feed);
  for (int s = 0; s < decode_steps; ++s) {
    std::vector<int> f(n, 1);
    f[n - 1] = 0;
    step(f);
  }
  std::vector<int> f(n, 1);
  f[n - 1] = 2 * chunk + 3;  // a new prompt spanning shards beside the decode rows
  step(f);
  EXPECT_GT(g[0].comm->stats().bytes, 0);
  for (int m = 0; m < 2; ++m) {
    for (auto& t : tables[m]) g[m].pool->release(t);
    for (int s = 0; s < g[m].pool->num_shards(); ++s)
      EXPECT_EQ(g[m].pool->shard(s).used_blocks(), 0) << "shard " << s;
  }
}

TEST(ShardedConcurrency, PartialsAtOnceEqualPartialsInTurnsBitForBit) {
  const Shape shapes[] = {
      {4, 4, 16, 16, 2}, {8, 2, 32, 8, 3}, {6, 1, 64, 16, 2}, {4, 2, 128, 4, 2}};
  uint32_t seed = 11;
  for (const Shape& sh : shapes) {
    for (int shards = 2; shards <= 4; ++shards) {
      const int chunk = sh.block_size * (1 + static_cast<int>(seed % 3));
      compare_modes(sh, shards, chunk, {5 * chunk + 3, 2 * chunk - 1, 1}, 4, seed++);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// A shard failing its attention: run_layer returns that error, and only after every other shard
// finished (a slow peer's attention is done when run_layer returns); with two failing, the first
// in shard order. The shard group keeps working afterwards and every block comes back.
TEST(ShardedConcurrency, AnErrorOnOneShardReturnsAfterEveryShardFinished) {
  const int H = 4, Hkv = 2, d = 16, bs = 8, chunk = 8, S = 4;
  Group g = make_group(S, 64, bs, chunk, kv::KvShape{1, Hkv, d});
  model::ShardedAttention sa;
  kv::BlockTable t;
  t.spread = true;
  std::mt19937 rng(3);
  int len = 0;
  auto run = [&](int feed) -> Status {
    EXPECT_TRUE(g.pool->reserve(t, len + feed));
    const model::ShardedSeq seq{&t, len, feed, len > 0 && feed == 1};
    KVSPLIT_RETURN_IF_ERROR(sa.prepare({&seq, 1}, *g.pool, {H, Hkv, d, 0.25f}, {}, *g.comm));
    const auto q = randn(rng, size_t(feed) * H * d), k = randn(rng, size_t(feed) * Hkv * d),
               v = randn(rng, size_t(feed) * Hkv * d);
    std::vector<float> out(q.size());
    Status st = sa.run_layer(0, q.data(), k.data(), v.data(), out.data());
    if (st.ok()) len += feed;
    return st;
  };
  ASSERT_TRUE(run(4 * chunk).ok());  // every shard holds a chunk

  g.peers[1]->fail = true;     // shard 2 fails
  g.peers[2]->delay_ms = 100;  // shard 3 is slow
  const int calls3 = g.peers[2]->attention_calls.load();
  Status st = run(1);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st.to_string();
  EXPECT_EQ(g.peers[2]->attention_calls.load(), calls3 + 1);
  EXPECT_EQ(g.peers[2]->attention_done.load(), g.peers[2]->attention_calls.load())
      << "run_layer returned while a shard was still computing";

  // Two peers failing: the first in shard order is returned.
  g.peers[0]->fail = true;
  g.peers[2]->delay_ms = 0;
  st = run(1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("device 1"), std::string::npos) << st.to_string();
  EXPECT_EQ(g.peers[1]->attention_done.load(), g.peers[1]->attention_calls.load());

  for (FaultyBackend* p : g.peers) p->fail = false;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(run(1).ok());  // the group works on
  g.pool->release(t);
  for (int s = 0; s < S; ++s) EXPECT_EQ(g.pool->shard(s).used_blocks(), 0) << "shard " << s;
}

// stories260K through LlamaModel::forward on a 3-shard group under memory pressure (sequences are
// preempted and recomputed, finish at different steps, and scored decode steps are not involved):
// the tokens of shards computing at once equal those of shards taking turns, and every shard's
// blocks come back.
TEST(ShardedConcurrency, BatchWithPreemptionOnAShardGroupSameTokensEveryBlockBack) {
  KVSPLIT_REQUIRE_MODELS();
  model::LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  auto loaded = model::load_model(model_path("stories260K.bin"), lo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::vector<sched::GenerationInput> inputs;
  for (int i = 0; i < 8; ++i) {
    sched::GenerationInput in;
    for (int j = 0; j < 20 + 9 * i; ++j) in.prompt_ids.push_back(1 + (i * 31 + j * 17) % 500);
    in.params.temperature = i % 2 ? 0.8f : 0.f;
    in.params.seed = 5 + i;
    in.params.max_tokens = 60 + 8 * i;  // about 1,100 positions for the group's 480
    in.params.ignore_eos = true;
    inputs.push_back(in);
  }
  std::vector<std::vector<int32_t>> tokens[2];
  for (int m = 0; m < 2; ++m) {
    const model::ModelConfig& c = loaded->config;
    Group g = make_group(3, 10, 16, 32, kv::KvShape{c.num_layers, c.num_kv_heads, c.head_dim});
    auto lm = model::LlamaModel::create(*loaded, *g.home);
    ASSERT_TRUE(lm.ok());
    sched::BatchOptions bo;
    bo.max_batch_tokens = 48;
    bo.forward.concurrent_shards = m == 0;
    auto out = sched::generate_batch(**lm, *g.pool, nullptr, inputs, bo);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    int preempted = 0, spread = 0;
    for (const auto& o : *out) {
      tokens[m].push_back(o.output_ids);
      preempted += o.preemptions;
      spread += o.shards > 1;
    }
    EXPECT_GT(preempted, 0);
    EXPECT_EQ(spread, static_cast<int>(inputs.size()));
    EXPECT_GT((*lm)->sharding_stats().exchange.bytes, 0);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(g.pool->shard(s).used_blocks(), 0) << "shard " << s;
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

}  // namespace
}  // namespace kvsplit::testing
