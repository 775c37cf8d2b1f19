// The YAML's speculative section: defaults, every key, and errors naming the field.
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"

namespace kvsplit::config {
namespace {

void expect_error(const std::string& yaml, const std::string& needle) {
  auto c = parse_config(yaml);
  ASSERT_FALSE(c.ok()) << "accepted:\n" << yaml;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message '" << c.status().message() << "' lacks '" << needle << "'";
}

TEST(SpeculativeConfig, OffByDefault) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->engine.speculative.enabled());
  EXPECT_EQ(c->engine.speculative.num_speculative_tokens, 4);
}

TEST(SpeculativeConfig, EveryKeyIsRead) {
  auto c = parse_config(
      "speculative: {method: ngram, num_speculative_tokens: 7, prompt_lookup_min: 2, "
      "prompt_lookup_max: 5}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.speculative.method, SpeculativeMethod::kNgram);
  EXPECT_EQ(c->engine.speculative.num_speculative_tokens, 7);
  EXPECT_EQ(c->engine.speculative.prompt_lookup_min, 2);
  EXPECT_EQ(c->engine.speculative.prompt_lookup_max, 5);
  c = parse_config("speculative: {method: none}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->engine.speculative.enabled());
}

TEST(SpeculativeConfig, BadValuesNameTheField) {
  expect_error("speculative: {method: eagle}\n", "speculative.method");
  expect_error("speculative: {method: ngram, num_speculative_tokens: 0}\n",
               "speculative.num_speculative_tokens");
  expect_error("speculative: {num_speculative_tokens: 17}\n", "speculative.num_speculative_tokens");
  expect_error("speculative: {prompt_lookup_max: 33}\n", "speculative.prompt_lookup_max");
  expect_error("speculative: {prompt_lookup_min: 3, prompt_lookup_max: 2}\n",
               "speculative.prompt_lookup_min");
  expect_error("speculative: {methd: ngram}\n", "methd");
  expect_error("speculative: [ngram]\n", "speculative");
}

}  // namespace
}  // namespace kvsplit::config
