// Tenant isolation against the real binary with two API keys: a request id belongs to the key
// that submitted it. Key B cannot abort key A's request, B's Abort of A's id answers exactly as
// for an unknown id, B can use the same id at the same time, and server-assigned ids are random
// and use a prefix clients may not. The model is synthetic llama-110m (tens of ms per token on a
// CPU), so A's request is still running while B acts; A's own duplicate submission afterwards
// (ALREADY_EXISTS) proves it.
#include <atomic>
#include <bitset>
#include <map>
#include <set>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

constexpr char kKeyA[] = "alpha-key-000001";
constexpr char kKeyB[] = "bravo-key-000002";

struct Stream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  std::vector<int32_t> ids;
  v1::GenerateResponse last;
};

class TenantTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::ofstream(dir_->file("t.yaml")) << "kv: {capacity_mb: 256}\n";
    server_ = new ServerProcess({"--config", dir_->file("t.yaml"), "--model",
                                 "synthetic:llama-110m", "--api-key", kKeyA, "--api-key", kKeyB},
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

  static v1::GenerateRequest request(const std::string& id, uint32_t max_tokens) {
    v1::GenerateRequest r;
    r.set_request_id(id);
    r.set_prompt("Once upon a time");
    r.set_max_tokens(max_tokens);
    r.set_ignore_eos(true);
    r.mutable_sampling()->set_temperature(0.0f);
    return r;
  }
  std::unique_ptr<Stream> open(const std::string& key, const v1::GenerateRequest& req) {
    auto s = std::make_unique<Stream>();
    s->ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    s->reader = stub_->Generate(&s->ctx, req);
    return s;
  }
  static bool read(Stream* s) {
    v1::GenerateResponse msg;
    if (!s->reader->Read(&msg)) return false;
    s->ids.insert(s->ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    s->last = msg;
    return true;
  }
  static grpc::Status drain(Stream* s) {
    while (read(s)) {
    }
    return s->reader->Finish();
  }
  // Abort as `key`: the status and the response message's bytes.
  std::pair<grpc::Status, std::string> abort_raw(const std::string& key, const std::string& id) {
    v1::AbortRequest req;
    req.set_request_id(id);
    std::string resp;
    grpc::Status st = raw_unary(channel_, "/kvsplit.v1.Generation/Abort", req.SerializeAsString(),
                                &resp, std::chrono::milliseconds(10000), key);
    return {st, resp};
  }
  bool all_kv_free() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    v1::GetServerStatsResponse s;
    do {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyA);
      s.Clear();
      if (stub_->GetServerStats(&ctx, {}, &s).ok()) {
        bool free = s.pools_size() > 0 && s.num_running() == 0 && s.num_waiting() == 0 &&
                    s.active_streams() == 0;
        for (const auto& p : s.pools()) free = free && p.kv_blocks_free() == p.kv_blocks_total();
        if (free) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
    ADD_FAILURE() << s.DebugString();
    return false;
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};
TempDir* TenantTest::dir_ = nullptr;
ServerProcess* TenantTest::server_ = nullptr;

TEST_F(TenantTest, AnotherKeyCannotAbortOrProbeARequest) {
  constexpr uint32_t kTokens = 40;
  auto a = open(kKeyA, request("job-1", kTokens));
  ASSERT_TRUE(read(a.get()));  // A's request runs

  // B aborts A's id: the same answer as for an id nobody uses, byte for byte.
  auto [st_a, resp_a] = abort_raw(kKeyB, "job-1");
  auto [st_none, resp_none] = abort_raw(kKeyB, "no-such-request-id");
  ASSERT_TRUE(st_a.ok()) << st_a.error_message();
  EXPECT_EQ(st_a.error_code(), st_none.error_code());
  EXPECT_EQ(st_a.error_message(), st_none.error_message());
  EXPECT_EQ(st_a.error_details(), st_none.error_details());
  EXPECT_EQ(resp_a, resp_none);
  v1::AbortResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(resp_a));
  EXPECT_FALSE(parsed.aborted());

  // B can use the same id while A's request runs: no ALREADY_EXISTS, nothing learned.
  auto b = open(kKeyB, request("job-1", 2));
  grpc::Status st_b = drain(b.get());
  EXPECT_TRUE(st_b.ok()) << st_b.error_message();
  EXPECT_EQ(b->last.request_id(), "job-1");
  EXPECT_EQ(b->ids.size(), 2u);

  // A's request is still in flight (so it was during B's calls): A's own reuse is a duplicate.
  auto dup = open(kKeyA, request("job-1", 2));
  grpc::Status st_dup = drain(dup.get());
  EXPECT_EQ(st_dup.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st_dup.error_message();

  // A's stream was not touched: every token, finished by length.
  grpc::Status st = drain(a.get());
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(a->ids.size(), kTokens);
  EXPECT_EQ(a->last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(a->last.request_id(), "job-1");
  EXPECT_TRUE(all_kv_free());
}

TEST_F(TenantTest, OwnAbortStillWorks) {
  auto a = open(kKeyA, request("mine", 200));
  ASSERT_TRUE(read(a.get()));
  auto [st, resp] = abort_raw(kKeyA, "mine");
  ASSERT_TRUE(st.ok()) << st.error_message();
  v1::AbortResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(resp));
  EXPECT_TRUE(parsed.aborted());
  EXPECT_TRUE(drain(a.get()).ok());
  EXPECT_EQ(a->last.finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_LT(a->ids.size(), 200u);
  EXPECT_TRUE(all_kv_free());
}

TEST_F(TenantTest, ServerAssignedIdsAreRandomAndTheirPrefixIsReserved) {
  std::set<std::string> ids;
  std::bitset<128> seen_one, seen_zero;
  for (int i = 0; i < 32; ++i) {
    auto s = open(i % 2 ? kKeyA : kKeyB, request("", 1));
    grpc::Status st = drain(s.get());
    ASSERT_TRUE(st.ok()) << st.error_message();
    const std::string id = s->last.request_id();
    ASSERT_EQ(id.size(), 5u + 32u) << id;
    ASSERT_EQ(id.rfind("grpc-", 0), 0u) << id;
    ASSERT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
    EXPECT_TRUE(ids.insert(id).second) << id;
    for (int k = 0; k < 32; ++k) {
      const int nibble = std::stoi(id.substr(5 + k, 1), nullptr, 16);
      for (int bit = 0; bit < 4; ++bit)
        ((nibble >> bit) & 1 ? seen_one : seen_zero).set(4 * k + bit);
    }
  }
  // A counter leaves most bits constant; 128 random bits leave one constant over 32 ids with
  // probability 128 * 2^-31.
  EXPECT_TRUE(seen_one.all() && seen_zero.all());

  // Clients cannot take ids of that form, so assigned ids never collide with theirs.
  for (const char* id : {"grpc-1", "grpc-0123456789abcdef0123456789abcdef", "grpc-"}) {
    auto s = open(kKeyA, request(id, 1));
    grpc::Status st = drain(s.get());
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_NE(st.error_message().find("request_id"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find("reserved"), std::string::npos) << st.error_message();
  }
  EXPECT_TRUE(all_kv_free());
}

// Every path a key takes (a good call with each key, a wrong key, a key in a malformed header,
// two authorization entries, an Abort), then a SIGHUP whose reload line proves the log was
// written after them: no key text anywhere in it.
TEST_F(TenantTest, KeysAreNeverLogged) {
  auto a = open(kKeyA, request("logged-a", 1));
  EXPECT_TRUE(drain(a.get()).ok());
  auto b = open(kKeyB, request("logged-b", 1));
  EXPECT_TRUE(drain(b.get()).ok());
  auto wrong = open("wrong-key-zz9999", request("logged-w", 1));
  EXPECT_EQ(drain(wrong.get()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Basic ") + kKeyA);
    auto r = stub_->Generate(&ctx, request("logged-m", 1));
    v1::GenerateResponse msg;
    while (r->Read(&msg)) {
    }
    EXPECT_EQ(r->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyA);
    ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyB);
    auto r = stub_->Generate(&ctx, request("logged-d", 1));
    v1::GenerateResponse msg;
    while (r->Read(&msg)) {
    }
    EXPECT_EQ(r->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_TRUE(abort_raw(kKeyB, "logged-a").first.ok());
  server_->signal(SIGHUP);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string log = server_->log();
  while (log.find("SIGHUP: reloaded") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = server_->log();
  }
  ASSERT_NE(log.find("SIGHUP: reloaded"), std::string::npos) << log;
  for (const char* key : {kKeyA, kKeyB, "wrong-key-zz9999"})
    EXPECT_EQ(log.find(key), std::string::npos) << key << " in:\n" << log;
  EXPECT_TRUE(all_kv_free());
}

// Calls refused by authentication take no stream slot, and a call gives its slot back as it
// finishes: with a limit of one stream, a keyed client calling one request at a time is never told
// the server is at its limit, while keyless calls flood it (each of them used to count until it
// finished) and its own previous call's OnDone may still be to come (the slot went back there).
TEST(TenantStreamLimit, KeylessCallsDoNotCountAgainstTheLimit) {
  TempDir dir;
  std::ofstream(dir.file("t.yaml")) << "server: {max_concurrent_streams: 1}\n";
  ServerProcess server(
      {"--config", dir.file("t.yaml"), "--model", "synthetic:stories260k", "--api-key", kKeyA},
      dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  std::atomic<bool> stop{false};
  std::atomic<int> keyless_unauthenticated{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 4; ++t) {
    flood.emplace_back([&] {
      // Each thread keeps calls in flight on its own channel, without a key.
      auto ch = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
      auto st = v1::Generation::NewStub(ch);
      while (!stop.load()) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        v1::GenerateRequest r;
        r.set_prompt("Once");
        r.set_max_tokens(1);
        auto reader = st->Generate(&ctx, r);
        v1::GenerateResponse msg;
        while (reader->Read(&msg)) {
        }
        if (reader->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED)
          keyless_unauthenticated.fetch_add(1);
      }
    });
  }
  std::map<grpc::StatusCode, int> codes;
  // Until enough of both happened (at least 3 s), or 60 s on a slow machine.
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < start + std::chrono::seconds(60) &&
         (std::chrono::steady_clock::now() < start + std::chrono::seconds(3) ||
          keyless_unauthenticated.load() <= 100 || codes[grpc::StatusCode::OK] <= 10)) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyA);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GenerateRequest r;
    r.set_prompt("Once");
    r.set_max_tokens(1);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    ++codes[reader->Finish().error_code()];
  }
  stop = true;
  for (std::thread& t : flood) t.join();
  EXPECT_GT(keyless_unauthenticated.load(), 100) << "the flood did not run";
  EXPECT_GT(codes[grpc::StatusCode::OK], 10);
  for (const auto& [code, n] : codes) {
    if (code != grpc::StatusCode::OK) {
      EXPECT_EQ(n, 0) << "keyed calls ended with code " << code << " (RESOURCE_EXHAUSTED = 8: "
                      << "refused at the stream limit); OK " << codes[grpc::StatusCode::OK];
    }
  }
}

// One connection holding every Generate call the server allows still reaches the server: a call
// more is refused at once with RESOURCE_EXHAUSTED (not left waiting, client-side, for an HTTP/2
// stream until its deadline), and Abort on the same connection ends one of the held calls.
TEST(TenantStreamLimit, OneConnectionAtTheLimitIsAnsweredAtOnce) {
  TempDir dir;
  std::ofstream(dir.file("t.yaml")) << "server: {max_concurrent_streams: 2}\n";
  ServerProcess server(
      {"--config", dir.file("t.yaml"), "--model", "synthetic:llama-110m", "--api-key", kKeyA},
      dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  auto call = [&](grpc::ClientContext* ctx, const std::string& id) {
    ctx->AddMetadata("authorization", std::string("Bearer ") + kKeyA);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest r;
    r.set_request_id(id);
    r.set_prompt("Once upon a time");
    r.set_max_tokens(1000);
    r.set_ignore_eos(true);
    return stub->Generate(ctx, r);
  };
  grpc::ClientContext held_ctx[2];
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> held[2];
  for (int i = 0; i < 2; ++i) {
    held[i] = call(&held_ctx[i], "held-" + std::to_string(i));
    v1::GenerateResponse first;
    ASSERT_TRUE(held[i]->Read(&first)) << "held call " << i << " did not start";
  }
  const auto t0 = std::chrono::steady_clock::now();
  grpc::ClientContext more_ctx;
  auto more = call(&more_ctx, "one-more");
  v1::GenerateResponse msg;
  while (more->Read(&msg)) {
  }
  EXPECT_EQ(more->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  v1::AbortRequest abort;
  abort.set_request_id("held-0");
  std::string resp;
  const grpc::Status st =
      raw_unary(channel, "/kvsplit.v1.Generation/Abort", abort.SerializeAsString(), &resp,
                std::chrono::seconds(30), kKeyA);
  EXPECT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  v1::AbortResponse aborted;
  EXPECT_TRUE(aborted.ParseFromString(resp) && aborted.aborted());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20.0) << "the calls waited for a stream";
  while (held[0]->Read(&msg)) {
  }
  EXPECT_TRUE(held[0]->Finish().ok());  // aborted: a final event, FINISH_REASON_CANCELLED
  held_ctx[1].TryCancel();
  while (held[1]->Read(&msg)) {
  }
  EXPECT_EQ(held[1]->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// server.max_streams_per_tenant: one key holding its limit of streams gets RESOURCE_EXHAUSTED for
// one more, naming the setting, while another key's calls are still served (with only the
// server-wide limit, one key could hold every slot); a slot given back is usable again.
TEST(TenantStreamLimit, OneTenantCannotHoldEveryStream) {
  TempDir dir;
  std::ofstream(dir.file("t.yaml"))
      << "server: {max_concurrent_streams: 3, max_streams_per_tenant: 2}\n";
  ServerProcess server({"--config", dir.file("t.yaml"), "--model", "synthetic:llama-110m",
                        "--api-key", kKeyA, "--api-key", kKeyB},
                       dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  auto call = [&](grpc::ClientContext* ctx, const char* key, int max_tokens) {
    ctx->AddMetadata("authorization", std::string("Bearer ") + key);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest r;
    r.set_prompt("Once upon a time");
    r.set_max_tokens(max_tokens);
    r.set_ignore_eos(true);
    return stub->Generate(ctx, r);
  };
  auto finish = [](grpc::ClientReader<v1::GenerateResponse>* reader) {
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  };
  grpc::ClientContext held_ctx[2];
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> held[2];
  for (int i = 0; i < 2; ++i) {
    held[i] = call(&held_ctx[i], kKeyA, 1000);
    v1::GenerateResponse first;
    ASSERT_TRUE(held[i]->Read(&first)) << "held call " << i << " did not start";
  }
  {
    grpc::ClientContext ctx;
    auto more = call(&ctx, kKeyA, 1);
    const grpc::Status st = finish(more.get());
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st.error_message().find("server.max_streams_per_tenant"), std::string::npos)
        << st.error_message();
  }
  for (int i = 0; i < 3; ++i) {  // the other key is served, one call at a time
    grpc::ClientContext ctx;
    auto b = call(&ctx, kKeyB, 1);
    const grpc::Status st = finish(b.get());
    EXPECT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  }
  held_ctx[0].TryCancel();
  EXPECT_EQ(finish(held[0].get()).error_code(), grpc::StatusCode::CANCELLED);
  // The cancelled call's slot comes back as the server learns of the cancel (a moment later).
  grpc::Status again;
  for (int attempt = 0; attempt < 100; ++attempt) {
    grpc::ClientContext ctx;
    auto a = call(&ctx, kKeyA, 1);
    again = finish(a.get());
    if (again.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(again.ok()) << again.error_code() << " " << again.error_message();
  held_ctx[1].TryCancel();
  EXPECT_EQ(finish(held[1].get()).error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace kvsplit::testing
