// The KV cache manager's migrate_to_shard action moves up to its value in pages: as many as the
// target shard has room for when that is fewer (docs/kvm.md).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "engine/start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

Request prompt_of(int n, int salt) {
  Request r;
  for (int k = 0; k < n; ++k) r.prompt_token_ids.push_back(5 + (31 * salt + 7 * k) % 400);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 4;
  r.sampling.ignore_eos = true;
  return r;
}

// Two shards of 16 pages. A fills shard 0 (a 250-token prompt, 16 pages; it is not spread, so
// its pages prefer the home shard) and B takes 10 pages of shard 1 (shard 0 is full). The worker
// is then held with both prefilled: the emptiest shard is shard 1 with 6 free pages, and A's 16
// pages on shard 0 are the candidates. The rule asks for 16; 6 move, and the tokens are those of
// the same requests without the manager. Before, the whole 16 were asked of shard 1, the move
// was refused, and every decision failed.
TEST(EngineKvmMigrate, MovesWhatTheTargetShardHasRoomFor) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kColocated);
  c.block_size = 16;
  c.kv_blocks_per_worker = 16;
  c.spatial.shards = 2;
  c.spatial.spatial_chunk_size = 16;
  c.spatial.min_context = 100000;  // nothing is spread
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  KvmRule migrate;
  migrate.name = "rebalance";
  migrate.when = {"device_kv_use", "", KvmCmp::kGreater, 0.5};
  migrate.exit = {"device_kv_use", "", KvmCmp::kLess, 0.01};
  migrate.then = {"migrate_to_shard", KvmActionOp::kSet, 16};
  migrate.cooldown_ms = 5;
  c.kvm.rules = {migrate};
  auto engine = EngineImpl::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);

  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto a = e.submit(prompt_of(250, 1));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(testing::wait_for_stats(e, [](const EngineStats& s) { return s.num_waiting >= 1; }));
  auto b = e.submit(prompt_of(150, 2));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE(testing::wait_for_stats(e, [](const EngineStats& s) { return s.num_waiting >= 2; }));
  // A step at a time until both are prefilled (running), then held there.
  ASSERT_TRUE(testing::step_until(e, 0, [&] { return e.stats().pools[0].running >= 2; }));
  ASSERT_EQ(e.stats().pools[0].running, 2);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);

  bool applied = false;
  std::string decisions;
  while (!applied && std::chrono::steady_clock::now() < until) {
    decisions.clear();
    for (const KvmDecision& d : e.stats().kvm_decisions) {
      applied |= d.param == "migrate_to_shard" && d.applied;
      decisions += d.rule + ": " + (d.applied ? "applied" : d.error) + "\n";
    }
    if (!applied) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(applied) << decisions;
  int64_t migrated = 0;
  for (const PoolStats& p : e.stats().pools) migrated += p.kv_migrated_pages;
  // Shard 1's 6 free pages in the first decision; later ones may move 6 back (shard 0 is then the
  // emptiest), never more at once.
  EXPECT_GE(migrated, 6);
  EXPECT_EQ(migrated % 6, 0);

  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  auto ref = Engine::create(testing::stories_config(ServingMode::kColocated));
  ASSERT_TRUE(ref.ok());
  int salt = 1;
  for (RequestHandle* h : {&*a, &*b}) {
    const Collected got = collect(std::move(*h));
    ASSERT_TRUE(got.final_event.status.ok()) << got.final_event.status.to_string();
    EXPECT_EQ(got.tokens, collect(*(*ref)->submit(prompt_of(salt == 1 ? 250 : 150, salt))).tokens);
    ++salt;
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

}  // namespace
}  // namespace kvsplit
