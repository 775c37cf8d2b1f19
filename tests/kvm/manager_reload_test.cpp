// KvCacheManager::reload between enforce and dry-run (docs/kvm.md, "Dry-run" and "Reload"): the
// rules active when the policy switched from enforce to dry-run entered under enforce, so their
// changes are in place and their exits are still applied, across later dry-run reloads too; a rule
// that entered during dry-run changed nothing and applies no exit; a rule the reload changed
// starts inactive and carries nothing over; back in enforce every rule acts again.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvm/manager.h"
#include "manager_test_util.h"

namespace kvsplit::kvm {
namespace {

// "hot" as in policy() (semantic_threshold +0.05 above 90 %, out below 80 %), and "hotter" on a
// setting of its own (evict_threshold = 0.05 above 97 %, out below 85 %).
KvmConfig two_rules(KvmMode mode) {
  KvmConfig c = policy(mode);
  KvmRule hotter;
  hotter.name = "hotter";
  hotter.when = {"device_kv_use", "", KvmCmp::kGreater, 0.97};
  hotter.exit = {"device_kv_use", "", KvmCmp::kLess, 0.85};
  hotter.then = {"evict_threshold", KvmActionOp::kSet, 0.05};
  hotter.cooldown_ms = 100;
  c.rules.push_back(hotter);
  return c;
}

ParamTable two_settings() {
  ParamTable t = baseline();  // semantic_threshold 0.15
  t.set("evict_threshold", "", 0.01);
  return t;
}

const KvmDecision* find(const std::vector<KvmDecision>& ds, const std::string& rule) {
  for (const KvmDecision& d : ds)
    if (d.rule == rule) return &d;
  return nullptr;
}

// A second reload in dry-run (a SIGHUP that rotates the decision log) keeps what the first knew:
// the rule active at the switch from enforce still applies its exit, and the value comes back.
TEST(KvCacheManagerReload, ARuleActiveAtTheSwitchKeepsItsExitAcrossDryRunReloads) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kEnforce), baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(95), {}).size(), 1u);  // enter: 0.15 -> 0.20, applied
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.20, 1e-9);
  m.reload(policy(KvmMode::kDryRun));
  m.reload(policy(KvmMode::kDryRun));
  const std::vector<KvmDecision> ds = m.tick(150, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_TRUE(ds[0].applied);
  ASSERT_EQ(act.applied.size(), 2u);
  EXPECT_EQ(act.applied[1].action, "exit");
  EXPECT_NEAR(act.applied[1].after, 0.15, 1e-9);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
}

// Of two rules, only the one that entered under enforce applies its exit after the switch:
// "hotter" was inactive at the switch and entered in dry-run (logged, not applied), so its exit is
// not applied either (not even as a no-op: nothing of it is in place), also when another dry-run
// reload comes while it is active.
TEST(KvCacheManagerReload, ARuleThatEnteredInDryRunAppliesNoExit) {
  FakeActuator act;
  KvCacheManager m(two_rules(KvmMode::kEnforce), two_settings(), &act);
  std::vector<KvmDecision> ds = m.tick(0, stats_at(95), {});  // hot enters: 0.15 -> 0.20
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_TRUE(ds[0].applied);
  m.reload(two_rules(KvmMode::kDryRun));
  ds = m.tick(150, stats_at(98), {});  // hot repeats, hotter enters: neither applied
  ASSERT_EQ(ds.size(), 2u);
  ASSERT_NE(find(ds, "hotter"), nullptr);
  EXPECT_EQ(find(ds, "hotter")->action, "enter");
  EXPECT_FALSE(find(ds, "hotter")->applied);
  EXPECT_FALSE(find(ds, "hot")->applied);
  EXPECT_NEAR(m.params().get("evict_threshold", ""), 0.01, 1e-9);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.20, 1e-9);
  m.reload(two_rules(KvmMode::kDryRun));  // active now, but entered in dry-run: still nothing
  ds = m.tick(300, stats_at(82), {});     // hotter exits; hot stays (its band)
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "hotter");
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_FALSE(ds[0].applied);
  ds = m.tick(450, stats_at(70), {});  // hot exits: applied, the value comes back
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "hot");
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  ASSERT_EQ(act.applied.size(), 2u);  // hot's enter and exit, nothing of hotter
  EXPECT_EQ(act.applied[0].rule, "hot");
  EXPECT_EQ(act.applied[1].rule, "hot");
}

// A rule the reload changed starts inactive (docs/kvm.md: it does not restore its parameter) and
// carries nothing over from the rule of the same name it replaced: switched to dry-run while the
// old rule was active, then the rule edited in a second reload, the new rule enters and leaves
// in dry-run and applies nothing.
TEST(KvCacheManagerReload, AChangedRuleDoesNotInheritTheExitOfTheOneItReplaced) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kEnforce), baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(95), {}).size(), 1u);  // enter: 0.15 -> 0.20, applied
  m.reload(policy(KvmMode::kDryRun));                 // its exit would be applied
  KvmConfig changed = policy(KvmMode::kDryRun);
  changed.rules[0].then.value = 0.1;
  m.reload(changed);
  std::vector<KvmDecision> ds = m.tick(150, stats_at(95), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "enter");  // a new rule: it enters
  EXPECT_FALSE(ds[0].applied);
  ds = m.tick(300, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_FALSE(ds[0].applied);
  EXPECT_EQ(act.applied.size(), 1u);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.20, 1e-9);  // the old rule's, kept
}

// Back in enforce every rule acts again: one that entered in dry-run applies its change at its
// next repeat and restores the value at its exit; one that entered under enforce and lived
// through a dry-run spell keeps moving the value and restores the one from before its enter.
TEST(KvCacheManagerReload, BackInEnforceEveryRuleActsAgain) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kDryRun), baseline(), &act);
  std::vector<KvmDecision> ds = m.tick(0, stats_at(95), {});  // enter, not applied
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_FALSE(ds[0].applied);
  m.reload(policy(KvmMode::kEnforce));
  ds = m.tick(150, stats_at(95), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "repeat");
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.20, 1e-9);
  ds = m.tick(300, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  ASSERT_EQ(act.applied.size(), 2u);
  // Enforce -> dry-run -> enforce while active.
  ASSERT_EQ(m.tick(450, stats_at(95), {}).size(), 1u);  // enter: 0.15 -> 0.20
  m.reload(policy(KvmMode::kDryRun));
  m.reload(policy(KvmMode::kEnforce));
  ds = m.tick(600, stats_at(95), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "repeat");
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.25, 1e-9);
  ds = m.tick(750, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NEAR(ds[0].after, 0.15, 1e-9);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  EXPECT_EQ(act.applied.size(), 5u);
}

}  // namespace
}  // namespace kvsplit::kvm
