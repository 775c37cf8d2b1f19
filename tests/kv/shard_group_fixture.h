// A KV pool with a shard group of CPU backends, for the shard group's tests: fill and read a
// table's pages on whichever shard holds them, attach a disk tier, check that nothing is held.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "kv/kv_pool.h"
#include "test_util.h"

namespace kvsplit::kv {

using kernels::KvPrecision;

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

struct Group {
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KvPool> pool;

  // `base`: every shard's CPU backend options (threads 1; async_copies for host prefetches).
  Group(int shards, int blocks, int chunk, int host_pages = 0, backend::BackendOptions base = {}) {
    base.threads = 1;
    be = std::move(backend::create_backend("cpu", base)).value();
    KvPoolConfig c;
    c.num_blocks = blocks;
    c.block_size = kBlock;
    c.host_bytes = host_pages * KvPool::block_bytes(c, KvShape{kLayers, kKvHeads, kHeadDim});
    pool = std::move(KvPool::create(*be, c, KvShape{kLayers, kKvHeads, kHeadDim})).value();
    std::vector<std::unique_ptr<backend::Backend>> peers;
    for (int s = 1; s < shards; ++s) {
      backend::BackendOptions o = base;
      o.device = s;
      peers.push_back(std::move(backend::create_backend("cpu", o)).value());
    }
    if (shards > 1) {
      EXPECT_TRUE(pool->add_shards(std::move(peers), chunk).ok());
    }
  }
  int64_t floats() const { return pool->page_layer_bytes(KvPrecision::kFull) / 4; }
  float* page(const BlockTable& t, size_t i, int l) {
    const int s = t.pages.empty() ? 0 : t.pages[i].shard;
    return static_cast<float*>(pool->shard(s).layer(l).data) + t.blocks[i] * floats();
  }
  void fill(const BlockTable& t, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    for (size_t i = 0; i < t.blocks.size(); ++i)
      for (int l = 0; l < kLayers; ++l)
        for (int64_t j = 0; j < floats(); ++j) page(t, i, l)[j] = n(rng);
  }
  std::vector<float> read(const BlockTable& t) {
    std::vector<float> out;
    for (size_t i = 0; i < t.blocks.size(); ++i)
      for (int l = 0; l < kLayers; ++l)
        out.insert(out.end(), page(t, i, l), page(t, i, l) + floats());
    return out;
  }
  // Attaches a disk tier below the (home) host tier.
  void attach_disk(int64_t extents = 64) {
    DiskTierConfig c;
    c.path = dir.path().string();
    c.extent_bytes = 4096;
    c.capacity_bytes = extents * c.extent_bytes;
    auto t = DiskTier::open(c);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    disk = t->get();
    pool->attach_disk(std::move(t).value());
  }
  // Every shard's blocks, the host tier and the disk are back to empty.
  void expect_all_free() {
    for (int s = 0; s < pool->num_shards(); ++s)
      EXPECT_EQ(pool->shard(s).allocator().num_used(), 0) << "shard " << s;
    EXPECT_EQ(pool->host_allocator().num_used(), 0);
    if (disk != nullptr) {
      EXPECT_EQ(disk->stats().records, 0);
      EXPECT_EQ(disk->stats().extents_used, 0);
    }
  }
  testing::TempDir dir;
  DiskTier* disk = nullptr;
  std::vector<int> shards_of(const BlockTable& t) {
    std::vector<int> s;
    for (const PageEntry& p : t.pages) s.push_back(p.shard);
    return s;
  }
};

}  // namespace kvsplit::kv
