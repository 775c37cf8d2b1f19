// Test helpers for the scoring side outputs of mixed-precision attention (AttentionArgs::score_seqs
// and friends), shared by the CPU suite (tests/backend/attention_mixed_test.cpp) and the kernel
// parity suite (tests/kernels/mixed_attention_parity_test.cpp, emulated and on the GPU): the
// host buffers of one scored call and the check of its outputs against the fp64 mixed oracle.
// Every pointer is HOST memory; the kernel suite copies device results into `relevance` / `bound`.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/split_plan.h"
#include "oracle/attention_oracle.h"
#include "oracle/mixed_attention_oracle.h"

namespace kvsplit::oracle {

// Summaries of the case's full pages (taken before make_mixed poisons demoted originals) and
// the scoring buffers, pre-filled with small random values that the max must keep or raise.
// `summarizer` makes the summaries (the CPU backend: its summarize_kv_page is the reference).
struct Scoring {
  std::vector<uint8_t> score_seqs;
  std::vector<int32_t> slots;
  std::vector<kernels::KvSummaryElem> summaries;  // f16 bits
  std::vector<float> relevance0, bound0, relevance, bound;
  int num_slots = 0;
  int parts = 1;  // summary_parts: each summary covers its page in this many parts

  // summary_parts must divide the case's block size.
  Scoring(AttentionCase& c, backend::Backend& summarizer, Rng& rng, int summary_parts = 1)
      : parts(summary_parts) {
    const int bs = c.spec.block_size, hd = c.spec.head_dim, nkv = c.spec.num_kv_heads;
    const kernels::QuantPageLayout ql{nkv, bs, hd, parts};
    const int64_t block_elems = int64_t{2} * nkv * bs * hd;
    score_seqs.assign(c.num_seqs, 0);
    for (auto& x : score_seqs) x = rng.range(0, 3) != 0;
    score_seqs[rng.range(0, c.num_seqs - 1)] = 1;
    slots.assign(c.block_tables.size(), -1);
    for (int s = 0; s < c.num_seqs; ++s) {
      for (int b = 0; (b + 1) * bs <= c.kv_lens[s]; ++b) {  // full pages only
        if (rng.range(0, 4) == 0) continue;                 // some pages have no summary
        if (b < c.unread_pages(s)) continue;                // before the window: poisoned
        const size_t row = static_cast<size_t>(s) * c.max_blocks_per_seq + b;
        slots[row] = num_slots++;
        const auto per_slot = static_cast<size_t>(ql.summary_elems());
        summaries.resize(static_cast<size_t>(num_slots) * per_slot);
        const Status st = summarizer.summarize_kv_page(
            c.pages.data() + c.block_tables[row] * block_elems, backend::DType::kF32, ql,
            summaries.data() + static_cast<size_t>(slots[row]) * per_slot);
        EXPECT_TRUE(st.ok()) << st.to_string();
      }
    }
    relevance0.resize(static_cast<size_t>(c.num_seqs) * c.max_blocks_per_seq * bs);
    bound0.resize(c.block_tables.size());
    for (float& x : relevance0) x = static_cast<float>(rng.uniform(0.0, 0.3));
    for (float& x : bound0) x = static_cast<float>(rng.uniform(0.0, 0.3));
    reset();
  }
  void reset() {
    relevance = relevance0;
    bound = bound0;
  }
  void apply(backend::AttentionArgs& a) {
    a.score_seqs = score_seqs.data();
    a.token_relevance = relevance.data();
    a.summary_slots = slots.data();
    a.summaries = summaries.empty() ? nullptr : summaries.data();
    a.num_summary_slots = num_slots;
    a.summary_parts = parts;
    a.page_bound = bound.data();
  }
};

// Tolerances of expect_side_outputs: relevance absolute (exp of an f32 score difference against
// fp64), bounds relative (exp of a sum of head_dim products).
struct SideOutputTolerance {
  double relevance = 1e-5;
  double bound = 2e-5;
};

// Checks sc.relevance / sc.bound (the outputs of a call made with `a`, host pointers) against the
// oracle `want`: untouched where not scored, not resident or without a summary; max(init, oracle)
// elsewhere; the most attended token of a scored sequence exactly 1; page bounds +inf for a
// sequence with nothing resident and >= every full-precision token's relevance (Quest).
inline void expect_side_outputs(const backend::AttentionArgs& a, const MixedResult& want,
                                const Scoring& sc, const std::string& what,
                                const SideOutputTolerance& tol = {}) {
  const int bs = a.kv.block_size;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int64_t t0 = static_cast<int64_t>(s) * a.max_blocks_per_seq * bs;
    const int64_t b0 = static_cast<int64_t>(s) * a.max_blocks_per_seq;
    const int nb = (a.kv_lens[s] + bs - 1) / bs;
    float max_rel = 0.f;
    bool any_resident = false;
    for (int t = 0; t < a.max_blocks_per_seq * bs; ++t) {
      const float got = sc.relevance[t0 + t], init = sc.relevance0[t0 + t];
      const double w = want.relevance[t0 + t];
      if (!sc.score_seqs[s] || t >= a.kv_lens[s] || w < 0) {
        ASSERT_EQ(got, init) << what << ": seq " << s << " token " << t << " must be untouched";
        continue;
      }
      any_resident = true;
      max_rel = std::max(max_rel, got);
      ASSERT_NEAR(got, std::max<double>(init, w), tol.relevance)
          << what << ": relevance of seq " << s << " token " << t;
    }
    if (any_resident) {
      EXPECT_EQ(max_rel, 1.f) << what << ": seq " << s << " most attended token";
    }
    for (int b = 0; b < a.max_blocks_per_seq; ++b) {
      const float got = sc.bound[b0 + b], init = sc.bound0[b0 + b];
      if (!sc.score_seqs[s] || b >= nb || sc.slots[b0 + b] < 0 ||
          std::isnan(want.page_bound[b0 + b])) {  // NaN: before the window
        ASSERT_EQ(got, init) << what << ": bound of seq " << s << " page " << b << " untouched";
        continue;
      }
      const double w = std::max<double>(init, want.page_bound[b0 + b]);
      if (std::isinf(w)) {  // nothing of the sequence resident: every bound is +inf
        ASSERT_EQ(got, std::numeric_limits<float>::infinity()) << what << ": page " << b;
        continue;
      }
      ASSERT_NEAR(got, w, tol.bound * std::max(1.0, w))
          << what << ": bound of seq " << s << " page " << b;
      // Quest: the bound is >= the relative probability of every token of a full-precision page
      // (a quantized page is attended with dequantized keys, while its summary bounds the
      // original ones: it may exceed the bound by the quantization error).
      const bool full = !a.page_precision || a.page_precision[b0 + b] == 0;
      for (int t = b * bs; full && t < std::min((b + 1) * bs, a.kv_lens[s]); ++t) {
        const double rel = want.relevance[t0 + t];
        if (rel >= 0) {
          ASSERT_GE(got, rel * (1 - tol.bound)) << what << ": page " << b << " tok " << t;
        }
      }
    }
  }
}

// Context lengths log-uniform in [1, max_len].
inline int random_len(Rng& rng, int max_len) {
  const double x = rng.uniform(0.0, std::log(static_cast<double>(max_len)));
  return std::clamp(static_cast<int>(std::exp(x)), 1, max_len);
}

// Split plans to run a decode case with: no split, one page per split, 2..5 pages per split.
inline std::vector<backend::SplitPlan> plans_for(const AttentionCase& c, Rng& rng) {
  const int bs = c.spec.block_size;
  std::vector<backend::SplitPlan> plans;
  const int w = c.spec.window;
  plans.push_back(backend::make_split_plan(c.kv_lens.data(), c.num_seqs, bs, 0, w));
  plans.push_back(backend::make_split_plan(c.kv_lens.data(), c.num_seqs, bs, bs, w));
  plans.push_back(
      backend::make_split_plan(c.kv_lens.data(), c.num_seqs, bs, bs * rng.range(2, 5), w));
  return plans;
}

// ... and, given the pages' precisions (MixedCase::precision), the planner's plans sized on the
// attended pages (bounds where some are evicted) with one and three pages per split at the least,
// on a device wide enough that it splits.
inline std::vector<backend::SplitPlan> plans_for(const AttentionCase& c, Rng& rng,
                                                 const std::vector<uint8_t>& precision) {
  std::vector<backend::SplitPlan> plans = plans_for(c, rng);
  const int bs = c.spec.block_size;
  for (const int pages : {1, 3}) {
    backend::SplitPlanConfig cfg;
    cfg.min_chunk_tokens = pages * bs;
    plans.push_back(backend::plan_decode_splits(c.kv_lens.data(), c.num_seqs, c.spec.num_kv_heads,
                                                bs, /*parallelism=*/1024, cfg, c.spec.window,
                                                {precision.data(), c.max_blocks_per_seq}));
  }
  return plans;
}

}  // namespace kvsplit::oracle
