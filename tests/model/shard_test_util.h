// Helpers of the sharded-attention tests (tests/model and tests/model/concurrency): a CPU backend
// for one shard, and normal random values.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"

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

inline std::vector<float> randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace kvsplit::testing
