// The KV cache manager in the engine (docs/kvm.md): under memory pressure its device-use rule
// raises the semantic threshold, pages are demoted, and the rule exits (restoring the threshold)
// when pressure drops; every step is in the decisions (stats and the JSON decision log). Dry-run
// decides the same and changes nothing. A policy reload under load drops no request, a bad
// policy keeps the old one, class rules move only their class, and the SetCutParams command
// checks what it is given.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"
#include "engine/start_together.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

// Never demotes by itself: any demotion comes from the KVM raising semantic_threshold.
SemanticCutConfig quiet_semantic() {
  SemanticCutConfig c;
  c.semantic_threshold = 0.f;
  c.evict_threshold = 0.f;
  c.demote_after_steps = 1;
  c.evict_after_steps = 1000000;
  c.score_interval = 1;
  c.sink_tokens = 4;
  c.recent_tokens = 16;
  return c;
}

KvmRule pressure_rule(double enter, double exit) {
  KvmRule r;
  r.name = "device-pressure";
  r.when = {"device_kv_use", "", KvmCmp::kGreater, enter};
  r.exit = {"device_kv_use", "", KvmCmp::kLess, exit};
  r.then = {"semantic_threshold", KvmActionOp::kAdd, 0.5};
  r.min = 0;
  r.max = 0.99;
  r.cooldown_ms = 20;
  return r;
}

// Colocated, one worker with a small pool (40 blocks of 16 tokens) that the requests fill.
// A rule that enters at the first sample and never exits or repeats: `then` applied once.
KvmRule once_rule(const std::string& name, KvmAction then, const std::string& cls = "") {
  KvmRule r;
  r.name = name;
  r.when = {"device_kv_use", "", KvmCmp::kGreaterEqual, 0.0};  // holds from the first sample
  r.exit = {"device_kv_use", "", KvmCmp::kLess, 0.0};          // never
  r.then = std::move(then);
  r.sla_class = cls;
  r.cooldown_ms = 1e9;
  return r;
}

EngineConfig pressure_config(KvmMode mode, const std::string& log_path) {
  EngineConfig c = testing::stories_config(ServingMode::kColocated);
  c.block_size = 16;
  c.kv_blocks_per_worker = 40;
  c.kv_policy = KvPolicy::kSemantic;
  c.semantic = quiet_semantic();
  c.kvm.enabled = true;
  c.kvm.mode = mode;
  c.kvm.interval_ms = 10;
  c.kvm.decision_log = log_path;
  c.kvm.rules = {pressure_rule(0.5, 0.1)};
  return c;
}

std::vector<RequestHandle> submit_long(Engine& e, int n, int max_tokens,
                                       const std::string& cls = "") {
  const char* prompts[] = {"Once upon a time", "Lily wanted to", "The dog", "Tom and his mom"};
  std::vector<RequestHandle> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.request_id = fmt::format("{}r{}", cls, i);
    r.prompt = prompts[i % 4];
    r.sampling.temperature = 0.f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sla_class = cls;
    auto h = e.submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) out.push_back(*h);
  }
  return out;
}

void expect_all_finished(std::vector<RequestHandle>& hs) {
  for (RequestHandle& h : hs) {
    const Collected c = collect(h, std::chrono::seconds(300));
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.finals, 1);
    EXPECT_TRUE(c.final_event.status.ok()) << c.final_event.status.to_string();
    EXPECT_EQ(c.final_event.finish_reason, FinishReason::kLength);
  }
}

// Waits (bounded) until the manager has logged a decision matching `pred`.
template <typename Pred>
bool wait_for_decision(const Engine& e, Pred pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const KvmDecision& d : e.stats().kvm_decisions)
      if (pred(d)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Makes the pressure last until the manager has seen it. The caller holds the worker's forward
// passes (hold_forward) before it submits the requests; this steps the worker one step at a time
// until they hold more than `use` of its blocks, then, still held on that step boundary (no
// forward pass: the KV stays; housekeeping and the manager's commands go on), waits until a
// decision matching `pred` is logged, and lets it go on. (Polled from a worker running freely,
// the requests could finish between two samples on a slow machine, or the hold come late.)
void hold_forward(EngineImpl& e) {
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
}

template <typename Pred>
bool hold_until_decided(EngineImpl& e, double use, Pred pred) {
  const bool held = testing::step_until(e, 0, [&] {
    const PoolStats p = e.stats().pools.at(0);
    return p.kv_blocks_total > 0 && p.kv_blocks_total - p.kv_blocks_free > use * p.kv_blocks_total;
  });
  EXPECT_TRUE(held) << "the requests never held more than " << use << " of the blocks";
  const bool decided = held && wait_for_decision(e, pred);
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  return decided;
}

double param_value(const EngineStats& s, const std::string& p, const std::string& cls = "") {
  for (const EngineStats::KvmParam& k : s.kvm_params)
    if (k.param == p && k.sla_class == cls) return k.value;
  return -1;
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("kvsplit-{}-{}.jsonl", name, static_cast<long>(::getpid())))
      .string();
}

int64_t demotions(const EngineStats& s) {
  int64_t n = 0;
  for (const PoolStats& p : s.pools) n += p.kv_demotions;
  return n;
}

TEST(EngineKvm, PressureRaisesThresholdDemotesAndExits) {
  KVSPLIT_REQUIRE_MODELS();
  // Control: the same load without the manager demotes nothing (threshold 0).
  {
    EngineConfig c = pressure_config(KvmMode::kEnforce, "");
    c.kvm = KvmConfig{};
    auto e = EngineImpl::create(c);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto hs = submit_long(**e, 4, 150);
    expect_all_finished(hs);
    EXPECT_EQ(demotions((*e)->stats()), 0);
    EXPECT_FALSE((*e)->stats().kvm_enabled);
  }
  const std::string log = temp_path("kvm-pressure");
  std::remove(log.c_str());
  EngineConfig c = pressure_config(KvmMode::kEnforce, log);
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const std::vector<int> free0 = testing::free_blocks(**e);
  hold_forward(**e);
  auto hs = submit_long(**e, 4, 150);
  ASSERT_TRUE(
      hold_until_decided(**e, 0.6, [](const KvmDecision& d) { return d.action == "enter"; }));
  expect_all_finished(hs);
  ASSERT_TRUE(testing::pools_back_to(**e, free0));
  // Pressure is gone: the rule exits and restores the threshold.
  ASSERT_TRUE(wait_for_decision(**e, [](const KvmDecision& d) { return d.action == "exit"; }));
  const EngineStats s = (*e)->stats();
  EXPECT_TRUE(s.kvm_enabled);
  EXPECT_GT(demotions(s), 0) << "the raised threshold demoted nothing";
  EXPECT_DOUBLE_EQ(param_value(s, "semantic_threshold"), 0.0);
  EXPECT_DOUBLE_EQ(param_value(s, "recall_wait_ms"), c.semantic.recall_wait_ms);  // a rule target
  EXPECT_DOUBLE_EQ(param_value(s, "max_recalls_per_step"), c.semantic.max_recalls_per_step);
  EXPECT_DOUBLE_EQ(param_value(s, "recall_precision"), 0.0);  // full
  // The decisions: enter (0 -> 0.5), maybe a repeat (-> 0.99), then exit (back to 0), in order.
  std::vector<KvmDecision> ds(s.kvm_decisions.begin(), s.kvm_decisions.end());
  ASSERT_GE(ds.size(), 2u);
  EXPECT_EQ(ds.front().action, "enter");
  EXPECT_EQ(ds.front().rule, "device-pressure");
  EXPECT_DOUBLE_EQ(ds.front().before, 0.0);
  EXPECT_DOUBLE_EQ(ds.front().after, 0.5);
  EXPECT_TRUE(ds.front().applied);
  EXPECT_NE(ds.front().monitors.find("device_kv_use="), std::string::npos);
  EXPECT_EQ(ds.back().action, "exit");
  EXPECT_DOUBLE_EQ(ds.back().after, 0.0);
  for (const KvmDecision& d : ds) EXPECT_LE(d.after, 0.99 + 1e-9);
  // The JSON log has the same decisions, one parsable line each.
  (*e)->shutdown(std::chrono::milliseconds(0));
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["rule"], "device-pressure");
    EXPECT_EQ(j["mode"], "enforce");
    EXPECT_TRUE(j["monitors"].contains("device_kv_use"));
    ++lines;
  }
  EXPECT_EQ(lines, static_cast<int>(s.kvm_decisions_total));
  std::remove(log.c_str());
}

TEST(EngineKvm, DryRunDecidesButChangesNothing) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kDryRun, "");
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  hold_forward(**e);
  auto hs = submit_long(**e, 4, 150);
  ASSERT_TRUE(
      hold_until_decided(**e, 0.6, [](const KvmDecision& d) { return d.action == "enter"; }));
  expect_all_finished(hs);
  const EngineStats s = (*e)->stats();
  EXPECT_EQ(demotions(s), 0);
  EXPECT_DOUBLE_EQ(param_value(s, "semantic_threshold"), 0.0);
  for (const KvmDecision& d : s.kvm_decisions) EXPECT_FALSE(d.applied);
}

// A class's first semantic override starts from the configured settings: an engine-wide rule's
// transient value (here semantic_threshold raised by "hot") is not copied into the class, where
// it would stay after "hot" restored the engine-wide value.
TEST(EngineKvm, ClassOverrideStartsFromTheConfiguredSettings) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  SlaClass batch;
  batch.name = "batch";
  c.sla_classes.push_back(batch);
  c.kvm.rules = {once_rule("hot", {"semantic_threshold", KvmActionOp::kAdd, 0.2}),
                 once_rule("batch-evict", {"evict_threshold", KvmActionOp::kSet, 0.01}, "batch")};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(wait_for_decision(
      **e, [](const KvmDecision& d) { return d.rule == "batch-evict" && d.applied; }));
  const EngineStats s = (*e)->stats();
  EXPECT_NEAR(param_value(s, "semantic_threshold"), c.semantic.semantic_threshold + 0.2, 1e-6);
  std::optional<SemanticCutConfig> sc;
  for (const SlaClass& k : (*e)->sla_classes())
    if (k.name == "batch") sc = k.semantic;
  ASSERT_TRUE(sc.has_value());
  EXPECT_FLOAT_EQ(sc->evict_threshold, 0.01f);
  EXPECT_FLOAT_EQ(sc->semantic_threshold, c.semantic.semantic_threshold);
}

TEST(EngineKvm, ClassRuleMovesOnlyItsClass) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  SlaClass batch;
  batch.name = "batch";
  c.sla_classes.push_back(batch);
  c.kvm.rules[0].sla_class = "batch";
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  hold_forward(**e);
  auto hs = submit_long(**e, 4, 150, "batch");
  ASSERT_TRUE(
      hold_until_decided(**e, 0.6, [](const KvmDecision& d) { return d.action == "enter"; }));
  const EngineStats mid = (*e)->stats();
  for (const KvmDecision& d : mid.kvm_decisions) EXPECT_EQ(d.sla_class, "batch");
  EXPECT_DOUBLE_EQ(param_value(mid, "semantic_threshold", ""), 0.0);
  expect_all_finished(hs);
}

TEST(EngineKvm, BadPolicyKeepsTheOldAndReloadUnderLoadDropsNothing) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  KvmConfig bad = c.kvm;
  bad.rules[0].then.param = "semantic_treshold";
  const Status st = (*e)->update_kvm_policy(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("semantic_treshold"), std::string::npos) << st.message();
  KvmConfig swap_rule = c.kvm;
  swap_rule.rules[0].then = {"swap", KvmActionOp::kSet, 2};  // the temporal cut: never swap
  swap_rule.rules[0].name = "no-swap";
  swap_rule.rules[0].min = KvmRule{}.min;  // the threshold rule's bounds are not swap's
  swap_rule.rules[0].max = KvmRule{}.max;
  const std::vector<int> free0 = testing::free_blocks(**e);
  auto hs = submit_long(**e, 6, 120);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE((*e)->update_kvm_policy(i % 2 ? swap_rule : c.kvm).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  expect_all_finished(hs);
  EXPECT_TRUE(testing::pools_back_to(**e, free0));
  EXPECT_EQ((*e)->stats().requests_failed, 0);
}

// stats() never waits for the manager: a tick whose command waits on workers that do not step
// (held here; up to 5 s for a reply) holds the manager's lock, and stats() reads what the last
// tick published instead.
TEST(EngineKvm, StatsDoNotWaitForATickWaitingOnWorkers) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  c.kvm.interval_ms = 200;
  c.kvm.rules = {once_rule("hot", {"semantic_threshold", KvmActionOp::kAdd, 0.1})};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  (*e)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kAll);
  double slowest_ms = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  while (std::chrono::steady_clock::now() < until) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)(*e)->stats();
    slowest_ms = std::max(
        slowest_ms,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  (*e)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  // A stats() that waited on the tick would take its command's 5 s; a descheduled test thread
  // on a loaded machine (sanitizers) can take a second or more by itself.
  EXPECT_LT(slowest_ms, 2500);
  // The rule did fire meanwhile (its command reached the workers once they stepped again).
  EXPECT_TRUE(wait_for_decision(**e, [](const KvmDecision& d) { return d.rule == "hot"; }));
}

// A manager that was off cannot be started after shutdown(): its thread would drive stopped
// workers and nothing would join it (std::terminate at destruction).
TEST(EngineKvm, NoManagerStartsAfterShutdown) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  const KvmConfig policy = c.kvm;
  c.kvm = KvmConfig{};  // off at start
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  (*e)->shutdown(std::chrono::milliseconds(0));
  const Status st = (*e)->update_kvm_policy(policy);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_EQ((*e)->update_kvm_policy(KvmConfig{}).code(), StatusCode::kOk);  // nothing to start
  e->reset();  // destroyed without a thread left running
}

// An integer setting a rule moves is checked against its range before it is narrowed: an
// unbounded "max_queue *= 1000" is refused (the class keeps its queue), not wrapped or taken.
// A reload that gives a class unchanged (a SIGHUP to rotate the decision log) keeps the setting
// the manager moved on it (it went back to the file's, the rule still active); a class whose
// settings changed takes the new values.
TEST(EngineKvm, AnUnchangedClassKeepsWhatTheManagerMovedAcrossAReload) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kColocated);
  SlaClass batch;
  batch.name = "batch";
  batch.max_queue = 64;
  c.sla_classes.push_back(batch);
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  c.kvm.rules = {once_rule("halve", {"max_queue", KvmActionOp::kMul, 0.5}, "batch")};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(wait_for_decision(
      **e, [](const KvmDecision& d) { return d.param == "max_queue" && d.applied; }));
  auto queue_of = [&](const std::string& name) {
    for (const SlaClass& k : (*e)->sla_classes())
      if (k.name == name) return k.max_queue;
    return -1;
  };
  EXPECT_EQ(queue_of("batch"), 32);
  ASSERT_TRUE((*e)->update_sla_classes(c.sla_classes).ok());  // the same classes again
  EXPECT_EQ(queue_of("batch"), 32);
  EXPECT_DOUBLE_EQ(param_value((*e)->stats(), "max_queue", "batch"), 32);
  std::vector<SlaClass> edited = c.sla_classes;
  edited[1].max_queue = 100;
  ASSERT_TRUE((*e)->update_sla_classes(edited).ok());
  EXPECT_EQ(queue_of("batch"), 100);
  EXPECT_DOUBLE_EQ(param_value((*e)->stats(), "max_queue", "batch"), 100);
  // Given unchanged again after that edit: it keeps 100 (nothing moved it since).
  ASSERT_TRUE((*e)->update_sla_classes(edited).ok());
  EXPECT_EQ(queue_of("batch"), 100);
}

TEST(EngineKvm, IntegerSettingsOutOfRangeAreRefusedNotWrapped) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kColocated);
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  const KvmRule grow =
      once_rule("grow", {"max_queue", KvmActionOp::kMul, 1000}, c.sla_classes[0].name);
  c.kvm.rules = {grow};
  const int32_t queue0 = c.sla_classes[0].max_queue;
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(wait_for_decision(**e, [](const KvmDecision& d) { return d.param == "max_queue"; }));
  const EngineStats s = (*e)->stats();
  ASSERT_FALSE(s.kvm_decisions.empty());
  const KvmDecision& d = s.kvm_decisions.front();
  EXPECT_FALSE(d.applied);
  EXPECT_NE(d.error.find("max_queue: must be in [1, 1000000]"), std::string::npos) << d.error;
  EXPECT_DOUBLE_EQ(param_value(s, "max_queue", grow.sla_class), queue0);
}

// A semantic setting the cut's validation refuses names the field (semantic.<field>). (A rule
// whose `=` value is outside the range is refused with the policy: this one steps out of it.)
TEST(EngineKvm, RefusedSemanticSettingsNameTheField) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  c.kvm.interval_ms = 10;
  c.kvm.rules = {once_rule("high", {"semantic_threshold", KvmActionOp::kAdd, 1.5})};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(
      wait_for_decision(**e, [](const KvmDecision& d) { return d.param == "semantic_threshold"; }));
  const KvmDecision d = (*e)->stats().kvm_decisions.front();
  EXPECT_FALSE(d.applied);
  EXPECT_NE(d.error.find("semantic.semantic_threshold: must be in [0, 1]"), std::string::npos)
      << d.error;
}

// The semantic cut's integer knobs too: recent_tokens = 2^32 used to wrap to 0 (which passes
// the cut's validation) while the decision reported 2^32 as applied.
TEST(EngineKvm, SemanticIntegerSettingsOutOfRangeAreRefusedNotWrapped) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  c.kvm.interval_ms = 10;
  c.kvm.rules = {once_rule("wide", {"recent_tokens", KvmActionOp::kAdd, 4294967296.0})};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(
      wait_for_decision(**e, [](const KvmDecision& d) { return d.param == "recent_tokens"; }));
  const EngineStats s = (*e)->stats();
  ASSERT_FALSE(s.kvm_decisions.empty());
  const KvmDecision& d = s.kvm_decisions.front();
  EXPECT_FALSE(d.applied);
  EXPECT_NE(d.error.find("recent_tokens: must be in [0, 2147483647]"), std::string::npos)
      << d.error;
  EXPECT_DOUBLE_EQ(param_value(s, "recent_tokens", ""), c.semantic.recent_tokens);
}

TEST(EngineKvm, SetCutParamsChecksItsInput) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = pressure_config(KvmMode::kEnforce, "");
  c.kvm = KvmConfig{};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  sched::SetCutParams bad;
  bad.semantic = quiet_semantic();
  bad.semantic->semantic_threshold = 2.f;
  const Status refused = (*e)->send_command(0, bad).get().status;
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message().rfind("semantic.semantic_threshold: must be in [0, 1]", 0), 0u)
      << refused.message();  // the field's name, not "semanticsemantic_threshold"
  sched::SetCutParams step;
  step.temporal_step_size = 0;
  EXPECT_EQ((*e)->send_command(0, step).get().status.code(), StatusCode::kInvalidArgument);
  sched::SetCutParams good;
  good.semantic = quiet_semantic();
  good.swap = SwapMode::kNever;
  EXPECT_TRUE((*e)->send_command(0, good).get().status.ok());
  // A worker without the semantic cut refuses semantic settings.
  EngineConfig full = testing::stories_config(ServingMode::kColocated);
  auto f = EngineImpl::create(full);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->send_command(0, good).get().status.code(), StatusCode::kFailedPrecondition);
}

// Every worker's state, by a SnapshotState command each.
std::vector<sched::WorkerState> worker_states(EngineImpl& e) {
  std::vector<sched::WorkerState> out;
  for (size_t i = 0; i < e.num_workers(); ++i) {
    const sched::CommandReply r = e.send_command(i, sched::SnapshotState{}).get();
    EXPECT_TRUE(r.status.ok()) << r.status.to_string();
    out.push_back(r.state);
  }
  return out;
}

// max_chunk_tokens (fair prefill's cap): a rule sets it on every worker that prefills (prefill,
// and decode workers for their recomputes), the gauge follows, the workers run with it, and values
// outside [0, 2^20] are refused by the rules' check (naming the rule and the field) and by the
// worker's command (naming the field), changing nothing.
TEST(EngineKvm, MaxChunkTokensRuleReachesEveryWorkerAndBadValuesAreRefused) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kDisaggregated);
  ASSERT_EQ(c.max_chunk_tokens, 0);  // no cap to start with
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  c.kvm.rules = {once_rule("chunk-cap", {"max_chunk_tokens", KvmActionOp::kSet, 24})};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(wait_for_decision(
      **e, [](const KvmDecision& d) { return d.param == "max_chunk_tokens" && d.applied; }));
  auto chunk_caps = [&] {
    std::vector<int> caps;
    for (const sched::WorkerState& w : worker_states(**e))
      caps.push_back(w.scheduler.max_chunk_tokens);
    return caps;
  };
  ASSERT_EQ((*e)->num_workers(), 3u);  // prefill-0, decode-0, decode-1
  EXPECT_EQ(chunk_caps(), (std::vector<int>{24, 24, 24}));
  EXPECT_DOUBLE_EQ(param_value((*e)->stats(), "max_chunk_tokens"), 24);

  // The workers run with it: requests finish and every block comes back.
  const std::vector<int> free0 = testing::free_blocks(**e);
  auto hs = submit_long(**e, 4, 40);
  expect_all_finished(hs);
  EXPECT_TRUE(testing::pools_back_to(**e, free0));

  // The worker's command refuses a value out of range, naming the field, and keeps its cap.
  for (int bad : {-1, (1 << 20) + 1}) {
    sched::SetSchedulerParams cmd;
    cmd.max_chunk_tokens = bad;
    const sched::CommandReply r = (*e)->send_command(0, cmd).get();
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find(
                  fmt::format("max_chunk_tokens: must be in [0, 1048576], got {}", bad)),
              std::string::npos)
        << r.status.message();
  }
  EXPECT_EQ(chunk_caps(), (std::vector<int>{24, 24, 24}));

  // A policy with a value out of range is refused naming the rule and the field; the old one
  // stays.
  KvmConfig bad = c.kvm;
  bad.rules[0].then.value = -3;
  Status st = (*e)->update_kvm_policy(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kvm.rules[0] (chunk-cap): then: max_chunk_tokens must be in "
                              "[0, 1048576], got -3"),
            std::string::npos)
      << st.message();
  bad.rules[0].then = {"max_chunk_tokens", KvmActionOp::kMul, 0.5};  // would reach 0 (no cap)
  st = (*e)->update_kvm_policy(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kvm.rules[0] (chunk-cap): min:"), std::string::npos) << st.message();
  EXPECT_EQ(chunk_caps(), (std::vector<int>{24, 24, 24}));
  EXPECT_DOUBLE_EQ(param_value((*e)->stats(), "max_chunk_tokens"), 24);
  EXPECT_EQ((*e)->stats().requests_failed, 0);
}

// max_chunk_ms (fair prefill's time-based cap): a rule sets it on every worker that prefills, the
// gauge follows, the workers run with it; out of range it is refused by the worker's command.
TEST(EngineKvm, MaxChunkMsRuleReachesEveryWorker) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kDisaggregated);
  ASSERT_EQ(c.max_chunk_ms, 0);  // off to start with
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  c.kvm.rules = {once_rule("time-cap", {"max_chunk_ms", KvmActionOp::kSet, 2.5})};
  auto e = EngineImpl::create(c);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(wait_for_decision(
      **e, [](const KvmDecision& d) { return d.param == "max_chunk_ms" && d.applied; }));
  auto time_caps = [&] {
    std::vector<double> caps;
    for (const sched::WorkerState& w : worker_states(**e)) caps.push_back(w.max_chunk_ms);
    return caps;
  };
  EXPECT_EQ(time_caps(), (std::vector<double>{2.5, 2.5, 2.5}));
  EXPECT_DOUBLE_EQ(param_value((*e)->stats(), "max_chunk_ms"), 2.5);
  const std::vector<int> free0 = testing::free_blocks(**e);
  auto hs = submit_long(**e, 4, 40);
  expect_all_finished(hs);
  EXPECT_TRUE(testing::pools_back_to(**e, free0));
  for (double bad : {-1.0, 2e6}) {
    sched::SetSchedulerParams cmd;
    cmd.max_chunk_ms = bad;
    const sched::CommandReply r = (*e)->send_command(0, cmd).get();
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find("max_chunk_ms: must be in [0, 1e6]"), std::string::npos)
        << r.status.message();
  }
  EXPECT_EQ(time_caps(), (std::vector<double>{2.5, 2.5, 2.5}));
  EXPECT_EQ((*e)->stats().requests_failed, 0);
}

TEST(EngineKvm, RulesNeedTheirCut) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kColocated);
  c.kvm.enabled = true;
  c.kvm.rules = {pressure_rule(0.5, 0.1)};
  auto e = EngineImpl::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("device-pressure"), std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace kvsplit

namespace kvsplit {
namespace {

// The spatial cut's knobs: a rule that sets spatial_min_context to 0 spreads new sequences over
// the shards, and a one-shot migrate_to_shard rule moves pages to the emptiest shard; the tokens
// are those of the same requests without the manager.
TEST(EngineKvm, SpatialKnobsSpreadAndMigrateWithoutChangingTokens) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig c = testing::stories_config(ServingMode::kColocated);
  c.block_size = 16;
  c.kv_blocks_per_worker = 64;
  c.spatial.shards = 2;
  c.spatial.spatial_chunk_size = 16;
  c.spatial.min_context = 100000;  // nothing spreads unless the manager says so
  auto run = [&](const EngineConfig& cfg, EngineStats* stats_out) {
    auto e = EngineImpl::create(cfg);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    std::vector<std::vector<int32_t>> tokens;
    if (!e.ok()) return tokens;
    if (cfg.kvm.enabled) {  // the spread rule first, so the requests below are placed by it
      EXPECT_TRUE(wait_for_decision(
          **e, [](const KvmDecision& d) { return d.param == "spatial_min_context" && d.applied; }));
    }
    const bool migrating = std::any_of(cfg.kvm.rules.begin(), cfg.kvm.rules.end(),
                                       [](const KvmRule& r) { return r.name == "rebalance"; });
    if (migrating) hold_forward(**e);
    auto hs = submit_long(**e, 3, 120);
    if (migrating) {  // the migration happens while the requests hold pages
      EXPECT_TRUE(hold_until_decided(**e, 0.1, [](const KvmDecision& d) {
        return d.param == "migrate_to_shard" && d.applied;
      }));
    }
    for (RequestHandle& h : hs) {
      const Collected col = collect(h, std::chrono::seconds(300));
      EXPECT_TRUE(col.final_event.status.ok()) << col.final_event.status.to_string();
      tokens.push_back(col.tokens);
    }
    *stats_out = (*e)->stats();
    return tokens;
  };
  EngineStats plain_stats, kvm_stats;
  const auto plain = run(c, &plain_stats);
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  KvmRule spread;
  spread.name = "spread-all";
  spread.when = {"device_kv_use", "", KvmCmp::kGreaterEqual, 0.0};
  spread.exit = {"device_kv_use", "", KvmCmp::kLess, 0.0};
  spread.then = {"spatial_min_context", KvmActionOp::kSet, 0};
  spread.cooldown_ms = 1e9;
  KvmRule migrate;
  migrate.name = "rebalance";
  migrate.when = {"device_kv_use", "", KvmCmp::kGreater, 0.05};
  migrate.exit = {"device_kv_use", "", KvmCmp::kLess, 0.01};
  migrate.then = {"migrate_to_shard", KvmActionOp::kSet, 4};
  migrate.cooldown_ms = 5;
  // The spread rule alone: moved pages exchange too, so the spread is checked without them.
  c.kvm.rules = {spread};
  EngineStats spread_stats;
  EXPECT_EQ(run(c, &spread_stats), plain);
  int64_t spread_exchange = 0;
  for (const PoolStats& p : spread_stats.pools) spread_exchange += p.kv_shard_exchange_bytes;
  EXPECT_GT(spread_exchange, 0) << "the spread rule spread no sequence over the shards";
  c.kvm.rules = {spread, migrate};
  const auto managed = run(c, &kvm_stats);
  EXPECT_EQ(managed, plain);
  int64_t migrated = 0, exchange = 0;
  for (const PoolStats& p : kvm_stats.pools) {
    migrated += p.kv_migrated_pages;
    exchange += p.kv_shard_exchange_bytes;
  }
  EXPECT_GT(exchange, 0) << "no sequence was spread over the shards";
  std::string decisions;
  for (const KvmDecision& d : kvm_stats.kvm_decisions)
    decisions += fmt::format("{} {} {}->{} applied {} {}\n", d.rule, d.action, d.before, d.after,
                             d.applied, d.error);
  EXPECT_GT(migrated, 0) << "the migrate rule moved nothing; decisions:\n" << decisions;
  for (const PoolStats& p : plain_stats.pools) EXPECT_EQ(p.kv_shard_exchange_bytes, 0);
}

}  // namespace
}  // namespace kvsplit
