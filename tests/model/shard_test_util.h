// Helpers of the sharded-attention tests (tests/model and tests/model/concurrency): a CPU backend
// for one shard, and normal random values.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_pool.h"

namespace kvsplit::testing {

// A CPU backend for shard `device`; peers do not spin, as in the engine.
inline std::unique_ptr<backend::Backend> shard_cpu(int device, int threads = 2) {
  backend::BackendOptions o;
  o.threads = threads;
  o.device = device;
  o.spin_micros = 0;
  auto be = backend::create_backend("cpu", o);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  return std::move(be).value();
}

// A pool of `blocks` blocks of `block_size` tokens on `home` with `shards` - 1 peer shards, peer s
// (1..) the backend make_peer(s) returns, placed in chunks of `chunk` tokens.
template <typename MakePeer>
std::unique_ptr<kv::KvPool> sharded_pool(backend::Backend& home, int shards, int blocks,
                                         int block_size, int chunk, const kv::KvShape& shape,
                                         MakePeer make_peer) {
  kv::KvPoolConfig pc;
  pc.num_blocks = blocks;
  pc.block_size = block_size;
  auto pool = kv::KvPool::create(home, pc, shape);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return nullptr;
  std::vector<std::unique_ptr<backend::Backend>> peers;
  for (int s = 1; s < shards; ++s) peers.push_back(make_peer(s));
  const Status st = (*pool)->add_shards(std::move(peers), chunk);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return std::move(pool).value();
}

inline std::vector<float> randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace kvsplit::testing
