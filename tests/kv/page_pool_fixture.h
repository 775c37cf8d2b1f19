// A small KvPool with every semantic-cut tier on a CPU backend, with seeded page contents: the
// page-transition tests (tests/kv/page_ops_test.cpp, tests/kv/async/).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "kv/kv_pool.h"

namespace kvsplit::kv::testing {

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

struct PagePoolFixture {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KvPool> pool;

  // `options`: the CPU backend's (threads defaults to 1; async_copies for asynchronous restores).
  // `wrap`: wraps that backend (fault injection); unset: none.
  explicit PagePoolFixture(
      int host_pages = 8, int blocks = 8, int int8_blocks = 8, int int4_blocks = 8,
      backend::BackendOptions options = {},
      const std::function<std::unique_ptr<backend::Backend>(std::unique_ptr<backend::Backend>)>&
          wrap = nullptr) {
    if (options.threads <= 0) options.threads = 1;
    be = std::move(backend::create_backend("cpu", options)).value();
    if (wrap) be = wrap(std::move(be));
    KvPoolConfig c;
    c.num_blocks = blocks;
    c.block_size = kBlock;
    c.int8_blocks = int8_blocks;
    c.int4_blocks = int4_blocks;
    c.summary_slots = 8;
    c.host_bytes = host_pages * KvPool::block_bytes(c, KvShape{kLayers, kKvHeads, kHeadDim});
    pool = std::move(KvPool::create(*be, c, KvShape{kLayers, kKvHeads, kHeadDim})).value();
  }

  // Fills every page of `table` (all layers) with seeded random values.
  void fill(const BlockTable& table, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    const int64_t floats = pool->page_layer_bytes(kernels::KvPrecision::kFull) / 4;
    for (int l = 0; l < kLayers; ++l)
      for (int32_t b : table.blocks) {
        float* p = static_cast<float*>(pool->layer(l).data) + b * floats;
        for (int64_t i = 0; i < floats; ++i) p[i] = n(rng);
      }
  }
  // The page's full-precision bytes of every layer (the page must be kFull and resident).
  std::vector<float> page(const BlockTable& table, int i) {
    const int64_t floats = pool->page_layer_bytes(kernels::KvPrecision::kFull) / 4;
    std::vector<float> out;
    for (int l = 0; l < kLayers; ++l) {
      const float* p = static_cast<const float*>(pool->layer(l).data) + table.blocks[i] * floats;
      out.insert(out.end(), p, p + floats);
    }
    return out;
  }
  // The bytes of page i's copy in the arena of rung `p` (the page must be resident at `p`).
  std::vector<uint8_t> arena_bytes(const BlockTable& table, int i, kernels::KvPrecision p) {
    const int64_t n = pool->page_layer_bytes(p);
    std::vector<uint8_t> out;
    for (int l = 0; l < kLayers; ++l) {
      const auto* at = static_cast<const uint8_t*>(pool->arena(p, l)) + table.blocks[i] * n;
      out.insert(out.end(), at, at + n);
    }
    return out;
  }
  void expect_all_free() {
    EXPECT_EQ(pool->allocator().num_used(), 0);
    EXPECT_EQ(pool->arena_allocator(kernels::KvPrecision::kInt8).num_used(), 0);
    EXPECT_EQ(pool->arena_allocator(kernels::KvPrecision::kInt4).num_used(), 0);
    EXPECT_EQ(pool->summary_allocator().num_used(), 0);
    EXPECT_EQ(pool->host_allocator().num_used(), 0);
  }
};

}  // namespace kvsplit::kv::testing
