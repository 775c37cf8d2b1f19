// Builders of the KvCacheManager tests (manager_test.cpp, manager_reload_test.cpp): a fake
// actuator, recorded engine stats and a one-rule policy.
#pragma once

#include <string>
#include <vector>

#include "kvm/manager.h"

namespace kvsplit::kvm {

class FakeActuator : public Actuator {
 public:
  Status apply(const KvmDecision& d) override {
    applied.push_back(d);
    if (late) return deadline_exceeded("a worker did not apply the command in time");
    return refuse ? failed_precondition("refused for the test") : ok_status();
  }
  std::vector<KvmDecision> applied;
  bool refuse = false;
  bool late = false;  // a worker has the command but had not replied in time
};

// One decoding pool with `used` of 100 blocks in use.
inline EngineStats stats_at(int used) {
  EngineStats s;
  PoolStats p;
  p.name = "colocated-0";
  p.kv_blocks_total = 100;
  p.kv_blocks_free = 100 - used;
  p.kv_shards = 2;
  p.kv_shard_use = {used / 100.0, 0.0};
  s.pools.push_back(p);
  SlaClassStats c;
  c.name = "default";
  s.classes.push_back(c);
  return s;
}

inline KvmConfig policy(KvmMode mode, const std::string& log = "") {
  KvmConfig c;
  c.enabled = true;
  c.mode = mode;
  c.decision_log = log;
  KvmRule r;
  r.name = "hot";
  r.when = {"device_kv_use", "", KvmCmp::kGreater, 0.9};
  r.exit = {"device_kv_use", "", KvmCmp::kLess, 0.8};
  r.then = {"semantic_threshold", KvmActionOp::kAdd, 0.05};
  r.max = 0.4;
  r.cooldown_ms = 100;
  c.rules.push_back(r);
  return c;
}

inline ParamTable baseline() {
  ParamTable t;
  t.set("semantic_threshold", "", 0.15);
  return t;
}

}  // namespace kvsplit::kvm
