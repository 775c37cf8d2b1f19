// KvCacheManager (kvm/manager.h) over a fake actuator and recorded engine stats: enforce applies
// and moves the parameter table, dry-run calls nothing and moves nothing, a refused action is
// recorded with its error and leaves the table, counters and the JSON decision log match.
#include "kvm/manager.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "kvm/expr.h"
#include "manager_test_util.h"

namespace kvsplit::kvm {
namespace {

// A class rule on swap that entered while its class followed the engine-wide value exits back to
// following it (KvmDecision::inherit): a later engine-wide change reaches the class. Its exit used
// to write the engine-wide value as the class's own, so "swap = never" on a slow disk no longer
// reached the class and its requests kept swapping.
TEST(KvCacheManager, AClassSwapRuleExitsBackToTheEngineWideValue) {
  FakeActuator act;
  KvmConfig c;
  c.enabled = true;
  c.mode = KvmMode::kEnforce;
  KvmRule cls;
  cls.name = "class-swap";
  cls.sla_class = "default";
  cls.when = {"device_kv_use", "", KvmCmp::kGreater, 0.9};
  cls.exit = {"device_kv_use", "", KvmCmp::kLess, 0.8};
  cls.then = {"swap", KvmActionOp::kSet, 1};  // always
  KvmRule global;
  global.name = "global-never";
  global.when = {"device_kv_use", "", KvmCmp::kLess, 0.3};
  global.exit = {"device_kv_use", "", KvmCmp::kGreater, 0.5};
  global.then = {"swap", KvmActionOp::kSet, 2};  // never
  c.rules = {cls, global};
  ParamTable t;
  t.set("swap", "", 0);  // auto; the class has no value of its own
  KvCacheManager m(c, t, &act);
  const int series[] = {95, 60, 20};  // class enters, class exits, engine-wide enters
  for (int i = 0; i < 3; ++i) m.tick(i * 1000.0, stats_at(series[i]), {});
  ASSERT_EQ(act.applied.size(), 3u);
  EXPECT_EQ(act.applied[1].action, "exit");
  EXPECT_TRUE(act.applied[1].inherit);
  EXPECT_DOUBLE_EQ(act.applied[1].after, 0);
  EXPECT_FALSE(act.applied[2].inherit);
  EXPECT_FALSE(m.params().has("swap", "default"));
  EXPECT_DOUBLE_EQ(m.params().get("swap", "default"), 2);  // the class follows "never"
}

TEST(KvCacheManager, EnforceAppliesAndMovesTheTable) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kEnforce), baseline(), &act);
  const int series[] = {50, 95, 95, 95, 85, 70};  // enter, cooldown, repeat, band, exit
  const double times[] = {0, 10, 50, 120, 200, 300};
  std::vector<std::string> actions;
  for (int i = 0; i < 6; ++i) {
    for (const KvmDecision& d : m.tick(times[i], stats_at(series[i]), {}))
      actions.push_back(d.action);
  }
  EXPECT_EQ(actions, (std::vector<std::string>{"enter", "repeat", "exit"}));
  ASSERT_EQ(act.applied.size(), 3u);
  EXPECT_NEAR(act.applied[0].after, 0.20, 1e-9);
  EXPECT_NEAR(act.applied[1].after, 0.25, 1e-9);
  EXPECT_NEAR(act.applied[2].after, 0.15, 1e-9);  // restored on exit
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  EXPECT_EQ(m.decisions_total(), 3);
  EXPECT_EQ(m.counts().at({"hot", "enter"}), 1);
  EXPECT_EQ(m.recent().size(), 3u);
  EXPECT_NEAR(m.last_snapshot().device_kv_use, 0.70, 1e-9);
  EXPECT_EQ(m.ticks(), 6);
}

TEST(KvCacheManager, DryRunCallsNothingAndMovesNothing) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kDryRun), baseline(), &act);
  int decisions = 0;
  for (int i = 0; i < 5; ++i) {
    for (const KvmDecision& d : m.tick(i * 150.0, stats_at(95), {})) {
      EXPECT_FALSE(d.applied);
      EXPECT_NEAR(d.before, 0.15, 1e-9);  // the table never moved
      EXPECT_NEAR(d.after, 0.20, 1e-9);
      ++decisions;
    }
  }
  EXPECT_GE(decisions, 2);
  EXPECT_TRUE(act.applied.empty());
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
}

// Dry-run follows the rules as enforce would: an exit is taken as if applied (the rule is no
// longer active, and enters again), not refused and retried at every cooldown.
TEST(KvCacheManager, DryRunExitsAndEntersAgainAsEnforceWould) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kDryRun), baseline(), &act);  // cooldown 100 ms
  const int series[] = {95, 70, 70, 70, 95};
  std::vector<std::string> actions;
  for (int i = 0; i < 5; ++i)
    for (const KvmDecision& d : m.tick(i * 200.0, stats_at(series[i]), {}))
      actions.push_back(d.action);
  EXPECT_EQ(actions, (std::vector<std::string>{"enter", "exit", "enter"}));
  EXPECT_TRUE(act.applied.empty());
}

// A policy switched from enforce to dry-run (SIGHUP) while a rule is active: the rule's change is
// in place, so its exit is still applied and the value comes back; nothing else is applied. The
// exit was logged unapplied and the value stayed for good.
TEST(KvCacheManager, AnEnforcedRuleStillRestoresItsValueAfterASwitchToDryRun) {
  FakeActuator act;
  KvCacheManager m(policy(KvmMode::kEnforce), baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(95), {}).size(), 1u);  // enter: 0.15 -> 0.20, applied
  ASSERT_EQ(act.applied.size(), 1u);
  m.reload(policy(KvmMode::kDryRun));  // the same rule keeps its state
  std::vector<KvmDecision> ds = m.tick(150, stats_at(95), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "repeat");
  EXPECT_FALSE(ds[0].applied);
  ds = m.tick(300, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_TRUE(ds[0].applied);
  ASSERT_EQ(act.applied.size(), 2u);
  EXPECT_NEAR(act.applied[1].after, 0.15, 1e-9);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  // Dry-run from then on: a new enter is logged only.
  ds = m.tick(450, stats_at(95), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_FALSE(ds[0].applied);
  EXPECT_EQ(act.applied.size(), 2u);
  ds = m.tick(600, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_FALSE(ds[0].applied);  // its enter was never applied: nothing to restore
  EXPECT_EQ(act.applied.size(), 2u);
}

// Two rules on one setting whose later one's change is not in place: the earlier one's exit
// restores the value itself (the later one's exit may never be applied) and hands the later one
// the value from before them both. Either half alone left a change for good: keeping the setting
// (stacked rules' exit-keep) kept the earlier change while the later exit was never applied, and
// not handing the value over made the later exit, once applied, write back the earlier change.
// Case "dry-run": enforce, the first enters; dry-run, the second enters; the first exits; enforce
// again, the second exits.
TEST(KvCacheManager, AnEnforcedRuleDoesNotHandItsRestoreToADryRunOne) {
  FakeActuator act;
  KvmConfig c = policy(KvmMode::kEnforce);
  KvmRule later = c.rules[0];
  later.name = "hotter";
  later.when = {"device_kv_use", "", KvmCmp::kGreater, 0.97};
  later.exit = {"device_kv_use", "", KvmCmp::kLess, 0.5};
  c.rules.push_back(later);
  KvCacheManager m(c, baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(95), {}).size(), 1u);  // hot enters: 0.15 -> 0.20, applied
  c.mode = KvmMode::kDryRun;
  m.reload(c);
  for (const KvmDecision& d : m.tick(150, stats_at(98), {})) EXPECT_FALSE(d.applied) << d.rule;
  std::vector<KvmDecision> ds = m.tick(300, stats_at(70), {});  // hot exits, hotter stays
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "hot");
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  c.mode = KvmMode::kEnforce;
  m.reload(c);
  ds = m.tick(450, stats_at(40), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "hotter");
  EXPECT_NEAR(ds[0].after, 0.15, 1e-9);  // the value from before both, not hot's 0.20
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
}

// Case "refused": the second rule's enter is refused by a worker; the first exits and restores;
// the second's repeat then applies and its exit restores the value from before them both.
TEST(KvCacheManager, ARuleWhoseEnterWasRefusedGetsTheValueBeforeBoth) {
  FakeActuator act;
  KvmConfig c = policy(KvmMode::kEnforce);
  c.rules[0].then = {"semantic_threshold", KvmActionOp::kSet, 0.2};
  KvmRule later = c.rules[0];
  later.name = "hotter";
  later.when = {"device_kv_use", "", KvmCmp::kGreater, 0.97};
  later.exit = {"device_kv_use", "", KvmCmp::kLess, 0.5};
  later.then = {"semantic_threshold", KvmActionOp::kSet, 0.3};
  c.rules.push_back(later);
  c.rules[0].cooldown_ms = 1e6;  // hot does not enter again after its exit
  KvCacheManager m(c, baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(95), {}).size(), 1u);  // hot: 0.15 -> 0.2
  act.refuse = true;
  std::vector<KvmDecision> ds = m.tick(150, stats_at(98), {});  // hotter's enter, refused
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_FALSE(ds[0].applied);
  act.refuse = false;
  ds = m.tick(300, stats_at(70), {});  // hot exits
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  ds = m.tick(450, stats_at(98), {});  // hotter repeats: applied now
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "repeat");
  EXPECT_TRUE(ds[0].applied);
  ds = m.tick(600, stats_at(40), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_NEAR(ds[0].after, 0.15, 1e-9);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
}

TEST(KvCacheManager, RefusedActionIsRecordedAndLeavesTheTable) {
  FakeActuator act;
  act.refuse = true;
  const std::string log =
      (std::filesystem::temp_directory_path() / "kvsplit-manager-test.jsonl").string();
  std::remove(log.c_str());
  {
    KvCacheManager m(policy(KvmMode::kEnforce, log), baseline(), &act);
    const auto ds = m.tick(0, stats_at(95), {});
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_FALSE(ds[0].applied);
    EXPECT_NE(ds[0].error.find("refused"), std::string::npos);
    EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.15, 1e-9);
  }
  std::ifstream in(log);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["rule"], "hot");
  EXPECT_EQ(j["action"], "enter");
  EXPECT_EQ(j["applied"], false);
  EXPECT_NE(j["error"].get<std::string>().find("refused"), std::string::npos);
  EXPECT_NEAR(j["monitors"]["device_kv_use"].get<double>(), 0.95, 1e-9);
  EXPECT_FALSE(std::getline(in, line));
  std::remove(log.c_str());
}

// The decision log is reopened on every reload (a SIGHUP after a rotation writes to the new
// file; it kept writing to the renamed one), and a failed write is noticed and said once
// (/dev/full: every decision was dropped in silence).
TEST(KvCacheManager, TheDecisionLogIsReopenedOnReloadAndAFailedWriteIsNoticed) {
  FakeActuator act;
  const std::string log =
      (std::filesystem::temp_directory_path() / "kvsplit-manager-rotate.jsonl").string();
  const std::string rotated = log + ".1";
  std::remove(log.c_str());
  std::remove(rotated.c_str());
  KvCacheManager m(policy(KvmMode::kEnforce, log), baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(95), {}).size(), 1u);  // enter
  std::rename(log.c_str(), rotated.c_str());
  m.reload(policy(KvmMode::kEnforce, log));             // the same path
  ASSERT_EQ(m.tick(200, stats_at(50), {}).size(), 1u);  // exit
  auto lines = [](const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l)["action"]);
    return out;
  };
  EXPECT_EQ(lines(rotated), (std::vector<std::string>{"enter"}));
  EXPECT_EQ(lines(log), (std::vector<std::string>{"exit"}));
  EXPECT_FALSE(m.decision_log_failed());
  std::remove(log.c_str());
  std::remove(rotated.c_str());

  if (std::ifstream("/dev/full").good()) {
    KvCacheManager full(policy(KvmMode::kEnforce, "/dev/full"), baseline(), &act);
    EXPECT_FALSE(full.decision_log_failed());  // it opens
    EXPECT_EQ(full.tick(0, stats_at(95), {}).size(), 1u);
    EXPECT_TRUE(full.decision_log_failed());  // the write found the disk full
  }
  KvCacheManager missing(policy(KvmMode::kEnforce, "/nonexistent/dir/kvm.jsonl"), baseline(), &act);
  EXPECT_TRUE(missing.decision_log_failed());
}

// A refused decision's value never took effect: a later rule of the same tick on the same
// setting starts from the value in place (a "*= 0.5" after a refused "= 2000000" halved the
// refused value, 1e6, instead of the table's 1024).
TEST(KvCacheManager, ALaterRuleStartsFromTheValueARefusedOneLeft) {
  class RefuseFirst : public Actuator {
   public:
    Status apply(const KvmDecision& d) override {
      seen.push_back(d);
      return seen.size() == 1 ? invalid_argument("max_queue: must be in [1, 1000000]")
                              : ok_status();
    }
    std::vector<KvmDecision> seen;
  } act;
  KvmConfig c = policy(KvmMode::kEnforce);
  KvmRule set = c.rules[0], halve = c.rules[0];
  set.name = "set";
  set.then = {"max_queue", KvmActionOp::kSet, 2000000};
  set.sla_class = "default";
  set.max = 1e9;
  halve.name = "halve";
  halve.then = {"max_queue", KvmActionOp::kMul, 0.5};
  halve.sla_class = "default";
  halve.max = 1e9;
  c.rules = {set, halve};
  ParamTable t = baseline();
  t.set("max_queue", "default", 1024);
  KvCacheManager m(c, t, &act);
  const auto ds = m.tick(0, stats_at(95), {});
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_FALSE(ds[0].applied);
  EXPECT_TRUE(ds[1].applied);
  EXPECT_DOUBLE_EQ(ds[1].before, 1024);
  EXPECT_DOUBLE_EQ(ds[1].after, 512);
  EXPECT_DOUBLE_EQ(m.params().get("max_queue", "default"), 512);
}

// A command a worker had not acknowledged in time is still applied by it: the table moves (with
// the delay recorded), so the rule's exit restores the value.
TEST(KvCacheManager, ALateWorkerReplyStillMovesTheTable) {
  FakeActuator act;
  act.late = true;
  KvCacheManager m(policy(KvmMode::kEnforce), baseline(), &act);
  auto ds = m.tick(0, stats_at(95), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_TRUE(ds[0].applied);
  EXPECT_NE(ds[0].error.find("in time"), std::string::npos);
  EXPECT_NEAR(m.params().get("semantic_threshold", ""), 0.20, 1e-12);
  act.late = false;
  ds = m.tick(1000, stats_at(50), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_NEAR(ds[0].before, 0.20, 1e-12);
  EXPECT_DOUBLE_EQ(ds[0].after, 0.15);
  EXPECT_EQ(act.applied.size(), 2u);  // the restore was sent
}

// A manager whose rule halves class batch's max_queue (1024 at start) under pressure, after the
// tick that entered it: 512.
KvCacheManager halving_batch_queue(FakeActuator* act) {
  KvmConfig c = policy(KvmMode::kEnforce);
  c.rules[0].then = {"max_queue", KvmActionOp::kMul, 0.5};
  c.rules[0].sla_class = "batch";
  c.rules[0].min = 1;
  c.rules[0].max = 1e6;
  ParamTable t = baseline();
  t.set("max_queue", "batch", 1024);
  KvCacheManager m(c, t, act);
  m.tick(0, stats_at(95), {});
  return m;
}

// The operator's class reload: the table takes the new class settings, and an active rule on one
// restores the new value at its exit (not the one from before the reload).
TEST(KvCacheManager, ClassReloadRebasesTheTableAndTheRestoreValue) {
  FakeActuator act;
  KvCacheManager m = halving_batch_queue(&act);  // entered: 1024 -> 512
  EXPECT_DOUBLE_EQ(m.params().get("max_queue", "batch"), 512);
  ParamTable reloaded;
  reloaded.set("semantic_threshold", "", 0.3);  // engine-wide entries are not the classes'
  reloaded.set("max_queue", "batch", 64);
  m.rebase_classes(reloaded);
  EXPECT_DOUBLE_EQ(m.params().get("max_queue", "batch"), 64);
  EXPECT_DOUBLE_EQ(m.params().get("semantic_threshold", ""), 0.15);
  const auto ds = m.tick(1000, stats_at(50), {});  // exit
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_DOUBLE_EQ(ds[0].before, 64);
  EXPECT_DOUBLE_EQ(ds[0].after, 64);  // the operator's value, not the 1024 of before
  EXPECT_DOUBLE_EQ(m.params().get("max_queue", "batch"), 64);
}

// A reload that gives a class exactly as before (a SIGHUP to rotate the decision log) while a rule
// on it is active: the class keeps the moved value and the rule's exit still restores the value
// from before its enter. Rebased to the moved value, the exit "restored" 512 and the change stayed
// for good, each later enter halving it again.
TEST(KvCacheManager, AnUnchangedClassReloadKeepsTheRestoreValue) {
  FakeActuator act;
  KvCacheManager m = halving_batch_queue(&act);  // entered: 1024 -> 512
  ParamTable reloaded;                           // what the engine runs: the moved value
  reloaded.set("max_queue", "batch", 512);
  m.rebase_classes(reloaded, {"batch"});
  EXPECT_DOUBLE_EQ(m.params().get("max_queue", "batch"), 512);
  const auto ds = m.tick(1000, stats_at(50), {});  // exit
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_DOUBLE_EQ(ds[0].before, 512);
  EXPECT_DOUBLE_EQ(ds[0].after, 1024);
  EXPECT_DOUBLE_EQ(m.params().get("max_queue", "batch"), 1024);
}

// A class setting the KVM gave a class that the reloaded file gives none: the class reads the
// engine-wide value again (as its requests do, the router's override being the file's), so an
// active `=` rule re-applies its value at its next repeat, and its exit restores the engine-wide
// value. Before, the table kept the KVM's value and the rule never re-applied it.
TEST(KvCacheManager, ClassReloadDropsAClassSettingTheFileDoesNotGive) {
  KvmConfig c = policy(KvmMode::kEnforce);
  c.rules[0].then = {"semantic_threshold", KvmActionOp::kSet, 0.3};
  c.rules[0].sla_class = "batch";
  FakeActuator act;
  KvCacheManager m(c, baseline(), &act);
  m.tick(0, stats_at(95), {});  // enter: batch 0.15 (engine-wide) -> 0.3
  EXPECT_DOUBLE_EQ(m.params().get("semantic_threshold", "batch"), 0.3);
  ParamTable reloaded;
  reloaded.set("max_queue", "batch", 64);  // no semantic block for batch in the file
  m.rebase_classes(reloaded);
  EXPECT_FALSE(m.params().has("semantic_threshold", "batch"));
  EXPECT_DOUBLE_EQ(m.params().get("semantic_threshold", "batch"), 0.15);
  auto ds = m.tick(200, stats_at(95), {});  // past the cooldown, still hot: the value again
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "repeat");
  EXPECT_DOUBLE_EQ(ds[0].before, 0.15);
  EXPECT_DOUBLE_EQ(ds[0].after, 0.3);
  ds = m.tick(400, stats_at(50), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_DOUBLE_EQ(ds[0].after, 0.15);  // the engine-wide value
}

// A class rule on a semantic setting of a class without a semantic block of its own, entered while
// an engine-wide rule holds a transient value: it starts from the configured value (the engine
// builds the class's block from the configured settings) and its exit restores that, so once both
// rules exit the class runs the configured value. It used to start from and restore the transient
// engine-wide value, which the class then kept for good.
TEST(KvCacheManager, AClassSemanticRuleStartsFromTheConfiguredValue) {
  FakeActuator act;
  KvmConfig c = policy(KvmMode::kEnforce);
  c.rules[0].then = {"semantic_threshold", KvmActionOp::kSet, 0.2};
  KvmRule cls = c.rules[0];
  cls.name = "class-hot";
  cls.sla_class = "interactive";
  cls.when = {"device_kv_use", "", KvmCmp::kGreater, 0.95};
  cls.exit = {"device_kv_use", "", KvmCmp::kLess, 0.9};
  cls.then = {"semantic_threshold", KvmActionOp::kSet, 0.3};
  c.rules.push_back(cls);
  KvCacheManager m(c, baseline(), &act);
  ASSERT_EQ(m.tick(0, stats_at(92), {}).size(), 1u);  // engine-wide 0.15 -> 0.2
  std::vector<KvmDecision> ds = m.tick(150, stats_at(97), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "class-hot");
  EXPECT_DOUBLE_EQ(ds[0].before, 0.15);
  ds = m.tick(300, stats_at(85), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "exit");
  EXPECT_DOUBLE_EQ(ds[0].after, 0.15);
  ds = m.tick(450, stats_at(70), {});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "hot");
  EXPECT_DOUBLE_EQ(m.params().get("semantic_threshold", ""), 0.15);
  EXPECT_DOUBLE_EQ(m.params().get("semantic_threshold", "interactive"), 0.15);
}

// The engine gives a class its own semantic block (a copy of the configured one) at the class's
// first semantic setting: the table then lists every semantic parameter of the class at the value
// the class runs, not the engine-wide value that no longer reaches it.
TEST(KvCacheManager, AClassFirstSemanticSettingListsTheClassBlock) {
  class BlockActuator : public FakeActuator {
   public:
    ParamTable settings() override {
      ParamTable t;
      t.set("semantic_threshold", "", 0.4);  // an engine-wide rule's transient value
      t.set("semantic_threshold", "batch", 0.15);
      t.set("evict_threshold", "batch", 0.01);
      return t;
    }
  };
  KvmConfig c = policy(KvmMode::kEnforce);
  c.rules[0].then = {"evict_threshold", KvmActionOp::kSet, 0.05};
  c.rules[0].sla_class = "batch";
  ParamTable t = baseline();
  t.set("semantic_threshold", "", 0.4);
  BlockActuator act;
  KvCacheManager m(c, t, &act);
  m.tick(0, stats_at(95), {});
  EXPECT_DOUBLE_EQ(m.params().get("evict_threshold", "batch"), 0.05);  // the decision's value
  EXPECT_TRUE(m.params().has("semantic_threshold", "batch"));
  EXPECT_DOUBLE_EQ(m.params().get("semantic_threshold", "batch"), 0.15);
  act.refuse = true;  // a refused class decision adopts nothing
  KvmConfig other = c;
  other.rules[0].sla_class = "default";
  KvCacheManager n(other, t, &act);
  n.tick(0, stats_at(95), {});
  EXPECT_FALSE(n.params().has("semantic_threshold", "default"));
}

// A reload takes the new policy's latency window (the percentiles' span), not only its rules.
TEST(KvCacheManager, ReloadTakesTheNewLatencyWindow) {
  KvmConfig c = policy(KvmMode::kDryRun);
  c.window_ms = 10000;
  KvCacheManager m(c, baseline(), nullptr);
  m.monitor().latency().add("default", 0, 100, 10);
  m.tick(5000, stats_at(0), {});
  ASSERT_EQ(m.last_snapshot().classes.size(), 1u);
  EXPECT_EQ(m.last_snapshot().classes[0].samples, 1);  // 5 s old: inside 10 s
  c.window_ms = 2000;
  m.reload(c);
  m.tick(5100, stats_at(0), {});
  EXPECT_EQ(m.last_snapshot().classes[0].samples, 0);  // outside 2 s
}

// A sample stamped after the snapshot's time (a request the simulator finishes later in the step
// it samples at) is not counted yet; it is at the next snapshot past its time.
TEST(Monitor, ASampleNewerThanTheSnapshotWaitsForALaterOne) {
  LatencyWindow w(1000);
  w.add("default", 100, 40, 4);
  w.add("default", 250, 900, 9);
  KvmClassLatency at200;
  at200.name = "default";
  w.fill(200, &at200);
  EXPECT_EQ(at200.samples, 1);
  EXPECT_DOUBLE_EQ(at200.ttft_p99_ms, 40);
  KvmClassLatency at300;
  at300.name = "default";
  w.fill(300, &at300);
  EXPECT_EQ(at300.samples, 2);
  EXPECT_DOUBLE_EQ(at300.ttft_p99_ms, 900);
}

// pages_evicted_fraction is of the decoding sequences' pages: a decode pool's full blocks in use
// count idle prefix-cache pages (no sequence's), and a prefill pool's sequences are not
// decoding. Over the blocks in use (and the prefill pool's) it read 10 / 130 here.
TEST(Monitor, TheEvictedFractionIsOfTheDecodingSequencesPages) {
  Monitor mon(1000);
  EngineStats s = stats_at(100);  // colocated-0: 100 full blocks in use, 60 of them idle cache
  s.pools[0].kv_pages_full = 100;
  s.pools[0].kv_pages_evicted = 10;
  s.pools[0].kv_sequence_pages = 50;  // 40 resident + 10 evicted
  PoolStats prefill;
  prefill.name = "prefill-0";
  prefill.kv_blocks_total = 30;
  prefill.kv_pages_full = 30;
  prefill.kv_sequence_pages = 30;
  s.pools.push_back(prefill);
  EXPECT_DOUBLE_EQ(mon.sample(1000, s, {}).pages_evicted_fraction, 0.2);
}

TEST(Monitor, RatesPercentilesAndWorstPools) {
  Monitor mon(1000);
  EngineStats s = stats_at(30);
  PoolStats prefill;
  prefill.name = "prefill-0";
  prefill.kv_blocks_total = 10;
  prefill.kv_blocks_free = 0;  // full, but prefill pools do not count for device use
  s.pools.push_back(prefill);
  for (int i = 1; i <= 100; ++i) mon.latency().add("default", 500, i, 2 * i);
  s.classes[0].queued = 3;
  s.classes[0].oldest_queued_ms = 250;
  KvmSnapshot a = mon.sample(1000, s, {});
  EXPECT_NEAR(a.device_kv_use, 0.30, 1e-9);
  ASSERT_EQ(a.workers.size(), 2u);
  EXPECT_EQ(a.workers[0].shard_use, (std::vector<double>{0.30, 0.0}));
  ASSERT_EQ(a.classes.size(), 1u);
  EXPECT_EQ(a.classes[0].samples, 100);
  EXPECT_EQ(a.classes[0].queue_depth, 3);
  EXPECT_DOUBLE_EQ(a.classes[0].queue_wait_ms, 250);
  EXPECT_DOUBLE_EQ(a.classes[0].ttft_p50_ms, 50);
  EXPECT_DOUBLE_EQ(a.classes[0].ttft_p99_ms, 99);
  EXPECT_DOUBLE_EQ(a.classes[0].itl_p99_ms, 198);
  s.pools[0].kv_swaps_out = 10;
  s.pools[0].kv_swap_bytes = 1000;
  KvmSnapshot b = mon.sample(1500, s, {.link_bytes_per_s = 4000});
  EXPECT_NEAR(b.swap_rate, 20.0, 1e-9);     // 10 swaps in 0.5 s
  EXPECT_NEAR(b.link_use, 0.5, 1e-9);       // 2000 B/s of 4000
  KvmSnapshot c = mon.sample(2600, s, {});  // the samples at 500 ms left the 1 s window
  EXPECT_EQ(c.classes[0].samples, 0);
}

// link_use is the busiest worker's: each worker's bytes over its own measured link (one GPU
// each), not every worker's bytes summed over one link, which read two workers moving half
// their link each as a full link.
TEST(Monitor, LinkUseIsTheBusiestWorkersOwnLink) {
  Monitor mon(1000);
  EngineStats s = stats_at(30);
  s.pools[0].kv_link_bytes_per_s = 4000;
  PoolStats other = s.pools[0];
  other.name = "colocated-1";
  s.pools.push_back(other);
  mon.sample(1000, s, {.link_bytes_per_s = 1e9});
  s.pools[0].kv_swap_bytes = 2000;            // 0.5 of its link in 1 s
  s.pools[1].kv_shard_exchange_bytes = 1000;  // 0.25 of its link
  EXPECT_NEAR(mon.sample(2000, s, {.link_bytes_per_s = 1e9}).link_use, 0.5, 1e-9);
}

// Shards exchanging in one memory (CPU shards, virtual shards on one GPU) or GPU to GPU never
// use the host link: however much they exchange, link_use stays 0 (it read 1.0 here, every
// exchanged byte divided by the host link's bandwidth).
TEST(Monitor, ShardExchangeOffTheHostLinkIsNoLinkUse) {
  Monitor mon(1000);
  EngineStats s = stats_at(30);
  s.pools[0].kv_link_bytes_per_s = 4000;
  mon.sample(1000, s, {});
  s.pools[0].kv_shard_exchange_bytes = 4000;  // 4000 B/s, none of it staged through the host
  EXPECT_DOUBLE_EQ(mon.sample(2000, s, {}).link_use, 0);
}

// A one-token request has no ITL: it is no sample of the ITL percentiles (it read as 0).
TEST(Monitor, ANaNLatencyIsNoSample) {
  Monitor mon(1000);
  EngineStats s = stats_at(30);
  mon.latency().add("default", 900, 40, std::numeric_limits<double>::quiet_NaN());
  mon.latency().add("default", 900, 60, 20);
  const KvmSnapshot a = mon.sample(1000, s, {});
  ASSERT_EQ(a.classes.size(), 1u);
  EXPECT_DOUBLE_EQ(a.classes[0].itl_p50_ms, 20);
  EXPECT_DOUBLE_EQ(a.classes[0].ttft_p50_ms, 40);
  EXPECT_DOUBLE_EQ(a.classes[0].ttft_p99_ms, 60);
}

// storage_latency_ms is the disk's EWMA only while operations keep finishing: a rule that stopped
// the disk's use (swap = never on high latency) would otherwise read the old value for good.
TEST(Monitor, StorageLatencyGoesWhenTheDiskIsIdle) {
  Monitor mon(1000);
  EngineStats s = stats_at(30);
  s.pools[0].kv_disk_latency_ms = 40;
  s.pools[0].kv_disk_latency_age_ms = 200;  // inside the 1 s window
  EXPECT_DOUBLE_EQ(mon.sample(1000, s, {}).storage_latency_ms, 40);
  s.pools[0].kv_disk_latency_age_ms = 1500;  // no operation for longer than the window
  EXPECT_DOUBLE_EQ(mon.sample(2000, s, {}).storage_latency_ms, 0);
}

// disk_kv_use: a pool's disk tier bytes in use over its capacity, 0 without a disk tier, the
// most loaded decoding pool's (a prefill pool's spilled prefix pages do not count).
TEST(Monitor, DiskKvUseIsTheFullestDecodingDiskTier) {
  Monitor mon(1000);
  EngineStats s = stats_at(30);
  EXPECT_DOUBLE_EQ(mon.sample(1000, s, {}).disk_kv_use, 0);  // no disk tier
  s.pools[0].kv_disk_bytes_used = 1 << 20;  // a total of 0 is no tier, whatever the count says
  EXPECT_DOUBLE_EQ(mon.sample(1100, s, {}).disk_kv_use, 0);
  s.pools[0].kv_disk_bytes_total = 8 << 20;
  s.pools[0].kv_disk_bytes_used = 0;
  EXPECT_DOUBLE_EQ(mon.sample(1200, s, {}).disk_kv_use, 0);  // a tier, empty
  s.pools[0].kv_disk_bytes_used = 2 << 20;
  PoolStats other = s.pools[0];
  other.name = "colocated-1";
  other.kv_disk_bytes_used = 6 << 20;
  s.pools.push_back(other);
  PoolStats prefill = s.pools[0];
  prefill.name = "prefill-0";
  prefill.kv_disk_bytes_used = 8 << 20;  // full, but prefill pools do not count
  s.pools.push_back(prefill);
  const KvmSnapshot a = mon.sample(1300, s, {});
  EXPECT_DOUBLE_EQ(a.disk_kv_use, 0.75);
  ASSERT_EQ(a.workers.size(), 3u);
  EXPECT_DOUBLE_EQ(a.workers[0].disk_kv_use, 0.25);
  EXPECT_DOUBLE_EQ(a.workers[1].disk_kv_use, 0.75);
  EXPECT_DOUBLE_EQ(a.workers[2].disk_kv_use, 1.0);
  EXPECT_DOUBLE_EQ(a.host_kv_use, 0);  // the disk's bytes are not the host tier's
}

// A rule `when: disk_kv_use > 0.5` enters on the disk tier's use alone and exits below its exit.
TEST(KvCacheManager, ADiskUseRuleFiresOnTheDiskTier) {
  FakeActuator act;
  KvmConfig c = policy(KvmMode::kEnforce);
  auto when = parse_condition("disk_kv_use > 0.5");
  auto exit = parse_condition("disk_kv_use < 0.2");
  ASSERT_TRUE(when.ok() && exit.ok());
  c.rules[0].name = "disk-full";
  c.rules[0].when = *when;
  c.rules[0].exit = *exit;
  KvCacheManager m(c, baseline(), &act);
  auto at = [](int64_t disk_used) {
    EngineStats s = stats_at(95);  // device and host use play no part
    s.pools[0].kv_host_bytes_total = 100;
    s.pools[0].kv_host_bytes_used = 99;
    s.pools[0].kv_disk_bytes_total = 100;
    s.pools[0].kv_disk_bytes_used = disk_used;
    return s;
  };
  EXPECT_TRUE(m.tick(0, at(50), {}).empty());  // 0.5 is not > 0.5
  const std::vector<KvmDecision> d = m.tick(200, at(60), {});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].rule, "disk-full");
  EXPECT_EQ(d[0].action, "enter");
  EXPECT_NE(d[0].monitors.find("disk_kv_use=0.6"), std::string::npos) << d[0].monitors;
  EXPECT_NEAR(m.last_snapshot().disk_kv_use, 0.6, 1e-9);
  const std::vector<KvmDecision> e = m.tick(400, at(10), {});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].action, "exit");
  EXPECT_EQ(act.applied.size(), 2u);
}

}  // namespace
}  // namespace kvsplit::kvm
