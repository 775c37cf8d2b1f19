// The KVM's link monitors (src/kvm/monitor.h, docs/kvm.md "Metrics"): link_use counts the bytes
// that crossed a worker's host link (swaps, shard exchange staged through host memory) over its
// bandwidth; peer_exchange_mb_s the shard exchange that stayed off it.
#include <gtest/gtest.h>

#include "kvm/expr.h"
#include "kvm/monitor.h"
#include "kvm/rule_engine.h"

namespace kvsplit::kvm {
namespace {

PoolStats pool(const std::string& name, double link_bytes_per_s) {
  PoolStats p;
  p.name = name;
  p.kv_blocks_total = 100;
  p.kv_blocks_free = 100;
  p.kv_shards = 2;
  p.kv_link_bytes_per_s = link_bytes_per_s;
  return p;
}

TEST(MonitorLink, SwapsAndHostStagedExchangeShareTheHostLink) {
  Monitor mon(1000);
  EngineStats s;
  s.pools.push_back(pool("colocated-0", 4000));
  mon.sample(1000, s, {});
  PoolStats& p = s.pools[0];
  p.kv_swap_bytes = 1000;
  p.kv_shard_exchange_bytes = 6000;       // in 1 s: 1000 staged through the host, 5000 not
  p.kv_shard_exchange_host_bytes = 1000;  // (shards on GPUs without peer access)
  const KvmSnapshot a = mon.sample(2000, s, {});
  EXPECT_DOUBLE_EQ(a.link_use, 0.5);              // (1000 + 1000) B/s of 4000
  EXPECT_DOUBLE_EQ(a.peer_exchange_mb_s, 0.005);  // 5000 B/s
  const KvmSnapshot b = mon.sample(3000, s, {});  // nothing moved since
  EXPECT_DOUBLE_EQ(b.link_use, 0);
  EXPECT_DOUBLE_EQ(b.peer_exchange_mb_s, 0);
}

// Both are the busiest worker's: each worker's bytes over its own interval, not a sum.
TEST(MonitorLink, EachIsTheBusiestWorkers) {
  Monitor mon(1000);
  EngineStats s;
  s.pools.push_back(pool("colocated-0", 4000));
  s.pools.push_back(pool("colocated-1", 4000));
  mon.sample(1000, s, {});
  s.pools[0].kv_shard_exchange_bytes = 3e6;  // 3 MB/s between its shards, in one memory
  s.pools[1].kv_shard_exchange_bytes = 2e6;
  s.pools[1].kv_shard_exchange_host_bytes = 1000;  // 0.25 of its host link
  const KvmSnapshot a = mon.sample(2000, s, {});
  EXPECT_DOUBLE_EQ(a.peer_exchange_mb_s, 3.0);
  EXPECT_DOUBLE_EQ(a.link_use, 0.25);
}

// A rule reads it, and it is a rate, not a fraction: a level above 1 is accepted.
TEST(MonitorLink, PeerExchangeIsARuleMetric) {
  KvmSnapshot s;
  s.peer_exchange_mb_s = 120;
  auto c = parse_condition("peer_exchange_mb_s > 100");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(read_metric(s, *c), 120);
  EXPECT_FALSE(is_class_metric("peer_exchange_mb_s"));
  KvmRule r;
  r.name = "busy-peers";
  r.when = *c;
  auto exit = parse_condition("peer_exchange_mb_s < 50");
  ASSERT_TRUE(exit.ok());
  r.exit = *exit;
  auto then = parse_action("spatial_min_context *= 2");
  ASSERT_TRUE(then.ok()) << then.status().to_string();
  r.then = *then;
  r.max = 1 << 20;
  EXPECT_TRUE(validate_rules({r}, {}).ok()) << validate_rules({r}, {}).to_string();
}

}  // namespace
}  // namespace kvsplit::kvm
