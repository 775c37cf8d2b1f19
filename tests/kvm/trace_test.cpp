#include "kvm/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "kvm/profile.h"
#include "test_util.h"

namespace kvsplit::kvm {
namespace {

TEST(Trace, ParsesLinesSkipsBlanksAndDefaultsTheClass) {
  const std::string text =
      "{\"arrival_ms\": 0, \"prompt_tokens\": 10, \"output_tokens\": 5, \"class\": \"voice\"}\n"
      "\n"
      "   \r\n"
      "{\"arrival_ms\": 12.5, \"prompt_tokens\": 3, \"output_tokens\": 1}\n";
  auto t = parse_trace(text);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].sla_class, "voice");
  EXPECT_EQ((*t)[0].prompt_tokens, 10);
  EXPECT_EQ((*t)[0].output_tokens, 5);
  EXPECT_EQ((*t)[0].line, 1);
  EXPECT_DOUBLE_EQ((*t)[1].arrival_ms, 12.5);
  EXPECT_EQ((*t)[1].sla_class, "");
  EXPECT_EQ((*t)[1].line, 4);
}

TEST(Trace, ErrorsNameTheLineAndTheField) {
  struct Case {
    std::string line2;
    std::string want;
  } cases[] = {
      {"{\"arrival_ms\": 1, \"prompt_tokens\": 0, \"output_tokens\": 1}", "t:2: prompt_tokens"},
      {"{\"arrival_ms\": 1, \"prompt_tokens\": 2.5, \"output_tokens\": 1}", "t:2: prompt_tokens"},
      {"{\"arrival_ms\": -1, \"prompt_tokens\": 2, \"output_tokens\": 1}", "t:2: arrival_ms"},
      {"{\"arrival_ms\": 1e12, \"prompt_tokens\": 2, \"output_tokens\": 1}",
       "t:2: arrival_ms: must be a number in [0, 1e9]"},
      {"{\"prompt_tokens\": 2, \"output_tokens\": 1}", "t:2: arrival_ms: missing"},
      {"{\"arrival_ms\": 1, \"prompt_tokens\": 2}", "t:2: output_tokens: missing"},
      {"{\"arrival_ms\": 1, \"prompt_tokens\": 2, \"output_tokens\": 1, \"class\": 3}",
       "t:2: class"},
      {"{\"arrival_ms\": 1, \"prompt_tokens\": 2, \"output_tokens\": 1, \"clas\": \"x\"}",
       "t:2: clas: unknown field"},
      {"{\"arrival_ms\": 1,", "t:2: bad JSON"},
      {"{\"arrival_ms\": 5, \"prompt_tokens\": 3, \"output_tokens\": 2, \"arrival_ms\": 7}",
       "t:2: duplicate key 'arrival_ms'"},
      {"[1, 2]", "t:2: must be a JSON object"},
      // The parser stopped at the NUL and took the line as valid.
      {std::string("{\"arrival_ms\": 1, \"prompt_tokens\": 2, \"output_tokens\": 1}\0junk", 62),
       "t:2: bad JSON: a NUL byte at offset 57"},
  };
  for (const Case& c : cases) {
    const std::string text =
        "{\"arrival_ms\": 0, \"prompt_tokens\": 1, \"output_tokens\": 1}\n" + c.line2 + "\n";
    auto t = parse_trace(text, "t");
    ASSERT_FALSE(t.ok()) << c.line2;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.want), std::string::npos)
        << c.line2 << " -> " << t.status().message();
  }
}

TEST(Trace, FileRoundTrip) {
  testing::TempDir tmp;
  std::vector<TraceRequest> t = {{0.25, 7, 3, "a"}, {10, 100, 1, ""}, {10.125, 1, 64, "b"}};
  ASSERT_TRUE(write_trace_file(tmp.file("t.jsonl"), t).ok());
  auto back = read_trace_file(tmp.file("t.jsonl"));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_DOUBLE_EQ((*back)[i].arrival_ms, t[i].arrival_ms);
    EXPECT_EQ((*back)[i].prompt_tokens, t[i].prompt_tokens);
    EXPECT_EQ((*back)[i].output_tokens, t[i].output_tokens);
    EXPECT_EQ((*back)[i].sla_class, t[i].sla_class);
  }
  EXPECT_EQ(format_trace(*back), format_trace(t));
  auto missing = read_trace_file(tmp.file("nope.jsonl"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Trace, PhasedGeneratorIsDeterministicAndPhased) {
  PhasedTraceOptions o;
  o.calm_ms = 20000;
  o.spike_ms = 20000;
  ASSERT_TRUE(validate(o).ok());
  const auto a = make_phased_trace(o);
  const auto b = make_phased_trace(o);
  EXPECT_EQ(format_trace(a), format_trace(b));
  o.seed = 2;
  EXPECT_NE(format_trace(make_phased_trace(o)), format_trace(a));
  ASSERT_FALSE(a.empty());
  // Sorted, two classes, and the spike has more and longer batch prompts than the calm phases.
  int64_t calm_batch = 0, spike_batch = 0, interactive = 0;
  double calm_len = 0, spike_len = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i > 0) {
      EXPECT_LE(a[i - 1].arrival_ms, a[i].arrival_ms);
    }
    EXPECT_LT(a[i].arrival_ms, 60000);
    if (a[i].sla_class == "interactive") {
      ++interactive;
      EXPECT_LE(a[i].prompt_tokens, o.interactive_prompt * 3 / 2);
      continue;
    }
    ASSERT_EQ(a[i].sla_class, "batch");
    const bool spike = a[i].arrival_ms >= 20000 && a[i].arrival_ms < 40000;
    (spike ? spike_batch : calm_batch)++;
    (spike ? spike_len : calm_len) += a[i].prompt_tokens;
  }
  EXPECT_GT(interactive, 0);
  ASSERT_GT(calm_batch, 0);
  ASSERT_GT(spike_batch, 0);
  EXPECT_GT(spike_batch, 3 * calm_batch);  // 6/s for 20 s vs 0.5/s for 40 s
  EXPECT_GT(spike_len / spike_batch, 2 * calm_len / calm_batch);
  o.spike_prompt = 0;
  EXPECT_NE(validate(o).message().find("spike_prompt"), std::string::npos);
}

// Sizes that ran out of memory (1e9 ms of calm at 1e4/s), looped for ever (two finite factors
// whose product is inf gave a step of 0) or overflowed an int (a length of 1.5 x 2e9) are errors.
TEST(Trace, PhasedGeneratorSizesAreBounded) {
  PhasedTraceOptions o;
  o.calm_ms = 4e8;
  o.interactive_rate = 1e4;
  EXPECT_NE(validate(o).message().find("requests, more than 10000000"), std::string::npos)
      << validate(o).message();
  o = PhasedTraceOptions{};
  o.rate_scale = 1e300;
  o.interactive_rate = 1e300;
  EXPECT_NE(validate(o).message().find("requests, more than"), std::string::npos)
      << validate(o).message();
  o = PhasedTraceOptions{};
  o.calm_ms = 6e8;
  EXPECT_NE(validate(o).message().find("must span at most 1e9 ms"), std::string::npos);
  o = PhasedTraceOptions{};
  o.interactive_prompt = 2000000000;
  EXPECT_EQ(validate(o).message(), "interactive_prompt: must be in [1, 1e8]");
  o.interactive_prompt = 100000000;
  EXPECT_TRUE(validate(o).ok());
}

TEST(Trace, RateScaleMultipliesEveryPhasesArrivals) {
  PhasedTraceOptions o;
  o.calm_ms = 20000;
  o.spike_ms = 20000;
  auto count = [](const std::vector<TraceRequest>& t, const std::string& cls, double t0,
                  double t1) {
    return std::count_if(t.begin(), t.end(), [&](const TraceRequest& r) {
      return r.sla_class == cls && r.arrival_ms >= t0 && r.arrival_ms < t1;
    });
  };
  const auto base = make_phased_trace(o);
  o.rate_scale = 3;
  ASSERT_TRUE(validate(o).ok());
  const auto scaled = make_phased_trace(o);
  // Poisson counts: 3x the expected arrivals of each class and phase, within a few sigma.
  const struct {
    const char* cls;
    double t0, t1, rate;
  } phases[] = {{"interactive", 0, 60000, 4}, {"batch", 0, 20000, 0.5}, {"batch", 20000, 40000, 6}};
  for (const auto& p : phases) {
    const double expect = 3 * p.rate * (p.t1 - p.t0) / 1000;
    const double n = static_cast<double>(count(scaled, p.cls, p.t0, p.t1));
    EXPECT_NEAR(n, expect, 4 * std::sqrt(expect)) << p.cls << " from " << p.t0;
    const double n1 = static_cast<double>(count(base, p.cls, p.t0, p.t1));
    EXPECT_NEAR(n1, expect / 3, 4 * std::sqrt(expect / 3)) << p.cls << " from " << p.t0;
  }
  for (double bad : {0.0, -1.0, std::nan("")}) {
    o.rate_scale = bad;
    EXPECT_NE(validate(o).message().find("rate_scale"), std::string::npos) << bad;
  }
}

TEST(Profile, JsonRoundTripAndErrorsNameTheField) {
  EngineProfile p = default_profile();
  p.decode_ms_per_kv_token = 0.125;
  p.threads = 2;
  auto back = parse_profile(profile_to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_DOUBLE_EQ(back->decode_ms_per_kv_token, 0.125);
  EXPECT_EQ(back->threads, 2);
  EXPECT_EQ(profile_to_json(*back), profile_to_json(p));
  auto bad = parse_profile("{\"decode_ms_per_seq\": -1}", "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("p.json: decode_ms_per_seq"), std::string::npos);
  auto twice = parse_profile("{\"decode_ms_per_seq\": 1, \"decode_ms_per_seq\": 2}", "p.json");
  EXPECT_NE(twice.status().message().find("p.json: duplicate key 'decode_ms_per_seq'"),
            std::string::npos)
      << twice.status().message();
  auto unknown = parse_profile("{\"decode_ms\": 1}", "p.json");
  EXPECT_NE(unknown.status().message().find("decode_ms: unknown field"), std::string::npos);
  auto order = parse_profile("{\"kv_bytes_per_token_int4\": 5000}");
  EXPECT_NE(order.status().message().find("kv_bytes_per_token_int4"), std::string::npos);
  // Beyond an int: an error, not the value wrapped (4294967306 read as 10 cut every prompt).
  auto wide = parse_profile("{\"max_context\": 4294967306}", "p.json");
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("max_context: must be an integer in [0, 2147483647]"),
            std::string::npos)
      << wide.status().message();
}

// step_overhead_ms: written, read back, checked; a profile written before it existed (no such
// field) reads as 0 and costs a step what it did.
TEST(Profile, StepOverheadIsOptionalAndAddsToEveryStep) {
  EngineProfile p = default_profile();
  p.step_overhead_ms = 0.3;
  auto back = parse_profile(profile_to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_DOUBLE_EQ(back->step_overhead_ms, 0.3);
  EXPECT_DOUBLE_EQ(back->step_ms(0, 0, 1, 0), p.step_base_ms + 0.3 + p.decode_ms_per_seq);
  auto old = parse_profile(
      "{\"model\": \"synthetic:stories260k\", \"backend\": \"cpu\", \"threads\": 1, "
      "\"step_base_ms\": 0.25, \"prefill_ms_per_token\": 0.02, \"prefill_ms_per_kv_token\": "
      "0.001, \"decode_ms_per_seq\": 0.02, \"decode_ms_per_kv_token\": 0.0008, "
      "\"kv_bytes_per_token_full\": 1280, \"kv_bytes_per_token_int8\": 400, "
      "\"kv_bytes_per_token_int4\": 280, \"copy_bytes_per_ms\": 4e6}",
      "old.json");
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  EXPECT_DOUBLE_EQ(old->step_overhead_ms, 0);
  EXPECT_DOUBLE_EQ(old->step_ms(0, 0, 1, 0), 0.25 + 0.02);
  auto neg = parse_profile("{\"step_overhead_ms\": -0.1}", "p.json");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("p.json: step_overhead_ms: must be >= 0"),
            std::string::npos)
      << neg.status().message();
}

}  // namespace
}  // namespace kvsplit::kvm
