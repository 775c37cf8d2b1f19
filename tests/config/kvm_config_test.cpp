// The `kvm:` section of the server config (docs/kvm.md, docs/configuration.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "test_util.h"

namespace kvsplit::config {
namespace {

void expect_error(const std::string& yaml, const std::string& needle) {
  auto c = parse_config(yaml);
  ASSERT_FALSE(c.ok()) << "accepted:\n" << yaml;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message '" << c.status().message() << "' lacks '" << needle << "'";
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Runs the test body inside `dir` (relative rules_file paths), restoring the old directory.
class InDir {
 public:
  explicit InDir(const std::filesystem::path& dir) : old_(std::filesystem::current_path()) {
    std::filesystem::current_path(dir);
  }
  ~InDir() { std::filesystem::current_path(old_); }

 private:
  std::filesystem::path old_;
};

TEST(KvmConfigTest, NoSectionMeansOff) {
  auto c = parse_config("seed: 1\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->engine.kvm.enabled);
  EXPECT_TRUE(c->engine.kvm.rules.empty());
  EXPECT_NE(describe(*c).find("kvm=off"), std::string::npos) << describe(*c);
}

TEST(KvmConfigTest, DesignExampleParses) {
  auto c = parse_config(R"(
kvm:
  interval_ms: 100
  rules:
    - {when: "device_kv_use > 0.90", exit: "device_kv_use < 0.80",
       then: "semantic_threshold += 0.05", max: 0.4, cooldown_ms: 2000}
)");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const KvmConfig& k = c->engine.kvm;
  EXPECT_TRUE(k.enabled);
  EXPECT_EQ(k.mode, KvmMode::kEnforce);
  EXPECT_EQ(k.interval_ms, 100);
  ASSERT_EQ(k.rules.size(), 1u);
  const KvmRule& r = k.rules[0];
  EXPECT_EQ(r.name, "rule-0");
  EXPECT_EQ(r.when.metric, "device_kv_use");
  EXPECT_EQ(r.when.cmp, KvmCmp::kGreater);
  EXPECT_DOUBLE_EQ(r.when.value, 0.9);
  EXPECT_EQ(r.exit.cmp, KvmCmp::kLess);
  EXPECT_DOUBLE_EQ(r.exit.value, 0.8);
  EXPECT_EQ(r.then.param, "semantic_threshold");
  EXPECT_EQ(r.then.op, KvmActionOp::kAdd);
  EXPECT_DOUBLE_EQ(r.then.value, 0.05);
  EXPECT_DOUBLE_EQ(r.max, 0.4);
  EXPECT_EQ(r.min, KvmRule{}.min);
  EXPECT_DOUBLE_EQ(r.cooldown_ms, 2000);
  EXPECT_TRUE(r.restore_on_exit);
  EXPECT_NE(describe(*c).find("kvm=enforce(1 rule)"), std::string::npos) << describe(*c);
}

TEST(KvmConfigTest, FullSectionParses) {
  auto c = parse_config(R"(
sla_classes:
  voice: {max_ttft_ms: 300, max_itl_ms: 100}
  batch: {max_ttft_ms: 60000, max_itl_ms: 2000}
kvm:
  mode: dry-run
  interval_ms: 250
  window_ms: 30000
  decision_log: /tmp/kvm.jsonl
  rules:
    - name: voice-ttft
      when: "ttft_p99_ms[voice] > 250"
      exit: "ttft_p99_ms[voice] < 150"
      then: "max_queue *= 0.5"
      class: voice
      min: 4
      max: 64
      cooldown_ms: 0
      restore_on_exit: false
      hold_ms: 1500
    - name: slow-disk
      when: "storage_latency_ms > 20"
      exit: "storage_latency_ms < 5"
      then: "swap = never"
)");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const KvmConfig& k = c->engine.kvm;
  EXPECT_TRUE(k.enabled);
  EXPECT_EQ(k.mode, KvmMode::kDryRun);
  EXPECT_EQ(k.interval_ms, 250);
  EXPECT_EQ(k.window_ms, 30000);
  EXPECT_EQ(k.decision_log, "/tmp/kvm.jsonl");
  ASSERT_EQ(k.rules.size(), 2u);
  EXPECT_EQ(k.rules[0].name, "voice-ttft");
  EXPECT_EQ(k.rules[0].when.sla_class, "voice");
  EXPECT_EQ(k.rules[0].then.op, KvmActionOp::kMul);
  EXPECT_EQ(k.rules[0].sla_class, "voice");
  EXPECT_DOUBLE_EQ(k.rules[0].min, 4);
  EXPECT_DOUBLE_EQ(k.rules[0].max, 64);
  EXPECT_DOUBLE_EQ(k.rules[0].cooldown_ms, 0);
  EXPECT_FALSE(k.rules[0].restore_on_exit);
  EXPECT_DOUBLE_EQ(k.rules[0].hold_ms, 1500);
  EXPECT_DOUBLE_EQ(k.rules[1].hold_ms, 0);
  EXPECT_EQ(k.rules[1].name, "slow-disk");
  EXPECT_EQ(k.rules[1].then.param, "swap");
  EXPECT_DOUBLE_EQ(k.rules[1].then.value, 2);
  EXPECT_DOUBLE_EQ(k.rules[1].cooldown_ms, KvmRule{}.cooldown_ms);
  EXPECT_NE(describe(*c).find("kvm=dry-run(2 rules)"), std::string::npos) << describe(*c);
}

const char* kRule =
    "{when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", then: \"swap = never\"}";

TEST(KvmConfigTest, ExpressionErrorsNameTheFieldPath) {
  expect_error(std::string("kvm:\n  rules:\n    - ") + kRule +
                   "\n    - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", "
                   "then: \"semantic_treshold += 1\"}\n",
               "kvm.rules[1].then: unknown parameter 'semantic_treshold'");
  expect_error(
      "kvm:\n  rules:\n    - {when: \"devce_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", "
      "then: \"swap = never\"}\n",
      "kvm.rules[0].when: unknown metric 'devce_kv_use' (known: device_kv_use");
  expect_error(
      "kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use ~ 0.8\", "
      "then: \"swap = never\"}\n",
      "kvm.rules[0].exit: bad operator");
  // A named rule is named in its expression errors too (as the engine's checks name it).
  expect_error(
      "kvm:\n  rules:\n    - {name: hot, when: \"device_kv_use >\", exit: \"device_kv_use < "
      "0.8\", then: \"swap = never\"}\n",
      "kvm.rules[0] (hot).when: the value of 'device_kv_use >' must be a finite number");
}

TEST(KvmConfigTest, RequiredRuleFields) {
  expect_error("kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", then: \"swap = never\"}\n",
               "kvm.rules[0].exit: required");
  expect_error("kvm:\n  rules:\n    - {exit: \"device_kv_use < 0.9\", then: \"swap = never\"}\n",
               "kvm.rules[0].when: required");
  expect_error(
      "kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\"}\n",
      "kvm.rules[0].then: required");
}

TEST(KvmConfigTest, UnknownKeys) {
  expect_error("kvm: {intervall_ms: 100}\n", "kvm.intervall_ms: unknown key");
  expect_error(
      "kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < "
      "0.8\", then: \"swap = never\", cooldown: 5}\n",
      "kvm.rules[0].cooldown: unknown key");
}

TEST(KvmConfigTest, BadValues) {
  expect_error("kvm: {mode: enforcing}\n",
               "kvm.mode: must be 'enforce' or 'dry-run', got 'enforcing'");
  expect_error("kvm: {rules: {a: 1}}\n", "kvm.rules: must be a list of rules");
  expect_error("kvm: {rules: [3]}\n", "kvm.rules[0]: must be a mapping");
  expect_error(std::string("kvm: {rules: [") + kRule + "], interval_ms: 5}\n",
               "kvm.interval_ms: must be in [10, 60000], got 5");
  expect_error("kvm: {window_ms: 99}\n", "kvm.window_ms: must be in [100, 3600000], got 99");
  // Shorter than the sampling period: the requests finished between two windows were left out.
  expect_error("kvm: {interval_ms: 1000, window_ms: 500}\n",
               "kvm.window_ms: must be >= kvm.interval_ms (1000), got 500");
  expect_error(
      "kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", "
      "then: \"swap = never\", restore_on_exit: yes}\n",
      "kvm.rules[0].restore_on_exit: must be true or false");
  expect_error(
      "kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", "
      "then: \"swap = never\", max: high}\n",
      "kvm.rules[0].max: must be a finite number");
}

TEST(KvmConfigTest, RulesAreValidatedAgainstTheClasses) {
  expect_error(
      "sla_classes: {voice: {max_ttft_ms: 300}}\n"
      "kvm:\n  rules:\n    - {name: q, when: \"queue_depth[voice] > 9\", "
      "exit: \"queue_depth[voice] < 2\", then: \"max_queue *= 0.5\", class: chat}\n",
      "kvm.rules[0] (q): class: unknown class 'chat'");
  expect_error(std::string("kvm:\n  rules:\n    - {name: a, when: \"link_use > 0.5\", exit: "
                           "\"link_use > 0.9\", then: \"swap = never\"}\n"),
               "kvm.rules[0] (a): exit: 'link_use > 0.9' compares the same way");
  expect_error(std::string("kvm:\n  rules:\n    - {name: a, when: \"link_use > 0.5\", exit: "
                           "\"link_use < 0.4\", then: \"swap = never\", min: 2, max: 1}\n"),
               "kvm.rules[0] (a): min: must be <= max");
}

TEST(KvmConfigTest, DuplicateRuleNames) {
  expect_error(std::string("kvm:\n  rules:\n    - {name: a, when: \"link_use > 0.5\", exit: "
                           "\"link_use < 0.4\", then: \"swap = never\"}\n"
                           "    - {name: a, when: \"link_use > 0.5\", exit: "
                           "\"link_use < 0.4\", then: \"swap = auto\"}\n"),
               "kvm.rules[1] (a): name: duplicate rule name 'a'");
}

TEST(KvmConfigTest, RulesFileRelativeToTheCurrentDirectory) {
  kvsplit::testing::TempDir dir;
  write(dir.file("policy.yaml"),
        "rules:\n"
        "  - {name: from-file, when: \"link_use < 0.3\", exit: \"link_use > 0.6\",\n"
        "     then: \"migrate_to_shard = 16\", cooldown_ms: 500}\n"
        "  - {when: \"recall_rate > 100\", exit: \"recall_rate < 10\", then: \"swap = always\"}\n");
  InDir in(dir.path());
  auto c =
      parse_config(std::string("kvm:\n  rules_file: policy.yaml\n  rules:\n    - ") + kRule + "\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const KvmConfig& k = c->engine.kvm;
  EXPECT_TRUE(k.enabled);
  EXPECT_EQ(k.rules_file, "policy.yaml");
  ASSERT_EQ(k.rules.size(), 3u);  // inline first, then the file's
  EXPECT_EQ(k.rules[0].name, "rule-0");
  EXPECT_EQ(k.rules[1].name, "from-file");
  EXPECT_EQ(k.rules[1].then.param, "migrate_to_shard");
  EXPECT_DOUBLE_EQ(k.rules[1].cooldown_ms, 500);
  EXPECT_EQ(k.rules[2].name, "rule-2");  // numbered in the whole policy: no clash with rule-0

  // The file alone enables the KVM.
  auto only = parse_config("kvm: {rules_file: policy.yaml}\n");
  ASSERT_TRUE(only.ok()) << only.status().to_string();
  EXPECT_TRUE(only->engine.kvm.enabled);
  EXPECT_EQ(only->engine.kvm.rules.size(), 2u);

  auto direct = load_kvm_rules_file("policy.yaml");
  ASSERT_TRUE(direct.ok()) << direct.status().to_string();
  EXPECT_EQ(direct->size(), 2u);
  EXPECT_EQ((*direct)[1].name, "rule-1");
}

TEST(KvmConfigTest, RulesFileErrorsNameTheFile) {
  kvsplit::testing::TempDir dir;
  InDir in(dir.path());
  auto missing = parse_config("kvm: {rules_file: absent.yaml}\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("kvm.rules_file absent.yaml: no such file"),
            std::string::npos)
      << missing.status().message();

  write("bad.yaml",
        "rules:\n  - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", then: \"x = "
        "1\"}\n");
  expect_error("kvm: {rules_file: bad.yaml}\n",
               "kvm.rules_file bad.yaml: rules[0].then: unknown parameter 'x'");
  write("extra.yaml", "rules: []\nmode: dry-run\n");
  expect_error("kvm: {rules_file: extra.yaml}\n", "kvm.rules_file extra.yaml: mode: unknown key");
  write("empty.yaml", "");
  expect_error("kvm: {rules_file: empty.yaml}\n", "kvm.rules_file empty.yaml: rules: required");
  write("syntax.yaml", "rules: [\n");
  expect_error("kvm: {rules_file: syntax.yaml}\n", "kvm.rules_file syntax.yaml: YAML error");
  expect_error("kvm: {rules_file: \"\"}\n", "kvm.rules_file: must be a file path");

  // What validation finds in a file's rule (a class the config lacks) names the file and the
  // rule's index there, not its place in the merged list (it said "kvm.rules[1]", which the
  // config does not have).
  write("cls.yaml",
        "rules:\n  - {when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\",\n"
        "     then: \"semantic_threshold += 0.05\", class: nope}\n");
  expect_error(std::string("kvm:\n  rules_file: cls.yaml\n  rules:\n    - ") + kRule + "\n",
               "kvm.rules_file cls.yaml: rules[0] (rule-1): class: unknown class 'nope'");
}

TEST(KvmConfigTest, LoadConfigFileValidatesAPolicy) {
  kvsplit::testing::TempDir dir;
  write(dir.file("c.yaml"),
        "kvm:\n  rules:\n    - {when: \"device_kv_use > 0.9\", exit: "
        "\"device_kv_use > 0.95\", then: \"swap = never\"}\n");
  auto c = load_config_file(dir.file("c.yaml"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("kvm.rules[0] (rule-0): exit:"), std::string::npos)
      << c.status().message();
}

// The YAML blocks of a doc ("```yaml" to "```").
std::vector<std::string> yaml_blocks(const std::string& doc) {
  std::ifstream in(std::string(KVSPLIT_SOURCE_DIR) + "/" + doc);
  std::vector<std::string> blocks;
  std::string line, block;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && line == "```yaml") {
      inside = true;
      block.clear();
    } else if (inside && line == "```") {
      inside = false;
      blocks.push_back(block);
    } else if (inside) {
      block += line + "\n";
    }
  }
  return blocks;
}

TEST(KvmConfigTest, DocExamplesParse) {
  const auto kvm_doc = yaml_blocks("docs/kvm.md");
  ASSERT_FALSE(kvm_doc.empty());
  kvsplit::testing::TempDir dir;
  write(dir.file("kvm-rules.yaml"),
        "rules:\n  - {name: spread, when: \"link_use < 0.3\", exit: \"link_use > 0.6\", "
        "then: \"migrate_to_shard = 64\"}\n");
  InDir in(dir.path());
  auto c = parse_config(kvm_doc[0]);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.kvm.rules.size(), 5u);
  EXPECT_EQ(c->engine.kvm.rules[1].then.param, "recall_precision");
  EXPECT_EQ(c->engine.kvm.rules[1].then.value, 2.0);  // int4
  EXPECT_EQ(c->engine.kvm.rules[3].sla_class, "voice");

  const auto conf_doc = yaml_blocks("docs/configuration.md");
  ASSERT_FALSE(conf_doc.empty());
  c = parse_config(conf_doc.back());  // "## Example"
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->engine.kvm.enabled);
}

}  // namespace
}  // namespace kvsplit::config
