// The spatial cut on the CUDA backend (label `gpu`; skips without a device): the engine with its
// KV spread over 2 virtual shards on one GPU (two CudaBackends, so two streams, on device 0), and
// over one GPU per shard where several are visible, against the CPU engine with the same shards.
// Weights are stored in f32 (EngineImpl::InternalOptions::weight_dtype), so the tokens can be
// compared with the CPU engine's and the llama2.c goldens. The same paths run under emulation in
// tests/kernels/emulated_sharded_test.cpp (the prefix cache over shards too).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "kernel_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

// Chunks of one page (16 tokens): every sequence's pages alternate over the shards.
EngineConfig sharded_config(const std::string& backend_name, int shards) {
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.backend = backend_name;
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 96;
  cfg.spatial.shards = shards;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.handoff_timeout_ms = 60000;
  return cfg;
}

StatusOr<std::unique_ptr<EngineImpl>> make_engine(const EngineConfig& cfg) {
  EngineImpl::InternalOptions io;
  io.weight_dtype = backend::DType::kF32;
  return EngineImpl::create(cfg, io);
}

// Greedy generations of four prompts, 120 tokens each (past the goldens' 64 positions).
std::vector<std::vector<int32_t>> run_prompts(Engine& engine) {
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.request_id = "p" + std::to_string(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0.f;
    r.sampling.max_tokens = 120;
    r.sampling.ignore_eos = true;
    auto h = engine.submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) handles.push_back(*h);
  }
  std::vector<std::vector<int32_t>> out;
  for (RequestHandle& h : handles) {
    Collected c = collect(h, std::chrono::seconds(120));
    EXPECT_FALSE(c.timed_out);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    out.push_back(c.tokens);
  }
  return out;
}

int64_t exchanged_bytes(const Engine& engine) {
  int64_t n = 0;
  for (const PoolStats& p : engine.stats().pools) n += p.kv_shard_exchange_bytes;
  return n;
}

void expect_cuda_shards_match_cpu(const std::vector<int32_t>& devices) {
  EngineConfig cpu_cfg = sharded_config("cpu", 2);
  auto cpu = make_engine(cpu_cfg);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  const auto want = run_prompts(**cpu);
  ASSERT_EQ(want.size(), 4u);

  EngineConfig cfg = sharded_config("cuda", 2);
  cfg.devices = devices;
  auto engine = make_engine(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  const auto got = run_prompts(**engine);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  EXPECT_GT(exchanged_bytes(**engine), 0);  // the sequences were spread
  // kv.cuts.spatial.communicator auto: NCCL only for one GPU per shard in a build with NCCL.
  const bool own_gpus = devices.size() != 1;
  const std::string comm = own_gpus && backend::nccl_communicator_built() ? "nccl" : "in-process";
  for (const PoolStats& p : (*engine)->stats().pools) {
    EXPECT_EQ(p.kv_shards, 2) << p.name;
    EXPECT_EQ(p.kv_shard_communicator, comm) << p.name;
  }
}

TEST(CudaShardEngine, TwoVirtualShardsOnOneGpuMatchTheCpuEngine) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  expect_cuda_shards_match_cpu({0});  // every shard on device 0
}

TEST(CudaShardEngine, OneGpuPerShardMatchesTheCpuEngine) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  if (backend::visible_devices("cuda") < 2) GTEST_SKIP() << "needs two visible CUDA devices";
  expect_cuda_shards_match_cpu({});  // shard s on device s (round robin over the visible ones)
}

// Every decode step scored (thresholds 0: no page moves) with 2 virtual shards: the sharded
// scoring (each shard's head_max, then scoring-only calls against the merged maxima) runs on the
// CUDA kernels and the goldens stay token-exact.
TEST(CudaShardEngine, ScoredGoldensTokenExactOverTwoVirtualShards) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = sharded_config("cuda", 2);
  cfg.devices = {0};
  cfg.kv_blocks_per_worker = 3;  // 48 tokens per shard: no golden fits one shard
  cfg.kv_policy = KvPolicy::kSemantic;
  cfg.semantic.semantic_threshold = 0.f;
  cfg.semantic.evict_threshold = 0.f;
  cfg.semantic.score_interval = 1;
  auto engine = make_engine(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  int64_t moved = 0;
  for (const PoolStats& p : (*engine)->stats().pools) moved += p.kv_demotions + p.kv_evictions;
  EXPECT_EQ(moved, 0);
  EXPECT_GT(exchanged_bytes(**engine), 0);
}

// The prefix cache over 2 virtual shards on one GPU: a 200-token prompt spread in chunks of one
// page is cached on both shards; three other tenants' prompts push its pages into the pinned home
// host tier (the peer's through its own CudaBackend: the copy kernel across backends); the prompt
// again takes its 12 whole pages back onto the shards, with the CPU engine's tokens.
TEST(CudaShardEngine, PrefixCacheOverTwoVirtualShardsMatchesTheCpuEngine) {
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  auto request = [](const std::string& tenant, int salt) {
    Request r;
    r.tenant = tenant;
    for (int k = 0; k < 200; ++k) r.prompt_token_ids.push_back(3 + (k * 7 + salt * 131) % 480);
    r.sampling.temperature = 0.f;
    r.sampling.max_tokens = 16;
    r.sampling.ignore_eos = true;
    return r;
  };
  auto run = [&](const std::string& backend_name, int64_t* cached, int64_t* from_host) {
    EngineConfig cfg = sharded_config(backend_name, 2);
    cfg.devices = {0};
    cfg.kv_blocks_per_worker = 16;
    cfg.prefix_cache = true;
    cfg.temporal.host_capacity_mb = 4;
    auto engine = make_engine(cfg);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    std::vector<int32_t> tokens;
    if (!engine.ok()) return tokens;
    for (const Request& r :
         {request("t", 0), request("a", 1), request("b", 2), request("c", 3), request("t", 0)}) {
      Collected c = collect(*(*engine)->submit(r), std::chrono::seconds(120));
      EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      if (r.tenant == "t") {
        tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
        *cached = c.final_event.usage.cached_tokens;
      }
    }
    *from_host = 0;
    for (const PoolStats& p : (*engine)->stats().pools) *from_host += p.kv_prefix_hits_host;
    return tokens;
  };
  int64_t cpu_cached = 0, cpu_host = 0, cached = 0, from_host = 0;
  const std::vector<int32_t> want = run("cpu", &cpu_cached, &cpu_host);
  const std::vector<int32_t> got = run("cuda", &cached, &from_host);
  EXPECT_EQ(got, want);
  EXPECT_EQ(cpu_cached, 192);
  EXPECT_EQ(cached, 192);
  EXPECT_GT(from_host, 0);
}

}  // namespace
}  // namespace kvsplit
