// SIGHUP against the real binary: what a reload does not apply is named in the log, and the reload
// of server.api_keys and their per-key policies (the reload of the SLA classes and the kvm policy
// themselves: admin_test.cpp).
#include <optional>
#include <string>
#include <vector>

#include "server/raw_stream.h"
#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

class ReloadTest : public ::testing::Test {
 protected:
  void SetUp() override { KVSPLIT_REQUIRE_MODELS(); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_.file(name)) << text;
    return dir_.file(name);
  }
  // Waits (5 s) until the log holds `needle` `count` times.
  static bool wait_for_log(const ServerProcess& server, const std::string& needle, int count = 1) {
    for (int i = 0; i < 200; ++i) {
      if (count_lines_with(server.log(), needle) >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  TempDir dir_;
};

// A reload applies only sla_classes and kvm; every other setting the file changes since the start
// is named in a warning ("kv.capacity_mb: changed, needs a restart; not applied"), while the
// classes are still applied. It used to say nothing: an operator could believe a new
// kv.capacity_mb or server.api_keys in force. Unchanged settings rewritten in another style, and
// changes to the reloaded sections, are not reported.
TEST_F(ReloadTest, ChangedSettingsThatNeedARestartAreNamed) {
  const std::string cfg = write("r.yaml",
                                "kv: {capacity_mb: 16}\n"
                                "server: {drain_timeout_ms: 5000, max_prompt_bytes: 65536}\n"
                                "sla_classes:\n  gold: {max_ttft_ms: 100}\n");
  ServerProcess server({"--model", model_path("stories260K.bin"), "--config", cfg},
                       dir_.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  const std::string kNotApplied = ": changed, needs a restart; not applied";
  // Block style and another key order for the same values; a new class; four settings changed
  // outside the reloaded sections (one added, one removed, a new top-level key and section).
  write("r.yaml",
        "seed: 7\n"
        "model: synthetic:stories260k\n"
        "server:\n  max_prompt_bytes: 65536\n  default_max_tokens: 4\n"
        "kv:\n  capacity_mb: 32\n"
        "sla_classes:\n  gold: {max_ttft_ms: 100}\n  silver: {max_ttft_ms: 900}\n");
  server.signal(SIGHUP);
  ASSERT_TRUE(wait_for_log(server, "reloaded 2 SLA classes")) << server.log();
  const std::string log = server.log();
  for (const char* setting : {"seed", "model", "server.default_max_tokens",
                              "server.drain_timeout_ms", "kv.capacity_mb"}) {
    EXPECT_EQ(count_lines_with(log, std::string("SIGHUP: ") + setting + kNotApplied), 1)
        << setting << "\n"
        << log;
  }
  EXPECT_EQ(count_lines_with(log, kNotApplied), 5) << log;  // not max_prompt_bytes, not the classes
  EXPECT_EQ(log.find("sla_classes" + kNotApplied), std::string::npos) << log;
  // The classes were applied; the rest was not (still the default of 16 tokens, not 4).
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req;
  req.set_prompt("Once upon a time");
  req.set_ignore_eos(true);
  req.set_sla_class("silver");
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  int tokens = 0;
  while (reader->Read(&msg)) tokens += msg.token_ids_size();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 16);
  // Back to the file as started, a class aside: nothing to report.
  write("r.yaml",
        "sla_classes:\n  gold: {max_ttft_ms: 100}\n  bronze: {max_ttft_ms: 2000}\n"
        "server: {max_prompt_bytes: 65536, drain_timeout_ms: 5000}\n"
        "kv: {capacity_mb: 16}  # as started\n");
  server.signal(SIGHUP);
  ASSERT_TRUE(wait_for_log(server, "reloaded 2 SLA classes", 2)) << server.log();
  EXPECT_EQ(count_lines_with(server.log(), kNotApplied), 5) << server.log();
}

// server.api_keys is reloaded on SIGHUP: a removed key is refused for new calls at once, and its
// open Generate call ends with UNAUTHENTICATED, its request cancelled and its KV freed; a kept and
// an added key work, and the log does not call the keys unapplied. Removing every key (turning
// authentication off) is refused and changes nothing. Keys used to need a restart.
TEST_F(ReloadTest, ApiKeysAreReloadedAndARemovedKeysCallsEnd) {
  constexpr char kA[] = "alpha-key-000001", kB[] = "bravo-key-000002", kC[] = "charlie-key-00003";
  const std::string cfg =
      write("k.yaml", std::string("server:\n  api_keys: [") + kA + ", " + kB + "]\n");
  ServerProcess server({"--model", "synthetic:llama-110m", "--config", cfg},
                       dir_.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](grpc::ClientContext* ctx, const char* key, int max_tokens) {
    ctx->AddMetadata("authorization", std::string("Bearer ") + key);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
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
  grpc::ClientContext held_ctx;
  auto held = call(&held_ctx, kB, 1000);
  v1::GenerateResponse first;
  ASSERT_TRUE(held->Read(&first)) << "the held call did not start";

  write("k.yaml", std::string("server:\n  api_keys: [") + kA + ", " + kC + "]\n");
  server.signal(SIGHUP);
  ASSERT_TRUE(wait_for_log(server, "server.api_keys reloaded (2 keys; 1 open calls"))
      << server.log();
  const grpc::Status revoked = finish(held.get());
  EXPECT_EQ(revoked.error_code(), grpc::StatusCode::UNAUTHENTICATED) << revoked.error_message();
  EXPECT_NE(revoked.error_message().find("revoked"), std::string::npos) << revoked.error_message();
  for (const char* key : {kA, kB, kC}) {
    grpc::ClientContext ctx;
    auto reader = call(&ctx, key, 2);
    EXPECT_EQ(finish(reader.get()).error_code(),
              key == kB ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::OK)
        << key;
  }
  EXPECT_EQ(server.log().find("server.api_keys: changed"), std::string::npos) << server.log();
  EXPECT_TRUE(wait_server_idle(stub.get(), std::chrono::seconds(30), kA)) << "KV not freed";

  write("k.yaml", "server: {}\n");
  server.signal(SIGHUP);
  ASSERT_TRUE(wait_for_log(server, "server.api_keys not applied: removing every key"))
      << server.log();
  grpc::ClientContext keyless;
  v1::GetServerStatsResponse stats;
  EXPECT_EQ(stub->GetServerStats(&keyless, {}, &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext keyed;
  keyed.AddMetadata("authorization", std::string("Bearer ") + kC);
  EXPECT_TRUE(stub->GetServerStats(&keyed, {}, &stats).ok());
}

// A reload that changes a key's policy applies it to the key's new calls; a call admitted before
// keeps the policy it was admitted with (here: a class the new policy no longer allows). A policy
// is checked against the reloaded file's classes: one naming a class the file lacks, or keeping a
// class the file drops, rejects the reload and the old keys and policies stay.
TEST_F(ReloadTest, ApiKeyPoliciesAreReloadedForRequestsSubmittedAfter) {
  constexpr char kA[] = "alpha-key-000001", kB[] = "bravo-key-000002";
  const std::string classes =
      "sla_classes:\n  interactive: {max_ttft_ms: 2000}\n  batch: {max_ttft_ms: 60000}\n";
  auto keys = [&](const std::string& b_policy) {
    return std::string("server:\n  api_keys:\n    - ") + kA + "\n    - {key: " + kB + ", " +
           b_policy + "}\n";
  };
  const std::string cfg =
      write("p.yaml", keys("sla_classes: [batch], server_stats: false") + classes);
  ServerProcess server({"--model", "synthetic:stories260k", "--config", cfg},
                       dir_.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  auto request = [](const std::string& sla_class, int32_t priority) {
    v1::GenerateRequest r;
    r.set_prompt("Once upon a time");
    r.set_max_tokens(2);
    r.set_sla_class(sla_class);
    r.set_priority(priority);
    return r;
  };
  auto generate = [&](const char* key, const std::string& sla_class, int32_t priority = 0) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Generate(&ctx, request(sla_class, priority));
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish().error_code();
  };
  auto stats = [&](const char* key) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    v1::GetServerStatsResponse s;
    return stub->GetServerStats(&ctx, {}, &s).error_code();
  };
  using grpc::StatusCode;
  EXPECT_EQ(generate(kB, "interactive"), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(stats(kB), StatusCode::PERMISSION_DENIED);
  // A call of B admitted under the old policy, its message sent after the reload.
  RawStream admitted(channel, "/kvsplit.v1.Generation/Generate", kB);
  ASSERT_TRUE(admitted.started());
  for (int i = 0;; ++i) {  // until the server holds the call
    ASSERT_LT(i, 3000) << "the held call did not reach the server";
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kA);
    v1::GetServerStatsResponse s;
    if (stub->GetServerStats(&ctx, {}, &s).ok() && s.active_streams() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  write("p.yaml", keys("sla_classes: [interactive], max_priority: 5") + classes);
  server.signal(SIGHUP);
  ASSERT_TRUE(wait_for_log(server, "server.api_keys reloaded (2 keys; 0 open calls"))
      << server.log();
  ASSERT_TRUE(admitted.write(request("batch", 0).SerializeAsString()));
  ASSERT_TRUE(admitted.writes_done());
  // Its request arrives after the reload: the new policy decides (batch is no longer B's).
  const std::optional<grpc::Status> held = admitted.finish(std::chrono::seconds(30));
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->error_code(), StatusCode::PERMISSION_DENIED) << held->error_message();
  EXPECT_NE(held->error_message().find("batch"), std::string::npos) << held->error_message();
  EXPECT_EQ(generate(kB, "batch"), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(generate(kB, "interactive"), StatusCode::OK);
  EXPECT_EQ(generate(kB, "", 5), StatusCode::OK);
  EXPECT_EQ(generate(kB, "", 6), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(stats(kB), StatusCode::OK);

  // Rejected: a class the file does not configure; a class the reload drops.
  write("p.yaml", keys("sla_classes: [gold]") + classes);
  server.signal(SIGHUP);
  ASSERT_TRUE(wait_for_log(server, "server.api_keys[1].sla_classes[0]: unknown class 'gold'"))
      << server.log();
  write("p.yaml", keys("sla_classes: [interactive]") + "sla_classes:\n  batch: {}\n");
  server.signal(SIGHUP);
  ASSERT_TRUE(
      wait_for_log(server, "server.api_keys[1].sla_classes[0]: unknown class 'interactive'"))
      << server.log();
  EXPECT_EQ(count_lines_with(server.log(), "reload rejected, old SLA policy stays in force"), 2)
      << server.log();
  EXPECT_EQ(generate(kB, "interactive"), StatusCode::OK);
  EXPECT_EQ(generate(kB, "batch"), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(generate(kA, "batch"), StatusCode::OK);
}

}  // namespace
}  // namespace kvsplit::testing
