// The simulator applies a rule's setting to the workers the engine's command reaches: a
// max_num_seqs rule caps the decoding workers, never a prefill worker (the engine sends it with
// decoders_only), so in disaggregated mode prompts are still prefilled several at a time; a rule
// on a metric the model does not produce is named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvm/simulator.h"
#include "simulator_test_util.h"

namespace kvsplit::kvm {
namespace {

TEST(SimulatorRules, MaxNumSeqsCapsDecodingWorkersNotThePrefillWorker) {
  EngineConfig c = test_config();
  c.mode = ServingMode::kDisaggregated;
  c.num_prefill_workers = 1;
  c.num_decode_workers = 1;
  c.kvm.interval_ms = 10;
  std::vector<TraceRequest> burst = uniform_trace(40, 0.1, 64, 32);
  for (TraceRequest& r : burst) r.arrival_ms += 20;  // after the first sample
  auto free_run = simulate(c, test_profile(), burst);
  ASSERT_TRUE(free_run.ok()) << free_run.status().to_string();

  c.kvm.enabled = true;
  KvmRule cap;
  cap.name = "cap";
  cap.when = {"device_kv_use", "", KvmCmp::kGreaterEqual, 0.0};  // from the first sample
  cap.exit = {"device_kv_use", "", KvmCmp::kLess, 0.0};          // never
  cap.then = {"max_num_seqs", KvmActionOp::kSet, 2};
  cap.cooldown_ms = 1e9;
  c.kvm.rules = {cap};
  auto capped = simulate(c, test_profile(), burst);
  ASSERT_TRUE(capped.ok()) << capped.status().to_string();
  ASSERT_FALSE(capped->decisions.empty());
  EXPECT_TRUE(capped->decisions.front().applied);
  // The prefill worker takes the burst as before: the first tokens come at the same times (it
  // took two prompts at a time, and the interactive TTFT grew with the queue).
  for (const char* name : {"fast", "slow"}) {
    EXPECT_DOUBLE_EQ(cls(*capped, name).ttft_p50_ms, cls(*free_run, name).ttft_p50_ms) << name;
    EXPECT_DOUBLE_EQ(cls(*capped, name).ttft_p99_ms, cls(*free_run, name).ttft_p99_ms) << name;
    EXPECT_EQ(cls(*capped, name).finished, 20) << name;
  }
  // The decode worker runs two at a time: the run takes longer.
  EXPECT_GT(capped->end_ms, free_run->end_ms);
}

// A rule on a metric the model does not produce (it reads 0 all run long) is named in the result,
// which `kvsplit policy simulate` prints as a warning: "prefix_hit_rate < 0.3" fired at the first
// sample and capped the whole prediction without a word.
TEST(SimulatorRules, RulesOnMetricsTheModelDoesNotProduceAreNamed) {
  EngineConfig c = test_config();
  c.kvm.enabled = true;
  c.kvm.interval_ms = 10;
  KvmRule cold;
  cold.name = "cold-prefix";
  cold.when = {"prefix_hit_rate", "", KvmCmp::kLess, 0.3};
  cold.exit = {"prefix_hit_rate", "", KvmCmp::kGreater, 0.5};
  cold.then = {"max_num_seqs", KvmActionOp::kSet, 2};
  KvmRule hot = cold;
  hot.name = "hot";
  hot.when = {"device_kv_use", "", KvmCmp::kGreater, 0.9};
  hot.exit = {"link_use", "", KvmCmp::kLess, 0.1};
  hot.cooldown_ms = 100;
  c.kvm.rules = {cold, hot};
  auto r = simulate(c, test_profile(), uniform_trace(4, 1, 16, 4));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->unmodelled,
            (std::vector<std::string>{
                "rule 'cold-prefix' reads prefix_hit_rate, which the simulator does not model (it "
                "reads 0)",
                "rule 'hot' reads link_use, which the simulator does not model (it reads 0)"}));
  EXPECT_NE(sim_result_json(*r).find("\"unmodelled\":[\"rule 'cold-prefix'"), std::string::npos);
  c.kvm.rules = {hot};
  c.kvm.rules[0].exit = {"device_kv_use", "", KvmCmp::kLess, 0.8};
  auto modelled = simulate(c, test_profile(), uniform_trace(4, 1, 16, 4));
  ASSERT_TRUE(modelled.ok());
  EXPECT_TRUE(modelled->unmodelled.empty());
}

}  // namespace
}  // namespace kvsplit::kvm
