// The server's edges against the real binary: invalid requests, bad configs, SIGHUP reload,
// SIGTERM drain, TLS + API keys (self-signed cert made here with openssl), and a fuzz pass.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

grpc::Status generate_status(v1::Generation::Stub* stub, const v1::GenerateRequest& req,
                             std::vector<int32_t>* ids = nullptr,
                             grpc::ClientContext* ctx_in = nullptr) {
  grpc::ClientContext own;
  grpc::ClientContext* ctx = ctx_in ? ctx_in : &own;
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (ids) ids->insert(ids->end(), msg.token_ids().begin(), msg.token_ids().end());
  }
  return reader->Finish();
}

v1::GenerateRequest simple(const std::string& prompt = "Once upon a time",
                           uint32_t max_tokens = 4) {
  v1::GenerateRequest r;
  r.set_prompt(prompt);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

class AdminTest : public ::testing::Test {
 protected:
  void SetUp() override { KVSPLIT_REQUIRE_MODELS(); }
  std::unique_ptr<ServerProcess> start(std::vector<std::string> args) {
    args.insert(args.begin(), {"--model", model_path("stories260K.bin")});
    auto s =
        std::make_unique<ServerProcess>(args, dir_.file("server" + std::to_string(n_++) + ".log"));
    EXPECT_TRUE(s->started()) << s->log();
    return s;
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_.file(name)) << text;
    return dir_.file(name);
  }
  TempDir dir_;
  int n_ = 0;
};

TEST_F(AdminTest, InvalidRequestsNameTheField) {
  auto server = start(
      {"--config", write("c.yaml", "kv: {capacity_mb: 16}\nserver: {max_tokens_limit: 300}\n")});
  ASSERT_TRUE(server->started());
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  struct Case {
    const char* field;
    std::function<void(v1::GenerateRequest*)> mutate;
  };
  const std::vector<Case> cases = {
      {"sampling.temperature", [](auto* r) { r->mutable_sampling()->set_temperature(-1); }},
      {"sampling.temperature",
       [](auto* r) { r->mutable_sampling()->set_temperature(std::nanf("")); }},
      {"sampling.top_p", [](auto* r) { r->mutable_sampling()->set_top_p(0); }},
      {"sampling.top_p", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); }},
      {"sampling.top_k", [](auto* r) { r->mutable_sampling()->set_top_k(-2); }},
      {"sampling.min_p", [](auto* r) { r->mutable_sampling()->set_min_p(2); }},
      {"sampling.repetition_penalty",
       [](auto* r) { r->mutable_sampling()->set_repetition_penalty(0); }},
      {"sampling.presence_penalty",
       [](auto* r) { r->mutable_sampling()->set_presence_penalty(3); }},
      {"sampling.frequency_penalty",
       [](auto* r) { r->mutable_sampling()->set_frequency_penalty(-3); }},
      {"max_tokens", [](auto* r) { r->set_max_tokens(301); }},
      {"prompt", [](auto* r) { r->clear_input(); }},
      {"prompt_token_ids", [](auto* r) { r->mutable_prompt_token_ids(); }},
      {"prompt_token_ids[1]",
       [](auto* r) {
         r->mutable_prompt_token_ids()->add_ids(1);
         r->mutable_prompt_token_ids()->add_ids(512);
       }},
      {"prompt_token_ids",
       [](auto* r) {
         for (int i = 0; i < 600; ++i) r->mutable_prompt_token_ids()->add_ids(5);
       }},
      {"prompt",
       [](auto* r) {
         r->set_prompt(std::string(3000, 'a'));
         r->set_max_tokens(10);
       }},  // > context
      {"sla_class", [](auto* r) { r->set_sla_class("platinum"); }},
      {"priority", [](auto* r) { r->set_priority(5000); }},
      {"top_logprobs", [](auto* r) { r->set_top_logprobs(21); }},
      {"stop",
       [](auto* r) {
         for (int i = 0; i < 17; ++i) r->add_stop("x");
       }},
      {"stop[0]", [](auto* r) { r->add_stop(""); }},
      {"stop_token_ids[0]", [](auto* r) { r->add_stop_token_ids(-4); }},
      {"request_id", [](auto* r) { r->set_request_id("has space"); }},
  };
  for (const auto& c : cases) {
    v1::GenerateRequest req = simple();
    c.mutate(&req);
    grpc::Status st = generate_status(stub.get(), req);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(c.field), std::string::npos)
        << c.field << " not named in: " << st.error_message();
  }
  EXPECT_TRUE(generate_status(stub.get(), simple()).ok());  // still serving
}

TEST_F(AdminTest, InvalidUtf8PromptOnTheWire) {
  auto server = start({});
  ASSERT_TRUE(server->started());
  auto ch = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  // GenerateRequest{prompt (field 2): "\xff\xfeab", max_tokens (field 4): 4}, hand-encoded.
  const std::string bytes = std::string(
      "\x12\x04\xff\xfe"
      "ab"
      "\x20\x04",
      8);
  grpc::GenericStub generic(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, "/kvsplit.v1.Generation/Generate", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer req(&slice, 1);
  call->WriteLast(req, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::ByteBuffer resp;
  call->Read(&resp, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  // proto3 parsing rejects the invalid UTF-8 (the service parses the bytes itself, after
  // authentication): INVALID_ARGUMENT naming the field -- never OK, never a crash.
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("kvsplit.v1.GenerateRequest.prompt"), std::string::npos)
      << st.error_message();
  auto stub = v1::Generation::NewStub(ch);
  EXPECT_TRUE(generate_status(stub.get(), simple()).ok());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(AdminTest, BadConfigExitsNonZeroNamingTheField) {
  const std::string bad =
      write("bad.yaml", "sla_classes:\n  voice: {max_ttft_ms: 300, max_itl_ms: 0}\n");
  auto [code, out] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + bad);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("sla_classes.voice.max_itl_ms: must be > 0"), std::string::npos) << out;
  auto [code2, out2] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --port 0 --config " + bad);
  EXPECT_EQ(code2, 2);
  EXPECT_NE(out2.find("sla_classes.voice.max_itl_ms"), std::string::npos) << out2;
  const std::string unknown = write("unknown.yaml", "server: {prot: 5}\n");
  auto [code3, out3] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + unknown);
  EXPECT_EQ(code3, 2);
  EXPECT_NE(out3.find("server.prot: unknown key"), std::string::npos) << out3;
  auto [code4, out4] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " +
                                   KVSPLIT_SOURCE_DIR + "/configs/voice-assistant.yaml");
  EXPECT_EQ(code4, 0) << out4;
  // With --config beside it, which file was checked would be a guess: refused (--config was
  // ignored, and a broken one passed).
  auto [code4b, out4b] =
      run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + KVSPLIT_SOURCE_DIR +
                  "/configs/voice-assistant.yaml --config " + bad);
  EXPECT_EQ(code4b, 2);
  EXPECT_NE(out4b.find("give it without --config"), std::string::npos) << out4b;
  // Strict YAML through the binary (a duplicate key used to pass --check-config).
  const std::string dup = write("dup.yaml", "seed: 1\nseed: 2\n");
  auto [code5, out5] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + dup);
  EXPECT_EQ(code5, 2);
  EXPECT_NE(out5.find("seed: duplicate key (lines 1 and 2)"), std::string::npos) << out5;
  auto [code6, out6] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config /dev/zero");
  EXPECT_EQ(code6, 2);
  EXPECT_NE(out6.find("is a character device"), std::string::npos) << out6;
  // A file without a model: the check names the model the start would load, by the same
  // default-model rule (it said synthetic:stories260k, the engine config's built-in value).
  if (std::filesystem::exists(kvsplit::testing::model_path("stories260K.bin"))) {
    const std::string plain = write("plain.yaml", "seed: 1\n");
    auto [code8, out8] = run_command("KVSPLIT_MODELS=" + kvsplit::testing::models_dir() + " " +
                                     KVSPLIT_SERVER_BIN + " --check-config " + plain);
    EXPECT_EQ(code8, 0) << out8;
    EXPECT_NE(out8.find("model=" + kvsplit::testing::model_path("stories260K.bin")),
              std::string::npos)
        << out8;
  }
  // The flags beside --check-config are checked with the file, as at start (they were ignored:
  // --port 70000 passed).
  const std::string voice = std::string(KVSPLIT_SOURCE_DIR) + "/configs/voice-assistant.yaml";
  auto [code7, out7] =
      run_command(std::string(KVSPLIT_SERVER_BIN) + " --port 70000 --check-config " + voice);
  EXPECT_EQ(code7, 2) << out7;
  EXPECT_NE(out7.find("server.port"), std::string::npos) << out7;
  // --backend cpu runs a file written for cuda, whose pages may then be any size.
  const std::string cuda32 = write("cuda32.yaml", "pools: {backend: cuda}\nkv: {block_size: 32}\n");
  EXPECT_EQ(run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + cuda32).first, 2);
  EXPECT_EQ(run_command(std::string(KVSPLIT_SERVER_BIN) + " --backend cpu --check-config " + cuda32)
                .first,
            0);
  // What the engine refuses at start beyond the file's rules, and TLS files that do not exist:
  // exit 2 from both --check-config and --config (the first passed the check and failed the
  // start with 1, the second passed the check).
  for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
           {write("quant.yaml", "kv: {quant_fraction: 0.5, blocks_per_worker: 100}\n"),
            "quant_fraction"},
           {write("tls.yaml",
                  "server: {tls: {cert_file: /nonexistent.pem, key_file: " + voice + "}}\n"),
            "/nonexistent.pem"}}) {
    for (const std::string mode : {" --check-config ", " --port 0 --config "}) {
      auto [c, o] = run_command(std::string(KVSPLIT_SERVER_BIN) + mode + file);
      EXPECT_EQ(c, 2) << mode << file << ": " << o;
      EXPECT_NE(o.find(says), std::string::npos) << o;
    }
  }
}

// kv.cuts.spatial.communicator through the binary: a bad value fails --check-config naming the
// field; nccl on CPU shards fails the start with the reason (never a fallback); in_process serves
// and GetServerStats and /metrics name the communicator and count the exchange.
TEST_F(AdminTest, SpatialCommunicatorFromTheConfig) {
  const std::string bad =
      write("comm_bad.yaml", "kv:\n  cuts:\n    spatial: {communicator: mpi}\n");
  auto [code, out] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + bad);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("kv.cuts.spatial.communicator"), std::string::npos) << out;
  const std::string nccl =
      write("comm_nccl.yaml",
            "kv:\n  capacity_mb: 16\n  cuts:\n    spatial: {shards: 2, communicator: nccl}\n");
  auto [code2, out2] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --port 0 --model " +
                                   model_path("stories260K.bin") + " --config " + nccl);
  EXPECT_EQ(code2, 2);  // a bad config, refused before the model loads
  EXPECT_NE(out2.find("kv.cuts.spatial.communicator: nccl"), std::string::npos) << out2;
  // --check-config refuses it too (it passed, and the start then failed with exit 1).
  auto [code3, out3] = run_command(std::string(KVSPLIT_SERVER_BIN) + " --check-config " + nccl);
  EXPECT_EQ(code3, 2) << out3;
  EXPECT_NE(out3.find("kv.cuts.spatial.communicator: nccl"), std::string::npos) << out3;

  auto server = start({"--config", write("comm_in_process.yaml",
                                         "kv:\n  capacity_mb: 16\n  block_size: 16\n  cuts:\n"
                                         "    spatial: {shards: 2, spatial_chunk_size: 16, "
                                         "communicator: in_process}\n")});
  ASSERT_TRUE(server->started());
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  std::vector<int32_t> ids;
  // 5 prompt tokens + 40 generated: pages 0-2, chunks of one page alternate over the 2 shards.
  ASSERT_TRUE(generate_status(stub.get(), simple("Once upon a time", 40), &ids).ok());
  EXPECT_EQ(ids.size(), 40u);
  v1::GetServerStatsResponse stats;
  bool counted = false;
  for (int i = 0; i < 200 && !counted; ++i) {  // stats are published at the worker's next loop
    grpc::ClientContext ctx;
    stats.Clear();
    ASSERT_TRUE(stub->GetServerStats(&ctx, {}, &stats).ok());
    // Every pool (prefill and decode) names its group's communicator; the decode steps exchange.
    bool named = stats.pools_size() > 0;
    int64_t bytes = 0;
    double seconds = 0;
    for (const auto& p : stats.pools()) {
      named = named && p.kv_shard_communicator() == "in-process";
      bytes += p.kv_shard_exchange_bytes();
      seconds += p.kv_shard_exchange_seconds();
    }
    counted = named && bytes > 0 && seconds > 0;
    if (!counted) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(counted) << stats.DebugString();
  const std::string metrics = scrape_metrics(server->metrics_port());
  for (const char* name : {"kvsplit:kv_shard_communicator{", "communicator=\"in-process\"} 1",
                           "kvsplit:kv_shard_exchange_seconds_total{"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << " missing from\n" << metrics;
  }
}

// A second server on a port in use exits 1 (docs/server.md). gRPC's default SO_REUSEPORT let it
// bind beside the first and split the clients between them.
TEST_F(AdminTest, APortInUseExitsOne) {
  auto first = start({});
  ASSERT_TRUE(first->started());
  auto [code, out] = run_command("timeout 60 " + std::string(KVSPLIT_SERVER_BIN) +
                                 " --host 127.0.0.1 --port " + std::to_string(first->port()) +
                                 " --metrics-port -1 --model " + model_path("stories260K.bin"));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("cannot listen on 127.0.0.1:" + std::to_string(first->port())),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("listening on"), std::string::npos) << out;
}

// SIGTERM while the model still loads (llama-110m's synthetic weights take about a second):
// the process exits 143 at once and never listens. It used to finish the load, listen, report
// SERVING and only then drain.
TEST_F(AdminTest, SigtermDuringStartupExitsWithoutServing) {
  // The signal is sent once the config line is logged (the signals are blocked by then, and the
  // model load starts right after).
  const std::string log = dir_.file("startup.log");
  auto [code, out] = run_command(
      "sh -c '" + std::string(KVSPLIT_SERVER_BIN) +
      " --host 127.0.0.1 --port 0 --metrics-port -1 --model synthetic:llama-110m 2>" + log +
      " & pid=$!; for i in $(seq 1 1000); do grep -q \"config:\" " + log +
      " && break; sleep 0.01; done; kill -TERM $pid; wait $pid; echo exit=$?; cat " + log + "'");
  EXPECT_NE(out.find("exit=143"), std::string::npos) << out;
  EXPECT_EQ(out.find("listening on"), std::string::npos) << out;
  EXPECT_NE(out.find("during start-up"), std::string::npos) << out;
}

TEST_F(AdminTest, TlsFilesAreBoundedRegularFiles) {
  // /dev/zero as the certificate used to be read until memory ran out.
  auto [code, out] = run_command(std::string(KVSPLIT_SERVER_BIN) +
                                 " --port 0 --metrics-port 0 --model synthetic:stories260k "
                                 "--tls-cert /dev/zero "
                                 "--tls-key /dev/zero");
  EXPECT_EQ(code, 2);  // a bad config value, found before the engine starts
  EXPECT_EQ(out.find("Engine:"), std::string::npos) << out;
  EXPECT_NE(out.find("server.tls.cert_file: PEM file /dev/zero: is a character device"),
            std::string::npos)
      << out;
  // A file that is not PEM (a tokenizer) is named as such, not as a port that cannot listen.
  write("tok.bin", std::string("\x01\x02\x03not pem", 10));
  write("cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  const std::string tok = dir_.file("tok.bin"), pem = dir_.file("cert.pem");
  for (const auto& [cert, want] :
       {std::pair{tok, "server.tls.cert_file: " + tok + " holds no PEM certificate"},
        std::pair{pem, "server.tls.key_file: " + tok + " holds no PEM private key"}}) {
    std::tie(code, out) = run_command(std::string(KVSPLIT_SERVER_BIN) +
                                      " --port 0 --metrics-port -1 --model synthetic:stories260k "
                                      "--tls-cert " +
                                      cert + " --tls-key " + tok);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
  }
  // A key that is not the certificate's, and an encrypted key: refused before the model loads,
  // naming the field (both waited for the model, then failed as "cannot listen").
  const std::string a_cert = dir_.file("a.pem"), a_key = dir_.file("a.key");
  const std::string b_cert = dir_.file("b.pem"), b_key = dir_.file("b.key");
  const std::string enc_key = dir_.file("enc.key");
  for (const auto& [c, k] : {std::pair{a_cert, a_key}, std::pair{b_cert, b_key}}) {
    std::tie(code, out) = run_command(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
        "-subj /CN=localhost -keyout " +
        k + " -out " + c);
    ASSERT_EQ(code, 0) << out;
  }
  std::tie(code, out) =
      run_command("openssl pkey -in " + a_key + " -aes256 -passout pass:x -out " + enc_key);
  ASSERT_EQ(code, 0) << out;
  for (const auto& [k, want] :
       {std::pair{b_key, "server.tls.key_file: " + b_key + " does not match the certificate"},
        std::pair{enc_key, "server.tls.key_file: " + enc_key +
                               ": the PEM private key does not "
                               "parse or is encrypted"}}) {
    std::tie(code, out) = run_command(std::string(KVSPLIT_SERVER_BIN) +
                                      " --port 0 --metrics-port -1 --model synthetic:stories260k "
                                      "--tls-cert " +
                                      a_cert + " --tls-key " + k + " < /dev/null");
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_EQ(out.find("Engine:"), std::string::npos) << out;
  }
}

TEST_F(AdminTest, SighupReloadsClassesAndBadReloadKeepsOldPolicy) {
  const std::string cfg = write("live.yaml",
                                "kv: {capacity_mb: 16}\nsla_classes:\n  gold: {max_ttft_ms: 100}\n "
                                " silver: {max_ttft_ms: 900}\n");
  auto server = start({"--config", cfg});
  ASSERT_TRUE(server->started());
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  auto with_class = [&](const std::string& c) {
    v1::GenerateRequest r = simple();
    r.set_sla_class(c);
    return generate_status(stub.get(), r).error_code();
  };
  EXPECT_EQ(with_class("gold"), grpc::StatusCode::OK);
  EXPECT_EQ(with_class("bronze"), grpc::StatusCode::INVALID_ARGUMENT);
  auto wait_for_log = [&](const std::string& needle) {
    for (int i = 0; i < 200; ++i) {
      if (server->log().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  };
  write("live.yaml",
        "kv: {capacity_mb: 16}\nsla_classes:\n  gold: {max_ttft_ms: 100}\n  bronze: {max_ttft_ms: "
        "5000}\n");
  server->signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("reloaded 2 SLA classes")) << server->log();
  EXPECT_EQ(with_class("bronze"), grpc::StatusCode::OK);
  EXPECT_EQ(with_class("silver"), grpc::StatusCode::INVALID_ARGUMENT);
  write("live.yaml", "sla_classes:\n  gold: {max_ttft_ms: 100}\n  tin: {max_itl_ms: -1}\n");
  server->signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("reload rejected")) << server->log();
  EXPECT_NE(server->log().find("sla_classes.tin.max_itl_ms"), std::string::npos);
  EXPECT_EQ(with_class("bronze"), grpc::StatusCode::OK);  // the old policy stays in force
  EXPECT_EQ(with_class("tin"), grpc::StatusCode::INVALID_ARGUMENT);
  // A file caught empty (a write in progress) is no reload: it loaded as every default, and one
  // `default` class replaced gold and bronze.
  write("live.yaml", "# being rewritten\n\n");
  server->signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("has no settings")) << server->log();
  EXPECT_EQ(with_class("bronze"), grpc::StatusCode::OK);
  // The KV cache manager's policy reloads with the classes (docs/kvm.md): a rule whose cut is off
  // is rejected by the engine and the manager stays off; a valid one starts it.
  const std::string classes =
      "kv: {capacity_mb: 16}\nsla_classes:\n  gold: {max_ttft_ms: 100}\n  bronze: {max_ttft_ms: "
      "5000}\n";
  write("live.yaml", classes +
                         "kvm:\n  rules:\n    - {name: hot, when: \"device_kv_use > 0.9\", exit: "
                         "\"device_kv_use < 0.8\", then: \"semantic_threshold += 0.05\"}\n");
  server->signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("engine rejected the new kvm policy")) << server->log();
  EXPECT_NE(server->log().find("kvm.rules[0] (hot)"), std::string::npos) << server->log();
  v1::GetServerStatsResponse stats;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetServerStats(&ctx, {}, &stats).ok());
    EXPECT_FALSE(stats.kvm_enabled());
  }
  // A reload whose policy the engine rejects changes nothing, its classes included: dropping
  // bronze alongside a rejected rule used to apply the classes and then refuse the rules.
  write("live.yaml",
        "kv: {capacity_mb: 16}\nsla_classes:\n  gold: {max_ttft_ms: 100}\nkvm:\n  rules:\n    - "
        "{name: hot2, when: \"device_kv_use > 0.9\", exit: \"device_kv_use < 0.8\", then: "
        "\"semantic_threshold += 0.05\"}\n");
  server->signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("kvm.rules[0] (hot2)")) << server->log();
  EXPECT_NE(server->log().find("old SLA classes and policy stay"), std::string::npos)
      << server->log();
  EXPECT_EQ(with_class("bronze"), grpc::StatusCode::OK);
  write("live.yaml", classes +
                         "kvm:\n  interval_ms: 10\n  rules:\n    - {name: calm, when: "
                         "\"device_kv_use < 0.5\", exit: \"device_kv_use > 0.6\", then: \"swap = "
                         "never\", class: bronze}\n");
  server->signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("kvm policy reloaded (1 rules)")) << server->log();
  // An idle server has no device use: the rule enters at once and sets bronze's swap mode.
  bool entered = false;
  for (int i = 0; i < 200 && !entered; ++i) {
    grpc::ClientContext ctx;
    stats.Clear();
    ASSERT_TRUE(stub->GetServerStats(&ctx, {}, &stats).ok());
    for (const auto& d : stats.kvm_decisions())
      entered = entered || (d.rule() == "calm" && d.action() == "enter" && d.applied());
    if (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(entered) << stats.DebugString();
  EXPECT_TRUE(stats.kvm_enabled());
  bool param = false;
  for (const auto& p : stats.kvm_params())
    param = param || (p.param() == "swap" && p.sla_class() == "bronze" && p.value() == 2);
  EXPECT_TRUE(param) << stats.DebugString();
  EXPECT_GE(stats.kvm().classes_size(), 2);
  const std::string metrics = scrape_metrics(server->metrics_port());
  for (const char* name :
       {"kvsplit:kvm_decisions_total{rule=\"calm\",action=\"enter\"} 1",
        "kvsplit:kvm_param{param=\"swap\",sla_class=\"bronze\"} 2",
        "kvsplit:kvm_monitor{metric=\"device_kv_use\"}",
        "kvsplit:kvm_class_latency_ms{sla_class=\"gold\",quantile=\"ttft_p99\"}"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << " missing from\n" << metrics;
  }
  EXPECT_EQ(with_class("bronze"), grpc::StatusCode::OK);
  EXPECT_TRUE(server->alive());
}

// SIGHUP under load (docs/kvm.md, "Reload"): while client threads stream greedy requests, the
// policy file alternates between two valid KVM policies (rules that move swap, the time slice and
// the admission limits, none of which may change a greedy token) and a bad one. No request fails
// or changes its tokens, every reload is applied or rejected as it should be, and every KV block
// is back afterwards.
TEST_F(AdminTest, SighupReloadsUnderLoadDropNothing) {
  const std::string classes =
      "kv: {capacity_mb: 16}\nsla_classes:\n  gold: {max_ttft_ms: 100}\n  bronze: {max_ttft_ms: "
      "5000}\n";
  const std::string policy_a =
      classes +
      "kvm:\n  interval_ms: 10\n  rules:\n"
      "    - {name: calm, when: \"device_kv_use < 0.5\", exit: \"device_kv_use > 0.6\", then: "
      "\"swap = never\", class: bronze}\n"
      "    - {name: slice, when: \"queue_depth > 0\", exit: \"queue_depth < 0\", then: "
      "\"temporal_step_size = 4\"}\n";
  const std::string policy_b =
      classes +
      "kvm:\n  interval_ms: 10\n  rules:\n"
      "    - {name: calm, when: \"device_kv_use < 0.5\", exit: \"device_kv_use > 0.6\", then: "
      "\"swap = always\", class: bronze}\n"
      "    - {name: admit, when: \"device_kv_use < 0.9\", exit: \"device_kv_use > 0.95\", then: "
      "\"max_num_seqs = 3\", min: 1, max: 64}\n";
  const std::string policy_bad =
      classes +
      "kvm:\n  rules:\n    - {name: broken, when: \"device_kv_use >\", then: \"swap = "
      "never\"}\n";
  const std::string cfg = write("load.yaml", policy_a);
  auto server = start({"--config", cfg});
  ASSERT_TRUE(server->started());
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Ben",
                                            "One day, a bird"};
  std::vector<std::vector<int32_t>> want(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    v1::GenerateRequest r = simple(prompts[i], 24);
    r.set_sla_class(i % 2 ? "bronze" : "gold");
    ASSERT_TRUE(generate_status(stub.get(), r, &want[i]).ok());
    ASSERT_EQ(want[i].size(), 24u);
  }
  auto count = [&](const std::string& needle) {
    const std::string log = server->log();
    size_t n = 0;
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
    return n;
  };
  const size_t reloaded0 = count("kvm policy reloaded"), rejected0 = count("reload rejected");
  std::atomic<bool> stop{false};
  std::atomic<int> done{0}, failed{0}, wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      auto own = v1::Generation::NewStub(channel);
      for (int k = 0; !stop.load() || k < 3; ++k) {
        const size_t i = static_cast<size_t>(t + k) % prompts.size();
        v1::GenerateRequest r = simple(prompts[i], 24);
        r.set_sla_class(i % 2 ? "bronze" : "gold");
        std::vector<int32_t> ids;
        const grpc::Status st = generate_status(own.get(), r, &ids);
        if (!st.ok()) {
          ++failed;
          ADD_FAILURE() << "request failed during reloads: " << st.error_message();
        } else if (ids != want[i]) {
          ++wrong;
        }
        ++done;
      }
    });
  }
  // Each valid reload must be applied before the next signal, so wait for its log line.
  auto wait_count = [&](const std::string& needle, size_t n) {
    for (int i = 0; i < 400; ++i) {
      if (count(needle) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  size_t want_reloaded = reloaded0, want_rejected = rejected0;
  for (int round = 0; round < 9; ++round) {
    const int kind = round % 3;  // b, bad, a, b, bad, a, ...
    write("load.yaml", kind == 0 ? policy_b : kind == 1 ? policy_bad : policy_a);
    server->signal(SIGHUP);
    if (kind == 1) {
      ++want_rejected;
      ASSERT_TRUE(wait_count("reload rejected", want_rejected)) << server->log();
    } else {
      ++want_reloaded;
      ASSERT_TRUE(wait_count("kvm policy reloaded", want_reloaded)) << server->log();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  stop = true;
  for (auto& c : clients) c.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0) << "greedy tokens changed under a policy reload";
  EXPECT_GE(done.load(), 12);
  EXPECT_NE(server->log().find("kvm.rules[0] (broken)"), std::string::npos) << server->log();
  // The last policy (a) is in force, and its decisions were taken (a reload starts the rules
  // afresh: its first decision comes at a tick after it, which a loaded machine may delay).
  v1::GetServerStatsResponse stats;
  bool all_free = false, calm = false;
  for (int i = 0; i < 500 && !(all_free && calm); ++i) {
    grpc::ClientContext ctx;
    stats.Clear();
    ASSERT_TRUE(stub->GetServerStats(&ctx, {}, &stats).ok());
    all_free = stats.pools_size() > 0 && stats.num_running() == 0 && stats.num_waiting() == 0;
    for (const auto& p : stats.pools())
      all_free = all_free && p.kv_blocks_free() == p.kv_blocks_total();
    for (const auto& d : stats.kvm_decisions()) calm = calm || d.rule() == "calm";
    if (!(all_free && calm)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(all_free) << stats.DebugString();
  EXPECT_TRUE(stats.kvm_enabled());
  EXPECT_TRUE(calm) << stats.DebugString();
  EXPECT_TRUE(server->alive());
}

TEST_F(AdminTest, SigtermDrainsInFlightThenExitsZero) {
  auto server = start(
      {"--config", write("d.yaml", "kv: {capacity_mb: 16}\nserver: {drain_timeout_ms: 20000}\n")});
  ASSERT_TRUE(server->started());
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req = simple("Once upon a time", 300);
  req.set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg, last;
  ASSERT_TRUE(reader->Read(&msg));
  size_t n = msg.token_ids_size();
  server->signal(SIGTERM);
  while (reader->Read(&msg)) {
    n += msg.token_ids_size();
    last = msg;
  }
  grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);  // finished, not cut off
  EXPECT_EQ(n, 300u);
  EXPECT_EQ(server->stop(), 0) << server->log();
}

TEST_F(AdminTest, TlsAndApiKeys) {
  const std::string cert = dir_.file("cert.pem"), key = dir_.file("key.pem");
  auto [code, out] = run_command(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      key + " -out " + cert);
  ASSERT_EQ(code, 0) << out;
  auto server = start({"--tls-cert", cert, "--tls-key", key, "--api-key", "sekrit-key-1",
                       "--api-key", "sekrit-key-2"});
  ASSERT_TRUE(server->started());
  std::ifstream in(cert);
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  auto tls =
      v1::Generation::NewStub(grpc::CreateChannel(server->address(), grpc::SslCredentials(ssl)));
  auto call = [&](v1::Generation::Stub* stub, const std::string& bearer) {
    grpc::ClientContext ctx;
    if (!bearer.empty()) ctx.AddMetadata("authorization", bearer);
    return generate_status(stub, simple(), nullptr, &ctx).error_code();
  };
  EXPECT_EQ(server->log().find("clear text"), std::string::npos) << "TLS is on";
  EXPECT_EQ(call(tls.get(), "Bearer sekrit-key-1"), grpc::StatusCode::OK);
  EXPECT_EQ(call(tls.get(), "Bearer sekrit-key-2"), grpc::StatusCode::OK);
  EXPECT_EQ(call(tls.get(), "Bearer wrong-key-123"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(tls.get(), "sekrit-key-1"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(tls.get(), ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(tls.get(), "bearer sekrit-key-1"), grpc::StatusCode::OK);  // any case (RFC 9110)
  EXPECT_EQ(call(tls.get(), "BEARER sekrit-key-2"), grpc::StatusCode::OK);
  EXPECT_EQ(call(tls.get(), "Bearer   sekrit-key-1"), grpc::StatusCode::OK);  // 1*SP (RFC 9110)
  EXPECT_EQ(call(tls.get(), "Bearer "), grpc::StatusCode::UNAUTHENTICATED);
  {
    // Two authorization entries (a proxy appending its own): refused, whichever is valid.
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer sekrit-key-1");
    ctx.AddMetadata("authorization", "Bearer wrong-key-123");
    EXPECT_EQ(generate_status(tls.get(), simple(), nullptr, &ctx).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext sctx;
  v1::GetServerStatsResponse stats;
  EXPECT_EQ(tls->GetServerStats(&sctx, {}, &stats).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A plaintext client cannot talk to the TLS port.
  auto plain = v1::Generation::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(call(plain.get(), "Bearer sekrit-key-1"), grpc::StatusCode::UNAVAILABLE);
  // kvsplit-client speaks TLS + bearer too.
  auto [ccode, cout] =
      run_command(std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server " +
                  server->address() + " --tls-ca " + cert +
                  " --api-key sekrit-key-1 --temperature 0 --max-tokens 5 --top-logprobs 3 --json "
                  "--stop QQQQ 'The dog'");
  EXPECT_EQ(ccode, 0) << cout;
  EXPECT_NE(cout.find("\"finish_reason\""), std::string::npos) << cout;
  // --top-logprobs: each token's alternatives, most likely first (they were dropped).
  const nlohmann::json reply = nlohmann::json::parse(cout, nullptr, false);
  ASSERT_TRUE(reply.is_object() && reply.contains("logprobs")) << cout;
  // The prompt after --stop is the prompt, not a second stop string (it was, and an empty prompt,
  // BOS alone, ran in its place).
  EXPECT_GT(reply["usage"]["prompt_tokens"].get<int>(), 1) << cout;
  ASSERT_EQ(reply["logprobs"].size(), 5u) << cout;
  for (const nlohmann::json& lp : reply["logprobs"]) {
    ASSERT_TRUE(lp.contains("top")) << lp.dump();
    ASSERT_EQ(lp["top"].size(), 3u) << lp.dump();
    EXPECT_GE(lp["top"][0]["logprob"].get<double>(), lp["top"][1]["logprob"].get<double>());
    EXPECT_GE(lp["top"][0]["logprob"].get<double>(), lp["logprob"].get<double>());  // greedy
  }
  // The key from $KVSPLIT_API_KEY (a flag shows in `ps`); --api-key, when given, wins.
  const std::string info = std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --info --server " +
                           server->address() + " --tls-ca " + cert;
  EXPECT_EQ(run_command("KVSPLIT_API_KEY=sekrit-key-2 " + info).first, 0);
  const auto wrong = run_command("KVSPLIT_API_KEY=not-a-key-at-all " + info);
  EXPECT_EQ(wrong.first, 1) << wrong.second;
  EXPECT_NE(wrong.second.find("UNAUTHENTICATED"), std::string::npos) << wrong.second;
  EXPECT_EQ(run_command("KVSPLIT_API_KEY=bad-key-123 " + info + " --api-key sekrit-key-1").first,
            0);
}

// kvsplit-client refuses flags it would drop (exit 2, before connecting): a server name to verify
// without TLS (the call went in plaintext), --info with --stats, generation flags with either
// (ignored), --top-logprobs without --json (asked for, never printed), no prompt (it ran BOS
// alone).
TEST_F(AdminTest, TheClientRefusesFlagsItWouldDrop) {
  const std::string client =
      std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server 127.0.0.1:1 ";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--tls-server-name x 'The dog'", "--tls-server-name needs --tls-ca"},
           {"--info --stats", "give one"},
           {"--info 'The dog'", "take no prompt"},
           {"--info --max-tokens 5", "--max-tokens is for a generation"},
           {"--stats --sla-class x", "--sla-class is for a generation"},
           {"'The dog' --top-logprobs 3", "--top-logprobs needs --json"},
           {"--max-tokens 4", "a prompt is required"}}) {
    auto [code, out] = run_command(client + args);
    EXPECT_EQ(code, 2) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
  // --json with --info is redundant, not dropped (both print JSON): the call is made (and fails
  // to connect here, exit 1), never refused as a usage error.
  auto [code, out] = run_command(client + "--info --json --timeout 2");
  EXPECT_EQ(code, 1) << out;
}

TEST_F(AdminTest, FuzzedRequestsNeverCrashTheServer) {
  auto server = start(
      {"--config", write("f.yaml", "kv: {capacity_mb: 16}\nserver: {max_tokens_limit: 64}\n")});
  ASSERT_TRUE(server->started());
  auto ch = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(ch);
  std::mt19937_64 rng(1234);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  auto rfloat = [&]() -> float {
    switch (pick(6)) {
      case 0:
        return std::nanf("");
      case 1:
        return std::numeric_limits<float>::infinity();
      case 2:
        return -1e30f;
      default:
        return static_cast<float>(static_cast<int64_t>(rng() % 4000) - 2000) / 500.0f;
    }
  };
  auto rbytes = [&](size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  };
  int ok = 0, invalid = 0, other = 0;
  for (int i = 0; i < 150; ++i) {
    v1::GenerateRequest r;
    if (pick(2))
      r.set_prompt(pick(10) == 0 ? std::string(1 << 20, 'z') : "Tom went" + std::to_string(i));
    else
      for (int k = pick(20); k >= 0; --k)
        r.mutable_prompt_token_ids()->add_ids(static_cast<int32_t>(rng() % 700) - 50);
    r.set_max_tokens(static_cast<uint32_t>(pick(3) ? pick(80) : rng()));
    if (pick(2)) r.mutable_sampling()->set_temperature(rfloat());
    if (pick(3) == 0) r.mutable_sampling()->set_top_p(rfloat());
    if (pick(3) == 0) r.mutable_sampling()->set_top_k(static_cast<int32_t>(rng()));
    if (pick(3) == 0) r.mutable_sampling()->set_min_p(rfloat());
    if (pick(3) == 0) r.mutable_sampling()->set_repetition_penalty(rfloat());
    if (pick(3) == 0) r.mutable_sampling()->set_seed(rng());
    if (pick(4) == 0) r.add_stop(pick(2) ? "the" : std::string(300, 'q'));
    if (pick(4) == 0) r.add_stop_token_ids(static_cast<int32_t>(rng() % 1000) - 100);
    if (pick(4) == 0) r.set_sla_class(pick(2) ? "default" : "nope");
    if (pick(4) == 0) r.set_priority(static_cast<int32_t>(rng()));
    if (pick(4) == 0) r.set_top_logprobs(static_cast<uint32_t>(pick(30)));
    if (pick(5) == 0)
      r.set_request_id(pick(2) ? "fuzz-" + std::to_string(i) : std::string(200, 'r'));
    r.set_ignore_eos(pick(2));
    grpc::Status st = generate_status(stub.get(), r);
    (st.ok() ? ok : st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? invalid : other)++;
    ASSERT_NE(st.error_code(), grpc::StatusCode::UNAVAILABLE)
        << "server died at iteration " << i << "\n"
        << server->log();
  }
  // Raw garbage as the request message and as unary requests.
  for (int i = 0; i < 30; ++i) {
    std::string resp;
    (void)raw_unary(ch, "/kvsplit.v1.Generation/GetServerStats",
                    rbytes(static_cast<size_t>(pick(64))), &resp);
    (void)raw_unary(ch, "/kvsplit.v1.Generation/Abort", rbytes(static_cast<size_t>(pick(64))),
                    &resp);
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(invalid, 0);
  EXPECT_TRUE(server->alive());
  EXPECT_TRUE(generate_status(stub.get(), simple()).ok()) << server->log();
}

}  // namespace
}  // namespace kvsplit::testing
