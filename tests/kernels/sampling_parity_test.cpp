// The sampling kernel against its host reference (tests/kernels/sampling_reference.h): the same
// candidates kept and the same token picked for the same Philox draw. Same source for the
// emulated kernels (tests/kernels) and the real ones (tests/gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/sampling/sampling.h"
#include "oracle/attention_oracle.h"
#include "sampling_reference.h"

namespace kvsplit::testing {
namespace {

using kernels::SampleRowParams;

// Runs the kernel on rows [num_rows, vocab] and returns the ids.
std::vector<int32_t> run_sample(const std::vector<float>& logits, int vocab,
                                const std::vector<SampleRowParams>& params) {
  DevArray<float> dl(logits);
  DevArray<SampleRowParams> dp(params);
  DevArray<int32_t> dids(std::vector<int32_t>(params.size(), -7));
  const Status st = kernels::launch_sample(dl.get(), static_cast<int>(params.size()), vocab,
                                           dp.get(), dids.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(device_sync(), "");
  return dids.to_host();
}

// Compares the kernel's picks with the reference. Under emulation the kernel and the reference
// share the host expf, so every pick is equal. On a GPU the device expf can differ from the host's
// by an ulp, which can move a draw or the top-p cut across a boundary: there one differing pick
// per check is allowed (docs/cuda.md), and only of a token the reference keeps.
class PickCheck {
 public:
  void expect(int32_t got, const float* row, int vocab, const SampleRowParams& p,
              const std::string& where) {
    const int32_t want = reference_sample(row, vocab, p);
    if (got == want) return;
#if defined(KVSPLIT_TEST_GPU)
    bool kept = false;
    for (const ReferenceCandidate& c : reference_kept(row, vocab, p)) kept = kept || c.id == got;
    if (kept && ++differing_ == 1) return;
#endif
    ADD_FAILURE() << where << ": picked " << got << ", reference " << want;
  }

 private:
  int differing_ = 0;
};

// Seeded logits with repeated values (ties), some -inf (masked) and NaN entries.
std::vector<float> make_logits(int rows, int vocab, uint64_t seed, double spread) {
  oracle::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows) * vocab);
  for (float& x : v) x = static_cast<float>(rng.uniform(-spread, spread));
  for (int r = 0; r < rows && vocab > 8; ++r) {
    float* row = v.data() + static_cast<size_t>(r) * vocab;
    row[vocab / 2] = row[vocab / 3];  // exact ties
    row[vocab - 1] = row[vocab / 3];
    row[1] = -INFINITY;
    if (r % 3 == 0) row[vocab / 4] = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

// Parameter sets covering every filter, alone and combined.
std::vector<SampleRowParams> param_mix(int vocab) {
  std::vector<SampleRowParams> out;
  auto add = [&](float t, int k, float top_p, float min_p) {
    SampleRowParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    out.push_back(p);
  };
  add(1.f, 0, 1.f, 0.f);      // plain multinomial
  add(0.f, 0, 1.f, 0.f);      // greedy
  add(0.7f, 5, 1.f, 0.f);     // top-k
  add(1.f, 0, 0.9f, 0.f);     // top-p
  add(1.3f, 50, 0.8f, 0.f);   // top-k then top-p
  add(1.f, 0, 1.f, 0.05f);    // min-p
  add(0.9f, 20, 0.7f, 0.1f);  // all three
  add(1.f, 1, 1.f, 0.f);      // top-1
  add(1.f, vocab, 1.f, 0.f);  // top-k off by size
  add(2.f, 0, 0.01f, 0.f);    // top-p keeps only the first
  add(0.5f, 3, 0.5f, 0.f);
  add(1.f, 0, 0.999f, 0.f);
  return out;
}

TEST(SamplingParity, MatchesHostReferenceAcrossFilters) {
  KVSPLIT_REQUIRE_DEVICE();
  PickCheck picks;  // one allowance for the whole test, as docs/cuda.md says
  for (int vocab : {1, 37, 1000, 5003}) {
    std::vector<SampleRowParams> params = param_mix(vocab);
    const int n = static_cast<int>(params.size());
    for (int r = 0; r < n; ++r) {
      params[r].seed = 1000u * vocab + r;
      params[r].step = static_cast<uint64_t>(r) * 7;
    }
    const std::vector<float> logits = make_logits(n, vocab, vocab, vocab > 100 ? 6.0 : 2.0);
    const std::vector<int32_t> got = run_sample(logits, vocab, params);
    for (int r = 0; r < n; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r) * vocab;
      picks.expect(got[r], row, vocab, params[r],
                   "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " (t " +
                       std::to_string(params[r].temperature) + " k " +
                       std::to_string(params[r].top_k) + " p " + std::to_string(params[r].top_p) +
                       " min_p " + std::to_string(params[r].min_p) + ")");
    }
  }
}

TEST(SamplingParity, ManyStepsStayInsideTheKeptSetAndMatch) {
  KVSPLIT_REQUIRE_DEVICE();
  const int vocab = 300, steps = 24;
  const std::vector<float> one = make_logits(1, vocab, 5, 3.0);
  std::vector<float> logits;
  std::vector<SampleRowParams> params(steps);
  for (int i = 0; i < steps; ++i) {
    logits.insert(logits.end(), one.begin(), one.end());
    params[i].temperature = 0.8f;
    params[i].top_k = 12;
    params[i].top_p = 0.85f;
    params[i].seed = 4242;
    params[i].step = static_cast<uint64_t>(i);
  }
  const std::vector<ReferenceCandidate> kept = reference_kept(one.data(), vocab, params[0]);
  ASSERT_GT(kept.size(), 2u);
  ASSERT_LE(kept.size(), 12u);
  std::set<int32_t> kept_ids, seen;
  for (const auto& c : kept) kept_ids.insert(c.id);
  const std::vector<int32_t> got = run_sample(logits, vocab, params);
  PickCheck picks;
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE(kept_ids.count(got[i])) << "step " << i << " picked " << got[i];
    picks.expect(got[i], one.data(), vocab, params[i], "step " + std::to_string(i));
    seen.insert(got[i]);
  }
  EXPECT_GT(seen.size(), 1u);  // the step advances the stream
}

TEST(SamplingParity, TokenDependsOnlyOnItsRowSeedAndStep) {
  KVSPLIT_REQUIRE_DEVICE();
  const int vocab = 512;
  const std::vector<float> batch = make_logits(6, vocab, 77, 4.0);
  std::vector<SampleRowParams> params(6);
  for (int r = 0; r < 6; ++r) {
    params[r].top_k = r % 2 ? 40 : 0;
    params[r].top_p = 0.9f;
    params[r].seed = 31 + r;
    params[r].step = 5;
  }
  const std::vector<int32_t> together = run_sample(batch, vocab, params);
  for (int r = 0; r < 6; ++r) {
    const std::vector<float> alone(batch.begin() + r * vocab, batch.begin() + (r + 1) * vocab);
    EXPECT_EQ(run_sample(alone, vocab, {params[r]})[0], together[r]) << "row " << r;
  }
}

TEST(SamplingParity, TiesAtTheCutKeepTheLowestIds) {
  KVSPLIT_REQUIRE_DEVICE();
  const int vocab = 200, rows = 20;
  std::vector<float> logits(static_cast<size_t>(rows) * vocab, 0.25f);  // all equal
  std::vector<SampleRowParams> params(rows);
  for (int r = 0; r < rows; ++r) {
    params[r].seed = 9;
    params[r].step = static_cast<uint64_t>(r);
    if (r % 2) {
      params[r].top_k = 10;  // ids 0..9
    } else {
      params[r].top_p = 0.25f;  // the first 51 ids in key order: mass 51/200 > 0.25 first
    }
  }
  const std::vector<int32_t> got = run_sample(logits, vocab, params);
  for (int r = 0; r < rows; ++r) {
    EXPECT_LT(got[r], r % 2 ? 10 : 51) << "row " << r;
    EXPECT_GE(got[r], 0);
    EXPECT_EQ(got[r], reference_sample(logits.data(), vocab, params[r])) << "row " << r;
  }
}

// Degenerate rows have no usable logit: -1 (the engine fails such a sequence, never picks a token
// from NaN or infinite logits).
TEST(SamplingParity, GreedyTakesTheArgmaxAndDegenerateRowsGiveMinusOne) {
  KVSPLIT_REQUIRE_DEVICE();
  const float inf = INFINITY, nan = std::numeric_limits<float>::quiet_NaN();
  const int vocab = 6;
  const std::vector<float> logits = {
      1,    5,    3,    5,    0,    2,     // greedy: lowest id of the tie
      -inf, -inf, -inf, -inf, -inf, -inf,  // all masked: -1
      1,    2,    inf,  0,    inf,  3,     // +inf present: -1
      nan,  nan,  nan,  nan,  nan,  nan,   // all NaN: -1
      nan,  1,    nan,  4,    4,    nan,   // sampled, top-1: NaN never kept
  };
  std::vector<SampleRowParams> params(5);
  params[0].temperature = 0.f;
  params[4].top_k = 1;
  const std::vector<int32_t> got = run_sample(logits, vocab, params);
  EXPECT_EQ(got, (std::vector<int32_t>{1, -1, -1, -1, 3}));
}

TEST(SamplingParity, RejectsBadShapesAndParams) {
  KVSPLIT_REQUIRE_DEVICE();
  DevArray<float> dl(std::vector<float>(8, 0.f));
  DevArray<SampleRowParams> dp(std::vector<SampleRowParams>(1));
  DevArray<int32_t> dids(1);
  EXPECT_EQ(kernels::launch_sample(dl.get(), 1, 0, dp.get(), dids.get(), nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::launch_sample(dl.get(), 1, kernels::kSampleMaxVocab + 1, dp.get(), dids.get(),
                                   nullptr)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::launch_sample(dl.get(), -1, 8, dp.get(), dids.get(), nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::launch_sample(nullptr, 1, 8, dp.get(), dids.get(), nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(kernels::launch_sample(nullptr, 0, 8, nullptr, nullptr, nullptr).ok());
  SampleRowParams p;
  EXPECT_TRUE(kernels::validate_sample_params(p).ok());
  p.top_p = 0.f;
  const Status st = kernels::validate_sample_params(p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.to_string().find("top_p"), std::string::npos) << st.to_string();
  p = SampleRowParams{};
  p.temperature = -1.f;
  EXPECT_NE(kernels::validate_sample_params(p).to_string().find("temperature"), std::string::npos);
  p = SampleRowParams{};
  p.top_k = -2;
  EXPECT_NE(kernels::validate_sample_params(p).to_string().find("top_k"), std::string::npos);
  p = SampleRowParams{};
  p.min_p = 1.5f;
  EXPECT_NE(kernels::validate_sample_params(p).to_string().find("min_p"), std::string::npos);
}

}  // namespace
}  // namespace kvsplit::testing
