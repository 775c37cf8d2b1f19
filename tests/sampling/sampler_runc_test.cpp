// Sampler vs an independent transcription of llama2.c run.c's sampler (softmax, random_f32,
// sample_argmax, sample_mult, sample_topp with glibc qsort), over many random logits and seeds.
// With only temperature / top_p / seed set, kvsplit must pick the same tokens bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace kvsplit::sampling {
namespace {

// ---- Reference: run.c, transcribed in C style (kept deliberately separate from sampler.cpp). ----
namespace runc {

struct ProbIndex {
  float prob;
  int index;
};

void softmax(float* x, int size) {
  float max_val = x[0];
  for (int i = 1; i < size; i++) {
    if (x[i] > max_val) max_val = x[i];
  }
  float sum = 0.0f;
  for (int i = 0; i < size; i++) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int i = 0; i < size; i++) x[i] /= sum;
}

int sample_argmax(const float* p, int n) {
  int max_i = 0;
  float max_p = p[0];
  for (int i = 1; i < n; i++) {
    if (p[i] > max_p) {
      max_i = i;
      max_p = p[i];
    }
  }
  return max_i;
}

int sample_mult(const float* p, int n, float coin) {
  float cdf = 0.0f;
  for (int i = 0; i < n; i++) {
    cdf += p[i];
    if (coin < cdf) return i;
  }
  return n - 1;
}

int compare(const void* a, const void* b) {
  const ProbIndex* a_ = static_cast<const ProbIndex*>(a);
  const ProbIndex* b_ = static_cast<const ProbIndex*>(b);
  if (a_->prob > b_->prob) return -1;
  if (a_->prob < b_->prob) return 1;
  return 0;
}

int sample_topp(const float* p, int n, float topp, ProbIndex* probindex, float coin) {
  int n0 = 0;
  const float cutoff = (1.0f - topp) / (n - 1);
  for (int i = 0; i < n; i++) {
    if (p[i] >= cutoff) {
      probindex[n0].index = i;
      probindex[n0].prob = p[i];
      n0++;
    }
  }
  // run.c goes on to read probindex[-1] when nothing passes the cutoff (possible only when
  // topp < 1 / n). Report it; kvsplit returns the argmax there.
  if (n0 == 0) return -1;
  qsort(probindex, n0, sizeof(ProbIndex), compare);
  float cumulative_prob = 0.0f;
  int last_idx = n0 - 1;
  for (int i = 0; i < n0; i++) {
    cumulative_prob += probindex[i].prob;
    if (cumulative_prob > topp) {
      last_idx = i;
      break;
    }
  }
  float r = coin * cumulative_prob;
  float cdf = 0.0f;
  for (int i = 0; i <= last_idx; i++) {
    cdf += probindex[i].prob;
    if (r < cdf) return probindex[i].index;
  }
  return probindex[last_idx].index;
}

unsigned int random_u32(unsigned long long* state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (*state * 0x2545F4914F6CDD1Dull) >> 32;
}

float random_f32(unsigned long long* state) { return (random_u32(state) >> 8) / 16777216.0f; }

struct Sampler {
  int vocab_size;
  std::vector<ProbIndex> probindex;
  float temperature;
  float topp;
  unsigned long long rng_state;
};

int sample(Sampler* s, float* logits) {
  if (s->temperature == 0.0f) return sample_argmax(logits, s->vocab_size);
  for (int q = 0; q < s->vocab_size; q++) logits[q] /= s->temperature;
  softmax(logits, s->vocab_size);
  float coin = random_f32(&s->rng_state);
  if (s->topp <= 0 || s->topp >= 1) return sample_mult(logits, s->vocab_size, coin);
  return sample_topp(logits, s->vocab_size, s->topp, s->probindex.data(), coin);
}

}  // namespace runc

// Logits of a few shapes: Gaussian, peaked (one or two dominant ids), quantized (many exact ties
// in probability, so the tie order of the sort matters), and wide (near-flat distributions where
// top-p keeps thousands of candidates).
std::vector<float> make_logits(std::mt19937_64& rng, int vocab, int kind) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = normal(rng);
  switch (kind) {
    case 0:
      for (float& x : l) x *= 3.0f;
      break;
    case 1:
      l[rng() % vocab] += 12.0f;
      l[rng() % vocab] += 10.0f;
      break;
    case 2:
      for (float& x : l) x = std::round(x * 2.0f);  // values in a handful of levels
      break;
    default:
      for (float& x : l) x *= 0.3f;
      break;
  }
  return l;
}

struct Case {
  int vocab;
  float temperature;
  float top_p;
};

TEST(SamplerRuncTest, MatchesRuncSamplerBitForBit) {
  const int vocabs[] = {2, 3, 17, 512, 4096, 32000};
  const float temperatures[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.7f};
  const float top_ps[] = {0.1f, 0.5f, 0.9f, 0.95f, 0.999f, 1.0f};
  std::mt19937_64 rng(20240611);
  int compared = 0;
  int differing_tokens_between_kinds = 0;
  int undefined_cases = 0;
  for (int vocab : vocabs) {
    for (float t : temperatures) {
      for (float top_p : top_ps) {
        const uint64_t seed = rng() % 1000000 + 1;
        SamplingParams params;
        params.temperature = t;
        params.top_p = top_p;
        ASSERT_TRUE(params.validate().ok());
        Sampler ours(params, seed);
        runc::Sampler ref{vocab, std::vector<runc::ProbIndex>(vocab), t, top_p, seed};
        const int steps = vocab >= 32000 ? 6 : 24;
        int last = -1;
        for (int step = 0; step < steps; ++step) {
          std::vector<float> logits = make_logits(rng, vocab, step % 4);
          std::vector<float> copy = logits;
          int expected = runc::sample(&ref, copy.data());
          if (expected == -1) {  // run.c's undefined case: the nucleus is the most probable id
            expected = runc::sample_argmax(copy.data(), vocab);
            ++undefined_cases;
          }
          const int got = ours.sample(logits.data(), vocab, {}, {});
          ASSERT_EQ(got, expected) << "vocab " << vocab << " temperature " << t << " top_p "
                                   << top_p << " seed " << seed << " step " << step;
          differing_tokens_between_kinds += (got != last);
          last = got;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 3000);
  EXPECT_LT(undefined_cases, compared / 20);
  EXPECT_GT(differing_tokens_between_kinds, compared / 4);  // the comparison is not trivial
}

// The golden run's published configuration: t = 1.0, p = 0.9, seed 133742, vocab 512, many steps
// on one RNG stream, peaked logits similar to a trained model's.
TEST(SamplerRuncTest, LongStreamOneSeed) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  const uint64_t seed = 133742;
  Sampler ours(params, seed);
  runc::Sampler ref{512, std::vector<runc::ProbIndex>(512), 1.0f, 0.9f, seed};
  std::mt19937_64 rng(7);
  for (int step = 0; step < 2000; ++step) {
    std::vector<float> logits = make_logits(rng, 512, 1 + step % 3);
    std::vector<float> copy = logits;
    ASSERT_EQ(ours.sample(logits.data(), 512, {}, {}), runc::sample(&ref, copy.data()))
        << "step " << step;
  }
}

// The probabilities run.c leaves in the logits buffer are ours too (same float softmax).
TEST(SamplerRuncTest, SoftmaxBufferIsBitIdentical) {
  SamplingParams params;
  params.temperature = 0.7f;
  Sampler ours(params, 99);
  std::mt19937_64 rng(3);
  std::vector<float> logits = make_logits(rng, 1000, 0);
  std::vector<float> ref = logits;
  for (float& x : ref) x /= 0.7f;
  runc::softmax(ref.data(), 1000);
  (void)ours.sample(logits.data(), 1000, {}, {});
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(logits[i], ref[i]) << i;
}

// Llama-3-sized vocab: nuclei from a handful of ids to most of the vocab (the histogram presort
// and its chunked fallback in sampler.cpp), still bit-exact.
TEST(SamplerRuncTest, LargeVocabNuclei) {
  const int vocab = 128256;
  std::mt19937_64 rng(11);
  int draws = 0;
  for (float sigma : {0.3f, 2.5f, 4.0f, 8.0f}) {
    for (float top_p : {0.5f, 0.9f, 0.999f}) {
      SamplingParams params;
      params.temperature = 1.0f;
      params.top_p = top_p;
      const uint64_t seed = rng() | 1;
      Sampler ours(params, seed);
      runc::Sampler ref{vocab, std::vector<runc::ProbIndex>(vocab), 1.0f, top_p, seed};
      std::normal_distribution<float> normal(0.0f, sigma);
      std::vector<float> logits(vocab), copy;
      for (int step = 0; step < 3; ++step) {
        for (float& x : logits) x = normal(rng);
        if (step == 2) {
          for (float& x : logits) x = std::round(x * 4.0f) / 4.0f;  // ties
        }
        copy = logits;
        const int expected = runc::sample(&ref, copy.data());
        ASSERT_EQ(ours.sample(logits.data(), vocab, {}, {}), expected)
            << "sigma " << sigma << " top_p " << top_p << " step " << step;
        ++draws;
      }
    }
  }
  EXPECT_EQ(draws, 36);
}

TEST(SamplerRuncTest, RngIsRuncRandomF32) {
  unsigned long long ref_state = 133742;
  uint64_t state = 133742;
  for (int i = 0; i < 10000; ++i) {
    ASSERT_EQ(Sampler::uniform_from_state(&state), runc::random_f32(&ref_state)) << i;
  }
  EXPECT_EQ(state, ref_state);
}

}  // namespace
}  // namespace kvsplit::sampling
