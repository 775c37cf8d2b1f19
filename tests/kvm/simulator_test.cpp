#include "kvm/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "kvm/simulator_model.h"
#include "simulator_test_util.h"

namespace kvsplit::kvm {
namespace {

TEST(Simulator, IdleEngineMeetsTargetsAndCountsEveryRequest) {
  auto r = simulate(test_config(), test_profile(), uniform_trace(20, 500, 64, 16));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(cls(*r, "fast").requests, 10);
  EXPECT_EQ(cls(*r, "slow").requests, 10);
  EXPECT_EQ(cls(*r, "fast").finished, 10);
  EXPECT_DOUBLE_EQ(cls(*r, "fast").attainment, 1.0);
  // One request alone: its prefill step (1 + 64 * 0.01 ms) is its TTFT.
  EXPECT_NEAR(cls(*r, "fast").ttft_p50_ms, 1.64, 1e-9);
  EXPECT_EQ(r->preemptions, 0);
}

// With the profile's max_context a trace is fitted to the model (as bench_serving_offline
// does), and the requests a server refuses (prompt + output - 1 > max_context) are counted. A cut
// prompt is priced at its cut length.
TEST(Simulator, RequestsOverTheContextAreCounted) {
  EngineProfile p = test_profile();
  p.max_context = 512;
  const std::vector<TraceRequest> trace = {{0, 1000, 8, "fast"},     // prompt cut to 511
                                           {100, 500, 100, "fast"},  // output cut to 12
                                           {200, 500, 13, "fast"},   // 512 positions: served
                                           {300, 64, 16, "fast"}};
  auto r = simulate(test_config(), p, trace);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->over_context, 2);
  EXPECT_EQ(cls(*r, "fast").finished, 4);
  EXPECT_NEAR(r->requests[0].ttft_ms, 2 * 1 + 511 * 0.01, 1e-9);  // two chunks (256 a step)
  const nlohmann::json j = nlohmann::json::parse(sim_result_json(*r));
  EXPECT_EQ(j["over_context"], 2);
  p.max_context = 0;  // unknown: nothing fitted
  auto whole = simulate(test_config(), p, trace);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->over_context, 0);
}

TEST(Simulator, MoreLoadMeansHigherTtft) {
  const EngineConfig c = test_config();
  auto light = simulate(c, test_profile(), uniform_trace(200, 20, 128, 64));
  auto heavy = simulate(c, test_profile(), uniform_trace(200, 1, 128, 64));
  ASSERT_TRUE(light.ok() && heavy.ok());
  EXPECT_GT(cls(*heavy, "slow").ttft_p99_ms, 2 * cls(*light, "slow").ttft_p99_ms);
  EXPECT_GT(cls(*heavy, "fast").itl_p99_ms, cls(*light, "fast").itl_p99_ms);
  EXPECT_GT(heavy->end_ms, 0);
}

TEST(Simulator, SmallerKvCapacityPreempts) {
  EngineConfig c = test_config();
  const auto trace = uniform_trace(64, 1, 256, 256);
  auto big = simulate(c, test_profile(), trace);
  c.kv_blocks_per_worker = 200;  // 64 sequences of up to 32 pages do not fit
  auto small = simulate(c, test_profile(), trace);
  ASSERT_TRUE(big.ok() && small.ok());
  EXPECT_EQ(big->preemptions, 0);
  EXPECT_GT(small->preemptions, 0);
  EXPECT_EQ(small->recomputes, small->preemptions);  // no host tier: recompute only
  EXPECT_EQ(cls(*small, "fast").finished + cls(*small, "slow").finished, 64);
  // The high-priority class suffers less from the preemptions than the low one.
  EXPECT_LE(cls(*small, "fast").ttft_p99_ms, cls(*small, "slow").ttft_p99_ms);
  // With a host tier and swap: always, preemptions swap instead.
  c.temporal.host_capacity_mb = 64;
  c.temporal.swap = SwapMode::kAlways;
  auto swapped = simulate(c, test_profile(), trace);
  ASSERT_TRUE(swapped.ok());
  EXPECT_GT(swapped->swaps_out, 0);
  EXPECT_EQ(swapped->swaps_in, swapped->swaps_out);
}

EngineConfig pressure_config() {
  EngineConfig c = test_config();
  c.kv_policy = KvPolicy::kSemantic;
  c.semantic.semantic_threshold = 0.05f;
  c.semantic.evict_threshold = 0.0f;
  c.semantic.recent_tokens = 16;
  c.semantic.sink_tokens = 4;
  c.semantic.demote_after_steps = 1;
  c.semantic.score_interval = 1;
  c.kv_blocks_per_worker = 600;
  return c;
}

KvmRule raise_threshold_rule() {
  KvmRule r;
  r.name = "hot";
  r.when = {"device_kv_use", "", KvmCmp::kGreater, 0.8};
  r.exit = {"device_kv_use", "", KvmCmp::kLess, 0.3};
  r.then = {"semantic_threshold", KvmActionOp::kSet, 0.9};
  r.min = 0;
  r.max = 1;
  r.cooldown_ms = 50;
  return r;
}

// `off` with one rule doing `then` (enforce, every 10 ms): its first decision is refused with
// `error`, and the run's outcome is `base`'s (the rule-less run of `off`).
void expect_refused(EngineConfig off, const SimResult& base, const KvmAction& then,
                    const std::string& error, const std::vector<TraceRequest>& trace) {
  EngineConfig& on = off;
  on.kvm.enabled = true;
  on.kvm.interval_ms = 10;
  KvmRule r = raise_threshold_rule();
  r.then = then;
  r.min = KvmRule{}.min;  // unbounded: the setting's own range is what refuses
  r.max = KvmRule{}.max;
  on.kvm.rules = {r};
  auto got = simulate(on, test_profile(), trace);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_FALSE(got->decisions.empty());
  const KvmDecision& d = got->decisions.front();
  EXPECT_FALSE(d.applied);
  EXPECT_NE(d.error.find(error), std::string::npos) << d.error;
  EXPECT_EQ(got->preemptions, base.preemptions);
  EXPECT_DOUBLE_EQ(got->end_ms, base.end_ms);
}

// Decisions the engine refuses are refused here too (they were applied and reported applied):
// max_num_seqs multiplied beyond the worker's [1, 65536], and a semantic threshold the cut's
// validation refuses (evict_threshold at or above semantic_threshold). The outcome is the
// rule-less one. (A rule whose `=` value is outside the range is refused before the run.)
TEST(Simulator, DecisionsTheEngineRefusesAreRefused) {
  const auto trace = uniform_trace(48, 2, 512, 192);
  auto base = simulate(pressure_config(), test_profile(), trace);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  struct Case {
    KvmAction then;
    std::string error;
  } cases[] = {{{"max_num_seqs", KvmActionOp::kMul, 1e6}, "max_num_seqs: must be in [1, 65536]"},
               {{"evict_threshold", KvmActionOp::kAdd, 0.9},
                "semantic.evict_threshold: must be below semantic_threshold"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    expect_refused(pressure_config(), *base, c.then, c.error, trace);
  }
}

// A semantic `=` value, or the bound a rule moves towards, that the semantic cut's checks refuse
// beside the configured settings (evict_threshold at or above semantic_threshold) is refused
// before the run, with the engine's start-up error: such a rule passed --check-config and was
// refused at every swing.
TEST(Simulator, SemanticValuesRefusedBesideTheConfiguredOnesAreRefusedBeforeTheRun) {
  const auto trace = uniform_trace(48, 2, 512, 192);
  struct Case {
    KvmAction then;
    double max;
    std::string error;
  } cases[] = {
      {{"evict_threshold", KvmActionOp::kSet, 0.9}, 1, "kvm.rules[0] (hot): then: evict_threshold"},
      {{"evict_threshold", KvmActionOp::kAdd, 0.01},
       0.5,
       "kvm.rules[0] (hot): max: evict_threshold"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    EngineConfig on = pressure_config();
    on.kvm.enabled = true;
    KvmRule r = raise_threshold_rule();
    r.then = c.then;
    r.max = c.max;
    on.kvm.rules = {r};
    auto got = simulate(on, test_profile(), trace);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(c.error), std::string::npos) << got.status().message();
    EXPECT_NE(got.status().message().find("must be below semantic_threshold"), std::string::npos)
        << got.status().message();
  }
}

// Rules on a cut that is off are refused before the run, with the engine's start-up error,
// whatever the value: a semantic parameter the KV policy does not read, spatial_min_context
// or migrate_to_shard without shards.
TEST(Simulator, RulesOnACutThatIsOffAreRefusedBeforeTheRun) {
  const auto trace = uniform_trace(48, 2, 512, 192);
  struct Case {
    KvPolicy policy;
    KvmAction then;
    std::string error;
  } cases[] = {{KvPolicy::kFull,
                {"semantic_threshold", KvmActionOp::kSet, 0.5},
                "kvm.rules[0] (hot): then: semantic_threshold is not read under kv.policy full "
                "(the semantic cut is off"},
               {KvPolicy::kStreaming,
                {"score_interval", KvmActionOp::kSet, 2},
                "score_interval is not read under kv.policy streaming"},
               // H2O reads its scoring and window, not the ladder's thresholds (a rule on one
               // was logged as applied and changed nothing).
               {KvPolicy::kH2O,
                {"semantic_threshold", KvmActionOp::kSet, 0.5},
                "semantic_threshold is not read under kv.policy h2o"},
               {KvPolicy::kSemantic,
                {"spatial_min_context", KvmActionOp::kSet, 64},
                "spatial_min_context needs kv.cuts.spatial.shards > 1"},
               {KvPolicy::kSemantic,
                {"migrate_to_shard", KvmActionOp::kSet, 4},
                "migrate_to_shard needs kv.cuts.spatial.shards > 1"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    EngineConfig off = pressure_config();
    off.kv_policy = c.policy;
    ASSERT_TRUE(simulate(off, test_profile(), trace).ok());
    off.kvm.enabled = true;
    KvmRule r = raise_threshold_rule();
    r.then = c.then;
    r.min = KvmRule{}.min;
    r.max = KvmRule{}.max;
    off.kvm.rules = {r};
    auto got = simulate(off, test_profile(), trace);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(c.error), std::string::npos) << got.status().message();
  }
  // Streaming reads recent_tokens (its window): a rule on it runs.
  EngineConfig streaming = pressure_config();
  streaming.kv_policy = KvPolicy::kStreaming;
  streaming.kvm.enabled = true;
  KvmRule r = raise_threshold_rule();
  r.then = {"recent_tokens", KvmActionOp::kSet, 16};
  r.min = KvmRule{}.min;
  r.max = KvmRule{}.max;
  streaming.kvm.rules = {r};
  auto ran = simulate(streaming, test_profile(), trace);
  EXPECT_TRUE(ran.ok()) << ran.status().to_string();
}

// A class's semantic values start from the configured settings, as in the engine, not from the
// engine-wide values of the moment: an engine-wide evict_threshold raised to 0.04 does not make
// a class's semantic_threshold of 0.03 a refused order (the class keeps its configured 0).
TEST(Simulator, AClassSemanticDecisionStartsFromTheConfiguredSettings) {
  EngineConfig on = pressure_config();  // semantic 0.05, evict 0
  on.kvm.enabled = true;
  on.kvm.interval_ms = 10;
  KvmRule global = raise_threshold_rule();
  global.name = "evict";
  global.then = {"evict_threshold", KvmActionOp::kSet, 0.04};
  KvmRule cls = raise_threshold_rule();
  cls.name = "cls";
  cls.sla_class = "slow";
  cls.then = {"semantic_threshold", KvmActionOp::kSet, 0.03};
  on.kvm.rules = {global, cls};
  auto got = simulate(on, test_profile(), uniform_trace(48, 2, 512, 192));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_GE(got->decisions.size(), 2u);
  EXPECT_EQ(got->decisions[0].rule, "evict");
  EXPECT_TRUE(got->decisions[0].applied);
  EXPECT_EQ(got->decisions[1].rule, "cls");
  EXPECT_TRUE(got->decisions[1].applied) << got->decisions[1].error;
}

// As in the engine (KvCacheManager::adopt_class_settings): a class's first semantic setting gives
// it a block of its own, a copy of the configured one, and engine-wide rules no longer reach it, so
// a later class rule on another parameter starts from the configured value (0.05), not from the
// engine-wide 0.9 an engine-wide rule had set.
TEST(Simulator, AClassFirstSemanticSettingCopiesTheConfiguredBlock) {
  EngineConfig on = pressure_config();  // semantic 0.05, evict 0
  on.kvm.enabled = true;
  on.kvm.interval_ms = 10;
  KvmRule global = raise_threshold_rule();  // engine-wide semantic_threshold = 0.9
  global.name = "global";
  KvmRule evict = raise_threshold_rule();
  evict.name = "evict";
  evict.sla_class = "slow";
  evict.then = {"evict_threshold", KvmActionOp::kSet, 0.01};
  KvmRule raise = raise_threshold_rule();
  raise.name = "raise";
  raise.sla_class = "slow";
  raise.then = {"semantic_threshold", KvmActionOp::kAdd, 0.1};
  on.kvm.rules = {global, evict, raise};
  auto got = simulate(on, test_profile(), uniform_trace(48, 2, 512, 192));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_GE(got->decisions.size(), 3u);
  const KvmDecision& d = got->decisions[2];
  EXPECT_EQ(d.rule, "raise");
  EXPECT_NEAR(d.before, 0.05, 1e-6);
  EXPECT_NEAR(d.after, 0.15, 1e-6);
  EXPECT_TRUE(d.applied) << d.error;
}

// An exit that changes nothing (a one-shot action's exit-keep) is applied, as the engine counts
// it, not refused against the action's own range (migrate_to_shard's 0 at exit).
TEST(Simulator, AOneShotExitIsApplied) {
  EngineConfig on = pressure_config();
  on.spatial.shards = 2;
  on.kvm.enabled = true;
  on.kvm.interval_ms = 10;
  KvmRule r = raise_threshold_rule();
  r.then = {"migrate_to_shard", KvmActionOp::kSet, 4};
  on.kvm.rules = {r};
  auto got = simulate(on, test_profile(), uniform_trace(48, 2, 512, 192));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  int exits = 0;
  for (const KvmDecision& d : got->decisions) {
    if (d.action != "exit-keep") continue;
    ++exits;
    EXPECT_TRUE(d.applied) << d.error;
  }
  EXPECT_GT(exits, 0);
}

// A class's own semantic settings (SlaClass::semantic) are the ones its requests' pages follow,
// the steps before demotion and the sinks included: every class holding off demotion runs as an
// engine-wide hold-off does, not as the engine-wide settings would.
TEST(Simulator, AClassOwnSemanticSettingsApplyToItsRequests) {
  const auto trace = uniform_trace(48, 2, 512, 192);
  EngineConfig engine_wide = pressure_config();
  auto base = simulate(engine_wide, test_profile(), trace);
  engine_wide.semantic.demote_after_steps = 100000;
  engine_wide.semantic.sink_tokens = 10000;
  auto held = simulate(engine_wide, test_profile(), trace);
  EngineConfig per_class = pressure_config();
  for (SlaClass& sc : per_class.sla_classes) sc.semantic = engine_wide.semantic;
  auto got = simulate(per_class, test_profile(), trace);
  ASSERT_TRUE(base.ok() && held.ok() && got.ok());
  EXPECT_NE(held->preemptions, base->preemptions) << "the hold-off changes nothing here";
  EXPECT_EQ(got->preemptions, held->preemptions);
  EXPECT_DOUBLE_EQ(got->end_ms, held->end_ms);
}

TEST(Simulator, DeviceUseRuleRaisesSemanticThresholdAndFreesCapacity) {
  const auto trace = uniform_trace(48, 2, 512, 192);
  EngineConfig off = pressure_config();
  auto base = simulate(off, test_profile(), trace);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  EXPECT_TRUE(base->decisions.empty());
  ASSERT_GT(base->preemptions, 0);  // the spike overflows the pool with the low threshold

  EngineConfig on = pressure_config();
  on.kvm.enabled = true;
  on.kvm.interval_ms = 10;
  on.kvm.rules = {raise_threshold_rule()};
  auto kvm = simulate(on, test_profile(), trace);
  ASSERT_TRUE(kvm.ok()) << kvm.status().to_string();
  ASSERT_FALSE(kvm->decisions.empty());
  const KvmDecision& d = kvm->decisions.front();
  EXPECT_EQ(d.rule, "hot");
  EXPECT_EQ(d.action, "enter");
  EXPECT_EQ(d.param, "semantic_threshold");
  EXPECT_NEAR(d.before, 0.05, 1e-6);
  EXPECT_NEAR(d.after, 0.9, 1e-9);
  EXPECT_TRUE(d.applied);
  EXPECT_NE(d.monitors.find("device_kv_use"), std::string::npos);
  // Demoted pages free room: fewer preemptions and an earlier finish.
  EXPECT_LT(kvm->preemptions, base->preemptions);
  EXPECT_LT(kvm->end_ms, base->end_ms);
  // The rule exits when the pressure drops at the end.
  EXPECT_EQ(kvm->decisions.back().action.rfind("exit", 0), 0u) << kvm->decisions.back().action;

  // Dry-run: the same decisions are listed, none applied, and the outcome is the rule-less one.
  on.kvm.mode = KvmMode::kDryRun;
  auto dry = simulate(on, test_profile(), trace);
  ASSERT_TRUE(dry.ok());
  ASSERT_FALSE(dry->decisions.empty());
  for (const KvmDecision& x : dry->decisions) EXPECT_FALSE(x.applied);
  EXPECT_EQ(dry->preemptions, base->preemptions);
  EXPECT_DOUBLE_EQ(dry->end_ms, base->end_ms);
}

TEST(Simulator, DeterministicOutput) {
  EngineConfig on = pressure_config();
  on.kvm.enabled = true;
  on.kvm.rules = {raise_threshold_rule()};
  PhasedTraceOptions o;
  o.calm_ms = 2000;
  o.spike_ms = 2000;
  o.interactive_class = "fast";
  o.batch_class = "slow";
  const auto trace = make_phased_trace(o);
  auto a = simulate(on, test_profile(), trace);
  auto b = simulate(on, test_profile(), trace);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(sim_result_json(*a), sim_result_json(*b));
  EXPECT_GT(cls(*a, "fast").requests + cls(*a, "slow").requests, 0);
}

TEST(Simulator, BadTraceClassAndBadRuleAreNamed) {
  std::vector<TraceRequest> t = uniform_trace(2, 1, 8, 8);
  t[1].sla_class = "nope";
  t[1].line = 7;
  auto r = simulate(test_config(), test_profile(), t);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("trace line 7: class: unknown SLA class 'nope'"),
            std::string::npos)
      << r.status().message();

  EngineConfig c = test_config();
  c.kvm.enabled = true;
  KvmRule bad = raise_threshold_rule();
  bad.then.param = "semantic_treshold";
  c.kvm.rules = {bad};
  auto rr = simulate(c, test_profile(), uniform_trace(2, 1, 8, 8));
  ASSERT_FALSE(rr.ok());
  EXPECT_NE(rr.status().message().find("hot"), std::string::npos) << rr.status().message();
}

// A far-off arrival (1e12 ms hung: every sample up to it was replayed) is a clear error when
// it is more than 1e7 samples away; at a coarser interval the same trace runs.
TEST(Simulator, SamplesUpToTheLastArrivalAreBounded) {
  std::vector<TraceRequest> t = uniform_trace(2, 1, 8, 8);
  t[1].arrival_ms = 9e8;
  EngineConfig c = test_config();
  c.kvm.interval_ms = 1;
  auto far = simulate(c, test_profile(), t);
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(far.status().message().find("more than 10000000"), std::string::npos)
      << far.status().message();
  c.kvm.interval_ms = 1000;  // 9e5 samples
  auto r = simulate(c, test_profile(), t);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

// The samples while the run lasts are bounded too: a profile pricing a step in days (or at an
// infinite cost) is a clear error, not a loop that samples without end.
TEST(Simulator, SamplesWhileTheRunLastsAreBounded) {
  for (const double base_ms : {1e12, 1e308}) {
    EngineProfile p = test_profile();
    p.step_base_ms = base_ms;
    EngineConfig c = test_config();
    c.kvm.interval_ms = 1;
    auto r = simulate(c, p, uniform_trace(2, 1, 8, 8));
    ASSERT_FALSE(r.ok()) << base_ms;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("samples of kvm.interval_ms after the last arrival"),
              std::string::npos)
        << r.status().message();
  }
  // The samples before the last arrival count against the arrival bound only: a trace near that
  // bound whose run goes on a while still runs (the run-time bound counted them too).
  EngineProfile p = test_profile();
  p.step_base_ms = 100;
  EngineConfig c = test_config();
  c.kvm.interval_ms = 1;
  std::vector<TraceRequest> t = uniform_trace(2, 1, 8, 8);
  t[1].arrival_ms = 9.99e6;
  t[1].output_tokens = 200;
  auto near = simulate(c, p, t);
  ASSERT_TRUE(near.ok()) << near.status().to_string();
}

TEST(Simulator, DisaggregatedFinishesEveryRequestAndPaysTheHandoff) {
  EngineConfig c = test_config();
  c.mode = ServingMode::kDisaggregated;
  c.num_prefill_workers = 1;
  c.num_decode_workers = 1;
  c.kv_blocks_per_worker = 64;  // decode pool: preemptions that go back to the prefill worker
  const auto trace = uniform_trace(40, 3, 256, 128);
  auto r = simulate(c, test_profile(), trace);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(cls(*r, "fast").finished, 20);
  EXPECT_EQ(cls(*r, "slow").finished, 20);
  EXPECT_GT(r->recomputes, 0);
  // One request alone: TTFT is its prefill step on the prefill worker (the handoff comes after).
  auto one = simulate(c, test_profile(), uniform_trace(1, 1, 100, 4));
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(cls(*one, "fast").ttft_p50_ms, 2.0, 1e-9);
  // Its 3 decode tokens wait for the KV copy (7 pages of 16 tokens * 100 bytes / 1e5 bytes/ms =
  // 0.112 ms), then a decode step each (1 + 0.1 + 0.001 * kv).
  EXPECT_NEAR(cls(*one, "fast").itl_p50_ms, (0.112 + 3 * 1.1 + 0.001 * (100 + 101 + 102)) / 3,
              1e-9);
}

TEST(Simulator, MaxQueueRejects) {
  EngineConfig c = test_config();
  c.max_num_seqs = 1;
  c.sla_classes[1].max_queue = 2;
  auto r = simulate(c, test_profile(), uniform_trace(20, 0.01, 64, 64));
  ASSERT_TRUE(r.ok());
  EXPECT_GT(cls(*r, "slow").rejected, 0);
  EXPECT_EQ(cls(*r, "fast").rejected, 0);
  EXPECT_LT(cls(*r, "slow").attainment, 1.0);
}

// The per-request predictions (policy simulate --write-requests) agree with the class summaries:
// arrival order, every request once, rejected ones not ok, and the percentiles recomputed from
// them; preemptions add up to the run's.
TEST(Simulator, PerRequestOutcomesMatchTheClassSummaries) {
  EngineConfig c = test_config();
  c.kv_blocks_per_worker = 200;
  c.sla_classes[1].max_queue = 8;
  std::vector<TraceRequest> trace = uniform_trace(64, 1, 256, 256);
  std::reverse(trace.begin(), trace.end());  // the file's order is not the arrival order
  auto r = simulate(c, test_profile(), trace);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->requests.size(), trace.size());
  EXPECT_GT(r->preemptions, 0);
  EXPECT_GT(cls(*r, "slow").rejected, 0);
  int64_t preemptions = 0;
  std::map<std::string, std::vector<double>> ttft, itl;
  std::map<std::string, int64_t> finished;
  for (size_t k = 0; k < r->requests.size(); ++k) {
    const RequestOutcome& o = r->requests[k];
    EXPECT_EQ(o.index, static_cast<int64_t>(k));
    if (k > 0) {
      EXPECT_LE(r->requests[k - 1].arrival_ms, o.arrival_ms);
    }
    EXPECT_EQ(o.prompt_tokens, 256);
    preemptions += o.preemptions;
    if (!o.ok) continue;
    finished[o.sla_class]++;
    EXPECT_GE(o.e2e_ms, o.ttft_ms);
    ttft[o.sla_class].push_back(o.ttft_ms);
    itl[o.sla_class].push_back(o.mean_itl_ms);
  }
  EXPECT_EQ(preemptions, r->preemptions);
  for (const char* name : {"fast", "slow"}) {
    EXPECT_EQ(finished[name], cls(*r, name).finished) << name;
    EXPECT_DOUBLE_EQ(sim_detail::percentile(ttft[name], 99), cls(*r, name).ttft_p99_ms) << name;
    EXPECT_DOUBLE_EQ(sim_detail::percentile(itl[name], 50), cls(*r, name).itl_p50_ms) << name;
  }
  const std::string text = format_outcomes(r->requests);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 64);
  const auto first = nlohmann::json::parse(text.substr(0, text.find('\n')));
  EXPECT_EQ(first.at("index"), 0);
  EXPECT_EQ(first.at("arrival_ms"), 0.0);
  EXPECT_EQ(first.at("class"), "fast");
  EXPECT_EQ(first.at("prompt_tokens"), 256);
  EXPECT_EQ(first.at("ok"), true);
  EXPECT_DOUBLE_EQ(first.at("ttft_ms").get<double>(), r->requests[0].ttft_ms);
  EXPECT_EQ(first.at("preemptions"), r->requests[0].preemptions);
  EXPECT_NE(text.find("\"ok\":false"), std::string::npos);
}

// queue_wait_ms (the oldest queued request's wait) is sampled in the model as in the engine: a rule
// on it caps the slow class's queue once its backlog has waited, so later slow requests are
// rejected, where without the rule none is.
TEST(Simulator, QueueWaitRuleCapsTheBacklog) {
  EngineConfig c = test_config();
  c.max_num_seqs = 1;
  const auto trace = uniform_trace(40, 2, 64, 64);
  auto off = simulate(c, test_profile(), trace);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(cls(*off, "slow").rejected, 0);
  KvmRule r;
  r.name = "wait";
  r.when = {"queue_wait_ms", "slow", KvmCmp::kGreater, 30};
  r.exit = {"queue_wait_ms", "slow", KvmCmp::kLess, 1};
  r.then = {"max_queue", KvmActionOp::kSet, 2};
  r.sla_class = "slow";
  r.cooldown_ms = 0;
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  c.kvm.rules = {r};
  auto on = simulate(c, test_profile(), trace);
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  ASSERT_FALSE(on->decisions.empty());
  EXPECT_EQ(on->decisions[0].action, "enter");
  EXPECT_NE(on->decisions[0].monitors.find("queue_wait_ms[slow]="), std::string::npos)
      << on->decisions[0].monitors;
  // Entered once the oldest slow request had waited over 30 ms, on a 10 ms sample.
  EXPECT_GE(on->decisions[0].time_ms, 30);
  EXPECT_GT(cls(*on, "slow").rejected, 0);
  EXPECT_EQ(cls(*on, "fast").rejected, 0);
}

TEST(Simulator, JsonShape) {
  auto r = simulate(test_config(), test_profile(), uniform_trace(4, 1, 8, 8));
  ASSERT_TRUE(r.ok());
  const std::string j = sim_result_json(*r);
  EXPECT_EQ(j.find('\n'), std::string::npos);
  EXPECT_NE(j.find("\"classes\":{\"fast\":{"), std::string::npos) << j;
  EXPECT_NE(j.find("\"ttft_p99_ms\""), std::string::npos);
  EXPECT_NE(j.find("\"decisions\":[]"), std::string::npos);
}

// kv_quant_fraction: the semantic cut's device budget is split as the engine splits it
// (SequenceCut::split_budget): 1 MiB of 20 KiB blocks (1280 B per token x 16) with a quarter for
// the arenas gives 38 full blocks, 12 int8 pages (6400 B + a 640 B f16 key summary) and 30 int4
// pages (4480 B + two summaries). Pages demoted into the arenas free full blocks, so with a high
// threshold more sequences decode at once than with the whole budget as full blocks and no cut;
// with nothing demoted, fewer do (the arenas took a quarter of the budget).
TEST(Simulator, QuantFractionSplitsTheBudgetAndDemotionAdmitsMore) {
  EngineProfile p = test_profile();
  p.kv_bytes_per_token_full = 1280;
  p.kv_bytes_per_token_int8 = 400;
  p.kv_bytes_per_token_int4 = 280;
  EngineConfig full = test_config();
  full.block_size = 16;
  full.kv_blocks_per_worker = 0;
  full.kv_capacity_bytes = 1 << 20;
  EngineConfig split = full;
  split.kv_policy = KvPolicy::kSemantic;
  split.kv_quant_fraction = 0.25;
  split.semantic.sink_tokens = 4;
  split.semantic.recent_tokens = 16;
  split.semantic.demote_after_steps = 1;
  split.semantic.evict_after_steps = 1000000;
  split.semantic.score_interval = 1;
  split.semantic.evict_threshold = 0;
  // 24 requests of 96 + 160 tokens at once: 16 pages each at the end, 384 in all.
  const auto trace = uniform_trace(24, 0.01, 96, 160);

  auto f = simulate(full, p, trace);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->kv_blocks_per_worker, 51);
  EXPECT_EQ(f->int8_pages_per_worker, 0);

  split.semantic.semantic_threshold = 0.9f;
  auto demoting = simulate(split, p, trace);
  ASSERT_TRUE(demoting.ok()) << demoting.status().to_string();
  EXPECT_EQ(demoting->kv_blocks_per_worker, 38);
  EXPECT_EQ(demoting->int8_pages_per_worker, 12);
  EXPECT_EQ(demoting->int4_pages_per_worker, 30);
  EXPECT_GT(demoting->peak_running, f->peak_running);
  EXPECT_LT(demoting->preemptions, f->preemptions);

  split.semantic.semantic_threshold = 0;  // nothing demoted: 38 blocks against 51
  auto idle_cut = simulate(split, p, trace);
  ASSERT_TRUE(idle_cut.ok());
  EXPECT_LT(idle_cut->peak_running, f->peak_running);
  for (const SimResult* r : {&*f, &*demoting, &*idle_cut}) {
    EXPECT_EQ(cls(*r, "fast").finished + cls(*r, "slow").finished, 24);
  }

  // Without kv_quant_fraction the arenas come on top: the full pool keeps the whole budget.
  split.kv_quant_fraction = 0;
  auto on_top = simulate(split, p, trace);
  ASSERT_TRUE(on_top.ok());
  EXPECT_EQ(on_top->kv_blocks_per_worker, 51);
  EXPECT_EQ(on_top->int8_pages_per_worker, 51);

  // Summaries in 2 parts: 1280 B each, so the quarter holds 11 int8 pages (6400 + 1280 B) and 25
  // int4 pages (4480 + 2 x 1280 B), as SequenceCut::split_budget sizes them.
  split.kv_quant_fraction = 0.25;
  split.semantic.summary_parts = 2;
  auto parts = simulate(split, p, trace);
  ASSERT_TRUE(parts.ok()) << parts.status().to_string();
  EXPECT_EQ(parts->kv_blocks_per_worker, 38);
  EXPECT_EQ(parts->int8_pages_per_worker, 11);
  EXPECT_EQ(parts->int4_pages_per_worker, 25);
}

// Fair prefill (common::plan_fair_prefill, the Scheduler's rule): a short prompt arriving behind a
// long one is prefilled first (shortest remaining first), and with a max_chunk_tokens cap the
// long prompt's chunk shrinks while the short one has a chunk, so the short prompt's first token
// comes sooner and the long prompt's later, as the engine's cap does (docs/kv-cuts.md).
TEST(Simulator, MaxChunkTokensCapShortensTheShortPromptsTtft) {
  EngineProfile p = test_profile();
  p.prefill_ms_per_kv_token = 0.0005;  // attention grows with the chunk's context
  EngineConfig c = test_config();
  c.block_size = 16;
  c.max_batch_tokens = 512;
  // Same class: the long prompt at 0, a short one while its first chunk runs.
  std::vector<TraceRequest> t = {{0, 4000, 4, "slow"}, {1, 32, 4, "slow"}};
  auto ttft = [&](const SimResult& r, bool short_one) {
    // The class's p50 / p99 of two requests: the smaller is the short prompt's.
    return short_one ? cls(r, "slow").ttft_p50_ms : cls(r, "slow").ttft_p99_ms;
  };
  c.max_chunk_tokens = 0;
  auto uncapped = simulate(c, p, t);
  ASSERT_TRUE(uncapped.ok()) << uncapped.status().to_string();
  // Shortest remaining first: the short prompt finishes long before the 4000-token one.
  EXPECT_LT(ttft(*uncapped, true), ttft(*uncapped, false) / 4);
  c.max_chunk_tokens = 64;
  auto capped = simulate(c, p, t);
  ASSERT_TRUE(capped.ok());
  EXPECT_LT(ttft(*capped, true), ttft(*uncapped, true));
  EXPECT_GT(ttft(*capped, false), ttft(*uncapped, false));
  EXPECT_GT(capped->steps, uncapped->steps);

  // The KVM moves it too: a rule that sets the cap gives the capped run's latencies.
  c.max_chunk_tokens = 0;
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  KvmRule cap;
  cap.name = "cap";
  cap.when = {"device_kv_use", "", KvmCmp::kGreaterEqual, 0.0};
  cap.exit = {"device_kv_use", "", KvmCmp::kLess, 0.0};
  cap.then = {"max_chunk_tokens", KvmActionOp::kSet, 64};
  c.kvm.rules = {cap};
  std::vector<TraceRequest> later = t;
  for (TraceRequest& r : later) r.arrival_ms += 20;  // after the first sample
  auto ruled = simulate(c, p, later);
  ASSERT_TRUE(ruled.ok()) << ruled.status().to_string();
  ASSERT_FALSE(ruled->decisions.empty());
  EXPECT_EQ(ruled->decisions[0].param, "max_chunk_tokens");
  EXPECT_NEAR(ttft(*ruled, true), ttft(*capped, true), 1e-9);
  EXPECT_NEAR(ttft(*ruled, false), ttft(*capped, false), 1e-9);

  // The time-based cap: 1 ms of fixed cost and 0.01 ms a prompt token, so a 1.64 ms budget fits
  // 64 tokens when nothing decodes (fewer beside the short request's decode rows): it caps as the
  // token cap does, the long prompt's first chunk alike.
  c.kvm.enabled = false;
  c.kvm.rules.clear();
  c.max_chunk_ms = 1.0 + 0.01 * 64 + 0.001;
  auto timed = simulate(c, p, t);
  ASSERT_TRUE(timed.ok()) << timed.status().to_string();
  EXPECT_NEAR(ttft(*timed, true), ttft(*capped, true), 1e-9);
  EXPECT_GE(ttft(*timed, false), ttft(*capped, false));
  EXPECT_GE(timed->steps, capped->steps);
  // A rule that sets the time cap plans as the configured one.
  const double budget_ms = c.max_chunk_ms;
  c.max_chunk_ms = 0;
  c.kvm.enabled = true;
  cap.then = {"max_chunk_ms", KvmActionOp::kSet, budget_ms};
  c.kvm.rules = {cap};
  auto timed_rule = simulate(c, p, later);
  auto timed_later = [&] {
    EngineConfig fixed = c;
    fixed.kvm.enabled = false;
    fixed.kvm.rules.clear();
    fixed.max_chunk_ms = budget_ms;
    return simulate(fixed, p, later);
  }();
  ASSERT_TRUE(timed_rule.ok() && timed_later.ok()) << timed_rule.status().to_string();
  ASSERT_FALSE(timed_rule->decisions.empty());
  EXPECT_EQ(timed_rule->decisions[0].param, "max_chunk_ms");
  EXPECT_NEAR(ttft(*timed_rule, true), ttft(*timed_later, true), 1e-9);
  EXPECT_NEAR(ttft(*timed_rule, false), ttft(*timed_later, false), 1e-9);
  c.kvm.enabled = false;
  c.kvm.rules.clear();
  // A budget above any step's cost caps nothing; fair prefill's yield still holds (the long prompt
  // sits out the short one's step: one step's fixed cost later than uncapped).
  c.max_chunk_ms = 1e5;
  auto loose = simulate(c, p, t);
  ASSERT_TRUE(loose.ok());
  EXPECT_LT(ttft(*loose, false), ttft(*timed, false));
  EXPECT_NEAR(ttft(*loose, false), ttft(*uncapped, false), 1.0 + 1e-9);
  // pools.max_chunk_ms: auto: a step's budget is the tightest max_itl_ms of the classes of the
  // requests it serves. With their class's at the budget above, the plan is the configured
  // budget's.
  c.max_chunk_ms = 0;
  c.max_chunk_ms_auto = true;
  c.sla_classes[1].max_itl_ms = budget_ms;  // "slow", both requests' class
  auto itl_capped = simulate(c, p, t);
  ASSERT_TRUE(itl_capped.ok()) << itl_capped.status().to_string();
  EXPECT_EQ(itl_capped->steps, timed->steps);
  EXPECT_NEAR(ttft(*itl_capped, true), ttft(*timed, true), 1e-9);
  EXPECT_NEAR(ttft(*itl_capped, false), ttft(*timed, false), 1e-9);
  c.sla_classes[1].max_itl_ms = 1e5;
  auto itl_loose = simulate(c, p, t);
  ASSERT_TRUE(itl_loose.ok());
  EXPECT_NEAR(ttft(*itl_loose, false), ttft(*uncapped, false), 1.0 + 1e-9);
}

// A colocated step's decode rows come out of the prefill budget (decode_in_budget), and the
// profile's step_overhead_ms is paid once per step.
TEST(Simulator, DecodeRowsShareTheBudgetAndTheFixedCostIsPerStep) {
  EngineConfig c = test_config();
  EngineProfile p = test_profile();
  // One request alone: its prefill step is its TTFT, plus the fixed cost.
  p.step_overhead_ms = 0.25;
  auto one = simulate(c, p, uniform_trace(1, 1, 64, 4));
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(cls(*one, "fast").ttft_p50_ms, 1.64 + 0.25, 1e-9);
  EXPECT_NEAR(cls(*one, "fast").itl_p50_ms, (3 * 1.35 + 0.001 * (64 + 65 + 66)) / 3, 1e-9);
  // 64 decoding sequences leave a budget of max(80 - 64, 16) = 16 tokens: a 256-token prompt
  // takes 16 steps of at least 1 + 64 x 0.1 ms (80 tokens a step would take 4).
  p.step_overhead_ms = 0;
  c.max_batch_tokens = 80;
  c.max_num_seqs = 128;
  std::vector<TraceRequest> t = uniform_trace(64, 0.001, 16, 400);
  for (TraceRequest& r : t) r.sla_class = "fast";
  t.push_back({200, 256, 2, "slow"});
  auto r = simulate(c, p, t);
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->peak_running, 64);
  EXPECT_GT(cls(*r, "slow").ttft_p50_ms, 16 * 7.4);
}

}  // namespace
}  // namespace kvsplit::kvm
