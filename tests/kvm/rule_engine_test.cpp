#include "kvm/rule_engine.h"

#include <gtest/gtest.h>

#include "kvm/expr.h"
#include "rule_test_util.h"

namespace kvsplit::kvm {
namespace {

// Feeds a recorded series of device_kv_use, one sample every `step_ms`, applying the decisions
// to *table when `apply` (enforce) and leaving it alone otherwise (dry-run).
std::vector<KvmDecision> run_series(RuleEngine& engine, ParamTable* table,
                                    const std::vector<double>& series, double step_ms,
                                    bool apply = true, double t0 = 0) {
  std::vector<KvmDecision> all;
  for (size_t i = 0; i < series.size(); ++i) {
    auto ds = engine.evaluate(use_at(t0 + static_cast<double>(i) * step_ms, series[i]), *table);
    for (const KvmDecision& d : ds) {
      if (apply) table->set(d.param, d.sla_class, d.after);
      all.push_back(d);
    }
  }
  return all;
}

std::vector<std::string> actions(const std::vector<KvmDecision>& ds) {
  std::vector<std::string> out;
  for (const auto& d : ds) out.push_back(d.action);
  return out;
}

TEST(ParamTableTest, ClassFallsBackToGlobal) {
  ParamTable t;
  EXPECT_EQ(t.get("semantic_threshold", ""), 0);
  t.set("semantic_threshold", "", 0.15);
  EXPECT_EQ(t.get("semantic_threshold", "voice"), 0.15);
  EXPECT_FALSE(t.has("semantic_threshold", "voice"));
  t.set("semantic_threshold", "voice", 0.2);
  EXPECT_TRUE(t.has("semantic_threshold", "voice"));
  EXPECT_EQ(t.get("semantic_threshold", "voice"), 0.2);
  EXPECT_EQ(t.get("semantic_threshold", ""), 0.15);
}

TEST(RuleEngineTest, EntersAndExitsWithHysteresis) {
  RuleEngine engine({hot_rule()});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  // calm, pressure, the band between the levels (0.80..0.90), calm.
  auto ds = run_series(engine, &table, {0.5, 0.85, 0.93, 0.88, 0.85, 0.82, 0.79, 0.85}, 100);
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].action, "enter");
  EXPECT_EQ(ds[0].time_ms, 200);
  EXPECT_EQ(ds[0].rule, "hot");
  EXPECT_EQ(ds[0].param, "semantic_threshold");
  EXPECT_DOUBLE_EQ(ds[0].before, 0.15);
  EXPECT_DOUBLE_EQ(ds[0].after, 0.20);
  EXPECT_EQ(ds[0].monitors, "device_kv_use=0.93");
  EXPECT_FALSE(ds[0].applied);
  EXPECT_EQ(ds[1].action, "exit");
  EXPECT_EQ(ds[1].time_ms, 600);
  EXPECT_DOUBLE_EQ(ds[1].before, 0.20);
  EXPECT_DOUBLE_EQ(ds[1].after, 0.15);  // restored
  EXPECT_EQ(ds[1].monitors, "device_kv_use=0.79");
  EXPECT_FALSE(engine.state(0).active);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.15);
}

TEST(RuleEngineTest, NoFlappingAroundTheEnterLevel) {
  KvmRule r = hot_rule();
  r.max = 10;  // no bound in the way
  r.cooldown_ms = 1e9;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  std::vector<double> series;
  for (int i = 0; i < 200; ++i) series.push_back(i % 2 ? 0.91 : 0.89);
  auto ds = run_series(engine, &table, series, 100);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, "enter");
  EXPECT_TRUE(engine.state(0).active);
}

TEST(RuleEngineTest, RepeatsOnlyAfterTheCooldown) {
  KvmRule r = hot_rule();
  r.max = 10;
  RuleEngine engine({r});  // cooldown 2000 ms
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  // Above the enter level for 5 s, sampled every 500 ms: enter at 0, repeats at 2000 and 4000.
  auto ds = run_series(engine, &table, std::vector<double>(11, 0.95), 500);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat", "repeat"}));
  EXPECT_EQ(ds[1].time_ms, 2000);
  EXPECT_EQ(ds[2].time_ms, 4000);
  EXPECT_DOUBLE_EQ(ds[1].before, 0.15);
  EXPECT_DOUBLE_EQ(ds[2].after, 0.25);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.25);
}

TEST(RuleEngineTest, NoRepeatInTheBand) {
  KvmRule r = hot_rule();
  r.max = 10;
  r.cooldown_ms = 0;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  // Enter, then the band (active but `when` false): nothing; above again: repeat.
  auto ds = run_series(engine, &table, {0.95, 0.85, 0.85, 0.85, 0.95}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat"}));
  EXPECT_EQ(ds[1].time_ms, 400);
}

TEST(RuleEngineTest, BoundsClampAndStopDecisions) {
  KvmRule r = hot_rule();  // cooldown 2000
  r.then.value = 0.25;
  r.max = 0.6;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.25);
  auto ds = run_series(engine, &table, std::vector<double>(21, 0.95), 1000);  // 20 s
  // 0.25 -> 0.5 (enter) -> 0.6 (repeat, clamped from 0.75) -> at the bound: nothing more.
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat"}));
  EXPECT_DOUBLE_EQ(ds[0].after, 0.5);
  EXPECT_DOUBLE_EQ(ds[1].after, 0.6);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.6);
  EXPECT_TRUE(engine.state(0).active);

  // A step past the bound is clamped to it; min works the same way.
  KvmRule down =
      rule("cool", "device_kv_use < 0.2", "device_kv_use > 0.5", "semantic_threshold -= 0.25", 0);
  down.min = 0.05;
  RuleEngine e2({down});
  ParamTable t2;
  t2.set("semantic_threshold", "", 0.2);
  auto d2 = run_series(e2, &t2, {0.1, 0.1, 0.1}, 100);
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_DOUBLE_EQ(d2[0].after, 0.05);
}

TEST(RuleEngineTest, IntegerParametersAreRounded) {
  KvmRule r = rule("seqs", "queue_depth > 10", "queue_depth < 2", "max_num_seqs *= 0.7", 0);
  r.min = 1;
  RuleEngine engine({r});
  ParamTable table;
  table.set("max_num_seqs", "", 10);
  KvmSnapshot s;
  s.classes.push_back({});
  s.classes[0].name = "default";
  s.classes[0].queue_depth = 20;
  std::vector<double> seen;
  for (int i = 0; i < 8; ++i) {
    s.time_ms = i * 100;
    for (const auto& d : engine.evaluate(s, table)) {
      table.set(d.param, d.sla_class, d.after);
      seen.push_back(d.after);
    }
  }
  // 10 -> 7 -> 5 (4.9) -> 4 (3.5 rounds up) -> 3 (2.8) -> 2 (2.1) -> 1 (1.4) -> 1: stops.
  EXPECT_EQ(seen, (std::vector<double>{7, 5, 4, 3, 2, 1}));
}

// max_chunk_tokens (fair prefill's cap): an integer, engine-wide parameter whose results stay in
// its own range [0, 2^20] whatever the rule's bounds, and whose shrinking rules keep min >= 1.
TEST(RuleEngineTest, MaxChunkTokensMovesWithinItsRange) {
  KvmRule halve =
      rule("chunk", "ttft_p99_ms > 100", "ttft_p99_ms < 50", "max_chunk_tokens *= 0.5", 0);
  halve.min = 8;
  KvmRule grow = rule("grow", "queue_depth > 10", "queue_depth < 2", "max_chunk_tokens += 700000",
                      0);  // no max: the parameter's range is the bound
  RuleEngine engine({halve, grow});
  ParamTable table;
  table.set("max_chunk_tokens", "", 40);
  KvmSnapshot s;
  s.classes.push_back({});
  s.classes[0].name = "default";
  s.classes[0].ttft_p99_ms = 500;
  std::vector<double> seen;
  for (int i = 0; i < 4; ++i) {
    s.time_ms = i * 100;
    for (const auto& d : engine.evaluate(s, table)) {
      EXPECT_EQ(d.param, "max_chunk_tokens");
      table.set(d.param, d.sla_class, d.after);
      seen.push_back(d.after);
    }
  }
  // 40 -> 20 -> 10 -> 8 (5 clamped to min): stops.
  EXPECT_EQ(seen, (std::vector<double>{20, 10, 8}));
  s.classes[0].ttft_p99_ms = 80;  // in halve's band
  s.classes[0].queue_depth = 20;
  seen.clear();
  for (int i = 4; i < 8; ++i) {
    s.time_ms = i * 100;
    for (const auto& d : engine.evaluate(s, table)) {
      table.set(d.param, d.sla_class, d.after);
      seen.push_back(d.after);
    }
  }
  // 8 -> 700008 -> 1048576 (the range's top, not 1400008): stops.
  EXPECT_EQ(seen, (std::vector<double>{700008, 1048576}));
}

// max_chunk_tokens 0 is "no cap": += and *= from it would impose one; it stays off, and only
// `=` sets a cap.
TEST(RuleEngineTest, NoCapStaysOffUnderRelativeActions) {
  KvmSnapshot s;
  s.classes.push_back({});
  s.classes[0].name = "default";
  s.classes[0].ttft_p99_ms = 500;
  for (const char* action : {"max_chunk_tokens += 16", "max_chunk_tokens *= 2"}) {
    RuleEngine engine({rule("r", "ttft_p99_ms > 100", "ttft_p99_ms < 50", action, 0)});
    ParamTable table;
    table.set("max_chunk_tokens", "", 0);
    s.time_ms = 0;
    const auto d = engine.evaluate(s, table);  // the enter: the setting stays as it was
    ASSERT_EQ(d.size(), 1u) << action;
    EXPECT_EQ(d[0].after, 0) << action;
    s.time_ms = 100;
    EXPECT_TRUE(engine.evaluate(s, table).empty()) << action;  // no repeat: nothing moves
  }
  RuleEngine set({rule("r", "ttft_p99_ms > 100", "ttft_p99_ms < 50", "max_chunk_tokens = 32", 0)});
  ParamTable table;
  table.set("max_chunk_tokens", "", 0);
  const auto d = set.evaluate(s, table);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].after, 32);
}

// recall_wait_ms < 0 is "until the copy lands", above every bounded wait: *= 2 from it was clamped
// to 0 (no wait) and += 5 gave 5 ms; relative actions leave it, and only `=` bounds it.
TEST(RuleEngineTest, AnUnboundedRecallWaitStaysUnboundedUnderRelativeActions) {
  KvmSnapshot s;
  s.classes.push_back({});
  s.classes[0].name = "default";
  s.classes[0].ttft_p99_ms = 500;
  for (const char* action : {"recall_wait_ms *= 2", "recall_wait_ms += 5", "recall_wait_ms -= 1"}) {
    RuleEngine engine({rule("r", "ttft_p99_ms > 100", "ttft_p99_ms < 50", action, 0)});
    ParamTable table;
    table.set("recall_wait_ms", "", -1);
    const auto d = engine.evaluate(s, table);
    ASSERT_EQ(d.size(), 1u) << action;
    EXPECT_EQ(d[0].after, -1) << action;
  }
  RuleEngine set({rule("r", "ttft_p99_ms > 100", "ttft_p99_ms < 50", "recall_wait_ms = 4", 0)});
  ParamTable table;
  table.set("recall_wait_ms", "", -1);
  const auto d = set.evaluate(s, table);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].after, 4);
  // From a bounded wait, relative actions move it as before.
  RuleEngine twice({rule("r", "ttft_p99_ms > 100", "ttft_p99_ms < 50", "recall_wait_ms *= 2", 0)});
  table.set("recall_wait_ms", "", 3);
  const auto d2 = twice.evaluate(s, table);
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_EQ(d2[0].after, 6);
}

TEST(RuleEngineTest, PerClassRuleMovesOnlyItsClass) {
  KvmRule r = rule("voice-slow", "ttft_p99_ms[voice] > 250", "ttft_p99_ms[voice] < 150",
                   "semantic_threshold += 0.1", 0);
  r.sla_class = "voice";
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  KvmSnapshot s;
  s.time_ms = 0;
  s.classes.resize(2);
  s.classes[0].name = "voice";
  s.classes[0].ttft_p99_ms = 300;
  s.classes[1].name = "batch";
  s.classes[1].ttft_p99_ms = 5000;
  auto ds = engine.evaluate(s, table);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].sla_class, "voice");
  EXPECT_EQ(ds[0].monitors, "ttft_p99_ms[voice]=300");
  EXPECT_DOUBLE_EQ(ds[0].before, 0.15);  // the global value: voice had no override yet
  EXPECT_DOUBLE_EQ(ds[0].after, 0.25);
  table.set(ds[0].param, ds[0].sla_class, ds[0].after);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", "voice"), 0.25);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.15);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", "batch"), 0.15);
}

TEST(RuleEngineTest, ClassMetricWithoutClassReadsTheWorstClass) {
  RuleEngine engine(
      {rule("any-slow", "ttft_p99_ms > 1000", "ttft_p99_ms < 500", "swap = never", 0)});
  ParamTable table;
  KvmSnapshot s;
  s.classes.resize(2);
  s.classes[0].name = "voice";
  s.classes[0].ttft_p99_ms = 300;
  s.classes[1].name = "batch";
  s.classes[1].ttft_p99_ms = 1500;
  auto ds = engine.evaluate(s, table);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].monitors, "ttft_p99_ms[batch]=1500");
  EXPECT_DOUBLE_EQ(ds[0].after, 2);  // never
}

TEST(RuleEngineTest, DryRunChangesNothingAndRepeatsTheSameDecision) {
  KvmRule r = hot_rule();
  r.max = 10;
  RuleEngine engine({r});  // cooldown 2000
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  const ParamTable before = table;
  auto ds = run_series(engine, &table, std::vector<double>(9, 0.95), 500, /*apply=*/false);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat", "repeat"}));
  for (const auto& d : ds) {
    EXPECT_DOUBLE_EQ(d.before, 0.15);
    EXPECT_DOUBLE_EQ(d.after, 0.20);
    EXPECT_FALSE(d.applied);
  }
  EXPECT_EQ(table.values(), before.values());
  // Exit: the value at enter is what is still there.
  ds = run_series(engine, &table, {0.5}, 0, false, 5000);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"exit"}));
  EXPECT_DOUBLE_EQ(ds[0].before, 0.15);
  EXPECT_DOUBLE_EQ(ds[0].after, 0.15);
  EXPECT_EQ(table.values(), before.values());
}

TEST(RuleEngineTest, RestoreOnExitRestoresTheValueAtEnter) {
  KvmRule r = hot_rule();
  r.max = 10;
  r.cooldown_ms = 0;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  auto ds = run_series(engine, &table, {0.95, 0.95, 0.95, 0.7}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat", "repeat", "exit"}));
  EXPECT_NEAR(ds[3].before, 0.25, 1e-12);
  EXPECT_DOUBLE_EQ(ds[3].after, 0.1);
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.1);

  r.restore_on_exit = false;
  RuleEngine keep({r});
  table.set("semantic_threshold", "", 0.1);
  ds = run_series(keep, &table, {0.95, 0.95, 0.7}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat", "exit-keep"}));
  EXPECT_NEAR(ds[2].before, 0.2, 1e-12);
  EXPECT_NEAR(ds[2].after, 0.2, 1e-12);
  EXPECT_NEAR(table.get("semantic_threshold", ""), 0.2, 1e-12);
}

// hold_ms: a pool that empties for one sample between refills does not end the rule; the exit
// level held on every sample for hold_ms does. While the exit level holds, nothing repeats.
TEST(RuleEngineTest, HoldMsNeedsTheExitLevelOnEverySample) {
  KvmRule r = hot_rule();
  r.max = 10;
  r.cooldown_ms = 0;
  r.hold_ms = 250;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  // t = 0 enter; 100 dips (exit level, run starts); 200 back up (run broken: repeat); 300, 400,
  // 500 below the exit level: 300 + 250 = 550 not reached at 500; 600 exits.
  auto ds = run_series(engine, &table, {0.95, 0.1, 0.95, 0.1, 0.1, 0.1, 0.1}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat", "exit"}));
  EXPECT_DOUBLE_EQ(ds[1].time_ms, 200);
  EXPECT_DOUBLE_EQ(ds[2].time_ms, 600);
  EXPECT_DOUBLE_EQ(ds[2].after, 0.1);
  // The same series without a dwell flaps: it exits at the first dip.
  r.hold_ms = 0;
  RuleEngine flappy({r});
  table.set("semantic_threshold", "", 0.1);
  ds = run_series(flappy, &table, {0.95, 0.1, 0.95, 0.1}, 100);
  EXPECT_EQ(actions(ds), (std::vector<std::string>{"enter", "exit", "enter", "exit"}));
}

TEST(RuleEngineTest, OneShotRepeatsFromZeroAndNeverRestores) {
  RuleEngine engine(
      {rule("spread", "link_use < 0.3", "link_use > 0.6", "migrate_to_shard = 16", 1000)});
  ParamTable table;
  std::vector<KvmDecision> ds;
  for (double t : {0.0, 500.0, 1000.0}) {
    KvmSnapshot s;
    s.time_ms = t;
    s.link_use = 0.1;
    for (const auto& d : engine.evaluate(s, table)) {
      table.set(d.param, d.sla_class, d.after);  // a careless caller: must not matter
      ds.push_back(d);
    }
  }
  KvmSnapshot s;
  s.time_ms = 1500;
  s.link_use = 0.9;
  for (const auto& d : engine.evaluate(s, table)) ds.push_back(d);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "repeat", "exit-keep"}));
  EXPECT_DOUBLE_EQ(ds[0].before, 0);
  EXPECT_DOUBLE_EQ(ds[0].after, 16);
  EXPECT_DOUBLE_EQ(ds[1].before, 0);
  EXPECT_DOUBLE_EQ(ds[1].after, 16);
  EXPECT_DOUBLE_EQ(ds[2].after, 0);
}

TEST(RuleEngineTest, LaterRulesSeeEarlierRulesAfterValues) {
  KvmRule a = rule("a", "device_kv_use > 0.9", "device_kv_use < 0.8", "semantic_window = 100", 0);
  KvmRule b = rule("b", "device_kv_use > 0.9", "device_kv_use < 0.8", "semantic_window *= 2", 0);
  RuleEngine engine({a, b});
  ParamTable table;
  table.set("semantic_window", "", 4096);
  auto ds = engine.evaluate(use_at(0, 0.95), table);
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_DOUBLE_EQ(ds[0].before, 4096);
  EXPECT_DOUBLE_EQ(ds[0].after, 100);
  EXPECT_DOUBLE_EQ(ds[1].before, 100);
  EXPECT_DOUBLE_EQ(ds[1].after, 200);
  EXPECT_DOUBLE_EQ(table.get("semantic_window", ""), 4096);  // the caller's table is untouched
}

// The cooldown counts from the last application, an enter included: a monitor swinging across
// both levels at every sample gives one enter and one exit per cooldown, not one per sample.
TEST(RuleEngineTest, CooldownCountsFromAnEnterBeforeAnExit) {
  KvmRule r = hot_rule();
  r.max = 10;
  r.cooldown_ms = 500;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  const auto ds =
      run_series(engine, &table, {0.95, 0.7, 0.95, 0.7, 0.95, 0.7, 0.95, 0.7, 0.95}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "exit", "enter", "exit"}));
  EXPECT_DOUBLE_EQ(ds[2].time_ms, 600);  // not at 200 or 400: 500 ms after the first enter
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", ""), 0.1);
}

// The cooldown is a minimum: an enter exactly cooldown_ms after the last application is taken
// (as a repeat is, RepeatsOnlyAfterTheCooldown).
TEST(RuleEngineTest, AnEnterExactlyACooldownLaterIsTaken) {
  KvmRule r = hot_rule();
  r.max = 10;
  r.cooldown_ms = 500;
  RuleEngine engine({r});
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  const auto ds = run_series(engine, &table, {0.95, 0.7, 0.95, 0.95}, 250);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "exit", "enter"}));
  EXPECT_DOUBLE_EQ(ds[2].time_ms, 500);
}

// Rules on one setting stack: whichever exits first, the setting ends where it was before them
// all (a later rule started from the earlier one's value, so the earlier one's exit leaves the
// value to it and hands it the value to restore).
TEST(RuleEngineTest, StackedRulesOnOneSettingRestoreTheValueBeforeThemAll) {
  const KvmRule a =
      rule("a", "device_kv_use > 0.9", "device_kv_use < 0.88", "semantic_window = 100", 0);
  const KvmRule b =
      rule("b", "device_kv_use > 0.95", "device_kv_use < 0.5", "semantic_window *= 0.5", 0);
  for (const bool first_in_first_out : {true, false}) {
    RuleEngine engine({a, b});
    ParamTable table;
    table.set("semantic_window", "", 4096);
    // a enters (100), b enters on top (50); then either a exits first (0.87) and b later (0.4),
    // or both exit together (0.4: b after a in the same evaluation).
    const std::vector<double> series = first_in_first_out
                                           ? std::vector<double>{0.92, 0.97, 0.87, 0.4}
                                           : std::vector<double>{0.92, 0.97, 0.4};
    const auto ds = run_series(engine, &table, series, 100);
    if (first_in_first_out) {
      ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "enter", "exit-keep", "exit"}));
      EXPECT_DOUBLE_EQ(ds[2].after, 50);    // a leaves b's value in place
      EXPECT_DOUBLE_EQ(ds[3].after, 4096);  // b restores the value before a
    }
    EXPECT_DOUBLE_EQ(table.get("semantic_window", ""), 4096) << first_in_first_out;
  }
  // The stack in the other order (b exits first) restores a's value, then a the first one (a's
  // cooldown keeps it from applying "= 100" again while b holds the setting).
  ParamTable table;
  table.set("semantic_window", "", 4096);
  KvmRule a2 = a;
  a2.cooldown_ms = 10000;
  const KvmRule b2 =
      rule("b", "device_kv_use > 0.95", "device_kv_use < 0.93", "semantic_window *= 0.5", 0);
  RuleEngine lifo({a2, b2});
  const auto ds = run_series(lifo, &table, {0.92, 0.97, 0.92, 0.8}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "enter", "exit", "exit"}));
  EXPECT_DOUBLE_EQ(ds[2].after, 100);
  EXPECT_DOUBLE_EQ(ds[3].after, 4096);
}

// A class rule stacked on an engine-wide rule's transient value: the class had no value of its
// own, so its exit restores the engine-wide value of that moment (0.15, the engine-wide rule
// having exited), not the transient 0.3 it read at enter (which the class then kept for good).
TEST(RuleEngineTest, AClassRuleOnAnInheritedValueRestoresTheEngineWideOne) {
  KvmRule global =
      rule("global", "device_kv_use > 0.9", "device_kv_use < 0.8", "semantic_threshold = 0.3", 0);
  KvmRule cls =
      rule("cls", "device_kv_use > 0.95", "device_kv_use < 0.5", "semantic_threshold += 0.05", 0);
  cls.sla_class = "batch";
  RuleEngine engine({global, cls});
  ParamTable table;
  table.set("semantic_threshold", "", 0.15);
  const auto ds = run_series(engine, &table, {0.92, 0.97, 0.7, 0.4}, 100);
  ASSERT_EQ(actions(ds), (std::vector<std::string>{"enter", "enter", "exit", "exit"}));
  EXPECT_DOUBLE_EQ(ds[1].after, 0.35);  // batch: 0.3 (inherited) + 0.05
  EXPECT_DOUBLE_EQ(ds[2].after, 0.15);  // the engine-wide rule restores its value
  EXPECT_EQ(ds[3].sla_class, "batch");
  EXPECT_DOUBLE_EQ(ds[3].after, 0.15);  // the class follows the engine-wide value again
  EXPECT_DOUBLE_EQ(table.get("semantic_threshold", "batch"), 0.15);
}

TEST(RuleEngineTest, ReloadKeepsTheStateOfUnchangedRules) {
  KvmRule r = hot_rule();
  r.max = 10;
  KvmRule other = rule("other", "link_use > 0.9", "link_use < 0.5", "swap = never", 0);
  RuleEngine engine({r, other});
  ParamTable table;
  table.set("semantic_threshold", "", 0.1);
  auto ds = run_series(engine, &table, {0.95}, 0);
  ASSERT_EQ(ds.size(), 1u);
  ASSERT_TRUE(engine.state(0).active);

  // Same rule (now second), plus a changed copy of another: the unchanged one keeps its state,
  // so within the cooldown it does not enter again, and it still restores 0.1 on exit.
  KvmRule changed = r;
  changed.name = "hot2";
  engine.reload({other, r, changed});
  EXPECT_FALSE(engine.state(0).active);
  EXPECT_TRUE(engine.state(1).active);
  EXPECT_DOUBLE_EQ(engine.state(1).value_at_enter, 0.1);
  EXPECT_FALSE(engine.state(2).active);
  ds = run_series(engine, &table, {0.95}, 0, true, 1000);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].rule, "hot2");
  EXPECT_EQ(ds[0].action, "enter");

  // A rule whose text changed under the same name starts over.
  KvmRule edited = r;
  edited.cooldown_ms = 500;
  engine.reload({edited});
  EXPECT_FALSE(engine.state(0).active);
}

}  // namespace
}  // namespace kvsplit::kvm
