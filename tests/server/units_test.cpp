// Pure helpers of the server: request validation, bench workload/report.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <mutex>
#include <thread>

#include "config/config.h"
#include "server/auth.h"
#include "server/bench_report.h"
#include "server/convert.h"
#include "server/protocol.h"

namespace kvsplit::server {
namespace {

TEST(ConvertTest, DefaultsAndClassNaming) {
  RequestLimits l;
  l.vocab_size = 512;
  l.max_context = 512;
  l.default_max_tokens = 7;
  l.class_names = {"gold", "tin"};
  v1::GenerateRequest in;
  in.set_prompt("");
  auto r = to_engine_request(in, l);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.max_tokens, 7);
  EXPECT_TRUE(r->max_tokens_is_default);  // the engine fits it to the prompt's room
  EXPECT_EQ(r->sla_class, "gold");        // empty -> the default class, named
  EXPECT_EQ(r->sampling.temperature, SamplingParams{}.temperature);  // unset is not zero
  EXPECT_FALSE(r->sampling.seed.has_value());
  in.mutable_sampling()->set_temperature(0.0f);
  in.mutable_sampling()->set_seed(0);
  in.set_sla_class("tin");
  in.set_max_tokens(7);
  r = to_engine_request(in, l);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->max_tokens_is_default);  // the client's own 7: refused if it does not fit
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  ASSERT_TRUE(r->sampling.seed.has_value());
  EXPECT_EQ(r->sla_class, "tin");
  in.set_sla_class("lead");
  r = to_engine_request(in, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("known: gold, tin"), std::string::npos);
}

// The spatial cut's fields of a pool reach GetServerStats, the communicator's name included.
TEST(ConvertTest, ServerStatsCarryTheShardGroupsCommunicator) {
  EngineStats stats;
  PoolStats sharded;
  sharded.name = "worker-0";
  sharded.kv_shards = 2;
  sharded.kv_shard_exchange_bytes = 4096;
  sharded.kv_shard_exchange_seconds = 0.25;
  sharded.kv_shard_communicator = "nccl";
  stats.pools.push_back(sharded);
  PoolStats plain;
  plain.name = "worker-1";
  stats.pools.push_back(plain);
  v1::GetServerStatsResponse out;
  fill_server_stats(stats, {}, 0, &out);
  ASSERT_EQ(out.pools_size(), 2);
  EXPECT_EQ(out.pools(0).kv_shards(), 2);
  EXPECT_EQ(out.pools(0).kv_shard_exchange_bytes(), 4096);
  EXPECT_DOUBLE_EQ(out.pools(0).kv_shard_exchange_seconds(), 0.25);
  EXPECT_EQ(out.pools(0).kv_shard_communicator(), "nccl");
  EXPECT_EQ(out.pools(1).kv_shard_communicator(), "");  // no shard group
}

// A class's failed requests are SLO misses: GetServerStats carries them (it showed 2 of 2
// finished requests meeting their targets while 10 more had timed out in the queue), and how long
// its oldest queued request has waited.
TEST(ConvertTest, ServerStatsCarryEachClassesFailures) {
  EngineStats stats;
  SlaClassStats tight;
  tight.name = "tight";
  tight.finished = 2;
  tight.met_both = 2;
  tight.failed = 10;
  tight.queued = 3;
  tight.oldest_queued_ms = 41.5;
  stats.classes.push_back(tight);
  SlaClass def;
  def.name = "tight";
  def.max_ttft_ms = 50;
  v1::GetServerStatsResponse out;
  fill_server_stats(stats, {def}, 0, &out);
  ASSERT_EQ(out.classes_size(), 1);
  EXPECT_EQ(out.classes(0).finished(), 2);
  EXPECT_EQ(out.classes(0).failed(), 10);
  EXPECT_EQ(out.classes(0).queued(), 3);
  EXPECT_DOUBLE_EQ(out.classes(0).oldest_queued_ms(), 41.5);
  EXPECT_DOUBLE_EQ(out.classes(0).max_ttft_ms(), 50);
}

// A model path is bytes, the reply's `source` a proto string: a byte of invalid UTF-8 becomes
// U+FFFD (it once failed every GetModelInfo reply), the rest is kept.
TEST(ConvertTest, ModelSourceIsValidUtf8) {
  ModelInfo info;
  info.source = "/models/m\xff.bin";
  v1::GetModelInfoResponse out;
  fill_model_info(info, {}, &out);
  EXPECT_EQ(out.source(), "/models/m\xef\xbf\xbd.bin");
  std::string wire;
  EXPECT_TRUE(out.SerializeToString(&wire));
}

TEST(ConvertTest, ReservedIdPrefixAndEscapedClassNames) {
  RequestLimits l;
  l.vocab_size = 512;
  l.max_context = 512;
  l.class_names = {"gold"};
  v1::GenerateRequest in;
  in.set_prompt("hi");
  in.set_request_id("grpc-7");
  auto r = to_engine_request(in, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("request_id: the prefix 'grpc-' is reserved"),
            std::string::npos)
      << r.status().message();
  in.set_request_id("grpc7");  // only the exact prefix is reserved
  EXPECT_TRUE(to_engine_request(in, l).ok());
  in.set_sla_class(std::string("x\0\x1b[2J\x9b", 7));
  r = to_engine_request(in, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown class 'x\\x00\\x1b[2J\\x9b'"), std::string::npos)
      << r.status().message();
  in.set_sla_class(std::string(500, 'y'));
  r = to_engine_request(in, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("...(500 bytes)"), std::string::npos);
  EXPECT_LT(r.status().message().size(), 200u);
}

// config::kRequestFieldsBytes is what a message keeps beside its prompt: the largest request that
// passes validation must fit in it, or a prompt of server.max_prompt_bytes with long stop strings
// and ids is refused by gRPC's size limit before the server checks it (4096 was 900 bytes short).
RequestLimits largest_limits() {
  RequestLimits l;
  l.vocab_size = 1 << 30;
  l.max_context = 1 << 30;
  l.max_prompt_bytes = 1 << 20;
  l.max_tokens_limit = 1 << 20;
  l.class_names = {"default", std::string(64, 'c')};
  return l;
}

// Every field but guided at its longest encoding.
v1::GenerateRequest largest_request(const RequestLimits& l) {
  v1::GenerateRequest in;
  in.set_request_id(std::string(128, 'r'));
  in.set_prompt(std::string(1 << 20, 'p'));
  in.set_max_tokens(l.max_tokens_limit);
  v1::SamplingParams* s = in.mutable_sampling();
  s->set_temperature(0.5f);
  s->set_top_p(0.5f);
  s->set_top_k(-1);  // a negative int32 is the longest varint
  s->set_min_p(0.5f);
  s->set_seed(~uint64_t{0});
  s->set_repetition_penalty(1.5f);
  s->set_presence_penalty(-1.5f);
  s->set_frequency_penalty(-1.5f);
  for (int i = 0; i < 16; ++i) in.add_stop(std::string(256, static_cast<char>('a' + i)));
  for (int i = 0; i < 64; ++i) in.add_stop_token_ids(l.vocab_size - 1 - i);
  in.set_ignore_eos(true);
  in.set_sla_class(l.class_names.back());
  in.set_priority(-1000);
  in.set_top_logprobs(20);
  in.set_cache_salt(std::string(256, 's'));
  in.set_min_tokens(l.max_tokens_limit);
  // The most logit_bias entries, each of the longest encoding (an id near 2^30, a 5-byte varint).
  for (int i = 0; i < 200; ++i) (*s->mutable_logit_bias())[l.vocab_size - 1 - i] = -100.0f;
  in.set_n(128);
  in.set_prompt_logprobs(20);
  return in;
}

TEST(ConvertTest, TheLargestValidRequestFitsBesideItsPrompt) {
  const RequestLimits l = largest_limits();
  const v1::GenerateRequest in = largest_request(l);
  ASSERT_TRUE(to_engine_request(in, l).ok()) << to_engine_request(in, l).status().to_string();
  const size_t fields = in.ByteSizeLong() - in.prompt().size();
  EXPECT_LE(fields, static_cast<size_t>(config::kRequestFieldsBytes)) << fields;
}

// With guided decoding's largest constraint, 256 choices of 1024 bytes (a 32 KiB regex or schema
// is smaller), and ignore_eos off (guided decoding refuses it). Needs the engine side's validate
// to accept it as valid (it is at every limit, not past one).
TEST(ConvertTest, TheLargestGuidedRequestFitsBesideItsPrompt) {
  const RequestLimits l = largest_limits();
  v1::GenerateRequest in = largest_request(l);
  in.set_ignore_eos(false);
  v1::ChoiceList* choices = in.mutable_guided()->mutable_choice();
  // 256 choices of 128 bytes: the 32 KiB the choices may take in all, in the most pieces.
  for (size_t i = 0; i < kMaxGuidedChoices; ++i) {
    std::string c = std::to_string(i) + ":";
    c.resize(kMaxGuidedSpecBytes / kMaxGuidedChoices, static_cast<char>('a' + i % 26));
    choices->add_choices(c);
  }
  ASSERT_TRUE(to_engine_request(in, l).ok()) << to_engine_request(in, l).status().to_string();
  size_t fields = in.ByteSizeLong() - in.prompt().size();
  EXPECT_LE(fields, static_cast<size_t>(config::kRequestFieldsBytes)) << fields;

  in.mutable_guided()->set_regex(std::string(kMaxGuidedSpecBytes, 'a'));
  ASSERT_TRUE(to_engine_request(in, l).ok()) << to_engine_request(in, l).status().to_string();
  fields = in.ByteSizeLong() - in.prompt().size();
  EXPECT_LE(fields, static_cast<size_t>(config::kRequestFieldsBytes)) << fields;

  // And the default server.max_message_bytes holds it with the largest prompt the default allows.
  config::ServerConfig defaults;
  EXPECT_LE(static_cast<int64_t>(defaults.max_prompt_bytes) + config::kRequestFieldsBytes,
            defaults.max_message_bytes);
}

// A key's tenant: only a configured key (whole, of any length) has one, and its id is the
// documented PBKDF2 derivation (a published id costs an offline guesser 10,000 hashes per guess;
// it was one SHA-256), stable and never the key.
TEST(ApiKeyAuthTest, TenantsOfConfiguredKeysOnly) {
  const ApiKeyAuth auth(config::plain_api_keys({"alpha-key-000001", "bravo-key-000002-longer"}));
  ASSERT_NE(auth.tenant_of("alpha-key-000001"), nullptr);
  ASSERT_NE(auth.tenant_of("bravo-key-000002-longer"), nullptr);
  EXPECT_EQ(*auth.tenant_of("alpha-key-000001"), ApiKeyAuth::tenant_id("alpha-key-000001"));
  EXPECT_NE(*auth.tenant_of("alpha-key-000001"), *auth.tenant_of("bravo-key-000002-longer"));
  for (const char* wrong :
       {"", "alpha-key-00000", "alpha-key-0000011", "ALPHA-KEY-000001", "bravo-key-000002",
        "alpha-key-000052"})  // the last: its SHA-256 has the first byte of alpha-key-000001's
    EXPECT_EQ(auth.tenant_of(wrong), nullptr) << wrong;
  const std::string key = "alpha-key-000001";
  unsigned char want[6];
  ASSERT_EQ(PKCS5_PBKDF2_HMAC(key.data(), static_cast<int>(key.size()),
                              reinterpret_cast<const unsigned char*>("kvsplit-tenant"), 14, 10000,
                              EVP_sha256(), sizeof(want), want),
            1);
  std::string hex = "key-";
  for (unsigned char b : want) hex += fmt::format("{:02x}", b);
  EXPECT_EQ(ApiKeyAuth::tenant_id(key), hex);
  EXPECT_EQ(ApiKeyAuth::tenant_id(key).find(key), std::string::npos);
}

TEST(ThrottledLogTest, OneLinePerIntervalWithTheSuppressedCount) {
  std::vector<std::string> lines;
  std::mutex mu;
  ThrottledLog log(std::chrono::milliseconds(300), [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(line);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) log.report("bad request");
    });
  }
  for (auto& th : threads) th.join();
  // 1000 reports within far less than 300 ms on any machine that runs this in under a minute;
  // each line is at least 300 ms after the previous one.
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  log.report("bad request");
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "bad request");
  // Every report is accounted for: the ones logged plus the suppressed counts.
  int64_t total = static_cast<int64_t>(lines.size());
  for (const std::string& l : lines) {
    const auto at = l.find(" (");
    if (at != std::string::npos) total += std::stoll(l.substr(at + 2));
  }
  EXPECT_EQ(total, 1001);
  EXPECT_NE(lines.back().find("similar reports suppressed in the last 300 ms"), std::string::npos)
      << lines.back();
}

TEST(BenchReportTest, WorkloadIsSeededAndWithinRanges) {
  bench::Spec s;
  ASSERT_TRUE(bench::parse_spec("4:8", "2:3", "a:3,b:1", &s).ok());
  s.num_requests = 400;
  s.rate = 100;
  s.seed = 9;
  const auto w1 = bench::make_workload(s, 512, 512), w2 = bench::make_workload(s, 512, 512);
  ASSERT_EQ(w1.size(), 400u);
  int a = 0;
  for (size_t i = 0; i < w1.size(); ++i) {
    EXPECT_EQ(w1[i].prompt, w2[i].prompt);
    EXPECT_GE(w1[i].prompt.size(), 4u);
    EXPECT_LE(w1[i].prompt.size(), 8u);
    EXPECT_GE(w1[i].max_tokens, 2u);
    EXPECT_LE(w1[i].max_tokens, 3u);
    if (i) {
      EXPECT_GE(w1[i].arrival_s, w1[i - 1].arrival_s);
    }
    a += w1[i].sla_class == "a";
  }
  EXPECT_NEAR(w1.back().arrival_s, 4.0, 1.0);  // 400 arrivals at 100/s
  EXPECT_NEAR(a / 400.0, 0.75, 0.08);
  EXPECT_FALSE(bench::parse_spec("8:4", "2:3", "", &s).ok());
  EXPECT_FALSE(bench::parse_spec("4:8", "x", "", &s).ok());
  EXPECT_FALSE(bench::parse_spec("4:8", "2:3", "a:-1", &s).ok());
  // Whole numbers only: "16-128" was read as 16:16 and "32:128x" as 32:128.
  EXPECT_FALSE(bench::parse_spec("16-128", "2:3", "", &s).ok());
  EXPECT_FALSE(bench::parse_spec("4:8", "32:128x", "", &s).ok());
  EXPECT_FALSE(bench::parse_spec("4:", "2:3", "", &s).ok());
  ASSERT_TRUE(bench::parse_spec("16", "2:3", "", &s).ok());
  EXPECT_EQ(s.prompt_min, 16);
  EXPECT_EQ(s.prompt_max, 16);
}

// max_tokens is clipped to what the engine admits, prompt + max_tokens - 1 <= max_context (it
// was clipped two short).
TEST(BenchReportTest, MaxTokensIsClippedToWhatTheEngineAdmits) {
  bench::Spec s;
  ASSERT_TRUE(bench::parse_spec("90:90", "20:20", "", &s).ok());
  s.num_requests = 3;
  for (const bench::Work& w : bench::make_workload(s, 512, 100)) {
    ASSERT_EQ(w.prompt.size(), 90u);
    EXPECT_EQ(w.max_tokens, 11u);
  }
}

TEST(BenchReportTest, QuantilesAndGoodput) {
  EXPECT_DOUBLE_EQ(bench::quantile({1, 2, 3, 4, 5}, 0.5), 3);
  EXPECT_DOUBLE_EQ(bench::quantile({1, 2}, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(bench::quantile({}, 0.9), 0);
  bench::Spec s;
  std::vector<bench::Outcome> o(3);
  o[0] = {true, "", "v", 10, 50, 100, {5, 5}};
  o[1] = {true, "", "v", 10, 500, 900, {5}};  // misses TTFT
  o[2] = {false, "boom", "v", 0, 0, 0, {}};
  auto j = bench::summarize("grpc", s, o, 2.0, {{"v", {100, 20}}});
  EXPECT_EQ(j["errors"].get<int>(), 1);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(j["goodput_rps"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["p50"].get<double>(), 275);
}

// Goodput counts a request whose TTFT and mean ITL meet its class's targets, as the server's SLO
// counters do: one long gap (a preemption) over max_itl_ms does not fail a request whose mean
// ITL meets it; a mean over it does.
TEST(BenchReportTest, GoodputUsesTheMeanInterTokenLatency) {
  bench::Spec s;
  std::vector<bench::Outcome> o(2);
  for (bench::Outcome& r : o) {
    r.ok = true;
    r.sla_class = "v";
    r.record_message(50, 50, 1);  // first token at 50 ms
  }
  // 1 + 2 + 6 tokens after the first: gaps 45 ms, 10 ms, 30 ms: mean 85 / 9 ms; largest 45 ms.
  o[0].record_message(95, 45, 1);
  o[0].record_message(105, 10, 2);
  o[0].record_message(135, 30, 6);
  // Mean 25 ms per token.
  o[1].record_message(100, 50, 2);
  EXPECT_EQ(o[0].tokens, 10);
  EXPECT_DOUBLE_EQ(o[0].ttft_ms, 50);
  EXPECT_DOUBLE_EQ(o[0].mean_itl_ms(), 85.0 / 9);
  ASSERT_EQ(o[0].itl_ms.size(), 3u);
  EXPECT_DOUBLE_EQ(o[0].itl_ms[1], 5);
  EXPECT_DOUBLE_EQ(o[1].mean_itl_ms(), 25);
  auto j = bench::summarize("grpc", s, o, 1.0, {{"v", {100, 20}}});
  EXPECT_DOUBLE_EQ(j["goodput_rps"].get<double>(), 1);
}

TEST(BenchReportTest, ErrorsGroupByKindIgnoringNumbers) {
  EXPECT_EQ(bench::error_kind("request grpc-2738 waited 30158 ms"), "request grpc-# waited # ms");
  EXPECT_EQ(bench::error_kind("request grpc-3fa80b21c9d4e5f60718293a4b5c6d7e waited 30158 ms"),
            "request grpc-# waited # ms");
  EXPECT_EQ(bench::error_kind("decode-0: SLA class 'fade' bad"), "decode-#: SLA class 'fade' bad");
  EXPECT_EQ(bench::error_kind(std::string(500, 'x')).size(), 240u);
  bench::Spec s;
  s.num_requests = 3;
  std::vector<bench::Outcome> o(3);
  o[0] = {false, "request grpc-1 waited 30001 ms", "v", 0, 0, 0, {}};
  o[1] = {false, "request grpc-22 waited 30158 ms", "v", 0, 0, 0, {}};
  o[2] = {false, "boom", "v", 0, 0, 0, {}};
  auto j = bench::summarize("grpc", s, o, 1.0, {});
  ASSERT_EQ(j["error_kinds"].size(), 2u);
  EXPECT_EQ(j["error_kinds"]["request grpc-# waited # ms"].get<int>(), 2);
  EXPECT_EQ(j["error_kinds"]["boom"].get<int>(), 1);
}

}  // namespace
}  // namespace kvsplit::server
