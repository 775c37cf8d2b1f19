// Per-key policy (server.api_keys entries with a policy; docs/configuration.md "Per-key policy")
// against the real binary: a key limited to some SLA classes is refused the others
// (PERMISSION_DENIED) and gets its own default class, a priority above its ceiling is refused, a
// key without server_stats cannot read GetServerStats, and a key's max_streams replaces
// server.max_streams_per_tenant. A plain key keeps every right. (Reloads: reload_test.cpp.)
#include <map>
#include <optional>

#include "server/raw_stream.h"
#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

constexpr char kFull[] = "full-rights-key-01";     // a plain entry
constexpr char kBatch[] = "batch-only-key-02";     // [batch], priority <= 0, no stats
constexpr char kThree[] = "three-streams-key-03";  // max_streams: 3
constexpr char kAny[] = "any-streams-key-04";      // max_streams: 0 (no limit)
constexpr char kGenerate[] = "/kvsplit.v1.Generation/Generate";

class TenantPolicyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::ofstream(dir_->file("p.yaml")) << "server:\n"
                                           "  max_streams_per_tenant: 1\n"
                                           "  api_keys:\n"
                                           "    - "
                                        << kFull
                                        << "\n"
                                           "    - key: "
                                        << kBatch
                                        << "\n"
                                           "      sla_classes: [batch]\n"
                                           "      max_priority: 0\n"
                                           "      server_stats: false\n"
                                           "    - {key: "
                                        << kThree << ", max_streams: 3}\n"
                                        << "    - {key: " << kAny << ", max_streams: 0}\n"
                                        << "sla_classes:\n"
                                           "  interactive: {max_ttft_ms: 2000}\n"
                                           "  batch: {max_ttft_ms: 60000, priority: -10}\n";
    server_ =
        new ServerProcess({"--config", dir_->file("p.yaml"), "--model", "synthetic:stories260k"},
                          dir_->file("server.log"));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(server_->started()) << server_->log();
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Generation::NewStub(channel_);
  }
  void TearDown() override {
    EXPECT_TRUE(wait_server_idle(stub_.get(), std::chrono::seconds(30), kFull))
        << "a stream slot or KV block was not given back";
  }

  // One Generate call of `key` to its end: its status.
  grpc::Status generate(const char* key, const std::string& sla_class, int32_t priority = 0) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest r;
    r.set_prompt("Once upon a time");
    r.set_max_tokens(2);
    r.set_sla_class(sla_class);
    r.set_priority(priority);
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  }
  grpc::Status stats(const char* key, v1::GetServerStatsResponse* out) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    return stub_->GetServerStats(&ctx, {}, out);
  }
  // finished + failed of each class, as the full-rights key reads them.
  std::map<std::string, int64_t> class_counts() {
    v1::GetServerStatsResponse s;
    std::map<std::string, int64_t> out;
    if (!stats(kFull, &s).ok()) return out;
    for (const auto& c : s.classes()) out[c.name()] = c.finished() + c.failed();
    return out;
  }
  // Whether, within 30 s, the server counts `n` open Generate calls.
  bool wait_active_streams(int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    do {
      v1::GetServerStatsResponse s;
      if (stats(kFull, &s).ok() && s.active_streams() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (std::chrono::steady_clock::now() < deadline);
    return false;
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};
TempDir* TenantPolicyTest::dir_ = nullptr;
ServerProcess* TenantPolicyTest::server_ = nullptr;

TEST_F(TenantPolicyTest, AClassTheKeyMayNotUseIsRefused) {
  const grpc::Status refused = generate(kBatch, "interactive");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("class 'interactive' is not allowed"), std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(generate(kBatch, "batch").ok());
  EXPECT_TRUE(generate(kFull, "interactive").ok());
  EXPECT_TRUE(generate(kFull, "batch").ok());
  // An unknown class stays INVALID_ARGUMENT, whatever the key may use.
  EXPECT_EQ(generate(kBatch, "gold").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A request naming no class runs in the key's first class (the server's default, interactive,
// for a plain key): seen in the classes' counters.
TEST_F(TenantPolicyTest, ARequestWithoutAClassGetsTheKeysDefault) {
  auto count_changes = [&](const char* key) {
    const std::map<std::string, int64_t> before = class_counts();
    EXPECT_EQ(before.size(), 2u);
    const grpc::Status st = generate(key, "");
    EXPECT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    std::map<std::string, int64_t> after;
    for (int i = 0; i < 500; ++i) {  // the counters move as the request ends on its worker
      after = class_counts();
      if (after != before) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::map<std::string, int64_t> diff;
    for (const auto& [name, n] : after) diff[name] = n - before.at(name);
    return diff;
  };
  EXPECT_EQ(count_changes(kBatch),
            (std::map<std::string, int64_t>{{"batch", 1}, {"interactive", 0}}));
  EXPECT_EQ(count_changes(kFull),
            (std::map<std::string, int64_t>{{"batch", 0}, {"interactive", 1}}));
}

TEST_F(TenantPolicyTest, APriorityAboveTheKeysCeilingIsRefused) {
  const grpc::Status refused = generate(kBatch, "batch", 1);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("priority: 1 is above this API key's ceiling of 0"),
            std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(generate(kBatch, "batch", 0).ok());
  EXPECT_TRUE(generate(kBatch, "", -1000).ok());
  EXPECT_TRUE(generate(kFull, "", 1000).ok());
}

// GetServerStats shows every tenant's load: a key without server_stats is refused it from its
// headers (before any message), and keeps GetModelInfo.
TEST_F(TenantPolicyTest, ServerStatsNeedTheRight) {
  v1::GetServerStatsResponse s;
  const grpc::Status refused = stats(kBatch, &s);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("server_stats: false"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(s.pools_size(), 0);
  RawStream headers_only(channel_, "/kvsplit.v1.Generation/GetServerStats", kBatch);
  ASSERT_TRUE(headers_only.started());
  const std::optional<grpc::Status> st = headers_only.finish(std::chrono::seconds(5));
  ASSERT_TRUE(st.has_value()) << "no answer while the message is outstanding";
  EXPECT_EQ(st->error_code(), grpc::StatusCode::PERMISSION_DENIED);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + kBatch);
  v1::GetModelInfoResponse info;
  EXPECT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_TRUE(stats(kFull, &s).ok());
  EXPECT_GT(s.pools_size(), 0);
}

// server.max_streams_per_tenant is 1: a key with max_streams 3 holds three calls and is refused
// the fourth naming its own limit, one with max_streams 0 has no limit, a plain key keeps the
// server's.
TEST_F(TenantPolicyTest, AKeysMaxStreamsReplacesTheServersLimit) {
  auto expect_refused = [&](const char* key, const std::string& why) {
    RawStream more(channel_, kGenerate, key);
    const std::optional<grpc::Status> st = more.finish(std::chrono::seconds(5));
    ASSERT_TRUE(st.has_value()) << "no answer while the message is outstanding";
    EXPECT_EQ(st->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st->error_message();
    EXPECT_NE(st->error_message().find(why), std::string::npos) << st->error_message();
  };
  {
    std::vector<std::unique_ptr<RawStream>> held;
    for (int i = 0; i < 3; ++i) {
      held.push_back(std::make_unique<RawStream>(channel_, kGenerate, kThree));
      ASSERT_TRUE(held.back()->started());
    }
    ASSERT_TRUE(wait_active_streams(3));
    expect_refused(kThree, "limit of 3 concurrent streams (its key's max_streams");
  }
  ASSERT_TRUE(wait_active_streams(0));
  {
    RawStream held(channel_, kGenerate, kFull);
    ASSERT_TRUE(held.started());
    ASSERT_TRUE(wait_active_streams(1));
    expect_refused(kFull, "limit of 1 concurrent streams (server.max_streams_per_tenant)");
  }
  ASSERT_TRUE(wait_active_streams(0));
  std::vector<std::unique_ptr<RawStream>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawStream>(channel_, kGenerate, kAny));
    ASSERT_TRUE(held.back()->started());
  }
  ASSERT_TRUE(wait_active_streams(4));
  v1::GenerateRequest r;
  r.set_prompt("Once");
  r.set_max_tokens(1);
  ASSERT_TRUE(held[3]->write(r.SerializeAsString()));
  ASSERT_TRUE(held[3]->writes_done());
  const std::optional<grpc::Status> st = held[3]->finish(std::chrono::seconds(30));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->ok()) << st->error_code() << " " << st->error_message();
}

}  // namespace
}  // namespace kvsplit::testing
