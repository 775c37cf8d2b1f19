#include "kvm/expr.h"

#include <gtest/gtest.h>

namespace kvsplit::kvm {
namespace {

void expect_bad_condition(const std::string& text, const std::string& needle) {
  auto c = parse_condition(text);
  ASSERT_FALSE(c.ok()) << "accepted '" << text << "'";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message '" << c.status().message() << "' lacks '" << needle << "'";
}

void expect_bad_action(const std::string& text, const std::string& needle) {
  auto a = parse_action(text);
  ASSERT_FALSE(a.ok()) << "accepted '" << text << "'";
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find(needle), std::string::npos)
      << "message '" << a.status().message() << "' lacks '" << needle << "'";
}

TEST(KvmExprTest, ParsesConditions) {
  auto c = parse_condition("device_kv_use > 0.90");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->metric, "device_kv_use");
  EXPECT_EQ(c->sla_class, "");
  EXPECT_EQ(c->cmp, KvmCmp::kGreater);
  EXPECT_DOUBLE_EQ(c->value, 0.9);

  c = parse_condition("  ttft_p99_ms[voice]>=250 ");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->metric, "ttft_p99_ms");
  EXPECT_EQ(c->sla_class, "voice");
  EXPECT_EQ(c->cmp, KvmCmp::kGreaterEqual);
  EXPECT_DOUBLE_EQ(c->value, 250);

  c = parse_condition("link_use < 0.3");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cmp, KvmCmp::kLess);
  c = parse_condition("queue_depth[batch-2] <= 1e2");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->cmp, KvmCmp::kLessEqual);
  EXPECT_EQ(c->sla_class, "batch-2");
  EXPECT_DOUBLE_EQ(c->value, 100);
}

TEST(KvmExprTest, ConditionErrors) {
  expect_bad_condition("devce_kv_use > 0.9", "unknown metric 'devce_kv_use' (known: device_kv_use");
  expect_bad_condition("device_kv_use[voice] > 0.9", "engine-wide and takes no class");
  expect_bad_condition("device_kv_use = 0.9", "bad operator");
  expect_bad_condition("device_kv_use == 0.9", "bad operator");
  expect_bad_condition("device_kv_use > 0.9x", "must be a finite number");
  expect_bad_condition("device_kv_use > inf", "must be a finite number");
  expect_bad_condition("device_kv_use >", "must be a finite number");
  expect_bad_condition("ttft_p99_ms[voice > 1", "missing ']'");
  expect_bad_condition("ttft_p99_ms[] > 1", "empty class");
  expect_bad_condition("", "empty condition");
  expect_bad_condition("> 3", "expected a metric name");
}

TEST(KvmExprTest, ParsesActions) {
  auto a = parse_action("semantic_threshold += 0.05");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->param, "semantic_threshold");
  EXPECT_EQ(a->op, KvmActionOp::kAdd);
  EXPECT_DOUBLE_EQ(a->value, 0.05);
  a = parse_action("max_num_seqs *= 0.5");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->op, KvmActionOp::kMul);
  a = parse_action("recent_tokens-=64");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->op, KvmActionOp::kSub);
  EXPECT_DOUBLE_EQ(a->value, 64);
  a = parse_action("max_chunk_tokens = 32");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->param, "max_chunk_tokens");
  EXPECT_EQ(a->op, KvmActionOp::kSet);
  EXPECT_DOUBLE_EQ(a->value, 32);
  a = parse_action("migrate_to_shard = 32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->op, KvmActionOp::kSet);
  for (const auto& [name, v] : {std::pair{"auto", 0.0}, {"always", 1.0}, {"never", 2.0}}) {
    a = parse_action(std::string("swap = ") + name);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->param, "swap");
    EXPECT_DOUBLE_EQ(a->value, v);
  }
  for (const auto& [name, v] : {std::pair{"full", 0.0}, {"int8", 1.0}, {"int4", 2.0}}) {
    a = parse_action(std::string("recall_precision = ") + name);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_DOUBLE_EQ(a->value, v);
  }
}

TEST(KvmExprTest, ActionErrors) {
  expect_bad_action("semantic_treshold += 0.05", "unknown parameter 'semantic_treshold' (known:");
  expect_bad_action("semantic_threshold ++ 0.05", "bad operator");
  expect_bad_action("semantic_threshold == 0.05", "bad operator");
  expect_bad_action("semantic_threshold += abc", "must be a finite number");
  expect_bad_action("swap = sometimes", "swap must be auto, always or never");
  expect_bad_action("swap += 1", "swap takes '='");
  expect_bad_action("recall_precision = int2", "recall_precision must be full, int8 or int4");
  expect_bad_action("recall_precision += 1",
                    "recall_precision takes '=' (recall_precision = "
                    "full|int8|int4)");
  expect_bad_action("migrate_to_shard += 4", "one-shot");
  expect_bad_action("max_queue[voice] = 3", "give the rule a `class:`");
  expect_bad_action("", "empty action");
}

TEST(KvmExprTest, ToStringRoundTrips) {
  for (const char* text :
       {"device_kv_use > 0.9", "ttft_p99_ms[voice] <= 250", "link_use >= 0.3", "queue_depth < 4"}) {
    auto c = parse_condition(text);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(to_string(*c), text);
  }
  for (const char* text :
       {"semantic_threshold += 0.05", "swap = never", "max_num_seqs *= 0.5", "recent_tokens -= 64",
        "temporal_step_size = 8", "recall_precision = int4"}) {
    auto a = parse_action(text);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(to_string(*a), text);
  }
}

TEST(KvmExprTest, ParameterKinds) {
  EXPECT_TRUE(is_param("semantic_window"));
  EXPECT_FALSE(is_param("device_kv_use"));
  EXPECT_TRUE(is_metric("pages_evicted_fraction"));
  EXPECT_TRUE(is_class_metric("itl_p50_ms"));
  EXPECT_FALSE(is_class_metric("link_use"));
  EXPECT_TRUE(param_needs_class("max_queue"));
  EXPECT_FALSE(param_needs_class("semantic_threshold"));
  EXPECT_TRUE(param_is_global_only("max_num_seqs"));
  EXPECT_TRUE(param_is_global_only("spatial_min_context"));
  EXPECT_TRUE(param_is_global_only("migrate_to_shard"));
  EXPECT_TRUE(is_param("max_chunk_tokens"));
  EXPECT_TRUE(param_is_global_only("max_chunk_tokens"));
  EXPECT_TRUE(param_is_integer("max_chunk_tokens"));
  EXPECT_FALSE(param_needs_class("max_chunk_tokens"));
  ASSERT_TRUE(param_range("max_chunk_tokens").has_value());
  EXPECT_DOUBLE_EQ(param_range("max_chunk_tokens")->lo, 0);
  EXPECT_DOUBLE_EQ(param_range("max_chunk_tokens")->hi, 1 << 20);
  EXPECT_TRUE(param_range("max_chunk_tokens")->zero_is_off);
  EXPECT_TRUE(is_param("max_chunk_ms"));
  EXPECT_TRUE(param_is_global_only("max_chunk_ms"));
  EXPECT_FALSE(param_is_integer("max_chunk_ms"));  // milliseconds, not rounded
  ASSERT_TRUE(param_range("max_chunk_ms").has_value());
  EXPECT_DOUBLE_EQ(param_range("max_chunk_ms")->hi, 1e6);
  EXPECT_TRUE(param_range("max_chunk_ms")->zero_is_off);
  EXPECT_TRUE(check_setting("max_chunk_ms", 12.5).ok());
  EXPECT_EQ(check_setting("max_chunk_ms", -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_setting("max_chunk_ms", 2e6).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(param_range("semantic_threshold").has_value());
  // recall_wait_ms: a rule moves it within [0, 60000] (never to "until it lands", < 0).
  EXPECT_TRUE(is_param("recall_wait_ms"));
  EXPECT_FALSE(param_is_global_only("recall_wait_ms"));
  EXPECT_FALSE(param_is_integer("recall_wait_ms"));
  ASSERT_TRUE(param_range("recall_wait_ms").has_value());
  EXPECT_DOUBLE_EQ(param_range("recall_wait_ms")->lo, 0);
  EXPECT_DOUBLE_EQ(param_range("recall_wait_ms")->hi, 60000);
  EXPECT_FALSE(param_range("recall_wait_ms")->zero_is_off);
  EXPECT_TRUE(is_param("max_recalls_per_step"));
  EXPECT_TRUE(param_is_semantic("max_recalls_per_step"));
  EXPECT_TRUE(param_is_integer("max_recalls_per_step"));
  EXPECT_FALSE(param_is_global_only("max_recalls_per_step"));
  EXPECT_TRUE(check_setting("max_recalls_per_step", 0).ok());
  EXPECT_FALSE(check_setting("max_recalls_per_step", -1).ok());
  EXPECT_FALSE(param_is_global_only("swap"));
  EXPECT_TRUE(param_is_integer("semantic_window"));
  EXPECT_TRUE(param_is_integer("temporal_step_size"));
  EXPECT_FALSE(param_is_integer("semantic_threshold"));
  EXPECT_TRUE(param_is_one_shot("migrate_to_shard"));
  EXPECT_FALSE(param_is_one_shot("swap"));
  EXPECT_EQ(swap_value("never"), 2.0);
  EXPECT_FALSE(swap_value("maybe").has_value());
  EXPECT_EQ(named_value("recall_precision", "full"), 0.0);
  EXPECT_EQ(named_value("recall_precision", "int4"), 2.0);
  EXPECT_FALSE(named_value("recall_precision", "never").has_value());
  EXPECT_TRUE(param_is_named("recall_precision"));
  EXPECT_FALSE(param_is_named("max_recalls_per_step"));
  EXPECT_EQ(param_name_count("recall_precision"), 3);
  EXPECT_EQ(param_name_count("swap"), 3);
  EXPECT_EQ(param_name_count("max_recalls_per_step"), 0);
  EXPECT_TRUE(param_is_semantic("recall_precision"));
  EXPECT_TRUE(check_setting("recall_precision", 2).ok());
  EXPECT_FALSE(check_setting("recall_precision", 3).ok());
}

KvmSnapshot snapshot() {
  KvmSnapshot s;
  s.device_kv_use = 0.93;
  s.link_use = 0.2;
  KvmClassLatency voice;
  voice.name = "voice";
  voice.ttft_p99_ms = 300;
  voice.queue_depth = 2;
  voice.queue_wait_ms = 40;
  KvmClassLatency batch;
  batch.name = "batch";
  batch.ttft_p99_ms = 900;
  batch.queue_depth = 7;
  batch.queue_wait_ms = 1500;
  s.classes = {voice, batch};
  return s;
}

KvmCondition cond(const std::string& text) {
  auto c = parse_condition(text);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : KvmCondition{};
}

TEST(KvmExprTest, ReadsMetrics) {
  const KvmSnapshot s = snapshot();
  EXPECT_EQ(read_metric(s, cond("device_kv_use > 0")), 0.93);
  EXPECT_EQ(read_metric(s, cond("link_use > 0")), 0.2);
  std::string cls;
  EXPECT_EQ(read_metric(s, cond("ttft_p99_ms[voice] > 0"), &cls), 300);
  EXPECT_EQ(cls, "voice");
  // Without a class: the worst class.
  EXPECT_EQ(read_metric(s, cond("ttft_p99_ms > 0"), &cls), 900);
  EXPECT_EQ(cls, "batch");
  EXPECT_EQ(read_metric(s, cond("queue_depth > 0")), 7);
  EXPECT_EQ(read_metric(s, cond("queue_wait_ms[voice] > 0")), 40);
  EXPECT_EQ(read_metric(s, cond("queue_wait_ms > 0"), &cls), 1500);
  EXPECT_EQ(cls, "batch");
  // A class the snapshot lacks, or no classes at all: no value.
  EXPECT_FALSE(read_metric(s, cond("ttft_p99_ms[chat] > 0")).has_value());
  EXPECT_FALSE(read_metric(KvmSnapshot{}, cond("queue_depth > 0")).has_value());
}

TEST(KvmExprTest, Holds) {
  const KvmSnapshot s = snapshot();
  double v = 0;
  EXPECT_TRUE(holds(s, cond("device_kv_use > 0.9"), &v));
  EXPECT_DOUBLE_EQ(v, 0.93);
  EXPECT_FALSE(holds(s, cond("device_kv_use > 0.93")));
  EXPECT_TRUE(holds(s, cond("device_kv_use >= 0.93")));
  EXPECT_FALSE(holds(s, cond("device_kv_use < 0.93")));
  EXPECT_TRUE(holds(s, cond("device_kv_use <= 0.93")));
  EXPECT_TRUE(holds(s, cond("ttft_p99_ms[voice] < 500")));
  EXPECT_FALSE(holds(s, cond("ttft_p99_ms < 500")));  // batch is the worst
  EXPECT_FALSE(holds(s, cond("ttft_p99_ms[chat] < 500")));
  EXPECT_FALSE(holds(s, cond("ttft_p99_ms[chat] > 500")));
}

}  // namespace
}  // namespace kvsplit::kvm
