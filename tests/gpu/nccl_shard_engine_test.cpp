// The spatial cut over one GPU per shard with the NCCL communicator (label `gpu`): the engine with
// 2 shards on 2 GPUs and kv.cuts.spatial.communicator nccl (and auto, which must pick it) reports
// "nccl", exchanges bytes, and gives the tokens of the unsharded engine and of the same shards
// exchanging in-process. Skips with the reason without NCCL in the build, without a device, or
// with fewer than two visible CUDA devices. f32 weights, as tests/gpu/cuda_shard_engine_test.cpp.
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

#define KVSPLIT_REQUIRE_TWO_GPUS_AND_NCCL()                                                   \
  do {                                                                                        \
    if (!backend::nccl_communicator_built())                                                  \
      GTEST_SKIP() << "built without NCCL (KVSPLIT_WITH_NCCL off)";                           \
    KVSPLIT_REQUIRE_DEVICE();                                                                 \
    const int kvsplit_count_ = backend::visible_devices("cuda");                              \
    if (kvsplit_count_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << kvsplit_count_; \
  } while (0)

// One colocated worker (stories_config) on the CUDA backend; chunks of one page (16 tokens), so
// every sequence's pages alternate over the shards.
EngineConfig config(int shards, SpatialCommunicator comm) {
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.backend = "cuda";
  cfg.devices = {0, 1};  // the home on device 0, shard 1 on device 1
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 96;
  cfg.spatial.shards = shards;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.spatial.communicator = comm;
  cfg.handoff_timeout_ms = 60000;
  return cfg;
}

StatusOr<std::unique_ptr<EngineImpl>> make_engine(const EngineConfig& cfg) {
  EngineImpl::InternalOptions io;
  io.weight_dtype = backend::DType::kF32;
  return EngineImpl::create(cfg, io);
}

// Greedy generations of four prompts, 120 tokens each.
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

struct ShardedRun {
  std::vector<std::vector<int32_t>> tokens;
  std::string communicator;
  int64_t exchanged = 0;
};

ShardedRun run_sharded(SpatialCommunicator comm) {
  ShardedRun r;
  auto engine = make_engine(config(2, comm));
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return r;
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  r.tokens = run_prompts(**engine);
  for (const PoolStats& p : (*engine)->stats().pools) {
    EXPECT_EQ(p.kv_shards, 2) << p.name;
    r.communicator = p.kv_shard_communicator;
    r.exchanged += p.kv_shard_exchange_bytes;
  }
  return r;
}

TEST(NcclShardEngine, TwoGpusOverNcclMatchTheUnshardedEngine) {
  KVSPLIT_REQUIRE_TWO_GPUS_AND_NCCL();
  KVSPLIT_REQUIRE_MODELS();
  std::vector<std::vector<int32_t>> want;
  {
    auto plain = make_engine(config(1, SpatialCommunicator::kAuto));
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    want = run_prompts(**plain);
    ASSERT_EQ(want.size(), 4u);
  }
  for (SpatialCommunicator comm : {SpatialCommunicator::kNccl, SpatialCommunicator::kAuto}) {
    SCOPED_TRACE(spatial_communicator_name(comm));
    const ShardedRun got = run_sharded(comm);
    EXPECT_EQ(got.communicator, "nccl");
    EXPECT_GT(got.exchanged, 0);  // the sequences were spread and exchanged over NCCL
    ASSERT_EQ(got.tokens.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got.tokens[i], want[i]) << "prompt " << i;
  }
  // The same shards exchanging in-process: the transport changes, not one token.
  const ShardedRun nccl = run_sharded(SpatialCommunicator::kNccl);
  const ShardedRun in_process = run_sharded(SpatialCommunicator::kInProcess);
  EXPECT_EQ(in_process.communicator, "in-process");
  EXPECT_EQ(nccl.tokens, in_process.tokens);
  EXPECT_EQ(nccl.exchanged, in_process.exchanged);  // the same sends, counted the same way
}

// Two shards on one GPU (virtual shards) cannot use NCCL (one rank per device): nccl is a
// start-up error naming the two shards, auto exchanges in-process.
TEST(NcclShardEngine, VirtualShardsRefuseNccl) {
  if (!backend::nccl_communicator_built()) GTEST_SKIP() << "built without NCCL";
  KVSPLIT_REQUIRE_DEVICE();
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = config(2, SpatialCommunicator::kNccl);
  cfg.devices = {0};
  auto e = make_engine(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().to_string();
  EXPECT_NE(e.status().message().find("both on CUDA device 0"), std::string::npos)
      << e.status().to_string();
  cfg.spatial.communicator = SpatialCommunicator::kAuto;
  auto a = make_engine(cfg);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_GT(testing::expect_greedy_goldens(**a), 0);
  for (const PoolStats& p : (*a)->stats().pools) EXPECT_EQ(p.kv_shard_communicator, "in-process");
}

}  // namespace
}  // namespace kvsplit
