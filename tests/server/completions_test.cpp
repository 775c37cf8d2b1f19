// GenerateRequest.n (parallel sampling) against the real server: every message belongs to one
// completion (GenerateResponse.index), each completion ends with its own final message, the call
// ends OK after the last; completion i of a seeded request is the request with n = 1 and seed +
// i; kvsplit-client prints the completions (text and --json); bad values are refused. Also
// GenerateRequest.prompt_logprobs: sent first, in messages of at most 256 entries.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

namespace v1 = ::kvsplit::v1;

class CompletionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVSPLIT_REQUIRE_MODELS();
    server_ = std::make_unique<ServerProcess>(
        std::vector<std::string>{"--model", model_path("stories260K.bin")},
        dir_.file("server.log"));
    ASSERT_TRUE(server_->started()) << server_->log();
    stub_ = v1::Generation::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(CompletionsTest, EachMessageIsOneCompletionsAndEachEndsOnce) {
  v1::GenerateRequest req;
  req.set_prompt("Once upon a time");
  req.set_max_tokens(300);  // long enough that the completions' messages interleave
  req.set_n(3);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_seed(5);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::vector<std::vector<int32_t>> ids(3);
  std::vector<int> finals(3, 0), after_final(3, 0);
  std::vector<uint32_t> order;
  while (reader->Read(&msg)) {
    ASSERT_LT(msg.index(), 3u);
    const uint32_t i = msg.index();
    if (order.empty() || order.back() != i) order.push_back(i);
    if (finals[i] > 0) ++after_final[i];
    ids[i].insert(ids[i].end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      ++finals[i];
      EXPECT_EQ(msg.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(msg.usage().completion_tokens(), ids[i].size());
      EXPECT_GT(msg.usage().prompt_tokens(), 0u);
    }
  }
  const grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(finals[i], 1) << i;
    EXPECT_EQ(after_final[i], 0) << i;
    EXPECT_EQ(ids[i].size(), 300u) << i;
  }
  EXPECT_GT(order.size(), 3u) << "the completions were streamed one after the other";
  // Completion i is the request with n = 1 and seed 5 + i.
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest one = req;
    one.set_n(1);
    one.mutable_sampling()->set_seed(5 + i);
    grpc::ClientContext c1;
    auto r1 = stub_->Generate(&c1, one);
    std::vector<int32_t> want;
    while (r1->Read(&msg)) {
      EXPECT_EQ(msg.index(), 0u);
      want.insert(want.end(), msg.token_ids().begin(), msg.token_ids().end());
    }
    ASSERT_TRUE(r1->Finish().ok());
    EXPECT_EQ(ids[i], want) << "completion " << i;
  }
}

TEST_F(CompletionsTest, PromptLogprobsComeFirstInMessagesOfAtMost256) {
  v1::GenerateRequest req;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back(3 + (i * 53 + 7) % 480);
  for (int32_t t : prompt) req.mutable_prompt_token_ids()->add_ids(t);
  req.set_max_tokens(3);
  req.set_prompt_logprobs(2);
  req.set_top_logprobs(1);
  req.mutable_sampling()->set_temperature(0);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::vector<v1::TokenLogprob> plp;
  std::vector<int> chunk_sizes;
  int tokens = 0;
  float first_token_logprob = 1;
  while (reader->Read(&msg)) {
    if (msg.prompt_logprobs_size() > 0) {
      EXPECT_EQ(tokens, 0) << "prompt logprobs after a token";
      EXPECT_EQ(msg.token_ids_size(), 0);
      chunk_sizes.push_back(msg.prompt_logprobs_size());
      plp.insert(plp.end(), msg.prompt_logprobs().begin(), msg.prompt_logprobs().end());
    }
    if (tokens == 0 && msg.logprobs_size() > 0) first_token_logprob = msg.logprobs(0).logprob();
    tokens += msg.token_ids_size();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 3);
  EXPECT_EQ(chunk_sizes, (std::vector<int>{256, 43}));
  ASSERT_EQ(plp.size(), 299u);
  for (size_t i = 0; i < plp.size(); ++i) {
    EXPECT_EQ(plp[i].token_id(), prompt[i + 1]) << i;
    EXPECT_LE(plp[i].logprob(), 0.0f) << i;
    ASSERT_EQ(plp[i].top_size(), 2) << i;
  }
  // The last entry is the model's logprob of the last prompt token; the request for the prompt
  // minus it, forced (logit_bias) to generate that token, reports the same.
  v1::GenerateRequest forced;
  for (size_t i = 0; i + 1 < prompt.size(); ++i)
    forced.mutable_prompt_token_ids()->add_ids(prompt[i]);
  forced.set_max_tokens(1);
  forced.set_top_logprobs(1);
  forced.mutable_sampling()->set_temperature(0);
  (*forced.mutable_sampling()->mutable_logit_bias())[prompt.back()] = 100;
  grpc::ClientContext fctx;
  auto fr = stub_->Generate(&fctx, forced);
  float want = 1;
  while (fr->Read(&msg)) {
    if (msg.logprobs_size() > 0) want = msg.logprobs(0).logprob();
  }
  ASSERT_TRUE(fr->Finish().ok());
  EXPECT_NEAR(plp.back().logprob(), want, 1e-4);
  EXPECT_LE(first_token_logprob, 0.0f);
  // Out of range.
  req.set_prompt_logprobs(21);
  grpc::ClientContext bctx;
  auto bad = stub_->Generate(&bctx, req);
  EXPECT_FALSE(bad->Read(&msg));
  const grpc::Status st = bad->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("prompt_logprobs: ", 0), 0u) << st.error_message();
}

TEST_F(CompletionsTest, OutOfRangeNIsInvalidArgument) {
  v1::GenerateRequest req;
  req.set_prompt("Once upon a time");
  req.set_n(129);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  EXPECT_FALSE(reader->Read(&msg));
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("n: ", 0), 0u) << st.error_message();
}

TEST_F(CompletionsTest, ClientPrintsEveryCompletion) {
  const std::string client = std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server " +
                             server_->address() + " --max-tokens 12 --seed 9 ";
  const auto [code, out] = run_command(client + "--n 3 --json 'Once upon a time'");
  ASSERT_EQ(code, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("choices")) << out;
  ASSERT_EQ(j["choices"].size(), 3u) << out;
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& c = j["choices"][i];
    EXPECT_EQ(c["index"].get<int>(), i);
    EXPECT_EQ(c["finish_reason"].get<std::string>().rfind("FINISH_REASON_", 0), 0u) << out;
    EXPECT_EQ(c["usage"]["completion_tokens"].get<size_t>(), c["token_ids"].size());
    // The same as the request with n = 1 and seed 9 + i.
    const auto [one_code, one_out] =
        run_command(client.substr(0, client.size() - std::string("--seed 9 ").size()) + "--seed " +
                    std::to_string(9 + i) + " --json 'Once upon a time'");
    ASSERT_EQ(one_code, 0) << one_out;
    const nlohmann::json one = nlohmann::json::parse(one_out, nullptr, false);
    ASSERT_TRUE(one.is_object() && !one.contains("choices")) << one_out;
    EXPECT_EQ(c["token_ids"], one["token_ids"]) << i;
    EXPECT_EQ(c["text"], one["text"]) << i;
  }
  // Text: each completion on its own line, "[i] text".
  const auto [text_code, text_out] = run_command(client + "--n 2 'Once upon a time'");
  ASSERT_EQ(text_code, 0) << text_out;
  EXPECT_NE(text_out.find("[0] "), std::string::npos) << text_out;
  EXPECT_NE(text_out.find("[1] "), std::string::npos) << text_out;
  // Out of range: a usage error before any call.
  const auto [bad_code, bad_out] = run_command(client + "--n 0 'x'");
  EXPECT_EQ(bad_code, 2) << bad_out;
  // --prompt-logprobs: one entry per prompt token after the first, top level.
  const auto [plp_code, plp_out] =
      run_command(client + "--n 2 --prompt-logprobs 1 --json 'Once upon a time'");
  ASSERT_EQ(plp_code, 0) << plp_out;
  const nlohmann::json p = nlohmann::json::parse(plp_out, nullptr, false);
  ASSERT_TRUE(p.is_object() && p.contains("prompt_logprobs")) << plp_out;
  EXPECT_GE(p["prompt_logprobs"].size(), 3u) << plp_out;
  EXPECT_EQ(p["prompt_logprobs"][0]["top"].size(), 1u) << plp_out;
  const auto [plp_text_code, plp_text_out] = run_command(client + "--prompt-logprobs 1 'x'");
  EXPECT_EQ(plp_text_code, 2) << plp_text_out;
  EXPECT_NE(plp_text_out.find("--prompt-logprobs needs --json"), std::string::npos);
}

}  // namespace
}  // namespace kvsplit::testing
