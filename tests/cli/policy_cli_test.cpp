// `kvsplit policy simulate` and `policy make-trace`: exit codes, the --json shape.
#include <gtest/gtest.h>

#include <fstream>

#include "cli_run.h"

namespace kvsplit::testing {
namespace {

constexpr const char* kConfig = R"(pools:
  mode: colocated
  decode_workers: 1
  max_num_seqs: 32
  max_batch_tokens: 256
kv:
  block_size: 16
  blocks_per_worker: 300
sla_classes:
  interactive: {max_ttft_ms: 500, max_itl_ms: 100, priority: 1}
  batch: {max_ttft_ms: 5000, max_itl_ms: 500}
)";

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(PolicyCli, MakeTraceThenSimulateJson) {
  TempDir tmp;
  write(tmp.file("c.yaml"), kConfig);
  RunResult mk = run("policy make-trace --phased --calm-ms 2000 --spike-ms 2000 --out " +
                     quote(tmp.file("t.jsonl")));
  ASSERT_EQ(mk.exit_code, 0) << mk.err;
  RunResult r = run("policy simulate --json --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("t.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("built-in profile"), std::string::npos) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const nlohmann::json& j = lines[0];
  ASSERT_TRUE(j.contains("classes"));
  ASSERT_TRUE(j["decisions"].is_array());
  int64_t total = 0;
  for (const char* name : {"interactive", "batch"}) {
    ASSERT_TRUE(j["classes"].contains(name)) << j.dump();
    const nlohmann::json& c = j["classes"][name];
    for (const char* k : {"requests", "ttft_p99_ms", "itl_p99_ms", "attainment"})
      EXPECT_TRUE(c.contains(k) && c[k].is_number()) << name << "." << k;
    EXPECT_GE(c["attainment"].get<double>(), 0.0);
    EXPECT_LE(c["attainment"].get<double>(), 1.0);
    total += c["requests"].get<int64_t>();
  }
  EXPECT_GT(total, 0);
  // The human form: the per-class table.
  RunResult h = run("policy simulate --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("t.jsonl")));
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("attainment"), std::string::npos);
  EXPECT_NE(h.out.find("decisions (0)"), std::string::npos);
}

TEST(PolicyCli, ProfileFileIsUsed) {
  TempDir tmp;
  write(tmp.file("c.yaml"), kConfig);
  write(tmp.file("t.jsonl"), "{\"arrival_ms\":0,\"prompt_tokens\":100,\"output_tokens\":1}\n");
  write(tmp.file("p.json"),
        "{\"step_base_ms\": 5, \"prefill_ms_per_token\": 1, \"prefill_ms_per_kv_token\": 0}\n");
  RunResult r = run("policy simulate --json --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("t.jsonl")) + " --profile " + quote(tmp.file("p.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("built-in profile"), std::string::npos);
  // The default class (the first) takes the class-less line; TTFT = 5 + 100 * 1 ms.
  EXPECT_DOUBLE_EQ(json_lines(r.out)[0]["classes"]["interactive"]["ttft_p99_ms"].get<double>(),
                   105.0);
  write(tmp.file("p.json"), "{\"step_base_ms\": -5}\n");
  RunResult bad = run("policy simulate --config " + quote(tmp.file("c.yaml")) + " --trace " +
                      quote(tmp.file("t.jsonl")) + " --profile " + quote(tmp.file("p.json")));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("step_base_ms"), std::string::npos) << bad.err;
}

TEST(PolicyCli, BadInputExitsTwoNamingTheLine) {
  TempDir tmp;
  write(tmp.file("c.yaml"), kConfig);
  write(tmp.file("bad.jsonl"),
        "{\"arrival_ms\":0,\"prompt_tokens\":4,\"output_tokens\":2}\n\n"
        "{\"arrival_ms\":1,\"prompt_tokens\":-4,\"output_tokens\":2}\n");
  RunResult r = run("policy simulate --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("bad.jsonl")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad.jsonl:3: prompt_tokens"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());

  write(tmp.file("cls.jsonl"),
        "{\"arrival_ms\":0,\"prompt_tokens\":4,\"output_tokens\":2,\"class\":\"gold\"}\n");
  RunResult c = run("policy simulate --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("cls.jsonl")));
  EXPECT_EQ(c.exit_code, 2);
  EXPECT_NE(c.err.find("trace line 1: class: unknown SLA class 'gold'"), std::string::npos)
      << c.err;

  RunResult m = run("policy simulate --config " + quote(tmp.file("missing.yaml")) + " --trace " +
                    quote(tmp.file("cls.jsonl")));
  EXPECT_EQ(m.exit_code, 2);
  RunResult n = run("policy simulate --config " + quote(tmp.file("c.yaml")));
  EXPECT_EQ(n.exit_code, 2);  // --trace is required
  RunResult p = run("policy make-trace --out " + quote(tmp.file("x.jsonl")));
  EXPECT_EQ(p.exit_code, 2);  // --phased is required
  EXPECT_NE(p.err.find("--phased"), std::string::npos);
}

// A semantic-cut engine under a memory spike with a device-use rule: the rule fires in the
// simulation and the decisions appear in the --json line; a bad rule exits 2 naming it.
constexpr const char* kKvmConfig = R"(pools:
  mode: colocated
  decode_workers: 1
  max_num_seqs: 64
  max_batch_tokens: 256
kv:
  block_size: 16
  blocks_per_worker: 400
  policy: semantic
  cuts:
    semantic: {semantic_threshold: 0.05, evict_threshold: 0.0, recent_tokens: 16,
               demote_after_steps: 1, score_interval: 1}
sla_classes:
  interactive: {max_ttft_ms: 500, max_itl_ms: 100, priority: 1}
  batch: {max_ttft_ms: 5000, max_itl_ms: 500}
kvm:
  interval_ms: 10
  rules:
    - {name: hot, when: "device_kv_use > 0.8", exit: "device_kv_use < 0.3",
       then: "semantic_threshold = 0.9", cooldown_ms: 50}
)";

TEST(PolicyCli, KvmRuleFiresAndBadRuleIsNamed) {
  TempDir tmp;
  write(tmp.file("c.yaml"), kKvmConfig);
  std::string trace;
  for (int i = 0; i < 40; ++i) {
    trace += "{\"arrival_ms\":" + std::to_string(i * 2) +
             ",\"prompt_tokens\":512,\"output_tokens\":192,\"class\":\"batch\"}\n";
  }
  write(tmp.file("t.jsonl"), trace);
  write(tmp.file("p.json"),
        "{\"step_base_ms\": 1, \"prefill_ms_per_token\": 0.01, \"prefill_ms_per_kv_token\": 0, "
        "\"decode_ms_per_seq\": 0.1, \"decode_ms_per_kv_token\": 0.001, "
        "\"kv_bytes_per_token_full\": 100, \"kv_bytes_per_token_int8\": 30, "
        "\"kv_bytes_per_token_int4\": 18}\n");
  RunResult r = run("policy simulate --json --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("t.jsonl")) + " --profile " + quote(tmp.file("p.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = json_lines(r.out).at(0);
  ASSERT_FALSE(j["decisions"].empty()) << r.out;
  const nlohmann::json& d = j["decisions"][0];
  EXPECT_EQ(d["rule"], "hot");
  EXPECT_EQ(d["action"], "enter");
  EXPECT_EQ(d["param"], "semantic_threshold");
  EXPECT_EQ(d["class"], "");
  EXPECT_NEAR(d["before"].get<double>(), 0.05, 1e-6);
  EXPECT_DOUBLE_EQ(d["after"].get<double>(), 0.9);
  EXPECT_TRUE(d["time_ms"].is_number());
  EXPECT_NE(d["monitors"].get<std::string>().find("device_kv_use="), std::string::npos);
  EXPECT_EQ(j["classes"]["batch"]["requests"], 40);
  // The human form lists the decision.
  RunResult h = run("policy simulate --config " + quote(tmp.file("c.yaml")) + " --trace " +
                    quote(tmp.file("t.jsonl")) + " --profile " + quote(tmp.file("p.json")));
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("hot"), std::string::npos);
  EXPECT_NE(h.out.find("semantic_threshold"), std::string::npos);

  std::string bad = kKvmConfig;
  bad.replace(bad.find("semantic_threshold = 0.9"), 24, "semantic_treshold = 0.9");
  write(tmp.file("bad.yaml"), bad);
  RunResult b = run("policy simulate --config " + quote(tmp.file("bad.yaml")) + " --trace " +
                    quote(tmp.file("t.jsonl")));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.err.find("kvm.rules[0]"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("semantic_treshold"), std::string::npos) << b.err;
}

}  // namespace
}  // namespace kvsplit::testing
