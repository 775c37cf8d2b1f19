// The KV cache manager's disk_kv_use monitor in the engine (docs/kvm.md): 0 while the disk tier
// is empty, then, once preempted sequences were swapped to disk (no host tier), the pool's disk
// bytes in use over its capacity; a rule `when: disk_kv_use > 0` fires on it, and the requests
// still finish.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "engine/start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

bool has_decision(const EngineStats& s, const std::string& rule) {
  for (const KvmDecision& d : s.kvm_decisions)
    if (d.rule == rule && d.action == "enter") return true;
  return false;
}

TEST(EngineKvmDisk, DiskKvUseReadsTheDiskTierAndItsRuleFires) {
  KVSPLIT_REQUIRE_MODELS();
  kvsplit::testing::TempDir dir;
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.block_size = 16;
  cfg.kv_blocks_per_worker = 12;  // eight sequences of 90+ tokens outgrow it
  cfg.temporal.host_capacity_mb = 0;
  cfg.temporal.disk_path = dir.path().string();
  cfg.temporal.disk_capacity_mb = 16;
  cfg.temporal.swap = SwapMode::kAlways;
  cfg.kvm.enabled = true;
  cfg.kvm.interval_ms = 10;
  KvmRule r;
  r.name = "disk-used";
  r.when = {"disk_kv_use", "", KvmCmp::kGreater, 0.0};
  r.exit = {"disk_kv_use", "", KvmCmp::kLess, 0.0};  // never
  r.then = {"max_chunk_tokens", KvmActionOp::kSet, 24};
  r.cooldown_ms = 1e9;
  cfg.kvm.rules = {r};
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;

  // A disk tier, empty: samples read 0 and the rule stays out.
  ASSERT_TRUE(testing::wait_for_stats(e, [](const EngineStats& s) {
    return s.kvm.workers.size() == 1 && s.pools.size() == 1 && s.pools[0].kv_disk_bytes_total > 0;
  }));
  {
    const EngineStats s = e.stats();
    EXPECT_EQ(s.kvm.disk_kv_use, 0);
    EXPECT_FALSE(has_decision(s, "disk-used"));
  }

  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 8; ++i) {
    Request q;
    q.prompt = prompts[i % 4];
    q.sampling.temperature = 0.f;
    q.sampling.max_tokens = 90;
    q.sampling.ignore_eos = true;
    auto h = e.submit(q);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  // Step until sequences were swapped to disk; held there, the pool's disk counters stay.
  const bool swapped = testing::step_until(e, 0, [&] {
    const PoolStats p = e.stats().pools.at(0);
    return p.kv_swaps_to_disk > 0 && p.kv_disk_bytes_used > 0;
  });
  EXPECT_TRUE(swapped) << "no sequence was swapped to disk";
  double want = -1;
  const bool sampled = swapped && testing::wait_for_stats(e, [&](const EngineStats& s) {
                         const PoolStats& p = s.pools.at(0);
                         want = static_cast<double>(p.kv_disk_bytes_used) /
                                static_cast<double>(p.kv_disk_bytes_total);
                         return s.kvm.workers.size() == 1 &&
                                std::abs(s.kvm.disk_kv_use - want) < 1e-12 &&
                                std::abs(s.kvm.workers[0].disk_kv_use - want) < 1e-12;
                       });
  EXPECT_TRUE(sampled) << "disk_kv_use " << e.stats().kvm.disk_kv_use << ", the pool's " << want;
  EXPECT_GT(want, 0.0);
  EXPECT_LT(want, 1.0);
  EXPECT_EQ(e.stats().kvm.host_kv_use, 0);  // no host tier: the disk's bytes are not read there
  const bool fired = swapped && testing::wait_for_stats(e, [](const EngineStats& s) {
                       return has_decision(s, "disk-used");
                     });
  EXPECT_TRUE(fired) << "the disk_kv_use rule did not enter";
  for (const KvmDecision& d : e.stats().kvm_decisions) {
    if (d.rule == "disk-used") {
      EXPECT_NE(d.monitors.find("disk_kv_use="), std::string::npos) << d.monitors;
    }
  }
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  for (RequestHandle& h : handles) {
    const Collected c = collect(h, std::chrono::seconds(300));
    ASSERT_FALSE(c.timed_out);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.tokens.size(), 90u);
  }
}

}  // namespace
}  // namespace kvsplit
