// kvsplit-client --min-tokens and --logit-bias against the real server: they reach the engine
// (the tokens change as they should), and malformed values are usage errors (exit 2).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/server_harness.h"

namespace kvsplit::testing {
namespace {

std::vector<int32_t> ids_of(const std::string& json_out) {
  const nlohmann::json j = nlohmann::json::parse(json_out, nullptr, false);
  if (!j.is_object() || !j.contains("token_ids")) return {};
  return j["token_ids"].get<std::vector<int32_t>>();
}

TEST(ClientSamplingControls, MinTokensAndLogitBiasReachTheServer) {
  KVSPLIT_REQUIRE_MODELS();
  TempDir dir;
  ServerProcess server({"--model", model_path("stories260K.bin")}, dir.file("server.log"));
  ASSERT_TRUE(server.started()) << server.log();
  const std::string client = std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server " +
                             server.address() + " --temperature 0 --json ";

  const auto [plain_code, plain_out] = run_command(client + "--max-tokens 30 'Once upon a time'");
  ASSERT_EQ(plain_code, 0) << plain_out;
  const std::vector<int32_t> plain = ids_of(plain_out);
  ASSERT_EQ(plain.size(), 30u) << plain_out;

  // The greedy text's first token banned: it never appears.
  const std::string ban = std::to_string(plain[0]) + "=-100";
  const auto [ban_code, ban_out] =
      run_command(client + "--max-tokens 30 --logit-bias " + ban + " 'Once upon a time'");
  ASSERT_EQ(ban_code, 0) << ban_out;
  const std::vector<int32_t> banned = ids_of(ban_out);
  ASSERT_FALSE(banned.empty()) << ban_out;
  for (int32_t t : banned) EXPECT_NE(t, plain[0]);

  // The greedy story has a "." at token 11; min_tokens 20 holds the stop string off.
  const auto [stop_code, stop_out] =
      run_command(client + "--max-tokens 30 --stop . --min-tokens 20 'Once upon a time'");
  ASSERT_EQ(stop_code, 0) << stop_out;
  EXPECT_GE(ids_of(stop_out).size(), 20u) << stop_out;
  const auto [early_code, early_out] =
      run_command(client + "--max-tokens 30 --stop . 'Once upon a time'");
  ASSERT_EQ(early_code, 0) << early_out;
  EXPECT_LT(ids_of(early_out).size(), 20u) << early_out;

  // Server-side ranges come back as INVALID_ARGUMENT naming the field (exit 1 from the client).
  const auto [range_code, range_out] =
      run_command(client + "--max-tokens 4 --min-tokens 5 'Once upon a time'");
  EXPECT_EQ(range_code, 1) << range_out;
  EXPECT_NE(range_out.find("min_tokens"), std::string::npos) << range_out;
  const auto [vocab_code, vocab_out] =
      run_command(client + "--logit-bias 512=1 'Once upon a time'");
  EXPECT_EQ(vocab_code, 1) << vocab_out;
  EXPECT_NE(vocab_out.find("sampling.logit_bias: token id 512"), std::string::npos) << vocab_out;
}

TEST(ClientSamplingControls, MalformedValuesAreUsageErrors) {
  const std::string client =
      std::string(KVSPLIT_BINARY_DIR) + "/kvsplit-client --server 127.0.0.1:1 ";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--logit-bias 5 'x'", "ID=BIAS"},
           {"--logit-bias =3 'x'", "ID=BIAS"},
           {"--logit-bias 99999999999=1 'x'", "ID=BIAS"},
           {"--logit-bias 5=1 --logit-bias 5=2 'x'", "token id 5 is given twice"},
           {"--min-tokens -1 'x'", "--min-tokens"},
           {"--info --min-tokens 3", "--min-tokens is for a generation"},
           {"--stats --logit-bias 1=1", "--logit-bias is for a generation"}}) {
    const auto [code, out] = run_command(client + args);
    EXPECT_EQ(code, 2) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
}

}  // namespace
}  // namespace kvsplit::testing
