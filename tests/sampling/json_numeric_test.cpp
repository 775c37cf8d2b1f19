// JSON schema numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) through the
// whole guide (schema -> regex -> automaton), against arithmetic: every integer of a window, and
// decimals in quarters, are accepted exactly when the schema's range holds them. Plus the
// refusals (multipleOf, a number bound that is not whole, an empty range, a draft-4 boolean).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>

#include "sampling/guide.h"
#include "sampling/guide_test_util.h"
#include "sampling/json_schema.h"

namespace kvsplit::sampling {
namespace {

using testing::byte_vocab;

std::shared_ptr<GuideGrammar> schema_guide(const std::string& schema) {
  auto g = GuideGrammar::compile({GuidedDecoding::Kind::kJsonSchema, schema, {}}, byte_vocab());
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

bool accepts(GuideGrammar& g, const std::string& text) { return testing::whole_match(g, text); }

struct End {
  double value;
  bool exclusive;
};

// The schema's keywords for [lo, hi] and whether x is in that range.
std::string bounds_json(std::optional<End> lo, std::optional<End> hi) {
  std::string out;
  if (lo)
    out += fmt::format(",\"{}\":{}", lo->exclusive ? "exclusiveMinimum" : "minimum", lo->value);
  if (hi)
    out += fmt::format(",\"{}\":{}", hi->exclusive ? "exclusiveMaximum" : "maximum", hi->value);
  return out;
}

bool in_range(double x, std::optional<End> lo, std::optional<End> hi) {
  if (lo && (lo->exclusive ? !(x > lo->value) : !(x >= lo->value))) return false;
  if (hi && (hi->exclusive ? !(x < hi->value) : !(x <= hi->value))) return false;
  return true;
}

std::optional<End> random_end(std::mt19937& rng, bool whole) {
  std::uniform_int_distribution<int> pick(0, 5);
  if (pick(rng) == 0) return std::nullopt;
  std::uniform_int_distribution<int> mag(0, 3);
  const int digits = mag(rng);  // bounds of 1-4 digits, either sign
  std::uniform_int_distribution<int> v(-static_cast<int>(std::pow(10, digits + 1)) + 1,
                                       static_cast<int>(std::pow(10, digits + 1)) - 1);
  double value = v(rng);
  if (!whole && pick(rng) < 2) value += 0.5;  // an integer's bound may be fractional
  return End{value, pick(rng) < 2};
}

TEST(JsonNumeric, IntegerRangesHoldExactlyTheirIntegers) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 60; ++trial) {
    const std::optional<End> lo = random_end(rng, false);
    const std::optional<End> hi = random_end(rng, false);
    const std::string schema = "{\"type\":\"integer\"" + bounds_json(lo, hi) + "}";
    // The whole values inside each end; none between them: refused.
    const double first = !lo             ? -1e9
                         : lo->exclusive ? std::floor(lo->value) + 1
                                         : std::ceil(lo->value);
    const double last = !hi             ? 1e9
                        : hi->exclusive ? std::ceil(hi->value) - 1
                                        : std::floor(hi->value);
    if (first > last) {
      auto g = GuideGrammar::compile({GuidedDecoding::Kind::kJsonSchema, schema, {}}, byte_vocab());
      ASSERT_FALSE(g.ok()) << schema;
      EXPECT_NE(g.status().message().find("leave no integer in range"), std::string::npos)
          << g.status().message();
      continue;
    }
    const std::shared_ptr<GuideGrammar> g = schema_guide(schema);
    ASSERT_NE(g, nullptr);
    for (int x = -12000; x <= 12000; x += (x > -1200 && x < 1200) ? 1 : 97) {
      EXPECT_EQ(accepts(*g, std::to_string(x)), in_range(x, lo, hi)) << schema << " at " << x;
    }
    EXPECT_EQ(accepts(*g, "-0"), !lo && !hi) << schema;  // a range never writes "-0"
    EXPECT_FALSE(accepts(*g, "007")) << schema;
    EXPECT_FALSE(accepts(*g, "1.5")) << schema;
  }
}

TEST(JsonNumeric, NumberRangesHoldExactlyTheirDecimals) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const std::optional<End> lo = random_end(rng, true);
    const std::optional<End> hi = random_end(rng, true);
    if (lo && hi &&
        (lo->value > hi->value || (lo->value == hi->value && (lo->exclusive || hi->exclusive))))
      continue;  // empty: refused (below)
    const std::string schema = "{\"type\":\"number\"" + bounds_json(lo, hi) + "}";
    const std::shared_ptr<GuideGrammar> g = schema_guide(schema);
    ASSERT_NE(g, nullptr);
    // Quarters around every bound and 0, in several spellings.
    std::vector<double> points = {0.0};
    for (const auto& e : {lo, hi})
      if (e) points.push_back(e->value);
    for (const double p : points) {
      for (int k = -12; k <= 12; ++k) {
        const double x = p + k * 0.25;
        const std::string plain = fmt::format("{}", x);  // shortest: 12, 12.5, -0.25
        if (plain == "-0") continue;
        EXPECT_EQ(accepts(*g, plain), in_range(x, lo, hi)) << schema << " at " << plain;
        if (x == std::floor(x)) {
          const std::string zeros = plain + ".00";
          EXPECT_EQ(accepts(*g, zeros), in_range(x, lo, hi)) << schema << " at " << zeros;
        } else {
          const std::string trailing = fmt::format("{:.3f}", x);  // 12.250
          EXPECT_EQ(accepts(*g, trailing), in_range(x, lo, hi)) << schema << " at " << trailing;
        }
      }
    }
    EXPECT_EQ(accepts(*g, "-0.0"), !lo && !hi) << schema;
    EXPECT_FALSE(accepts(*g, "1.")) << schema;
  }
}

TEST(JsonNumeric, UnboundedAboveZeroKeepsExponents) {
  const std::shared_ptr<GuideGrammar> g = schema_guide(R"({"type":"number","minimum":0})");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(*g, "1e3"));
  EXPECT_TRUE(accepts(*g, "0.5E-2"));
  EXPECT_FALSE(accepts(*g, "-1e3"));
  // A bounded range is written without exponents (every number in it has such a spelling).
  const std::shared_ptr<GuideGrammar> b = schema_guide(R"({"type":"number","maximum":100})");
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(accepts(*b, "99.9"));
  EXPECT_TRUE(accepts(*b, "-1000000.5"));
  EXPECT_FALSE(accepts(*b, "1e1"));
  EXPECT_FALSE(accepts(*b, "100.01"));
}

TEST(JsonNumeric, TheTighterOfTwoBoundsAtOneEndWins) {
  const std::shared_ptr<GuideGrammar> g =
      schema_guide(R"({"type":"integer","minimum":3,"exclusiveMinimum":3,"maximum":9,
                       "exclusiveMaximum":12})");
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(accepts(*g, "3"));
  EXPECT_TRUE(accepts(*g, "4"));
  EXPECT_TRUE(accepts(*g, "9"));
  EXPECT_FALSE(accepts(*g, "10"));
  const std::shared_ptr<GuideGrammar> big =
      schema_guide(R"({"type":"integer","minimum":-1000000000000000,"maximum":1000000000000000})");
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(accepts(*big, "1000000000000000"));
  EXPECT_TRUE(accepts(*big, "-999999999999999"));
  EXPECT_FALSE(accepts(*big, "1000000000000001"));
  EXPECT_FALSE(accepts(*big, "-1000000000000001"));
}

TEST(JsonNumeric, RefusalsNameTheKeyword) {
  auto error = [](const std::string& schema) {
    StatusOr<std::string> rx = json_schema_to_regex(schema);
    EXPECT_FALSE(rx.ok()) << schema;
    if (rx.ok()) return std::string();
    EXPECT_EQ(rx.status().code(), StatusCode::kInvalidArgument);
    return rx.status().message();
  };
  EXPECT_NE(error(R"({"type":"integer","multipleOf":2})").find("keyword 'multipleOf'"),
            std::string::npos);
  EXPECT_NE(error(R"({"type":"number","minimum":0.5})").find("must be whole values"),
            std::string::npos);
  EXPECT_NE(error(R"({"type":"integer","minimum":5,"maximum":4})").find("leave no integer"),
            std::string::npos);
  EXPECT_NE(error(R"({"type":"integer","minimum":4.5,"maximum":4.9})").find("leave no integer"),
            std::string::npos);
  EXPECT_NE(error(R"({"type":"number","exclusiveMinimum":2,"maximum":2})").find("leave no number"),
            std::string::npos);
  EXPECT_NE(error(R"({"type":"integer","exclusiveMinimum":true})").find("must be a number"),
            std::string::npos);
  EXPECT_NE(error(R"({"type":"integer","maximum":1e16})").find("is not supported"),
            std::string::npos);
  const std::string m =
      error(R"({"type":"object","properties":{"n":{"type":"integer","minimum":9,"maximum":1}}})");
  EXPECT_NE(m.find("#/properties/n"), std::string::npos) << m;
}

}  // namespace
}  // namespace kvsplit::sampling
