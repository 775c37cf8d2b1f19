// validate_rules (kvm/rule_engine.h): one test per kind of error, each naming the rule and the
// field.
#include <gtest/gtest.h>

#include "kvm/expr.h"
#include "kvm/rule_engine.h"
#include "rule_test_util.h"

namespace kvsplit::kvm {
namespace {

// validate_rules: one test per kind of error, each naming the rule and the field.
class ValidateRulesTest : public ::testing::Test {
 protected:
  void expect_error(const KvmRule& bad, const std::string& needle) {
    auto s = validate_rules({hot_rule(), bad}, {"default", "voice"});
    ASSERT_FALSE(s.ok()) << "accepted";
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(needle), std::string::npos)
        << "message '" << s.message() << "' lacks '" << needle << "'";
  }
  KvmRule good() {
    return rule("r", "ttft_p99_ms[voice] > 250", "ttft_p99_ms[voice] < 150",
                "semantic_threshold += 0.05");
  }
};

TEST_F(ValidateRulesTest, AcceptsGoodRules) {
  EXPECT_TRUE(validate_rules({hot_rule(), good()}, {"default", "voice"}).ok());
  KvmRule q = rule("q", "queue_depth[voice] > 50", "queue_depth[voice] < 10", "max_queue *= 0.5");
  q.sla_class = "voice";
  EXPECT_TRUE(validate_rules({q}, {"voice"}).ok());
}

// Rule names travel in metric labels, GetServerStats' string fields and log lines: the class
// names' characters only (a name with a byte of invalid UTF-8 once broke every stats reply).
TEST_F(ValidateRulesTest, NameCharacters) {
  for (const char* bad : {"bad\xffname", "two words", "a\"b", "x{y}"}) {
    KvmRule r = good();
    r.name = bad;
    expect_error(r, "name: must be 1..64 characters of [A-Za-z0-9_.-]");
  }
  KvmRule r = good();
  r.name = std::string(65, 'a');
  expect_error(r, "name: must be 1..64 characters");
  r.name = "ok_name-1.2";
  EXPECT_TRUE(validate_rules({r}, {"default", "voice"}).ok());
}

TEST_F(ValidateRulesTest, DuplicateName) {
  KvmRule r = good();
  r.name = "hot";
  expect_error(r, "kvm.rules[1] (hot): name: duplicate rule name 'hot'");
}

TEST_F(ValidateRulesTest, EmptyName) {
  KvmRule r = good();
  r.name = "";
  expect_error(r, "kvm.rules[1] (): name: must not be empty");
}

TEST_F(ValidateRulesTest, MissingWhen) {
  KvmRule r = good();
  r.when = {};
  expect_error(r, "kvm.rules[1] (r): when: required");
}

TEST_F(ValidateRulesTest, MissingExit) {
  KvmRule r = good();
  r.exit = {};
  expect_error(r, "kvm.rules[1] (r): exit: required");
}

// A fraction compared with a level outside [0, 1] (a percentage) would never fire, or always.
TEST_F(ValidateRulesTest, FractionMetricWithALevelOutsideZeroToOne) {
  KvmRule r = rule("r", "device_kv_use > 90", "device_kv_use < 0.8", "semantic_threshold += 0.05");
  expect_error(r,
               "kvm.rules[1] (r): when: device_kv_use is a fraction in [0, 1], compared with 90");
  KvmRule hit =
      rule("h", "prefix_hit_rate < 0.2", "prefix_hit_rate > 1.5", "semantic_threshold += 0.05");
  EXPECT_FALSE(validate_rules({hit}, {"default"}).ok());
  // The design's "link use < 30%" written as a percentage: always true, so refused.
  KvmRule link = rule("l", "link_use < 30", "link_use > 50", "migrate_to_shard = 1");
  expect_error(link, "link_use is a fraction in [0, 1], compared with 30");
  // Not a fraction: any level.
  KvmRule ms = rule("m", "storage_latency_ms > 90", "storage_latency_ms < 20", "swap = never");
  EXPECT_TRUE(validate_rules({ms}, {"default"}).ok());
}

TEST_F(ValidateRulesTest, UnknownMetric) {
  KvmRule r = good();
  r.when.metric = "devce_kv_use";
  r.when.sla_class = "";
  expect_error(r, "kvm.rules[1] (r): when: unknown metric 'devce_kv_use'");
}

TEST_F(ValidateRulesTest, ClassOnAGlobalMetric) {
  KvmRule r = good();
  r.exit.metric = "device_kv_use";
  expect_error(r, "kvm.rules[1] (r): exit: metric 'device_kv_use' is engine-wide");
}

TEST_F(ValidateRulesTest, UnknownClassInCondition) {
  KvmRule r = good();
  r.when.sla_class = "chat";
  expect_error(r, "kvm.rules[1] (r): when: unknown class 'chat'");
}

TEST_F(ValidateRulesTest, ExitSameDirectionAsWhen) {
  KvmRule r = hot_rule();
  r.name = "r";
  r.exit.cmp = KvmCmp::kGreater;
  expect_error(r, "kvm.rules[1] (r): exit: 'device_kv_use > 0.8' compares the same way");
}

TEST_F(ValidateRulesTest, ExitOverlapsWhen) {
  KvmRule r = rule("r", "device_kv_use > 0.8", "device_kv_use < 0.9", "swap = never");
  expect_error(r, "kvm.rules[1] (r): exit: 'device_kv_use < 0.9' overlaps");
  // Equal levels overlap only when both include the level.
  KvmRule touching = rule("t", "device_kv_use >= 0.8", "device_kv_use <= 0.8", "swap = never");
  expect_error(touching, "overlaps");
  KvmRule edge = rule("e", "device_kv_use >= 0.8", "device_kv_use < 0.8", "swap = never");
  EXPECT_TRUE(validate_rules({edge}, {}).ok());
  KvmRule down = rule("d", "link_use < 0.3", "link_use > 0.2", "swap = never");
  expect_error(down, "overlaps");
  // An exit on another metric can hold with `when` (it flapped at every sample): it needs a
  // cooldown or a hold to pace it.
  KvmRule other = rule("o", "ttft_p99_ms > 10", "ttft_p99_ms[default] < 100", "swap = never", 0);
  expect_error(other, "kvm.rules[1] (o): exit: 'ttft_p99_ms[default] < 100' reads another metric");
  other.cooldown_ms = 50;
  EXPECT_TRUE(validate_rules({other}, {"default"}).ok());
  other.cooldown_ms = 0;
  other.hold_ms = 20;
  EXPECT_TRUE(validate_rules({other}, {"default"}).ok());
}

TEST_F(ValidateRulesTest, UnknownParameter) {
  KvmRule r = good();
  r.then.param = "semantic_treshold";
  expect_error(r, "kvm.rules[1] (r): then: unknown parameter 'semantic_treshold'");
}

TEST_F(ValidateRulesTest, BadSwapValue) {
  KvmRule r = good();
  r.then = {"swap", KvmActionOp::kAdd, 1};
  expect_error(r, "kvm.rules[1] (r): then: swap must be set to auto, always or never");
}

TEST_F(ValidateRulesTest, ParameterNeedsAClass) {
  KvmRule r = good();
  r.then = {"max_queue", KvmActionOp::kMul, 0.5};
  expect_error(r, "kvm.rules[1] (r): class: required: max_queue is a per-class setting");
}

TEST_F(ValidateRulesTest, GlobalParameterWithAClass) {
  KvmRule r = good();
  r.then = {"max_num_seqs", KvmActionOp::kMul, 0.5};
  r.sla_class = "voice";
  expect_error(r, "kvm.rules[1] (r): class: max_num_seqs is engine-wide");
}

TEST_F(ValidateRulesTest, UnknownRuleClass) {
  KvmRule r = good();
  r.sla_class = "chat";
  expect_error(r, "kvm.rules[1] (r): class: unknown class 'chat'");
}

TEST_F(ValidateRulesTest, MinAboveMax) {
  KvmRule r = good();
  r.min = 0.5;
  r.max = 0.4;
  expect_error(r, "kvm.rules[1] (r): min: must be <= max, got min 0.5 and max 0.4");
}

// An integer setting is rounded inside [min, max]: bounds with no integer between them are
// refused (the setting once landed outside them, rounded to the nearest integer); one integer
// between them is enough.
TEST_F(ValidateRulesTest, IntegerParameterNeedsAnIntegerWithinItsBounds) {
  KvmRule r = rule("r", "queue_depth[voice] > 50", "queue_depth[voice] < 10", "max_queue = 3");
  r.sla_class = "voice";
  r.min = 2.2;
  r.max = 2.4;
  expect_error(r,
               "kvm.rules[1] (r): min: max_queue is an integer and no integer lies in [2.2, 2.4]");
  r.max = 3;
  EXPECT_TRUE(validate_rules({r}, {"voice"}).ok());
}

TEST_F(ValidateRulesTest, NegativeCooldown) {
  KvmRule r = good();
  r.cooldown_ms = -1;
  expect_error(r, "kvm.rules[1] (r): cooldown_ms: must be a finite number >= 0, got -1");
}

TEST_F(ValidateRulesTest, NegativeHold) {
  KvmRule r = good();
  r.hold_ms = -5;
  expect_error(r, "kvm.rules[1] (r): hold_ms: must be a finite number >= 0, got -5");
}

TEST_F(ValidateRulesTest, RecallWaitIsBoundedPerClassOrGlobally) {
  KvmRule ok =
      rule("wait", "itl_p99_ms[voice] > 40", "itl_p99_ms[voice] < 20", "recall_wait_ms *= 0.5");
  ok.sla_class = "voice";
  ok.min = 0.1;
  EXPECT_TRUE(validate_rules({ok}, {"voice"}).ok());
  KvmRule r = ok;
  r.name = "r";
  r.then = {"recall_wait_ms", KvmActionOp::kSet, -1};  // "until it lands" is not a rule's
  expect_error(r, "kvm.rules[1] (r): then: recall_wait_ms must be in [0, 60000], got -1");
}

TEST_F(ValidateRulesTest, RecallPrecisionIsSetByName) {
  KvmRule ok =
      rule("rung", "device_kv_use > 0.9", "device_kv_use < 0.7", "recall_precision = int4");
  EXPECT_TRUE(validate_rules({ok}, {"voice"}).ok());
  KvmRule r = ok;
  r.name = "r";
  r.then = {"recall_precision", KvmActionOp::kAdd, 1};
  expect_error(r, "kvm.rules[1] (r): then: recall_precision must be set to full, int8 or int4");
  for (double v : {3.0, -1.0, 1.5}) {  // a value past the names, or between two
    r.then = {"recall_precision", KvmActionOp::kSet, v};
    expect_error(r, "kvm.rules[1] (r): then: recall_precision must be set to full, int8 or int4");
  }
}

TEST_F(ValidateRulesTest, MaxRecallsPerStepIsPerClassOrGlobalAndNotNegative) {
  KvmRule ok =
      rule("recalls", "device_kv_use > 0.9", "device_kv_use < 0.7", "max_recalls_per_step = 1");
  ok.sla_class = "voice";
  EXPECT_TRUE(validate_rules({ok}, {"voice"}).ok());
  KvmRule r = ok;
  r.name = "r";
  r.then = {"max_recalls_per_step", KvmActionOp::kSet, -1};
  expect_error(r,
               "kvm.rules[1] (r): then: max_recalls_per_step must be in [0, 2147483647], got -1");
  // Halving it can reach 0, which lifts the limit: such a rule needs min >= 1.
  r.then = {"max_recalls_per_step", KvmActionOp::kMul, 0.5};
  expect_error(r, "kvm.rules[1] (r): min: 'max_recalls_per_step *= 0.5' can take");
  r.min = 1;
  EXPECT_TRUE(validate_rules({r}, {"voice"}).ok());
}

TEST_F(ValidateRulesTest, MaxChunkTokensIsEngineWideAndBounded) {
  KvmRule ok = rule("cap", "ttft_p99_ms[voice] > 250", "ttft_p99_ms[voice] < 150",
                    "max_chunk_tokens *= 0.5");
  ok.min = 16;
  ok.max = 512;
  EXPECT_TRUE(validate_rules({ok}, {"voice"}).ok());
  KvmRule off = ok;
  off.then = {"max_chunk_tokens", KvmActionOp::kSet, 0};  // '= 0' turns the cap off: allowed
  off.min = -1e300;
  EXPECT_TRUE(validate_rules({off}, {"voice"}).ok());

  KvmRule r = ok;
  r.name = "r";
  r.sla_class = "voice";
  expect_error(r, "kvm.rules[1] (r): class: max_chunk_tokens is engine-wide");
  r = ok;
  r.name = "r";
  r.then = {"max_chunk_tokens", KvmActionOp::kSet, -4};
  expect_error(r, "kvm.rules[1] (r): then: max_chunk_tokens must be in [0, 1048576], got -4");
  r.then = {"max_chunk_tokens", KvmActionOp::kSet, 2e6};
  expect_error(r, "kvm.rules[1] (r): then: max_chunk_tokens must be in [0, 1048576], got 2000000");
  r = ok;
  r.name = "r";
  r.max = 4e6;
  expect_error(r, "kvm.rules[1] (r): max: max_chunk_tokens must be in [0, 1048576], got 4000000");
  r = ok;
  r.name = "r";
  r.min = -1;
  expect_error(r, "kvm.rules[1] (r): min: max_chunk_tokens must be in [0, 1048576], got -1");
  // Halving without a floor would reach 0, which means no cap at all.
  r = ok;
  r.name = "r";
  r.min = -1e300;
  expect_error(r,
               "kvm.rules[1] (r): min: 'max_chunk_tokens *= 0.5' can take max_chunk_tokens "
               "down to 0, which turns it off; give min >= 1");
  r.then = {"max_chunk_tokens", KvmActionOp::kSub, 16};
  r.min = 0;
  expect_error(r, "kvm.rules[1] (r): min: 'max_chunk_tokens -= 16'");
  r.then = {"max_chunk_tokens", KvmActionOp::kAdd, 16};  // raising only: no floor needed
  EXPECT_TRUE(validate_rules({r}, {"voice"}).ok());
}

}  // namespace
}  // namespace kvsplit::kvm
