// server.api_keys entries with a per-key policy (a mapping with `key`): parsed beside plain
// entries, which keep full rights, and each of the policy's checks with its field path.
#include <gtest/gtest.h>

#include "config/config.h"

namespace kvsplit::config {
namespace {

constexpr char kClasses[] =
    "sla_classes:\n  interactive: {priority: 10}\n  batch: {priority: -10}\n";

// Asserts that server.api_keys `keys` (a YAML list, beside kClasses) fails with kInvalidArgument
// and a message containing `needle`.
void expect_keys_error(const std::string& keys, const std::string& needle) {
  const std::string yaml = std::string(kClasses) + "server:\n  api_keys: " + keys + "\n";
  auto c = parse_config(yaml);
  ASSERT_FALSE(c.ok()) << "accepted:\n" << yaml;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message '" << c.status().message() << "' lacks '" << needle << "'";
}

TEST(ApiKeyPolicyConfig, PlainAndPolicyEntriesParse) {
  auto c = parse_config(std::string(kClasses) +
                        "server:\n"
                        "  api_keys:\n"
                        "    - plain-key-full-rights\n"
                        "    - key: tenant-b-key-123\n"
                        "      sla_classes: [batch, interactive]\n"
                        "      max_priority: -5\n"
                        "      max_streams: 4\n"
                        "      server_stats: false\n"
                        "    - {key: only-a-key-0001}\n"
                        "    - {key: no-streams-limit, max_streams: 0, sla_classes: []}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const std::vector<ApiKey>& k = c->server.api_keys;
  ASSERT_EQ(k.size(), 4u);
  EXPECT_EQ(k[0].key, "plain-key-full-rights");
  EXPECT_EQ(k[0].policy, KeyPolicy{});  // full rights
  EXPECT_TRUE(k[0].policy.server_stats);
  EXPECT_EQ(k[1].key, "tenant-b-key-123");
  EXPECT_EQ(k[1].policy.sla_classes, (std::vector<std::string>{"batch", "interactive"}));
  EXPECT_EQ(k[1].policy.max_priority, -5);
  EXPECT_EQ(k[1].policy.max_streams, 4);
  EXPECT_FALSE(k[1].policy.server_stats);
  EXPECT_EQ(k[2].key, "only-a-key-0001");
  EXPECT_EQ(k[2].policy, KeyPolicy{});
  EXPECT_EQ(k[3].policy.max_streams, 0);
  EXPECT_TRUE(k[3].policy.sla_classes.empty());
  EXPECT_FALSE(k[3].policy.max_priority.has_value());
  EXPECT_NE(describe(*c).find("api_keys=4(2 with a policy)"), std::string::npos) << describe(*c);
  // The keys of --api-key flags: full rights.
  const std::vector<ApiKey> plain = plain_api_keys({"flag-key-00001"});
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].key, "flag-key-00001");
  EXPECT_EQ(plain[0].policy, KeyPolicy{});
}

TEST(ApiKeyPolicyConfig, EntryShapeErrorsNameTheField) {
  // An unknown field is not named: in a key's entry it may be a secret written in the wrong place.
  expect_keys_error("[{key: abcdefgh12, max_stream: 2}]",
                    "server.api_keys[0]: unknown field (its name is not shown: it may be a "
                    "secret); the fields are key, sla_classes, max_priority, max_streams, "
                    "server_stats");
  {
    auto c = parse_config("server:\n  api_keys: [{key: abcdefgh12, my-secret-key-999: 1}]\n");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().message().find("my-secret-key-999"), std::string::npos)
        << c.status().message();
  }
  expect_keys_error("[abcdefgh12, {sla_classes: [batch]}]",
                    "server.api_keys[1].key: required (the bearer key)");
  expect_keys_error("[{key: }]", "server.api_keys[0].key: has no value");
  expect_keys_error("[[abcdefgh12]]",
                    "server.api_keys[0]: must be a key (a string) or a mapping with `key`");
  expect_keys_error("[{key: abcdefgh12, sla_classes: batch}]",
                    "server.api_keys[0].sla_classes: must be a list of SLA class names");
  expect_keys_error("[{key: abcdefgh12, sla_classes: [{a: b}]}]",
                    "server.api_keys[0].sla_classes[0]: must be a string");
  expect_keys_error("[{key: abcdefgh12, max_streams: many}]",
                    "server.api_keys[0].max_streams: must be an integer");
  expect_keys_error("[{key: abcdefgh12, server_stats: no}]",
                    "server.api_keys[0].server_stats: must be true or false");
  expect_keys_error("[{key: short}]", "server.api_keys[0]: must be at least 8 characters");
  expect_keys_error("[{key: 'abcd efgh'}]", "server.api_keys[0]: must be printable ASCII");
}

// Duplicates are refused whatever form each entry takes (one key has one policy), without the
// key in the message.
TEST(ApiKeyPolicyConfig, DuplicateKeysAreRefused) {
  expect_keys_error("[abcdefgh12, zyxwvuts98, abcdefgh12]",
                    "server.api_keys[2]: the same key as server.api_keys[0]");
  expect_keys_error("[abcdefgh12, {key: abcdefgh12, max_priority: 0}]",
                    "server.api_keys[1]: the same key as server.api_keys[0]");
  auto c = parse_config("server: {api_keys: [abcdefgh12, abcdefgh12]}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("abcdefgh12"), std::string::npos) << c.status().message();
}

// A policy names configured classes only, each once: the file's own sla_classes (on a SIGHUP,
// the reloaded file's), or the built-in `default` class when the file has none.
TEST(ApiKeyPolicyConfig, ClassesMustBeConfigured) {
  expect_keys_error("[{key: abcdefgh12, sla_classes: [batch, gold]}]",
                    "server.api_keys[0].sla_classes[1]: unknown class 'gold' (sla_classes: "
                    "interactive, batch)");
  expect_keys_error("[{key: abcdefgh12, sla_classes: [default]}]",
                    "server.api_keys[0].sla_classes[0]: unknown class 'default'");
  expect_keys_error("[{key: abcdefgh12, sla_classes: [batch, interactive, batch]}]",
                    "server.api_keys[0].sla_classes[2]: class 'batch' is listed twice");
  EXPECT_TRUE(
      parse_config("server: {api_keys: [{key: abcdefgh12, sla_classes: [default]}]}\n").ok());
  auto no_batch = parse_config("server: {api_keys: [{key: abcdefgh12, sla_classes: [batch]}]}\n");
  ASSERT_FALSE(no_batch.ok());
  EXPECT_NE(no_batch.status().message().find("unknown class 'batch' (sla_classes: default)"),
            std::string::npos)
      << no_batch.status().message();
}

TEST(ApiKeyPolicyConfig, RangesOfPriorityAndStreams) {
  expect_keys_error("[{key: abcdefgh12, max_priority: 1001}]",
                    "server.api_keys[0].max_priority: must be in [-1000, 1000], got 1001");
  expect_keys_error("[{key: abcdefgh12, max_priority: -1001}]",
                    "server.api_keys[0].max_priority: must be in [-1000, 1000], got -1001");
  expect_keys_error("[{key: abcdefgh12, max_streams: -1}]",
                    "server.api_keys[0].max_streams: must be in [0, 100000], got -1");
  expect_keys_error("[{key: abcdefgh12, max_streams: 100001}]",
                    "server.api_keys[0].max_streams: must be in [0, 100000], got 100001");
  for (const char* edge :
       {"max_priority: -1000", "max_priority: 1000", "max_streams: 0", "max_streams: 100000"}) {
    auto c = parse_config(std::string("server: {api_keys: [{key: abcdefgh12, ") + edge + "}]}\n");
    EXPECT_TRUE(c.ok()) << edge << ": " << c.status().to_string();
  }
}

}  // namespace
}  // namespace kvsplit::config
