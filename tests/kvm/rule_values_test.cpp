// validate_rules checks a rule's values as the engine would take them: an `=`, min or max the
// engine refuses, a fraction on an integer setting, a negative level, and touching levels with
// nothing to pace the rule are refused before the run (they passed `--check-config`, and the
// engine then refused or ignored the rule at every swing). apply_action moves an integer setting
// by at least one under a factor.
#include <gtest/gtest.h>

#include <string>

#include "kvm/rule_engine.h"
#include "rule_test_util.h"

namespace kvsplit::kvm {
namespace {

void expect_refused(const KvmRule& r, const std::string& error) {
  const Status st = validate_rules({r}, {"batch"});
  ASSERT_FALSE(st.ok()) << to_string(r.then);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(error), std::string::npos) << st.message();
}

KvmRule hot(const std::string& then) {
  return rule("r", "device_kv_use > 0.9", "device_kv_use < 0.8", then);
}

TEST(RuleValues, ValuesTheEngineRefusesAreRefusedAtValidation) {
  expect_refused(hot("max_num_seqs = 0"), "then: max_num_seqs: must be in [1, 65536], got 0");
  KvmRule cls = hot("semantic_threshold = 5");
  cls.sla_class = "batch";
  expect_refused(cls, "then: semantic_threshold: must be in [0, 1], got 5");
  KvmRule queue = hot("max_queue = 0");
  queue.sla_class = "batch";
  expect_refused(queue, "then: max_queue: must be in [1, 1000000], got 0");
  KvmRule score = hot("score_interval = 0");
  expect_refused(score, "then: score_interval: must be in [1, ");
  KvmRule bounded = hot("evict_threshold += 0.1");
  bounded.max = 2;
  expect_refused(bounded, "max: evict_threshold: must be in [0, 1], got 2");
  KvmRule lowering = hot("evict_threshold -= 0.1");
  lowering.min = -1;
  expect_refused(lowering, "min: evict_threshold: must be in [0, 1], got -1");
  // A bound on the side the rule never moves to is harmless (a file with it stays valid).
  KvmRule raising = hot("max_num_seqs += 8");
  raising.min = 0;
  raising.max = 256;
  EXPECT_TRUE(validate_rules({raising}, {}).ok());
  // A one-shot action's value too: the engine refuses shard 0 at every firing.
  expect_refused(hot("migrate_to_shard = 0"), "then: migrate_to_shard: must be in [1, ");
  bounded.max = 0.5;
  // "= never" with max 0 (auto) was clamped back to auto at every application.
  KvmRule clamped = hot("swap = never");
  clamped.max = 0;
  expect_refused(clamped, "then: 'swap = never' lies above max 0");
  // In range: accepted.
  EXPECT_TRUE(validate_rules({hot("max_num_seqs = 8")}, {}).ok());
  bounded.min = 0.1;
  EXPECT_TRUE(validate_rules({bounded}, {}).ok());
}

TEST(RuleValues, AnIntegerSettingTakesWholeSteps) {
  // 0.3 rounded to 0: no limit on recalls, the opposite of what the rule meant.
  expect_refused(hot("max_recalls_per_step = 0.3"), "max_recalls_per_step is an integer");
  expect_refused(hot("temporal_step_size += 0.4"), "needs a whole number");  // never moved
  EXPECT_TRUE(validate_rules({hot("temporal_step_size += 2")}, {}).ok());

  // A factor moves an integer by at least one: 2 * 0.8 = 1.6 rounded back to 2 before.
  KvmRule shrink =
      rule("s", "queue_wait_ms[batch] > 100", "queue_wait_ms[batch] < 10", "max_queue *= 0.8", 0);
  shrink.sla_class = "batch";
  shrink.min = 1;
  ASSERT_TRUE(validate_rules({shrink}, {"batch"}).ok());
  RuleEngine engine({shrink});
  ParamTable table;
  table.set("max_queue", "batch", 2);
  KvmSnapshot snap;
  snap.classes.push_back({});
  snap.classes[0].name = "batch";
  snap.classes[0].queue_wait_ms = 500;
  auto apply = [&](KvmDecision& d) {
    table.set(d.param, d.sla_class, d.after);
    return true;
  };
  auto ds = engine.evaluate(snap, table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_DOUBLE_EQ(ds[0].after, 1);
  snap.time_ms = 10;
  EXPECT_TRUE(engine.evaluate(snap, table, apply).empty()) << "held at min 1";
  EXPECT_DOUBLE_EQ(table.get("max_queue", "batch"), 1);
}

TEST(RuleValues, LevelsAreNeverNegative) {
  // An exit that can never hold kept the rule's change for good.
  expect_refused(rule("r", "storage_latency_ms > 50", "storage_latency_ms < -5", "swap = never"),
                 "exit: storage_latency_ms is never negative, compared with -5");
  expect_refused(rule("r", "queue_depth[batch] > -1", "queue_depth[batch] < -2", "swap = never"),
                 "when: queue_depth is never negative");
  // "< 0" remains the way to write a rule that never exits.
  EXPECT_TRUE(
      validate_rules({rule("r", "device_kv_use >= 0", "device_kv_use < 0", "swap = never")}, {})
          .ok());
}

TEST(RuleValues, TouchingLevelsNeedACooldownOrAHold) {
  // No band: a reading hovering at 0.9 entered and exited at every sample.
  KvmRule r = rule("r", "device_kv_use > 0.9", "device_kv_use <= 0.9", "swap = never", 0);
  expect_refused(r, "meets when 'device_kv_use > 0.9' at one level");
  r.cooldown_ms = 50;
  EXPECT_TRUE(validate_rules({r}, {}).ok());
  r.cooldown_ms = 0;
  r.hold_ms = 20;
  EXPECT_TRUE(validate_rules({r}, {}).ok());
}

}  // namespace
}  // namespace kvsplit::kvm
