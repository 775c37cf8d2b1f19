// stories260K end to end on any Backend (the emulated kernel backend in tests/kernels, the CUDA
// backend in tests/gpu): logits at positions 0..7 of "Once upon a time" and greedy generations
// against the llama2.c run.c goldens (/work/shared/models/golden, see its README).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "kv/kv_pool.h"
#include "kv/page_ops.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sampling/sampler.h"
#include "sched/batch_generate.h"
#include "test_util.h"

namespace kvsplit::testing {

struct GoldenModel {
  model::LoadedModel loaded;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<kv::KvPool> pool;
};

inline std::unique_ptr<GoldenModel> load_golden_model(backend::Backend& be) {
  auto g = std::make_unique<GoldenModel>();
  model::LoadOptions lo;
  lo.tokenizer_path = model_path("tok512.bin");
  auto loaded = model::load_model(model_path("stories260K.bin"), lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return nullptr;
  g->loaded = std::move(loaded).value();
  auto m = model::LlamaModel::create(g->loaded, be);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return nullptr;
  g->model = std::move(m).value();
  kv::KvPoolConfig pc;
  pc.num_blocks = 512;  // all 12 greedy goldens at once need ~2.6K tokens
  pc.block_size = 16;
  auto pool = kv::KvPool::create(be, pc, g->model->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  g->pool = std::move(pool).value();
  return g;
}

// Largest |logit - golden| over positions 0..7, computed by one prefill and by token-by-token
// decode with split-K chunks of `chunk` tokens (-1: planner, 0: no split). Also counts positions
// whose argmax differs from the golden's.
struct LogitsError {
  double max_abs = 0;
  int argmax_mismatches = 0;
};
inline LogitsError golden_logits_error(GoldenModel& g, int chunk) {
  LogitsError err;
  const auto rows = read_jsonl(model_path("golden/stories260K_logits.jsonl"));
  EXPECT_EQ(rows.size(), 8u);
  const std::vector<int32_t> ctx = rows.back()["context_token_ids"].get<std::vector<int32_t>>();
  const int vocab = g.model->config().vocab_size;
  auto account = [&](const std::vector<float>& logits) {
    EXPECT_EQ(logits.size(), rows.size() * vocab);
    for (size_t r = 0; r < rows.size() && logits.size() == rows.size() * vocab; ++r) {
      const auto want = rows[r]["logits"].get<std::vector<float>>();
      const float* got = logits.data() + r * vocab;
      for (int v = 0; v < vocab; ++v) {
        EXPECT_FALSE(std::isnan(got[v])) << "pos " << r << " token " << v;
        err.max_abs = std::max(err.max_abs, std::fabs(double(got[v]) - want[v]));
      }
      if (std::max_element(got, got + vocab) - got !=
          std::max_element(want.begin(), want.end()) - want.begin())
        ++err.argmax_mismatches;
    }
  };
  kv::KvPool& pool = *g.pool;
  for (bool prefill : {true, false}) {
    kv::BlockTable table;
    EXPECT_TRUE(pool.reserve(table, static_cast<int>(ctx.size())));
    std::vector<float> logits;
    model::ForwardOptions fo;
    fo.force_chunk_tokens = chunk;
    if (prefill) {
      model::SeqStep s;
      s.tokens = ctx;
      s.table = &table;
      s.logits = model::SeqStep::Logits::kAll;
      EXPECT_TRUE(g.model->forward({&s, 1}, pool, &logits, fo).ok());
    } else {
      for (size_t i = 0; i < ctx.size(); ++i) {
        model::SeqStep s;
        s.tokens = std::span<const int32_t>(&ctx[i], 1);
        s.start_pos = static_cast<int>(i);
        s.table = &table;
        const Status st = g.model->forward({&s, 1}, pool, &logits, fo);
        EXPECT_TRUE(st.ok()) << st.to_string();
      }
    }
    account(logits);
    pool.release(table);
  }
  return err;
}

// Runs the first `max_cases` greedy goldens with at most `max_steps` steps as one batch, decode
// split-K chunks of `chunk` tokens (-1: planner); expects identical ids. With `max_new` >= 0 each
// case generates at most max_new tokens and is compared with that prefix of its golden
// (greedy output is prefix-consistent).
inline void expect_greedy_goldens(GoldenModel& g, int max_steps, int max_cases, int chunk = -1,
                                  int max_new = -1) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  std::vector<sched::GenerationInput> inputs;
  std::vector<std::vector<int32_t>> want;
  for (const auto& c : cases) {
    if (c["steps"].get<int>() > max_steps || static_cast<int>(inputs.size()) >= max_cases) continue;
    sched::GenerationInput in;
    in.prompt_ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    in.params.temperature = 0.f;
    in.params.max_tokens = c["steps"].get<int>() - static_cast<int>(in.prompt_ids.size()) + 1;
    std::vector<int32_t> golden = c["output_token_ids"].get<std::vector<int32_t>>();
    if (max_new >= 0 && in.params.max_tokens > max_new) {
      in.params.max_tokens = max_new;
      if (golden.size() > static_cast<size_t>(max_new)) golden.resize(max_new);
    }
    inputs.push_back(in);
    want.push_back(std::move(golden));
  }
  ASSERT_FALSE(inputs.empty());
  sched::BatchOptions bo;
  bo.forward.force_chunk_tokens = chunk;
  auto out = sched::generate_batch(*g.model, *g.pool, g.loaded.tokenizer.get(), inputs, bo);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_EQ((*out)[i].output_ids, want[i]) << "golden case " << i;
  EXPECT_EQ(g.pool->allocator().num_free(), g.pool->allocator().num_blocks());
}

// One step over the first `num_prompts` golden prompts (prefill) with the logits kinds cycling
// kArgmax, kLast, kAll, kNone, kArgmax, ...: each kArgmax id equals sampling::argmax_lowest of the
// kLast row the same step gives when the kArgmax sequences ask for kLast instead (the same rows,
// so the same GEMM shapes), and the logits rows that are
// returned are exactly those of the other sequences. On a backend with sample_tokens the ids come
// from the device. A kArgmax step without an ids output is kInvalidArgument.
inline void expect_argmax_rows_match_logits(GoldenModel& g, int num_prompts) {
  const auto cases = read_jsonl(model_path("golden/stories260K_greedy.jsonl"));
  const int vocab = g.model->config().vocab_size;
  kv::KvPool& pool = *g.pool;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < num_prompts && i < static_cast<int>(cases.size()); ++i)
    prompts.push_back(cases[i]["prompt_token_ids"].get<std::vector<int32_t>>());
  using L = model::SeqStep::Logits;
  const L kinds[] = {L::kArgmax, L::kLast, L::kAll, L::kNone};
  // mode 0: the kinds above; 1: kArgmax -> kLast; 2: every sequence kLast; 3: every one kArgmax.
  auto run = [&](int mode, std::vector<float>* logits, std::vector<int32_t>* ids) {
    std::vector<kv::BlockTable> tables(prompts.size());
    std::vector<model::SeqStep> steps;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_TRUE(pool.reserve(tables[i], static_cast<int>(prompts[i].size())));
      L kind = mode == 1 && kinds[i % 4] == L::kArgmax ? L::kLast : kinds[i % 4];
      if (mode == 2) kind = L::kLast;
      if (mode == 3) kind = L::kArgmax;
      steps.push_back({prompts[i], 0, &tables[i], kind});
    }
    const Status st = g.model->forward(steps, pool, logits, {}, ids);
    for (auto& t : tables) pool.release(t);
    return st;
  };
  std::vector<float> ref;
  ASSERT_TRUE(run(1, &ref, nullptr).ok());
  std::vector<float> logits;
  std::vector<int32_t> ids;
  ASSERT_TRUE(run(0, &logits, &ids).ok());
  // Walk the reference rows: kLast rows of argmax sequences become ids, the rest stay logits.
  size_t ref_row = 0, row = 0, id = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const L kind = kinds[i % 4];
    const size_t n = kind == L::kAll ? prompts[i].size() : (kind == L::kNone ? 0 : 1);
    for (size_t r = 0; r < n; ++r, ++ref_row) {
      const float* want = ref.data() + ref_row * vocab;
      if (kind == L::kArgmax) {
        ASSERT_LT(id, ids.size());
        EXPECT_EQ(ids[id++], sampling::argmax_lowest(want, vocab)) << "prompt " << i;
      } else {
        ASSERT_LE((row + 1) * vocab, logits.size());
        EXPECT_EQ(0, std::memcmp(logits.data() + row * vocab, want, vocab * sizeof(float)))
            << "prompt " << i << " row " << r;
        ++row;
      }
    }
  }
  EXPECT_EQ(ref_row * vocab, ref.size());
  EXPECT_EQ(id, ids.size());
  EXPECT_EQ(row * vocab, logits.size());
  EXPECT_EQ(run(0, &logits, nullptr).code(), StatusCode::kInvalidArgument);
  // A step of greedy rows only needs no logits output at all.
  std::vector<float> last;
  ASSERT_TRUE(run(2, &last, nullptr).ok());
  std::vector<int32_t> all_ids;
  ASSERT_TRUE(run(3, nullptr, &all_ids).ok());
  ASSERT_EQ(all_ids.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(all_ids[i], sampling::argmax_lowest(last.data() + i * vocab, vocab))
        << "prompt " << i;
  EXPECT_EQ(pool.allocator().num_free(), pool.allocator().num_blocks());
}

// Sliding windows through LlamaModel on `be` against the CPU backend's logits for the same seeded
// synthetic stories260K-shaped model, logits at every position of a 48-token prompt by one prefill
// and by token-by-token decode split one page (16 tokens) per split (so several splits, and one
// split plan per distinct window):
// - a mix of full and windowed layers (windows of 1 key, under a page, over one);
// - every layer windowed (largest window 17), with the decode dropping the pages behind the
//   window after each step (kv::drop_behind_window): two of its three pages go, and no logit moves.
// Max |logit - CPU| within `tol`; every block returned.
inline void expect_sliding_window_logits_match_cpu(backend::Backend& be, double tol) {
  model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto loaded = model::load_model("synthetic:stories260k@seed=9", lo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  constexpr int kLen = 48;
  std::vector<int32_t> prompt(kLen);
  for (int i = 0; i < kLen; ++i) prompt[i] = (i * 131 + 7) % loaded->config.vocab_size;
  auto run = [&](backend::Backend& b, bool decode, int* dropped) {
    std::vector<float> all;
    auto m = model::LlamaModel::create(*loaded, b);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return all;
    kv::KvPoolConfig pc;
    pc.num_blocks = 4;
    pc.block_size = 16;  // the kernels' compiled page size
    auto pool = kv::KvPool::create(b, pc, (*m)->kv_shape());
    EXPECT_TRUE(pool.ok());
    if (!pool.ok()) return all;
    kv::BlockTable table;
    EXPECT_TRUE((*pool)->reserve(table, kLen));
    model::ForwardOptions fo;
    fo.force_chunk_tokens = 16;
    const std::span<const int32_t> p(prompt);
    kv::PageOpStats ops;
    for (size_t i = 0; i < (decode ? prompt.size() : 1); ++i) {
      model::SeqStep st;
      st.tokens = decode ? p.subspan(i, 1) : p;
      st.start_pos = static_cast<int>(i);
      st.table = &table;
      st.logits = decode ? model::SeqStep::Logits::kLast : model::SeqStep::Logits::kAll;
      std::vector<float> logits;
      const Status s = (*m)->forward({&st, 1}, **pool, &logits, fo);
      EXPECT_TRUE(s.ok()) << s.to_string();
      all.insert(all.end(), logits.begin(), logits.end());
      if (decode)
        kv::drop_behind_window(**pool, table, static_cast<int>(i) + 1, loaded->config.kv_window(),
                               &ops);
    }
    if (dropped != nullptr) *dropped = table.window_dropped;
    (*pool)->release(table);
    EXPECT_EQ((*pool)->allocator().num_free(), (*pool)->allocator().num_blocks());
    return all;
  };
  std::unique_ptr<backend::Backend> cpu = backend::make_cpu_backend(1);
  for (const std::vector<int>& windows :
       {std::vector<int>{3, 0, 19, 1, 3}, std::vector<int>{3, 17, 5, 1, 9}}) {
    loaded->config.layer_window = windows;
    const bool slides = loaded->config.kv_window() > 0;
    const std::vector<float> want = run(*cpu, false, nullptr);
    for (bool decode : {false, true}) {
      int dropped = 0;
      const std::vector<float> got = run(be, decode, &dropped);
      ASSERT_EQ(got.size(), want.size());
      double d = 0;
      for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::fabs(double(got[i]) - want[i]));
      EXPECT_LT(d, tol) << (decode ? "decode" : "prefill")
                        << (slides ? ", every layer sliding" : "");
      // At 48 positions the next query reads keys from 48 - 17 + 1 = 32 on: pages 0 and 1 go.
      EXPECT_EQ(dropped, decode && slides ? 2 : 0);
    }
  }
}

}  // namespace kvsplit::testing
