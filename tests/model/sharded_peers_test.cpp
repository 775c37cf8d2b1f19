// Which shards of a shard group take part in a step of sharded attention
// (model/sharded_attention.h), and how: a peer holding nothing the step reads or writes is sent
// nothing and computes nothing (the exchange follows the shards a sequence uses, not the group's
// size); a forced split-K chunk (ForwardOptions::force_chunk_tokens) holds for sharded rows as for
// the home's; and a system that refuses the peers' job threads gets the shards in turns, not an
// exception.
#include <gtest/gtest.h>
#include <pthread.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "common/job_thread.h"
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

// A CPU backend counting its attention calls and keeping every decode call's split plan (calls
// come from the shard's job thread).
class CountingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int prefill_calls = 0, decode_calls = 0;
  std::vector<backend::SplitPlan> plans;

  Status attention_prefill(const backend::AttentionArgs& a) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++prefill_calls;
    return ForwardingBackend::attention_prefill(a);
  }
  Status attention_decode(const backend::AttentionArgs& a, const backend::SplitPlan& p) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++decode_calls;
      plans.push_back(p);
    }
    return ForwardingBackend::attention_decode(a, p);
  }

 private:
  std::mutex mu_;
};

// A shard group of `shards` counting CPU backends (the home one too), `blocks` blocks each.
struct Group {
  std::unique_ptr<CountingBackend> home;
  std::unique_ptr<kv::KvPool> pool;
  std::vector<CountingBackend*> be;  // every shard's, home first
  std::unique_ptr<backend::Communicator> comm = backend::make_in_process_communicator();
};

Group make_group(int shards, int blocks, int block_size, int chunk, const kv::KvShape& shape) {
  Group g;
  g.home = std::make_unique<CountingBackend>(shard_cpu(0));
  g.be.push_back(g.home.get());
  g.pool = sharded_pool(*g.home, shards, blocks, block_size, chunk, shape, [&](int s) {
    auto b = std::make_unique<CountingBackend>(shard_cpu(s));
    g.be.push_back(b.get());
    return b;
  });
  return g;
}

constexpr int kHeads = 8, kKvHeads = 4, kHeadDim = 8, kBlock = 16;

// One layer of sharded attention over group `g`: each step feeds `feed[i]` tokens of sequence i
// (decode rows first: a sequence with KV fed one token), with random q, k, v from `rng`.
struct Stepper {
  Group& g;
  std::vector<kv::BlockTable> tables;
  std::vector<int> len;
  model::ShardedAttention sa;

  Stepper(Group& group, int seqs) : g(group), tables(seqs), len(seqs, 0) {
    for (auto& t : tables) t.spread = true;
  }
  // Returns the step's output [rows, heads, head_dim]; `exchanged` gets the step's bytes.
  std::vector<float> step(const std::vector<int>& feed, std::mt19937& rng, int64_t* exchanged) {
    std::vector<model::ShardedSeq> seqs;
    int rows = 0;
    for (int pass = 0; pass < 2; ++pass) {  // decode rows first
      for (size_t i = 0; i < tables.size(); ++i) {
        const bool decode = feed[i] == 1 && len[i] > 0;
        if (feed[i] == 0 || decode != (pass == 0)) continue;
        EXPECT_TRUE(g.pool->reserve(tables[i], len[i] + feed[i]));
        seqs.push_back({&tables[i], len[i], feed[i], decode});
        rows += feed[i];
      }
    }
    const auto q = randn(rng, size_t(rows) * kHeads * kHeadDim);
    const auto k = randn(rng, size_t(rows) * kKvHeads * kHeadDim);
    const auto v = randn(rng, size_t(rows) * kKvHeads * kHeadDim);
    std::vector<float> out(q.size(), NAN);
    const int64_t before = g.comm->stats().bytes;
    const float scale = 1.f / std::sqrt(static_cast<float>(kHeadDim));
    Status st = sa.prepare(seqs, *g.pool, {kHeads, kKvHeads, kHeadDim, scale}, {}, *g.comm);
    if (st.ok()) st = sa.run_layer(0, q.data(), k.data(), v.data(), out.data());
    if (st.ok()) st = sa.finish_step();
    EXPECT_TRUE(st.ok()) << st.to_string();
    *exchanged = g.comm->stats().bytes - before;
    for (size_t i = 0; i < tables.size(); ++i) len[i] += feed[i];
    return out;
  }
  void release() {
    for (auto& t : tables) g.pool->release(t);
  }
};

// A 100-token prompt in chunks of 64 tokens, then 20 decode steps: its pages sit on shards 0 and
// 1 only. Over groups of 2, 4 and 8 shards every step exchanges the same bytes and gives the same
// output bit for bit, and shards 2.. are never called: traffic and work follow the shards the
// sequence uses, not the group's size (before 2026-12-06 each peer was sent every query row, sent
// back a partial and ran a prefill over nothing: 2.6x the bytes with 4 shards, 5.9x with 8).
TEST(ShardedPeers, PeersHoldingNothingAreSentNothingAndComputeNothing) {
  const kv::KvShape shape{1, kKvHeads, kHeadDim};
  std::vector<std::vector<int64_t>> bytes;
  std::vector<std::vector<std::vector<float>>> outs;
  for (int shards : {2, 4, 8}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    Group g = make_group(shards, 32, kBlock, 64, shape);
    Stepper s(g, 1);
    std::mt19937 rng(7);
    bytes.emplace_back();
    outs.emplace_back();
    for (int t = 0; t <= 20; ++t) {
      int64_t b = 0;
      outs.back().push_back(s.step({t == 0 ? 100 : 1}, rng, &b));
      bytes.back().push_back(b);
      EXPECT_EQ(std::vector<int>(s.sa.active_shards().begin(), s.sa.active_shards().end()),
                (std::vector<int>{0, 1}));
    }
    EXPECT_EQ(s.tables[0].shards_used(), 2);
    EXPECT_GT(g.be[1]->prefill_calls + g.be[1]->decode_calls, 0);
    for (int sh = 2; sh < shards; ++sh) {
      EXPECT_EQ(g.be[sh]->prefill_calls, 0) << "shard " << sh;
      EXPECT_EQ(g.be[sh]->decode_calls, 0) << "shard " << sh;
    }
    s.release();
  }
  EXPECT_EQ(bytes[1], bytes[0]);
  EXPECT_EQ(bytes[2], bytes[0]);
  EXPECT_EQ(outs[1], outs[0]);
  EXPECT_EQ(outs[2], outs[0]);
}

// A step with a decode row whose pages span shards 0-2 and the prefill of a new prompt whose
// pages are all on the home: shards 1 and 2 take part (the decode row) but hold no page of the
// prompt, so they run no prefill attention (its rows stay their empty partial).
TEST(ShardedPeers, NoPrefillAttentionOnAShardHoldingNoneOfThePrompts) {
  Group g = make_group(4, 32, kBlock, 32, kv::KvShape{1, kKvHeads, kHeadDim});
  Stepper s(g, 2);
  std::mt19937 rng(11);
  int64_t b = 0;
  s.step({70, 0}, rng, &b);  // shards 0, 1, 2
  std::vector<int> prefill(4), decode(4);
  for (int sh = 0; sh < 4; ++sh) {
    prefill[sh] = g.be[sh]->prefill_calls;
    decode[sh] = g.be[sh]->decode_calls;
  }
  s.step({1, 20}, rng, &b);  // the decode row, and a prompt within chunk 0 (the home's)
  EXPECT_EQ(std::vector<int>(s.sa.active_shards().begin(), s.sa.active_shards().end()),
            (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(g.be[0]->prefill_calls, prefill[0] + 1);
  for (int sh = 1; sh <= 2; ++sh) {
    EXPECT_EQ(g.be[sh]->prefill_calls, prefill[sh]) << "shard " << sh;
    EXPECT_EQ(g.be[sh]->decode_calls, decode[sh] + 1) << "shard " << sh;
  }
  EXPECT_EQ(g.be[3]->prefill_calls + g.be[3]->decode_calls, 0);
  s.release();
}

// stories260K in llama2.c format.
StatusOr<model::LoadedModel> load_stories() {
  model::LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  return model::load_model(model_path("stories260K.bin"), lo);
}

// One greedy request: a 100-token prompt (ids 1 + j * stride mod 500), 20 tokens generated.
std::vector<sched::GenerationInput> greedy_prompt(int stride) {
  std::vector<sched::GenerationInput> inputs(1);
  for (int j = 0; j < 100; ++j) inputs[0].prompt_ids.push_back(1 + (j * stride) % 500);
  inputs[0].params.temperature = 0.f;
  inputs[0].params.max_tokens = 20;
  inputs[0].params.ignore_eos = true;
  return inputs;
}

// The review's case through LlamaModel::forward: stories260K, chunk 64 tokens, a 100-token prompt
// and 20 generated tokens, whose pages sit on shards 0 and 1 only. Groups of 2, 4 and 8 shards
// exchange the same 394,080 bytes (5 layers x (100 query rows + the 36 prompt K/V rows on shard 1
// + 19 decode rows with theirs), one active peer) and give the same tokens; before 2026-12-06,
// 1,041,440 with 4 shards and 2,336,160 with 8.
TEST(ShardedPeers, GenerationExchangeFollowsTheShardsItUses) {
  KVSPLIT_REQUIRE_MODELS();
  auto loaded = load_stories();
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const model::ModelConfig& c = loaded->config;
  const std::vector<sched::GenerationInput> inputs = greedy_prompt(31);
  std::vector<std::vector<int32_t>> tokens;
  for (const int shards : {2, 4, 8}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    Group g = make_group(shards, 8, 16, 64, kv::KvShape{c.num_layers, c.num_kv_heads, c.head_dim});
    auto lm = model::LlamaModel::create(*loaded, *g.home);
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    auto out = sched::generate_batch(**lm, *g.pool, nullptr, inputs, sched::BatchOptions{});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].shards, 2);
    EXPECT_EQ((*lm)->sharding_stats().exchange.bytes, 394080);
    tokens.push_back((*out)[0].output_ids);
    for (int sh = 2; sh < shards; ++sh)
      EXPECT_EQ(g.be[sh]->prefill_calls + g.be[sh]->decode_calls, 0) << "shard " << sh;
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_EQ(tokens[2], tokens[0]);
}

// `kvsplit generate --split-chunk 0 --spatial-shards N`: ForwardOptions::force_chunk_tokens 0
// means no split for every decode row, the sharded rows' compact tables included. stories260K
// over 3 shards, with a split config under which the planner splits every decode call (the
// control run shows it does).
TEST(ShardedPeers, ForcedSplitChunkHoldsForShardedRows) {
  KVSPLIT_REQUIRE_MODELS();
  auto loaded = load_stories();
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const model::ModelConfig& c = loaded->config;
  const std::vector<sched::GenerationInput> inputs = greedy_prompt(17);
  for (const int force : {-1, 0}) {
    SCOPED_TRACE("force_chunk_tokens " + std::to_string(force));
    Group g = make_group(3, 16, 16, 32, kv::KvShape{c.num_layers, c.num_kv_heads, c.head_dim});
    auto lm = model::LlamaModel::create(*loaded, *g.home);
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    sched::BatchOptions bo;
    bo.forward.split.min_chunk_tokens = 16;
    bo.forward.split.work_items_per_unit = 64;
    bo.forward.force_chunk_tokens = force;
    auto out = sched::generate_batch(**lm, *g.pool, nullptr, inputs, bo);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ((*out)[0].shards, 3);
    int calls = 0, split = 0;
    for (CountingBackend* b : g.be) {
      for (const backend::SplitPlan& p : b->plans) {
        ++calls;
        split += p.has_splits();
      }
    }
    EXPECT_GE(calls, 3 * 19 * c.num_layers);  // every shard, every decode step and layer
    if (force < 0)
      EXPECT_GT(split, 0);  // the planner splits
    else
      EXPECT_EQ(split, 0);
  }
}

// While alive, the system refuses every new thread of this process: its default stack (1 PiB)
// cannot be mapped. ok() is false where that does not make std::thread fail.
class RefuseThreads {
 public:
  RefuseThreads() {
    if (pthread_getattr_default_np(&saved_) != 0) return;
    pthread_attr_t a;
    pthread_attr_init(&a);
    set_ =
        pthread_attr_setstacksize(&a, size_t{1} << 50) == 0 && pthread_setattr_default_np(&a) == 0;
    pthread_attr_destroy(&a);
    if (!set_) return;
    try {
      std::thread([] {}).join();
    } catch (const std::system_error&) {
      refused_ = true;
    }
  }
  ~RefuseThreads() {
    if (set_) pthread_setattr_default_np(&saved_);
  }
  bool ok() const { return refused_; }

 private:
  pthread_attr_t saved_;
  bool set_ = false, refused_ = false;
};

// The peers' job threads start on the first step that computes at once. If the system refuses
// them (ulimit -u, memory), that step and the later ones run the shards in turns, with the same
// output bit for bit, instead of an exception escaping the worker thread (before 2026-12-06:
// std::system_error, and the process aborted).
TEST(ShardedPeers, RefusedJobThreadsRunTheShardsInTurns) {
  const kv::KvShape shape{1, kKvHeads, kHeadDim};
  Group ga = make_group(3, 32, kBlock, 32, shape), gt = make_group(3, 32, kBlock, 32, shape);
  Stepper at_once(ga, 1), in_turns(gt, 1);
  in_turns.sa.set_concurrent(false);
  std::mt19937 rng_a(3), rng_t(3);
  int64_t ba = 0, bt = 0;
  {
    RefuseThreads refuse;
    if (!refuse.ok()) GTEST_SKIP() << "cannot make this system refuse a thread";
    const auto job = JobThread::create();
    EXPECT_EQ(job.status().code(), StatusCode::kResourceExhausted) << job.status().to_string();
    EXPECT_EQ(at_once.step({80}, rng_a, &ba), in_turns.step({80}, rng_t, &bt));
  }
  for (int t = 0; t < 3; ++t)  // threads allowed again: still in turns, still the same
    EXPECT_EQ(at_once.step({1}, rng_a, &ba), in_turns.step({1}, rng_t, &bt));
  EXPECT_EQ(ba, bt);
  at_once.release();
  in_turns.release();
}

}  // namespace
}  // namespace kvsplit::testing
