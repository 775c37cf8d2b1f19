// The Generation methods decide on a call from its headers, before any of its message is read:
// a call without a valid key, or over a stream limit, is refused while it has sent only its
// headers (it used to be answered only once a whole message of up to server.max_message_bytes had
// been buffered). A call that half-closes without a message, or sends a second one, gets
// INVALID_ARGUMENT and leaves no stream slot or KV block behind.
#include <optional>

#include "server/raw_stream.h"
#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

constexpr char kKeyA[] = "alpha-key-000001";
constexpr char kKeyB[] = "bravo-key-000002";
constexpr auto kPrompt = std::chrono::seconds(5);  // "at once", with room for a loaded machine

const char* const kMethods[] = {"/kvsplit.v1.Generation/Generate", "/kvsplit.v1.Generation/Abort",
                                "/kvsplit.v1.Generation/GetModelInfo",
                                "/kvsplit.v1.Generation/GetServerStats"};

std::string generate_bytes(int max_tokens) {
  v1::GenerateRequest r;
  r.set_prompt("Once upon a time");
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r.SerializeAsString();
}

// The smallest valid request message of each method.
std::string request_bytes(const std::string& method) {
  if (method.ends_with("/Generate")) return generate_bytes(1);
  if (method.ends_with("/Abort")) {
    v1::AbortRequest r;
    r.set_request_id("no-such-request");
    return r.SerializeAsString();
  }
  return "";
}

class HeaderAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::ofstream(dir_->file("t.yaml"))
        << "server: {max_concurrent_streams: 2, max_streams_per_tenant: 1}\n";
    server_ = new ServerProcess({"--config", dir_->file("t.yaml"), "--model",
                                 "synthetic:stories260k", "--api-key", kKeyA, "--api-key", kKeyB},
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
    EXPECT_TRUE(wait_server_idle(stub_.get(), std::chrono::seconds(30), kKeyA))
        << "a stream slot or KV block was not given back";
  }

  // Whether, within 30 s, the server counts `n` open Generate calls (a call's headers reach the
  // server a moment after the client has sent them).
  bool wait_active_streams(int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    do {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyA);
      v1::GetServerStatsResponse s;
      if (stub_->GetServerStats(&ctx, {}, &s).ok() && s.active_streams() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (std::chrono::steady_clock::now() < deadline);
    return false;
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};
TempDir* HeaderAuthTest::dir_ = nullptr;
ServerProcess* HeaderAuthTest::server_ = nullptr;

// A call that sends its headers and nothing more: with no key, or a wrong one, it is answered
// UNAUTHENTICATED at once on every method, not left waiting for a message.
TEST_F(HeaderAuthTest, CallWithoutValidKeyIsRefusedBeforeItsMessage) {
  for (const char* method : kMethods) {
    for (const std::string key : {"", "wrong-key-0000001"}) {
      SCOPED_TRACE(std::string(method) + " key '" + key + "'");
      RawStream call(channel_, method, key);
      ASSERT_TRUE(call.started());
      const std::optional<grpc::Status> st = call.finish(kPrompt);
      ASSERT_TRUE(st.has_value()) << "no answer while the message is outstanding";
      EXPECT_EQ(st->error_code(), grpc::StatusCode::UNAUTHENTICATED) << st->error_message();
    }
  }
}

// The stream limits are applied from the headers too: calls holding their slots without having
// sent a message count, and the call over a limit is refused before its message.
TEST_F(HeaderAuthTest, StreamLimitsAreAppliedBeforeTheMessage) {
  const std::string generate = kMethods[0];
  // One more call of `key`, sending no message, is refused RESOURCE_EXHAUSTED naming `limit`.
  auto expect_refused = [&](const char* key, const std::string& limit) {
    RawStream more(channel_, generate, key);
    const std::optional<grpc::Status> st = more.finish(kPrompt);
    ASSERT_TRUE(st.has_value()) << "no answer while the message is outstanding";
    EXPECT_EQ(st->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st->error_message().find(limit), std::string::npos) << st->error_message();
  };
  auto held_a = std::make_unique<RawStream>(channel_, generate, kKeyA);
  ASSERT_TRUE(held_a->started());
  ASSERT_TRUE(wait_active_streams(1));
  expect_refused(kKeyA, "server.max_streams_per_tenant");
  auto held_b = std::make_unique<RawStream>(channel_, generate, kKeyB);
  ASSERT_TRUE(held_b->started());
  ASSERT_TRUE(wait_active_streams(2));
  expect_refused(kKeyB, "server is at its limit");
  // A held call still gets its message served.
  ASSERT_TRUE(held_a->write(generate_bytes(2)));
  ASSERT_TRUE(held_a->writes_done());
  const std::optional<grpc::Status> st = held_a->finish(std::chrono::seconds(30));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->ok()) << st->error_code() << " " << st->error_message();
  held_b.reset();  // cancelled before its message: its slot goes back
}

// A half-close without a message is INVALID_ARGUMENT on every method (a server-streaming or unary
// server cannot answer it either), and so is a second message.
TEST_F(HeaderAuthTest, NoMessageOrASecondMessageIsInvalid) {
  for (const char* method : kMethods) {
    SCOPED_TRACE(method);
    {
      RawStream call(channel_, method, kKeyA);
      ASSERT_TRUE(call.writes_done());
      const std::optional<grpc::Status> st = call.finish(kPrompt);
      ASSERT_TRUE(st.has_value());
      EXPECT_EQ(st->error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st->error_message();
      EXPECT_NE(st->error_message().find("no request message"), std::string::npos)
          << st->error_message();
    }
    {
      RawStream call(channel_, method, kKeyA);
      // Generate: the first request runs long enough for the second message to arrive.
      const std::string first =
          std::string(method).ends_with("/Generate") ? generate_bytes(400) : request_bytes(method);
      ASSERT_TRUE(call.write(first));
      ASSERT_TRUE(call.write(request_bytes(method)));
      ASSERT_TRUE(call.writes_done());
      const std::optional<grpc::Status> st = call.finish(std::chrono::seconds(30));
      ASSERT_TRUE(st.has_value());
      EXPECT_EQ(st->error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st->error_message();
      EXPECT_NE(st->error_message().find("more than one request message"), std::string::npos)
          << st->error_message();
    }
  }
}

// A key removed by a reload (SIGHUP, server.api_keys) ends the calls it opened that are still
// waiting for their message, UNAUTHENTICATED, and their stream slots come back.
TEST(HeaderAuthReload, ARemovedKeysCallWaitingForItsMessageEnds) {
  TempDir dir;
  const std::string cfg = dir.file("k.yaml");
  std::ofstream(cfg) << "server:\n  max_concurrent_streams: 1\n  api_keys: [" << kKeyA << ", "
                     << kKeyB << "]\n";
  ServerProcess server({"--config", cfg, "--model", "synthetic:stories260k"},
                       dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  RawStream held(channel, kMethods[0], kKeyB);
  ASSERT_TRUE(held.started());
  for (int i = 0;; ++i) {  // until the server holds the call
    ASSERT_LT(i, 3000) << "the held call did not reach the server";
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyA);
    v1::GetServerStatsResponse s;
    if (stub->GetServerStats(&ctx, {}, &s).ok() && s.active_streams() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::ofstream(cfg) << "server:\n  max_concurrent_streams: 1\n  api_keys: [" << kKeyA << "]\n";
  server.signal(SIGHUP);
  const std::string kEnded = "(1 keys; 1 open calls of removed keys ended)";
  for (int i = 0; i < 3000 && server.log().find(kEnded) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(server.log().find(kEnded), std::string::npos) << server.log();
  const std::optional<grpc::Status> st = held.finish(kPrompt);
  ASSERT_TRUE(st.has_value()) << server.log();
  EXPECT_EQ(st->error_code(), grpc::StatusCode::UNAUTHENTICATED) << st->error_message();
  EXPECT_TRUE(wait_server_idle(stub.get(), std::chrono::seconds(30), kKeyA));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + kKeyA);
  v1::GenerateRequest r;
  r.set_prompt("Once");
  r.set_max_tokens(1);
  auto reader = stub->Generate(&ctx, r);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
}

// server.request_message_timeout_ms: a call that sends only its headers ends DEADLINE_EXCEEDED
// and gives its stream slot back (it took one from its headers), on Generate and on the unary
// methods; a call whose message came in time is not cut by it.
TEST(HeaderAuthMessageTimeout, HeaderOnlyCallEndsAndItsSlotComesBack) {
  TempDir dir;
  std::ofstream(dir.file("t.yaml"))
      << "server: {max_concurrent_streams: 1, request_message_timeout_ms: 300}\n";
  ServerProcess server({"--config", dir.file("t.yaml"), "--model", "synthetic:stories260k"},
                       dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  for (const char* method : {kMethods[0], kMethods[3]}) {
    SCOPED_TRACE(method);
    RawStream held(channel, method, "");
    ASSERT_TRUE(held.started());
    const std::optional<grpc::Status> st = held.finish(kPrompt);
    ASSERT_TRUE(st.has_value()) << "the header-only call was not ended";
    EXPECT_EQ(st->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st->error_message();
    EXPECT_NE(st->error_message().find("server.request_message_timeout_ms"), std::string::npos)
        << st->error_message();
  }
  // The slot came back: at max_concurrent_streams 1 a call is served.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GenerateRequest r;
    r.set_prompt("Once");
    r.set_max_tokens(1);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    const grpc::Status st = reader->Finish();
    EXPECT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  }
  // The message in time, read by the client well after the limit: served.
  RawStream call(channel, kMethods[0], "");
  ASSERT_TRUE(call.write(generate_bytes(2)));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const std::optional<grpc::Status> st = call.finish(std::chrono::seconds(30));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->ok()) << st->error_code() << " " << st->error_message();
  EXPECT_TRUE(wait_server_idle(stub.get(), std::chrono::seconds(30)));
}

// A drain (SIGTERM) ends a Generate call still waiting for its message at once, UNAVAILABLE
// "server is draining" (it is not in the engine: nothing else would end it before the cut-off).
TEST(HeaderAuthMessageTimeout, DrainEndsACallWaitingForItsMessage) {
  TempDir dir;
  ServerProcess server({"--model", "synthetic:stories260k"}, dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  RawStream held(channel, kMethods[0], "");
  ASSERT_TRUE(held.started());
  for (int i = 0;; ++i) {  // until the server holds the call
    ASSERT_LT(i, 3000) << "the held call did not reach the server";
    grpc::ClientContext ctx;
    v1::GetServerStatsResponse s;
    if (stub->GetServerStats(&ctx, {}, &s).ok() && s.active_streams() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server.signal(SIGTERM);
  const std::optional<grpc::Status> st = held.finish(std::chrono::milliseconds(1500));
  ASSERT_TRUE(st.has_value()) << server.log();
  EXPECT_EQ(st->error_code(), grpc::StatusCode::UNAVAILABLE) << st->error_message();
  EXPECT_NE(st->error_message().find("server is draining"), std::string::npos)
      << st->error_message();
}

}  // namespace
}  // namespace kvsplit::testing
