// RuleEngine: an exit the caller refuses leaves the rule active, and it tries the exit again.
#include <gtest/gtest.h>

#include <functional>

#include "kvm/expr.h"
#include "kvm/rule_engine.h"
#include "rule_test_util.h"

namespace kvsplit::kvm {
namespace {

KvmRule raise_rule(double cooldown_ms) {
  KvmRule r;
  r.name = "raise";
  r.when = *parse_condition("device_kv_use > 0.9");
  r.exit = *parse_condition("device_kv_use < 0.8");
  r.then = *parse_action("semantic_threshold = 0.45");
  r.cooldown_ms = cooldown_ms;
  return r;
}

// An apply callback that moves `table`, and refuses exits while *refuse is set.
std::function<bool(KvmDecision&)> refusing_exits(ParamTable* table, const bool* refuse) {
  return [table, refuse](KvmDecision& d) {
    if (*refuse && d.action == "exit") return false;
    table->set(d.param, d.sla_class, d.after);
    d.applied = true;
    return true;
  };
}

// The restore is refused while `refuse` is set (as the engine refuses a threshold that another
// rule's evict_threshold makes invalid): the rule keeps its change in place and stays active, tries
// the exit again once its cooldown has passed, and restores the value at enter once allowed.
// Without the retry the setting kept 0.45 for good and the next enter started from it.
TEST(RuleEngineRetry, ARefusedExitIsTriedAgainUntilTheValueIsRestored) {
  RuleEngine engine({raise_rule(/*cooldown_ms=*/500)});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  bool refuse = false;
  const auto apply = refusing_exits(&table, &refuse);
  auto ds = engine.evaluate(use_at(0, 0.95), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "enter");
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.45);

  refuse = true;
  ds = engine.evaluate(use_at(1000, 0.5), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_FALSE(ds[0].applied);
  EXPECT_TRUE(engine.state(0).active) << "a refused exit must leave the rule active";
  // Within the cooldown: no retry.
  EXPECT_TRUE(engine.evaluate(use_at(1200, 0.5), table, apply).empty());
  // After it: the retry, refused again.
  ds = engine.evaluate(use_at(1600, 0.5), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_TRUE(engine.state(0).active);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.45);

  refuse = false;
  ds = engine.evaluate(use_at(2200, 0.5), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_DOUBLE_EQ(ds[0].before, 0.45);
  EXPECT_DOUBLE_EQ(ds[0].after, 0.15);
  EXPECT_TRUE(ds[0].applied);
  EXPECT_FALSE(engine.state(0).active);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.15);

  // The next enter starts from the restored value, not from a stranded one.
  ds = engine.evaluate(use_at(3000, 0.95), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "enter");
  EXPECT_DOUBLE_EQ(ds[0].before, 0.15);
}

// A refused exit whose exit level stops holding: the rule is active as before (it may repeat on
// its `when`), and a later exit run restores the value at enter.
TEST(RuleEngineRetry, ARefusedExitThenPressureAgainKeepsTheValueAtEnter) {
  KvmRule r = raise_rule(/*cooldown_ms=*/0);
  r.then = *parse_action("semantic_threshold += 0.1");
  r.max = 0.6;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  bool refuse = false;
  const auto apply = refusing_exits(&table, &refuse);
  engine.evaluate(use_at(0, 0.95), table, apply);  // 0.25
  refuse = true;
  engine.evaluate(use_at(100, 0.5), table, apply);  // refused
  refuse = false;
  auto ds = engine.evaluate(use_at(200, 0.95), table, apply);  // pressure again: a repeat
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "repeat");
  EXPECT_NEAR(table.get("semantic_threshold", ""), 0.35, 1e-12);
  ds = engine.evaluate(use_at(300, 0.5), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_DOUBLE_EQ(ds[0].after, 0.15);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.15);
}

// With hold_ms, a refused exit has served its dwell: the retry comes after the cooldown, not
// after a second hold_ms of exit readings.
TEST(RuleEngineRetry, ARefusedExitIsRetriedAfterTheCooldownNotAnotherHold) {
  KvmRule r = raise_rule(/*cooldown_ms=*/500);
  r.hold_ms = 1000;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  bool refuse = true;
  const auto apply = refusing_exits(&table, &refuse);
  ASSERT_EQ(engine.evaluate(use_at(0, 0.95), table, apply).size(), 1u);  // enter
  EXPECT_TRUE(engine.evaluate(use_at(100, 0.5), table, apply).empty());  // the dwell starts
  auto ds = engine.evaluate(use_at(1100, 0.5), table, apply);            // served: refused
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_FALSE(ds[0].applied);
  refuse = false;
  ds = engine.evaluate(use_at(1600, 0.5), table, apply);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_TRUE(ds[0].applied);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.15);
}

}  // namespace
}  // namespace kvsplit::kvm
