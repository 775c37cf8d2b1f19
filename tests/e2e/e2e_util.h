// Shared fixtures of the end-to-end tests: a loaded stories260K in either format on the CPU
// backend, with a KV pool, and a helper to generate a batch.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_pool.h"
#include "model/llama_model.h"
#include "model/loader.h"
#include "sched/batch_generate.h"
#include "test_util.h"

namespace kvsplit::testing {

struct Engine260K {
  model::LoadedModel loaded;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<kv::KvPool> pool;
};

// format: "llama2c" or "hf".
inline std::unique_ptr<Engine260K> make_engine(const std::string& format, int threads = 2,
                                               int num_blocks = 512, int block_size = 16) {
  auto e = std::make_unique<Engine260K>();
  model::LoadOptions lo;
  std::string path;
  if (format == "hf") {
    path = model_path("stories260K-hf");
  } else {
    path = model_path("stories260K.bin");
    lo.tokenizer_path = model_path("tok512.bin");
  }
  auto loaded = model::load_model(path, lo);
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  if (!loaded.ok()) return nullptr;
  e->loaded = std::move(loaded).value();
  auto be = backend::create_backend("cpu", threads);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  if (!be.ok()) return nullptr;
  e->backend = std::move(be).value();
  auto m = model::LlamaModel::create(e->loaded, *e->backend);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return nullptr;
  e->model = std::move(m).value();
  kv::KvPoolConfig pc;
  pc.num_blocks = num_blocks;
  pc.block_size = block_size;
  auto pool = kv::KvPool::create(*e->backend, pc, e->model->kv_shape());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  e->pool = std::move(pool).value();
  return e;
}

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace kvsplit::testing
