// Sliding-window attention through LlamaModel (ModelConfig::layer_window) on the CPU backend, with
// a seeded synthetic stories260K-shaped model (5 layers): the receptive field of a windowed model
// is what the window says, decode (split-K, per-window plans) equals prefill, per-layer windows
// (Qwen2's mix of full and sliding layers) take effect layer by layer, and generation runs past the
// window with every block returned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "kv/kv_pool.h"
#include "kv/page_ops.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/batch_generate.h"

namespace kvsplit::model {
namespace {

struct Setup {
  LoadedModel loaded;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<kv::KvPool> pool;
};

// The synthetic model with `windows` (empty: full attention on every layer).
std::unique_ptr<Setup> make(const std::vector<int>& windows) {
  auto s = std::make_unique<Setup>();
  LoadOptions lo;
  lo.load_tokenizer = false;
  auto loaded = load_model("synthetic:stories260k@seed=3", lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return nullptr;
  s->loaded = std::move(loaded).value();
  s->loaded.config.layer_window = windows;
  s->be = backend::make_cpu_backend(2);
  auto m = LlamaModel::create(s->loaded, *s->be);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return nullptr;
  s->model = std::move(m).value();
  kv::KvPoolConfig pc;
  pc.num_blocks = 64;
  pc.block_size = 8;
  auto pool = kv::KvPool::create(*s->be, pc, s->model->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  s->pool = std::move(pool).value();
  return s;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    t[i] = static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(vocab));
  }
  return t;
}

// Logits of a prompt's every position (one prefill step), or its last position only.
std::vector<float> prefill(Setup& s, std::span<const int32_t> tokens, bool all) {
  kv::BlockTable table;
  EXPECT_TRUE(s.pool->reserve(table, static_cast<int>(tokens.size())));
  SeqStep step;
  step.tokens = tokens;
  step.table = &table;
  step.logits = all ? SeqStep::Logits::kAll : SeqStep::Logits::kLast;
  std::vector<float> logits;
  const Status st = s.model->forward({&step, 1}, *s.pool, &logits);
  EXPECT_TRUE(st.ok()) << st.to_string();
  s.pool->release(table);
  return logits;
}

// The same logits by token-by-token decode with split chunks of `chunk` (-1: the planner).
std::vector<float> decode(Setup& s, std::span<const int32_t> tokens, int chunk) {
  kv::BlockTable table;
  EXPECT_TRUE(s.pool->reserve(table, static_cast<int>(tokens.size())));
  ForwardOptions fo;
  fo.force_chunk_tokens = chunk;
  fo.split.min_chunk_tokens = 8;
  std::vector<float> all;
  for (size_t i = 0; i < tokens.size(); ++i) {
    SeqStep step;
    step.tokens = tokens.subspan(i, 1);
    step.start_pos = static_cast<int>(i);
    step.table = &table;
    std::vector<float> logits;
    const Status st = s.model->forward({&step, 1}, *s.pool, &logits, fo);
    EXPECT_TRUE(st.ok()) << st.to_string();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  s.pool->release(table);
  return all;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

// With every one of L layers windowed to W, the last position's logits depend on the last
// L * (W - 1) + 1 tokens only: the prompt cut to them gives the same logits (up to RoPE's rounding
// at other positions), one token fewer does not, and full attention does not either.
TEST(SlidingWindowModel, ReceptiveFieldIsLayersTimesWindow) {
  const int W = 6;
  auto s = make(std::vector<int>(5, W));
  ASSERT_NE(s, nullptr);
  const int L = s->loaded.config.num_layers;
  ASSERT_EQ(L, 5);
  const int field = L * (W - 1) + 1;  // 26
  const std::vector<int32_t> prompt = random_tokens(90, s->loaded.config.vocab_size, 11);
  const std::span<const int32_t> p(prompt);
  const std::vector<float> whole = prefill(*s, p, false);
  const std::vector<float> cut = prefill(*s, p.last(field), false);
  const std::vector<float> short_cut = prefill(*s, p.last(field - 1), false);
  const double same = max_diff(whole, cut), fewer = max_diff(whole, short_cut);
  EXPECT_LT(same, 2e-4);
  EXPECT_GT(fewer, 50 * std::max(same, 1e-6)) << "the receptive field is larger than expected";

  auto full = make({});
  ASSERT_NE(full, nullptr);
  const double unwindowed = max_diff(prefill(*full, p, false), cut);
  EXPECT_GT(unwindowed, 50 * std::max(same, 1e-6)) << "the window masked nothing";
  EXPECT_EQ(s->pool->allocator().num_free(), s->pool->allocator().num_blocks());
}

// Windowed decode (no split, one page per split, the planner) equals windowed prefill at every
// position, for uniform windows and for a mix of full and sliding layers (one plan per window).
TEST(SlidingWindowModel, DecodeEqualsPrefillWithPerLayerWindows) {
  const std::vector<std::vector<int>> configs = {
      {5, 5, 5, 5, 5}, {0, 9, 0, 17, 9}, {1, 1, 1, 1, 1}, {8, 8, 8, 8, 8}};
  const std::vector<int32_t> prompt = random_tokens(70, 512, 5);
  std::vector<std::vector<float>> outs;
  for (const std::vector<int>& w : configs) {
    auto s = make(w);
    ASSERT_NE(s, nullptr);
    const std::vector<float> want = prefill(*s, prompt, true);
    for (int chunk : {0, 8, -1}) {
      EXPECT_LT(max_diff(decode(*s, prompt, chunk), want), 1e-4)
          << "windows " << w[0] << "," << w[1] << " chunk " << chunk;
    }
    outs.push_back(want);
    EXPECT_EQ(s->pool->allocator().num_free(), s->pool->allocator().num_blocks());
  }
  // Each configuration computes something different (the per-layer windows are applied).
  for (size_t i = 0; i < outs.size(); ++i)
    for (size_t j = i + 1; j < outs.size(); ++j) EXPECT_GT(max_diff(outs[i], outs[j]), 1e-3);
}

// Generation runs past the window (the window slides; nothing stops at it), and identically to a
// longer window's up to the shorter one: every sequence of at most W positions attends as with
// full attention.
TEST(SlidingWindowModel, GeneratesPastTheWindow) {
  auto s = make(std::vector<int>(5, 12));
  auto full = make({});
  ASSERT_NE(s, nullptr);
  ASSERT_NE(full, nullptr);
  std::vector<sched::GenerationInput> inputs(2);
  inputs[0].prompt_ids = random_tokens(7, 512, 1);
  inputs[1].prompt_ids = random_tokens(20, 512, 2);  // longer than the window
  for (auto& in : inputs) {
    in.params.temperature = 0.f;
    in.params.max_tokens = 40;
  }
  auto out = sched::generate_batch(*s->model, *s->pool, nullptr, inputs, {});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  auto ref = sched::generate_batch(*full->model, *full->pool, nullptr, inputs, {});
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ((*out)[i].output_ids.size(), 40u) << "sequence " << i;
  }
  // Sequence 0: positions 0..11 see at most 12 keys, so its first 12 - 7 + 1 = 6 tokens (sampled
  // from positions 6..11) are full attention's.
  ASSERT_GE((*ref)[0].output_ids.size(), 6u);
  EXPECT_TRUE(std::equal((*ref)[0].output_ids.begin(), (*ref)[0].output_ids.begin() + 6,
                         (*out)[0].output_ids.begin()));
  EXPECT_EQ(s->pool->allocator().num_free(), s->pool->allocator().num_blocks());
}

// Pages dropped behind the window as it passes them (kv::drop_behind_window after every step)
// change no logit: decode token by token, and prefill in chunks, equal one prefill of the whole
// prompt on a table that keeps everything; only the window's pages stay in the pool.
TEST(SlidingWindowModel, DroppingPagesBehindTheWindowChangesNoLogit) {
  const int W = 12;  // blocks of 8: the window spans two or three pages
  auto s = make(std::vector<int>(5, W));
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->loaded.config.kv_window(), W);
  const std::vector<int32_t> prompt = random_tokens(61, 512, 9);
  const std::vector<float> want = prefill(*s, prompt, true);
  for (int chunk : {1, 5, 16}) {
    kv::BlockTable table;
    kv::PageOpStats st;
    std::vector<float> got;
    int peak_used = 0;
    for (int pos = 0; pos < static_cast<int>(prompt.size()); pos += chunk) {
      const int n = std::min<int>(chunk, static_cast<int>(prompt.size()) - pos);
      ASSERT_TRUE(s->pool->reserve(table, pos + n));
      SeqStep step;
      step.tokens = std::span<const int32_t>(prompt).subspan(pos, n);
      step.start_pos = pos;
      step.table = &table;
      step.logits = SeqStep::Logits::kAll;
      std::vector<float> logits;
      const Status fs = s->model->forward({&step, 1}, *s->pool, &logits);
      ASSERT_TRUE(fs.ok()) << fs.to_string();
      got.insert(got.end(), logits.begin(), logits.end());
      peak_used = std::max(peak_used, s->pool->allocator().num_used());
      kv::drop_behind_window(*s->pool, table, pos + n, W, &st);
      // Left: the pages from the one holding the next query's first key on.
      const int first = std::max(0, pos + n - W + 1) / 8;
      EXPECT_EQ(table.window_dropped, first) << "chunk " << chunk << " at " << pos;
    }
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(max_diff(got, want), 1e-4) << "chunk " << chunk;
    EXPECT_EQ(st.window_dropped, (61 - W + 1) / 8);
    // A chunk of c tokens needs the window's pages plus its own: never the whole prompt's 8.
    EXPECT_LE(peak_used, (W + chunk + 2 * 8 - 2) / 8) << "chunk " << chunk;
    s->pool->release(table);
    EXPECT_EQ(s->pool->allocator().num_free(), s->pool->allocator().num_blocks());
  }
}

// generate_batch on a pool smaller than a sequence (10 pages of 8 tokens; a 100-token prompt and
// 60 tokens: 20 pages): the prompt is prefilled chunk by chunk as the window frees pages, and the
// tokens are those of a pool that holds everything (a chunk that does not fit is cut to the pages
// left). In a pool smaller than the window's pages (2: a query's 12 keys can span 3) it is
// RESOURCE_EXHAUSTED. Nothing is left held either way.
TEST(SlidingWindowModel, ASequenceLongerThanThePoolRunsChunkByChunk) {
  auto s = make(std::vector<int>(5, 12));
  ASSERT_NE(s, nullptr);
  std::vector<sched::GenerationInput> inputs(2);
  inputs[0].prompt_ids = random_tokens(100, 512, 21);
  inputs[1].prompt_ids = random_tokens(37, 512, 22);
  for (auto& in : inputs) {
    in.params.temperature = 0.f;
    in.params.max_tokens = 60;
    in.params.ignore_eos = true;
  }
  auto want = sched::generate_batch(*s->model, *s->pool, nullptr, inputs, {});
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  sched::BatchOptions bo;
  bo.max_batch_tokens = 16;  // held at once: blocks_for(11 + 16) + 1 = 5 pages, each sequence
  for (int blocks : {10, 2}) {
    kv::KvPoolConfig pc;
    pc.num_blocks = blocks;
    pc.block_size = 8;
    auto small = kv::KvPool::create(*s->be, pc, s->model->kv_shape());
    ASSERT_TRUE(small.ok()) << small.status().to_string();
    auto got = sched::generate_batch(*s->model, **small, nullptr, inputs, bo);
    if (blocks == 2) {
      EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted) << got.status().to_string();
    } else {
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      for (size_t i = 0; i < inputs.size(); ++i) {
        EXPECT_EQ((*got)[i].output_ids, (*want)[i].output_ids) << "sequence " << i;
        EXPECT_GT((*got)[i].window_dropped_pages, 0) << "sequence " << i;
      }
    }
    EXPECT_EQ((*small)->allocator().num_free(), blocks);
  }
}

// The forward refuses a step whose queries would read a page dropped behind the window (named),
// and a model with one full layer never drops (kv_window 0).
TEST(SlidingWindowModel, AStepThatWouldReadADroppedPageIsRefused) {
  auto s = make(std::vector<int>(5, 12));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> prompt = random_tokens(40, 512, 4);
  kv::BlockTable table;
  ASSERT_TRUE(s->pool->reserve(table, 40));
  kv::PageOpStats st;
  ASSERT_EQ(kv::drop_behind_window(*s->pool, table, 40, 12, &st), 3);  // first key 29: pages 0-2
  SeqStep step;
  // Writes pages 3-4 only, but its first query (24) reads from key 13, on page 1.
  step.tokens = std::span<const int32_t>(prompt).subspan(24, 16);
  step.start_pos = 24;
  step.table = &table;
  std::vector<float> logits;
  const Status fs = s->model->forward({&step, 1}, *s->pool, &logits);
  EXPECT_EQ(fs.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fs.message().find("dropped behind the sliding window"), std::string::npos)
      << fs.to_string();
  s->pool->release(table);

  ModelConfig c = s->loaded.config;
  c.layer_window = {12, 12, 0, 12, 12};  // Qwen2's mix: the full layer reads everything
  EXPECT_EQ(c.kv_window(), 0);
  c.layer_window = {12, 20, 12, 12, 12};
  EXPECT_EQ(c.kv_window(), 20);
  c.layer_window.clear();
  EXPECT_EQ(c.kv_window(), 0);
}

}  // namespace
}  // namespace kvsplit::model
