// The spatial cut in the engine: each worker's KV pool is a shard group; a sequence spread over it
// produces exactly the tokens of the unsharded engine (the stories260K goldens, both modes),
// including when one shard could not hold it; a prompt longer than one shard's pool is refused
// without shards and served with them; every shard's blocks come back.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "kvm/monitor.h"
#include "start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

struct SpatialCase {
  ServingMode mode;
  int shards;
  int chunk;
};

class EngineSpatial : public ::testing::TestWithParam<SpatialCase> {};

// Two blocks (32 tokens) per shard: a 64-position golden needs at least two shards, so every
// golden below runs spread over the group.
TEST_P(EngineSpatial, GoldensTokenExactWithSmallShards) {
  KVSPLIT_REQUIRE_MODELS();
  const SpatialCase& p = GetParam();
  EngineConfig cfg = testing::stories_config(p.mode);
  cfg.kv_blocks_per_worker = 2;
  cfg.block_size = 16;
  cfg.spatial.shards = p.shards;
  cfg.spatial.spatial_chunk_size = p.chunk;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  for (int free : initial) EXPECT_EQ(free, 2 * p.shards);
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  int64_t exchanged = 0;
  for (const PoolStats& ps : (*engine)->stats().pools) {
    EXPECT_EQ(ps.kv_shards, p.shards) << ps.name;
    EXPECT_EQ(ps.kv_pages_remote, 0) << ps.name;  // all released
    exchanged += ps.kv_shard_exchange_bytes;
  }
  EXPECT_GT(exchanged, 0);
}

// kv_pages_remote counts the sequences' pages on peer shards: once they are released it is 0,
// though the peers' prefix caches still hold pages of the prompts (it counted the peers' used
// blocks).
TEST(EngineSpatialStats, RemotePagesLeaveOutIdleCachedPages) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 64;
  cfg.block_size = 8;
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 8;
  cfg.prefix_cache = true;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Request r;  // 41 prompt tokens: 5 full pages over the two shards, all cached
  for (int t = 0; t < 41; ++t) r.prompt_token_ids.push_back(3 + (t * 7) % 500);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 4;
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_FALSE(testing::collect(*h).timed_out);
  // The stats of after the last step (a final event comes before its step's stats).
  ASSERT_TRUE(testing::wait_for_stats(**engine, [](const EngineStats& s) {
    for (const PoolStats& p : s.pools)
      if (p.running + p.waiting > 0) return false;
    return true;
  }));
  int cached = 0;
  for (const PoolStats& ps : (*engine)->stats().pools) {
    EXPECT_EQ(ps.kv_pages_remote, 0) << ps.name;
    cached += ps.kv_prefix_cache_pages;
  }
  EXPECT_GT(cached, 0) << "no prompt page stayed cached: the test shows nothing";
}

INSTANTIATE_TEST_SUITE_P(ShardsAndChunks, EngineSpatial,
                         ::testing::Values(SpatialCase{ServingMode::kColocated, 2, 16},
                                           SpatialCase{ServingMode::kColocated, 3, 32},
                                           SpatialCase{ServingMode::kColocated, 4, 48},
                                           SpatialCase{ServingMode::kDisaggregated, 2, 32},
                                           SpatialCase{ServingMode::kDisaggregated, 3, 16},
                                           SpatialCase{ServingMode::kDisaggregated, 4, 48}),
                         [](const ::testing::TestParamInfo<SpatialCase>& info) {
                           return std::string(info.param.mode == ServingMode::kColocated
                                                  ? "colocated"
                                                  : "disagg") +
                                  "_" + std::to_string(info.param.shards) + "shards_chunk" +
                                  std::to_string(info.param.chunk);
                         });

Request long_request() {
  Request r;
  r.request_id = "long";
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int32_t>(i * 7 % 500);
  r.prompt_token_ids = prompt;
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 42;
  r.sampling.max_tokens = 30;
  r.sampling.ignore_eos = true;
  return r;
}

// 8 blocks (128 tokens) per worker: a 200-token prompt does not fit one; with three such shards
// it is served, with the tokens of an engine whose single pool holds it (seeded sampling).
TEST(EngineSpatialCapacity, LongPromptNeedsShards) {
  KVSPLIT_REQUIRE_MODELS();
  for (ServingMode mode : {ServingMode::kColocated, ServingMode::kDisaggregated}) {
    SCOPED_TRACE(mode == ServingMode::kColocated ? "colocated" : "disaggregated");
    EngineConfig cfg = testing::stories_config(mode);
    cfg.kv_blocks_per_worker = 8;
    {
      auto engine = Engine::create(cfg);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      auto h = (*engine)->submit(long_request());
      if (h.ok()) {  // refused at admission or finished with the same code
        Collected c = collect(*h);
        EXPECT_EQ(c.final_event.status.code(), StatusCode::kResourceExhausted)
            << c.final_event.status.to_string();
      } else {
        EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted) << h.status().to_string();
      }
    }
    std::vector<int32_t> want;
    {
      EngineConfig big = cfg;
      big.kv_blocks_per_worker = 64;
      auto engine = Engine::create(big);
      ASSERT_TRUE(engine.ok());
      auto h = (*engine)->submit(long_request());
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      Collected c = collect(*h);
      ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
      want = c.tokens;
      ASSERT_EQ(want.size(), 30u);
    }
    cfg.spatial.shards = 3;
    cfg.spatial.spatial_chunk_size = 64;
    auto engine = Engine::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    auto h = (*engine)->submit(long_request());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    Collected c = collect(*h);
    ASSERT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens, want);
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  }
}

// min_context: short sequences stay on the home shard, long ones are spread; both exact. Each
// shard holds 16 pages (256 tokens), so every request here fits the home shard alone: exchange
// bytes come from spreading only, not from pages that overflowed onto a peer.
TEST(EngineSpatialCapacity, MinContextSpreadsOnlyLongSequences) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 16;
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.spatial.min_context = 100;  // the 64-position goldens stay home; the long request spreads
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  // Bytes the shards exchanged (only spread sequences exchange anything).
  auto exchanged = [&] {
    int64_t b = 0;
    for (const PoolStats& p : (*engine)->stats().pools) b += p.kv_shard_exchange_bytes;
    return b;
  };
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  ASSERT_TRUE(testing::pools_back_to(**engine, initial));
  EXPECT_EQ(exchanged(), 0);  // the goldens stayed on the home shard
  // The boundary: prompt + max_tokens = min_context stays home, one more token spreads.
  for (const int max_tokens : {40, 41}) {
    Request r = long_request();
    r.prompt_token_ids.resize(60);
    r.sampling.max_tokens = max_tokens;
    const int64_t before = exchanged();
    const Collected b = collect(*(*engine)->submit(r));
    ASSERT_TRUE(b.final_event.status.ok()) << b.final_event.status.to_string();
    if (max_tokens == 40) {
      EXPECT_EQ(exchanged(), before) << "60 + 40 is not past min_context 100";
    } else {
      EXPECT_GT(exchanged(), before) << "60 + 41 is past min_context 100";
    }
  }
  const int64_t before_long = exchanged();
  auto h = (*engine)->submit(long_request());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Collected c = collect(*h);
  EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
  EXPECT_EQ(c.tokens.size(), 30u);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
  EXPECT_GT(exchanged(), before_long);  // the long request was spread
}

// The migration hook through the worker inbox: a held sequence's pages move to one shard, and
// it continues with exactly the tokens it produces without the move.
TEST(EngineSpatialMigrate, MigrateKvMovesPagesAndKeepsTheTokens) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  // 16 blocks per shard; the request holds 19 to 32 pages, one page per chunk round robin, when
  // it is held: about a third per shard, so shard 2 cannot take them all but takes a few.
  cfg.kv_blocks_per_worker = 16;
  cfg.spatial.shards = 3;
  cfg.spatial.spatial_chunk_size = 16;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const std::vector<int> initial = testing::free_blocks(**engine);
  Request r = long_request();
  r.tenant = "t";
  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int32_t>(i * 11 % 500);
  r.prompt_token_ids = prompt;
  r.sampling.max_tokens = 200;  // long enough that the hold lands while it decodes
  Collected alone = collect(*(*engine)->submit(r));
  ASSERT_TRUE(alone.final_event.status.ok()) << alone.final_event.status.to_string();
  auto send = [&](sched::WorkerCommand c) {
    auto f = (*engine)->send_command(0, std::move(c));
    EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    return f.get();
  };
  // Stepped to its fifth token and held there (decoding freely up to the hold, it could finish
  // first on a slow machine).
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto h = (*engine)->submit(r);
  ASSERT_TRUE(h.ok());
  std::vector<int32_t> tokens;
  ASSERT_TRUE(testing::step_to_tokens(**engine, 0, *h, 5, &tokens));
  sched::CommandReply rep = send(sched::SnapshotState{});
  ASSERT_EQ(rep.state.sequences.size(), 1u);
  EXPECT_EQ(rep.state.num_shards, 3);
  const std::vector<int> spread = rep.state.sequences[0].pages_per_shard;
  ASSERT_EQ(spread.size(), 3u);
  EXPECT_GT(spread[1], 0);  // one page per chunk: every shard holds some
  EXPECT_GT(spread[2], 0);
  rep = send(sched::MigrateKv{{"other", "long"}, 0, -1, 0});
  EXPECT_EQ(rep.status.code(), StatusCode::kNotFound);  // another tenant's request
  rep = send(sched::MigrateKv{{"t", "long"}, 0, -1, 7});
  EXPECT_EQ(rep.status.code(), StatusCode::kInvalidArgument) << rep.status.to_string();
  rep = send(sched::MigrateKv{{"t", "long"}, 0, -1, 2});
  EXPECT_EQ(rep.status.code(), StatusCode::kResourceExhausted) << rep.status.to_string();
  rep = send(sched::MigrateKv{{"t", "long"}, 0, 4, 2});  // the first four pages
  ASSERT_TRUE(rep.status.ok()) << rep.status.to_string();
  const std::vector<int> moved = rep.state.sequences[0].pages_per_shard;
  EXPECT_EQ(moved[0] + moved[1] + moved[2], spread[0] + spread[1] + spread[2]);
  EXPECT_GT(moved[2], spread[2]);
  EXPECT_GT(rep.state.migrated_pages, 0);
  // Up to the room the target has when the worker runs the command (the KV cache manager's
  // moves): the move refused whole above now fills shard 2, then finds no room at all.
  const int room = rep.state.shard_available[2];
  ASSERT_GT(room, 0);
  sched::MigrateKv fill{{"t", "long"}, 0, -1, 2};
  fill.max_pages = room + 5;  // more than fits, as from a stale snapshot
  fill.up_to_room = true;
  rep = send(fill);
  ASSERT_TRUE(rep.status.ok()) << rep.status.to_string();
  EXPECT_EQ(rep.state.sequences[0].pages_per_shard[2], moved[2] + room);
  EXPECT_EQ(rep.state.shard_available[2], 0);
  rep = send(fill);
  EXPECT_EQ(rep.status.code(), StatusCode::kResourceExhausted) << rep.status.to_string();
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected rest = collect(*h);
  ASSERT_TRUE(rest.final_event.status.ok()) << rest.final_event.status.to_string();
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, alone.tokens);
  EXPECT_TRUE(testing::pools_back_to(**engine, initial));
}

// SlaClass::spread overrides min_context: the same short request is spread for one class and
// stays home for the other (pages on shards other than home, seen while it is held).
TEST(EngineSpatialCapacity, ClassSpreadOverridesMinContext) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 32;
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.spatial.min_context = 1000;  // nothing is long enough by itself
  SlaClass wide;
  wide.name = "wide";
  wide.spread = true;
  cfg.sla_classes.push_back(wide);
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  for (const char* cls : {"default", "wide"}) {
    Request r;
    r.prompt = "Once upon a time";
    r.sla_class = cls;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 400;  // long enough that the hold lands while it decodes
    r.sampling.ignore_eos = true;
    // Stepped to its 20th token and held there (decoding freely up to the hold, it could
    // finish first on a slow machine).
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
    auto h = (*engine)->submit(r);
    ASSERT_TRUE(h.ok());
    std::vector<int32_t> tokens;
    ASSERT_TRUE(testing::step_to_tokens(**engine, 0, *h, 20, &tokens));
    auto f = (*engine)->send_command(0, sched::SnapshotState{});
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const sched::CommandReply rep = f.get();
    ASSERT_EQ(rep.state.sequences.size(), 1u);
    const std::vector<int>& pages = rep.state.sequences[0].pages_per_shard;
    ASSERT_EQ(pages.size(), 2u);
    if (std::string(cls) == "wide")
      EXPECT_GT(pages[1], 0) << cls;
    else
      EXPECT_EQ(pages[1], 0) << cls;
    (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
    Collected rest = collect(*h);
    EXPECT_TRUE(rest.final_event.status.ok());
  }
}

TEST(EngineSpatialConfig, BadValuesNameTheField) {
  EngineConfig cfg;
  cfg.model = "synthetic:stories260k";
  cfg.spatial.shards = 17;
  auto e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("spatial.shards"), std::string::npos)
      << e.status().to_string();
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 24;  // not a multiple of 16
  e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("spatial.spatial_chunk_size"), std::string::npos)
      << e.status().to_string();
}

// ---- kv.cuts.spatial.communicator (backend/communicator.h's rule) on CPU shards ----

// nccl on CPU shards: Engine creation fails with the reason (kInvalidArgument: not CUDA backends;
// kUnimplemented in a build without NCCL), naming the field; never a silent fallback. Without a
// shard group (shards 1) there is nothing to connect and the knob is not looked at.
TEST(EngineSpatialCommunicator, NcclOnCpuShardsFailsAtCreation) {
  KVSPLIT_REQUIRE_MODELS();
  for (ServingMode mode : {ServingMode::kColocated, ServingMode::kDisaggregated}) {
    EngineConfig cfg = testing::stories_config(mode);
    cfg.spatial.shards = 2;
    cfg.spatial.spatial_chunk_size = 16;
    cfg.spatial.communicator = SpatialCommunicator::kNccl;
    auto e = Engine::create(cfg);
    ASSERT_FALSE(e.ok());
    const std::string msg = e.status().to_string();
    if (backend::nccl_communicator_built()) {
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << msg;
      EXPECT_NE(msg.find("not a CUDA backend"), std::string::npos) << msg;
    } else {
      EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented) << msg;
      EXPECT_NE(msg.find("built without NCCL"), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find("kv.cuts.spatial.communicator: nccl"), std::string::npos) << msg;
    cfg.spatial.shards = 1;
    auto plain = Engine::create(cfg);
    EXPECT_TRUE(plain.ok()) << plain.status().to_string();
  }
}

// auto and in_process on CPU shards: the in-process communicator, reported per worker, with the
// goldens token-exact (two blocks per shard: every golden is spread) and bytes exchanged.
TEST(EngineSpatialCommunicator, AutoAndInProcessKeepTheGoldens) {
  KVSPLIT_REQUIRE_MODELS();
  for (SpatialCommunicator comm : {SpatialCommunicator::kAuto, SpatialCommunicator::kInProcess}) {
    SCOPED_TRACE(spatial_communicator_name(comm));
    EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
    cfg.kv_blocks_per_worker = 2;
    cfg.block_size = 16;
    cfg.spatial.shards = 2;
    cfg.spatial.spatial_chunk_size = 16;
    cfg.spatial.communicator = comm;
    auto engine = Engine::create(cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const std::vector<int> initial = testing::free_blocks(**engine);
    EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
    EXPECT_TRUE(testing::pools_back_to(**engine, initial));
    int64_t exchanged = 0;
    double seconds = 0;
    for (const PoolStats& ps : (*engine)->stats().pools) {
      EXPECT_EQ(ps.kv_shard_communicator, "in-process") << ps.name;
      exchanged += ps.kv_shard_exchange_bytes;
      seconds += ps.kv_shard_exchange_seconds;
    }
    EXPECT_GT(exchanged, 0);
    EXPECT_GT(seconds, 0.0);
  }
  // No shard group: no communicator to report.
  auto plain = Engine::create(testing::stories_config(ServingMode::kColocated));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  for (const PoolStats& ps : (*plain)->stats().pools) EXPECT_EQ(ps.kv_shard_communicator, "");
}

// The KVM's link_use is the host link's: CPU shards exchange in host memory, through no link, so
// a run whose shards exchanged bytes reads link_use 0 from its workers' stats (it read their
// exchange over the host link's bandwidth).
TEST(EngineSpatialCommunicator, CpuShardExchangeIsNoHostLinkUse) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.kv_blocks_per_worker = 2;
  cfg.block_size = 16;
  cfg.spatial.shards = 2;
  cfg.spatial.spatial_chunk_size = 16;
  auto engine = Engine::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  const EngineStats after = (*engine)->stats();
  EngineStats before = after;  // the same workers with nothing moved yet
  int64_t exchanged = 0;
  for (PoolStats& ps : before.pools) {
    exchanged += ps.kv_shard_exchange_bytes;
    ps.kv_swap_bytes = 0;
    ps.kv_shard_exchange_bytes = 0;
  }
  ASSERT_GT(exchanged, 0);
  kvm::Monitor mon(1000);
  const kvm::MonitorInputs link{.link_bytes_per_s = 1e6};  // a slow link: any byte would show
  mon.sample(1000, before, link);
  EXPECT_DOUBLE_EQ(mon.sample(2000, after, link).link_use, 0);
}

// ---- the semantic cut on sharded sequences ----

SemanticCutConfig scored_never_degrade() {  // scored every step, never leaves full precision
  SemanticCutConfig c;
  c.semantic_threshold = 0.f;
  c.evict_threshold = 0.f;
  c.score_interval = 1;
  return c;
}

SemanticCutConfig forced_ladder() {  // demotes, evicts and recalls pages from the first steps
  SemanticCutConfig c;
  c.semantic_threshold = 0.99f;
  c.evict_threshold = 0.5f;
  c.demote_after_steps = 1;
  c.evict_after_steps = 1;
  c.score_interval = 1;
  c.sink_tokens = 4;
  c.recent_tokens = 16;
  return c;
}

// Every worker idle with nothing held in any allocator of any shard (arenas, summaries, the home
// host tier); the snapshots sum the shards.
void expect_every_shard_free(EngineImpl& e) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string held;
  while (true) {
    held.clear();
    for (const sched::WorkerSnapshot& w : e.worker_snapshots()) {
      const PoolStats& p = w.pool;
      if (p.kv_blocks_free != p.kv_blocks_total || p.kv_pages_int8 != 0 || p.kv_pages_int4 != 0 ||
          p.kv_pages_evicted != 0 || p.kv_pages_remote != 0 || w.kv_summary_slots_used != 0 ||
          w.kv_host_slots_used != 0 || p.running != 0 || p.waiting != 0)
        held += p.name + " ";
    }
    if (held.empty() || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(held, "");
}

class EngineSpatialSemantic : public ::testing::TestWithParam<ServingMode> {};

// Scoring sharded sequences (thresholds 0: no page moves) leaves the goldens token-exact, with
// two blocks per shard so every golden is spread over the group.
TEST_P(EngineSpatialSemantic, ScoredGoldensTokenExact) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(GetParam());
  cfg.kv_blocks_per_worker = 2;
  cfg.block_size = 16;
  cfg.spatial.shards = 3;
  cfg.spatial.spatial_chunk_size = 16;
  cfg.kv_policy = KvPolicy::kSemantic;
  cfg.semantic = scored_never_degrade();
  cfg.handoff_timeout_ms = 60000;
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_GT(testing::expect_greedy_goldens(**engine), 0);
  int64_t demoted = 0, remote_seen = 0;
  for (const PoolStats& p : (*engine)->stats().pools) {
    demoted += p.kv_demotions + p.kv_evictions;
    remote_seen += p.kv_shard_exchange_bytes;
  }
  EXPECT_EQ(demoted, 0);
  EXPECT_GT(remote_seen, 0);
  expect_every_shard_free(**engine);
}

std::vector<Request> ladder_requests() {
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  std::vector<Request> out;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.request_id = "l" + std::to_string(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0.f;
    r.sampling.max_tokens = 200 - 30 * i;
    r.sampling.ignore_eos = true;
    out.push_back(r);
  }
  return out;
}

struct LadderRun {
  std::vector<Collected> got;
  int64_t demotions = 0, evictions = 0, recalls = 0, refused = 0, exchanged = 0;
};

LadderRun run_ladder(ServingMode mode, int shards) {
  EngineConfig cfg = testing::stories_config(mode);
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 96;  // arenas and host tier for every page: no refusals
  cfg.spatial.shards = shards;
  cfg.spatial.spatial_chunk_size = 16;  // pages alternate over the shards
  cfg.kv_policy = KvPolicy::kSemantic;
  cfg.semantic = forced_ladder();
  cfg.handoff_timeout_ms = 60000;
  LadderRun run;
  auto engine = EngineImpl::create(cfg);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return run;
  std::vector<RequestHandle> handles;
  for (const Request& r : ladder_requests()) handles.push_back(*(*engine)->submit(r));
  for (RequestHandle& h : handles) run.got.push_back(collect(h, std::chrono::seconds(300)));
  for (const PoolStats& p : (*engine)->stats().pools) {
    run.demotions += p.kv_demotions;
    run.evictions += p.kv_evictions;
    run.recalls += p.kv_recalls;
    run.refused += p.kv_refused_transitions;
    run.exchanged += p.kv_shard_exchange_bytes;
  }
  expect_every_shard_free(**engine);
  return run;
}

// Under a ladder that demotes, evicts and recalls, sequences spread over 2 or 3 shards produce the
// tokens the unsharded engine does with the same cut settings: each shard moves its own pages,
// and relevance is normalized over the whole sequence exactly as without shards.
TEST_P(EngineSpatialSemantic, ForcedLadderSameTokensAsUnsharded) {
  KVSPLIT_REQUIRE_MODELS();
  const LadderRun want = run_ladder(GetParam(), 1);
  ASSERT_EQ(want.got.size(), 4u);
  EXPECT_GT(want.demotions, 0);
  EXPECT_GT(want.evictions, 0);
  EXPECT_GT(want.recalls, 0);
  EXPECT_EQ(want.refused, 0);  // so the transitions depend on relevance only, not on timing
  for (int shards : {2, 3}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    const LadderRun run = run_ladder(GetParam(), shards);
    ASSERT_EQ(run.got.size(), want.got.size());
    for (size_t i = 0; i < want.got.size(); ++i) {
      ASSERT_FALSE(run.got[i].timed_out);
      ASSERT_TRUE(run.got[i].final_event.status.ok()) << run.got[i].final_event.status.to_string();
      EXPECT_EQ(run.got[i].tokens, want.got[i].tokens) << "request " << i;
    }
    EXPECT_EQ(run.refused, 0);
    EXPECT_GT(run.exchanged, 0);  // the sequences were spread
    // The merged attention equals the unsharded one within fp32 rounding, not bit for bit, so a
    // page whose smoothed relevance sits on a threshold may cross it one step apart: the counts
    // agree within 2% (the relevance itself is compared exactly in sharded_attention_test).
    auto near = [](int64_t a, int64_t b) {
      return std::llabs(a - b) <= std::max<int64_t>(2, b / 50);
    };
    EXPECT_TRUE(near(run.demotions, want.demotions)) << run.demotions << " vs " << want.demotions;
    EXPECT_TRUE(near(run.evictions, want.evictions)) << run.evictions << " vs " << want.evictions;
    EXPECT_TRUE(near(run.recalls, want.recalls)) << run.recalls << " vs " << want.recalls;
    EXPECT_GT(run.demotions, 0);
    EXPECT_GT(run.recalls, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineSpatialSemantic,
                         ::testing::Values(ServingMode::kColocated, ServingMode::kDisaggregated),
                         [](const ::testing::TestParamInfo<ServingMode>& info) {
                           return std::string(info.param == ServingMode::kColocated ? "colocated"
                                                                                    : "disagg");
                         });

}  // namespace
}  // namespace kvsplit
