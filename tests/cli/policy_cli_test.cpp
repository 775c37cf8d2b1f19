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

}  // namespace
}  // namespace kvsplit::testing
