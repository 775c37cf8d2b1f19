// server.metrics_host: parsed, validated, and its default (loopback when API keys are set); the
// checks server.host and server.api_keys share with it.
#include <gtest/gtest.h>

#include "config/config.h"

namespace kvsplit::config {
namespace {

TEST(MetricsHostTest, DefaultFollowsHostWithoutKeysAndLoopbackWithKeys) {
  auto c = parse_config("server: {host: 0.0.0.0}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->server.metrics_host, "");
  EXPECT_EQ(c->server.metrics_bind_host(), "0.0.0.0");
  c = parse_config("server: {host: 0.0.0.0, api_keys: [abcdefgh12]}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->server.metrics_bind_host(), "127.0.0.1");
  EXPECT_NE(describe(*c).find("metrics=127.0.0.1:9090"), std::string::npos) << describe(*c);
}

TEST(MetricsHostTest, ExplicitValueWins) {
  auto c = parse_config("server: {host: 10.0.0.5, api_keys: [abcdefgh12], metrics_host: '::'}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->server.metrics_host, "::");
  EXPECT_EQ(c->server.metrics_bind_host(), "::");
  c = parse_config("server: {metrics_host: metrics.internal}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->server.metrics_bind_host(), "metrics.internal");
}

TEST(MetricsHostTest, BadValuesNameTheField) {
  for (const char* yaml :
       {"server: {metrics_host: 'a b'}\n", "server: {metrics_host: [x]}\n",
        "server: {metrics_host: \"x\\ty\"}\n", "server: {metrics_host: 'a/b'}\n"}) {
    auto c = parse_config(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_NE(c.status().message().find("server.metrics_host"), std::string::npos)
        << c.status().message();
  }
  Config cfg;
  cfg.server.metrics_host = std::string(300, 'a');
  Status st = validate_config(cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("server.metrics_host"), std::string::npos) << st.message();
  // The bad value is echoed escaped.
  cfg.server.metrics_host = std::string("a\x1b[2Jb", 6);
  st = validate_config(cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'a\\x1b[2Jb'"), std::string::npos) << st.message();
}

// server.host takes the same check: "[::1]" passed --check-config, then the server bracketed it
// again ("[[::1]]") and could not listen (exit 1 at start).
TEST(MetricsHostTest, TheServerHostIsCheckedAlike) {
  for (const char* yaml : {"server: {host: '[::1]'}\n", "server: {host: 'a b'}\n"}) {
    auto c = parse_config(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_NE(c.status().message().find("server.host: must be a host name or IP address, IPv6 "
                                        "without brackets"),
              std::string::npos)
        << c.status().message();
  }
  EXPECT_TRUE(parse_config("server: {host: '::1'}\n").ok());
  EXPECT_TRUE(parse_config("server: {host: 0.0.0.0}\n").ok());
}

// An API key a client cannot present (the server strips the spaces after "Bearer", and gRPC
// refuses control characters in metadata) is refused: it passed and then matched no one.
TEST(MetricsHostTest, ApiKeysAClientCannotSendAreRefused) {
  for (const char* yaml :
       {"server: {api_keys: [' abcdefgh']}\n", "server: {api_keys: [\"abc\\tdefgh\"]}\n",
        "server: {api_keys: ['abcd efgh']}\n"}) {
    auto c = parse_config(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_NE(c.status().message().find("server.api_keys[0]: must be printable ASCII"),
              std::string::npos)
        << c.status().message();
  }
  EXPECT_TRUE(parse_config("server: {api_keys: ['sk-abc_123.XYZ~']}\n").ok());
}

}  // namespace
}  // namespace kvsplit::config
