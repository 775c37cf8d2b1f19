// Generation over gRPC against the real kvsplit-server binary: goldens with 64 streams in
// flight, cancellation and deadlines freeing all KV, health, reflection-free raw calls, metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

const char* kConfig = R"(
kv: {capacity_mb: 64}
server: {max_tokens_limit: 600, default_max_tokens: 8}
sla_classes:
  standard: {max_ttft_ms: 5000, max_itl_ms: 1000}
  voice: {max_ttft_ms: 300, max_itl_ms: 100, priority: 10}
)";

class GenerationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_models()) return;
    dir_ = new TempDir();
    std::ofstream(dir_->file("server.yaml")) << kConfig;
    server_ = new ServerProcess(
        {"--config", dir_->file("server.yaml"), "--model", model_path("stories260K-hf")},
        dir_->file("server.log"));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
    server_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override {
    KVSPLIT_REQUIRE_MODELS();
    ASSERT_TRUE(server_->started()) << server_->log();
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Generation::NewStub(channel_);
  }

  v1::GetServerStatsResponse stats() {
    grpc::ClientContext ctx;
    v1::GetServerStatsResponse r;
    EXPECT_TRUE(stub_->GetServerStats(&ctx, {}, &r).ok());
    return r;
  }
  // Waits until every pool has all its blocks free; returns false on timeout.
  bool wait_all_kv_free(std::chrono::milliseconds timeout, v1::GetServerStatsResponse* last) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    do {
      *last = stats();
      bool all_free = last->pools_size() > 0;
      for (const auto& p : last->pools())
        all_free = all_free && p.kv_blocks_free() == p.kv_blocks_total();
      // The stream count drops when a reactor is done, which can trail the KV release.
      if (all_free && last->num_running() == 0 && last->num_waiting() == 0 &&
          last->active_streams() == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
    return false;
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};
TempDir* GenerationTest::dir_ = nullptr;
ServerProcess* GenerationTest::server_ = nullptr;

struct Result {
  std::vector<int32_t> ids;
  std::string text;
  v1::GenerateResponse last;
  grpc::Status status;
  int messages = 0;
};

Result generate(v1::Generation::Stub* stub, const v1::GenerateRequest& req,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(120000)) {
  Result r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    r.ids.insert(r.ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    r.text += msg.text();
    r.last = msg;
    ++r.messages;
  }
  r.status = reader->Finish();
  return r;
}

TEST_F(GenerationTest, GoldensWith64StreamsInFlight) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  ASSERT_EQ(cases.size(), 12u);
  constexpr int kStreams = 64;
  std::vector<Result> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      const auto& c = cases[i % cases.size()];
      v1::GenerateRequest req;
      req.set_prompt(c["prompt"].get<std::string>());
      req.set_max_tokens(c["steps"].get<int>() - static_cast<int>(c["prompt_token_ids"].size()) +
                         1);
      req.mutable_sampling()->set_temperature(0.0f);
      results[i] = generate(stub_.get(), req);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    const auto& c = cases[i % cases.size()];
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, c["output_token_ids"].get<std::vector<int32_t>>())
        << "stream " << i << " prompt '" << c["prompt"] << "'";
    const auto& last = results[i].last;
    EXPECT_NE(last.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
    EXPECT_EQ(last.usage().completion_tokens(), results[i].ids.size());
    EXPECT_EQ(last.usage().prompt_tokens(), c["prompt_token_ids"].size());
    EXPECT_GT(last.timings().e2e_ms(), 0);
    EXPECT_GE(last.timings().e2e_ms(), last.timings().ttft_ms());
    // Effective KV (docs/kvm.md): pages and tokens were held, at most every token of the
    // request for its whole life.
    EXPECT_GT(last.usage().effective_kv_byte_seconds(), 0);
    EXPECT_GT(last.usage().kv_token_seconds(), 0);
    EXPECT_LE(last.usage().kv_token_seconds(),
              (last.usage().prompt_tokens() + last.usage().completion_tokens()) *
                  last.timings().e2e_ms() / 1e3);
  }
  v1::GetServerStatsResponse s;
  EXPECT_TRUE(wait_all_kv_free(std::chrono::seconds(5), &s)) << s.DebugString();
}

TEST_F(GenerationTest, TokenIdPromptAndIdsInEveryMessageMatchText) {
  v1::GenerateRequest req;
  req.mutable_prompt_token_ids()->add_ids(1);
  req.mutable_prompt_token_ids()->add_ids(403);
  req.set_max_tokens(20);
  req.set_request_id("my-req-1");
  req.mutable_sampling()->set_temperature(0.0f);
  Result r = generate(stub_.get(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.last.request_id(), "my-req-1");
  EXPECT_EQ(r.ids.size(), r.last.usage().completion_tokens());
  EXPECT_LE(r.ids.size(), 20u);  // max_tokens counts generated tokens
  EXPECT_FALSE(r.text.empty());
  EXPECT_EQ(r.last.usage().prompt_tokens(), 2u);
}

TEST_F(GenerationTest, DefaultMaxTokensAndLogprobs) {
  v1::GenerateRequest req;
  req.set_prompt("Once upon a time");
  req.set_ignore_eos(true);
  req.set_top_logprobs(3);
  req.mutable_sampling()->set_temperature(0.0f);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  int ids = 0, lps = 0;
  while (reader->Read(&msg)) {
    ids += msg.token_ids_size();
    lps += msg.logprobs_size();
    for (int i = 0; i < msg.logprobs_size(); ++i) {
      EXPECT_EQ(msg.logprobs(i).token_id(), msg.token_ids(i));
      EXPECT_LE(msg.logprobs(i).logprob(), 0.0f);
      EXPECT_EQ(msg.logprobs(i).top_size(), 3);
      EXPECT_EQ(msg.logprobs(i).top(0).token_id(), msg.token_ids(i));  // greedy: the top-1
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(ids, 8);  // server.default_max_tokens (ignore_eos)
  EXPECT_EQ(lps, ids);
}

// A prompt longer than the context: without max_tokens the message gives the prompt's length and
// the context's, with it the client's own value (it quoted "max_tokens (1)", the default fitted to
// the room left, to a client that had sent none). INVALID_ARGUMENT either way.
TEST_F(GenerationTest, APromptTooLongForTheContextQuotesOnlyWhatWasAsked) {
  v1::GenerateRequest req;
  req.set_prompt(std::string(3000, 'a'));
  req.mutable_sampling()->set_temperature(0.0f);
  const Result unset = generate(stub_.get(), req);
  EXPECT_EQ(unset.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const std::string& msg = unset.status.error_message();
  EXPECT_EQ(msg.find("max_tokens"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("prompt (", 0), 0u) << msg;
  const size_t tokens = std::stoul(msg.substr(8));
  EXPECT_GT(tokens, 512u) << msg;
  EXPECT_NE(msg.find("prompt (" + std::to_string(tokens) +
                     " tokens) is longer than the model context of 512 tokens"),
            std::string::npos)
      << msg;
  req.set_max_tokens(10);
  const Result set = generate(stub_.get(), req);
  EXPECT_EQ(set.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(set.status.error_message().find("prompt (" + std::to_string(tokens) +
                                            " tokens) + max_tokens (10) - 1 = " +
                                            std::to_string(tokens + 9) + " positions exceeds"),
            std::string::npos)
      << set.status.error_message();
}

TEST_F(GenerationTest, ClientCancelAndDeadlineFreeAllKv) {
  v1::GetServerStatsResponse before;
  ASSERT_TRUE(wait_all_kv_free(std::chrono::seconds(5), &before));
  const int64_t cancelled_before = before.requests_cancelled();
  constexpr int kStreams = 16;
  std::atomic<int> cancelled{0}, deadline{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req;
      req.set_prompt("Once upon a time");
      req.set_max_tokens(500);
      req.set_ignore_eos(true);
      grpc::ClientContext ctx;
      if (i % 2)
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(150));
      auto reader = stub_->Generate(&ctx, req);
      v1::GenerateResponse msg;
      if (reader->Read(&msg) && i % 2 == 0) ctx.TryCancel();  // after the first tokens
      while (reader->Read(&msg)) {
      }
      grpc::Status st = reader->Finish();
      if (st.error_code() == grpc::StatusCode::CANCELLED) ++cancelled;
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++deadline;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(cancelled.load(), kStreams / 2);
  EXPECT_GT(deadline.load(), 0) << "no stream hit its 150 ms deadline";
  v1::GetServerStatsResponse after;
  EXPECT_TRUE(wait_all_kv_free(std::chrono::seconds(5), &after)) << after.DebugString();
  ASSERT_EQ(after.pools_size(), before.pools_size());
  for (int i = 0; i < after.pools_size(); ++i)
    EXPECT_EQ(after.pools(i).kv_blocks_free(), before.pools(i).kv_blocks_free())
        << after.pools(i).name();
  // A cancel reaches the engine unless the request finished first (a client starved for the
  // ~0.5 s the 500 tokens take, on a loaded host): at least one must have been counted.
  EXPECT_GE(after.requests_cancelled() - cancelled_before, 1) << after.DebugString();
  EXPECT_EQ(after.active_streams(), 0);
}

// Abort without API keys (the anonymous tenant). The 500 tokens take ~0.5 s, so the Abort lands
// mid-stream unless the client is starved that long on a loaded host: a try where the request
// finished first (all 500 tokens, LENGTH) is tried again, and an Abort that never aborts fails.
TEST_F(GenerationTest, AbortByRequestId) {
  bool aborted = false;
  for (int attempt = 0; attempt < 3 && !aborted; ++attempt) {
    SCOPED_TRACE(attempt);
    v1::GenerateRequest req;
    req.set_prompt("The dog");
    req.set_max_tokens(500);
    req.set_ignore_eos(true);
    req.set_request_id("abort-me-" + std::to_string(attempt));
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    size_t ids = static_cast<size_t>(msg.token_ids_size());
    grpc::ClientContext actx;
    v1::AbortRequest areq;
    areq.set_request_id(req.request_id());
    v1::AbortResponse aresp;
    ASSERT_TRUE(stub_->Abort(&actx, areq, &aresp).ok());
    v1::GenerateResponse last = msg;
    while (reader->Read(&msg)) {
      ids += static_cast<size_t>(msg.token_ids_size());
      last = msg;
    }
    ASSERT_TRUE(reader->Finish().ok());
    aborted = aresp.aborted();
    if (aborted) {
      EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_CANCELLED);
      EXPECT_LT(ids, 500u);
    } else {
      // Not aborted only because it had finished: every token, and LENGTH.
      EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(ids, 500u);
    }
    grpc::ClientContext actx2;
    ASSERT_TRUE(stub_->Abort(&actx2, areq, &aresp).ok());
    EXPECT_FALSE(aresp.aborted());  // no longer in flight
  }
  EXPECT_TRUE(aborted);
  v1::GetServerStatsResponse last_stats;
  EXPECT_TRUE(wait_all_kv_free(std::chrono::seconds(10), &last_stats)) << last_stats.DebugString();
}

TEST_F(GenerationTest, HealthServingViaStandardService) {
  std::string resp;
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message; SERVING is status = 1.
  grpc::Status st = raw_unary(channel_, "/grpc.health.v1.Health/Check", "", &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp, std::string("\x08\x01", 2));
  const std::string svc = "kvsplit.v1.Generation";
  st = raw_unary(channel_, "/grpc.health.v1.Health/Check",
                 std::string("\x0a") + char(svc.size()) + svc, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp, std::string("\x08\x01", 2));
}

TEST_F(GenerationTest, ModelInfoAndStats) {
  grpc::ClientContext ctx;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.max_context(), 512);
  EXPECT_EQ(info.max_tokens_limit(), 600u);
  ASSERT_EQ(info.sla_classes_size(), 2);
  EXPECT_EQ(info.sla_classes(0), "standard");
  const auto s = stats();
  EXPECT_GE(s.pools_size(), 1);
  ASSERT_EQ(s.classes_size(), 2);
  EXPECT_EQ(s.classes(1).name(), "voice");
  EXPECT_EQ(s.classes(1).max_ttft_ms(), 300);
}

// The value of the sample `series` ("name" or "name{labels}", as exposed) in a scrape; -1 when
// it is missing.
double sample_value(const std::string& text, const std::string& series) {
  for (size_t at = text.find(series + " "); at != std::string::npos;
       at = text.find(series + " ", at + 1)) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
  }
  return -1;
}

// The counters move by what a request did, not only exist: its prompt and generated tokens, and
// one finished request of its class that met both of its (loose) targets.
TEST_F(GenerationTest, PrometheusCountersMoveByTheRequest) {
  const std::string finished = "kvsplit:sla_requests_finished_total{sla_class=\"standard\"}";
  const std::string met = "kvsplit:sla_slo_met_total{sla_class=\"standard\"}";
  const std::string before = scrape_metrics(server_->metrics_port());
  v1::GenerateRequest req;
  req.set_prompt("Lily wanted to");
  req.set_max_tokens(10);
  req.set_sla_class("standard");
  const Result r = generate(stub_.get(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  std::string after;
  for (int k = 0; k < 500; ++k) {  // the stats a scrape reads are published after the step
    after = scrape_metrics(server_->metrics_port());
    if (sample_value(after, finished) >= sample_value(before, finished) + 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto delta = [&](const std::string& series) {
    const double a = sample_value(after, series), b = sample_value(before, series);
    EXPECT_GE(a, 0) << series << " missing";
    EXPECT_GE(b, 0) << series << " missing";
    return a - b;
  };
  EXPECT_EQ(delta(finished), 1);
  EXPECT_EQ(delta(met), 1);  // 5 s TTFT, 1 s ITL: met by a 10-token request
  EXPECT_EQ(delta("kvsplit:generation_tokens_total"), r.last.usage().completion_tokens());
  EXPECT_EQ(delta("kvsplit:prompt_tokens_total"), r.last.usage().prompt_tokens());
  EXPECT_GT(r.last.usage().completion_tokens(), 0u);
}

TEST_F(GenerationTest, PrometheusMetrics) {
  v1::GenerateRequest req;
  req.set_prompt("Lily wanted to");
  req.set_max_tokens(10);
  req.set_sla_class("voice");
  ASSERT_TRUE(generate(stub_.get(), req).status.ok());
  const std::string text = scrape_metrics(server_->metrics_port());
  for (const char* name :
       {"kvsplit:time_to_first_token_seconds_bucket", "kvsplit:inter_token_latency_seconds_count",
        "kvsplit:e2e_request_latency_seconds_sum", "kvsplit:request_queue_time_seconds_count",
        "kvsplit:kv_cache_usage_perc{pool=", "kvsplit:num_requests_running",
        "kvsplit:num_requests_waiting", "kvsplit:num_preemptions_total",
        "kvsplit:prompt_tokens_total", "kvsplit:generation_tokens_total",
        "kvsplit:sla_slo_met_total{sla_class=\"voice\"}", "kvsplit:sla_requests_finished_total",
        // KV cut families (zeros with kv.policy full).
        "kvsplit:kv_pages{pool=", "rung=\"int8\"", "rung=\"evicted\"",
        "kvsplit:kv_demotions_total{pool=", "kvsplit:kv_evictions_total{pool=",
        "kvsplit:kv_recalls_total{pool=", "kvsplit:kv_recalls_quantized_total{pool=",
        "kvsplit:kv_recalls_cold_total{pool=", "kvsplit:kv_refused_transitions_total{pool=",
        "kvsplit:kv_recall_latency_mean_seconds{pool=", "kvsplit:kv_host_tier_used_bytes{pool=",
        // Temporal cut families.
        "kvsplit:kv_pages_host{pool=", "kvsplit:kv_swaps_total{pool=", "direction=\"in\"",
        "kvsplit:kv_swap_bytes_total{pool=", "kvsplit:kv_preemption_choices_total{pool=",
        "choice=\"fallback\"", "kvsplit:kv_prefetch_total{pool=", "result=\"hit\"",
        "result=\"miss\"",
        // Handoff health (every pool; zeros here).
        "kvsplit:handoffs_forwarded_total{pool=", "kvsplit:worker_marked_down{pool=",
        // Speculative decoding (zeros with speculative off).
        "kvsplit:spec_tokens_total{pool=", "result=\"accepted\"",
        "kvsplit:spec_rows_total{pool="}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " missing from:\n"
                                                  << text.substr(0, 3000);
  }
  // Its effective KV was summed under its class and tenant (no authentication: "anonymous").
  for (const char* name :
       {"kvsplit:kv_effective_byte_seconds_total{class=\"voice\",tenant=\"anonymous\"} ",
        "kvsplit:kv_token_seconds_total{class=\"voice\",tenant=\"anonymous\"} "}) {
    const size_t at = text.find(name);
    ASSERT_NE(at, std::string::npos) << name << " missing from:\n" << text.substr(0, 3000);
    EXPECT_GT(std::stod(text.substr(at + std::string(name).size())), 0) << name;
  }
  // The voice request was observed by the TTFT histogram.
  EXPECT_NE(text.find("kvsplit:time_to_first_token_seconds_count{sla_class=\"voice\"} "),
            std::string::npos);
}

}  // namespace
}  // namespace kvsplit::testing
