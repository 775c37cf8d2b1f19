// The KV host tier on CUDA: page-locked (pinned, portable) memory from Backend::alloc_host, and a
// swap out and back in through it with asynchronous copies is byte-exact on every layer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "kernel_test_util.h"
#include "kv/kv_pool.h"
#include "kv/swap.h"

namespace kvsplit::testing {
namespace {

TEST(CudaHostTier, AllocHostIsPinnedAndPortable) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = backend::create_cuda_backend(0);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  EXPECT_TRUE((*be)->host_memory_pinned());
  auto p = (*be)->alloc_host(size_t{3} << 20);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  unsigned int flags = 0;
  ASSERT_EQ(cudaHostGetFlags(&flags, *p), cudaSuccess) << "not page-locked";
  EXPECT_NE(flags & cudaHostAllocPortable, 0u);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, *p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  (*be)->free_host(*p);
}

TEST(CudaHostTier, SwapRoundTripThroughPinnedSlotsIsByteExact) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = backend::create_cuda_backend(0);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  const kv::KvShape shape{3, 2, 64};
  kv::KvPoolConfig pc;
  pc.block_size = 16;
  pc.num_blocks = 16;
  pc.host_bytes = 8 * kv::KvPool::block_bytes(pc, shape);
  auto pool = kv::KvPool::create(**be, pc, shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const size_t layer_bytes = static_cast<size_t>((*pool)->bytes_per_block() / shape.num_layers) *
                             static_cast<size_t>(pc.num_blocks);
  std::mt19937 rng(5);
  for (int l = 0; l < shape.num_layers; ++l) {
    std::vector<char> fill(layer_bytes);
    for (char& c : fill) c = static_cast<char>(rng());
    ASSERT_TRUE((*be)->copy_h2d((*pool)->layer(l).data, fill.data(), fill.size()).ok());
  }
  kv::BlockTable t;
  ASSERT_TRUE((*pool)->reserve(t, 5 * 16 + 7));  // 6 pages, the last partial
  const size_t page = layer_bytes / static_cast<size_t>(pc.num_blocks);
  auto read_pages = [&] {
    std::vector<char> out;
    for (int l = 0; l < shape.num_layers; ++l) {
      std::vector<char> all(layer_bytes);
      EXPECT_TRUE((*be)->copy_d2h(all.data(), (*pool)->layer(l).data, all.size()).ok());
      for (int32_t b : t.blocks)
        out.insert(out.end(), all.begin() + b * page, all.begin() + (b + 1) * page);
    }
    return out;
  };
  const std::vector<char> before = read_pages();
  kv::SwapStats st;
  auto out = kv::swap_out(**pool, t, &st);
  ASSERT_TRUE(out.ok() && *out);
  EXPECT_EQ(st.to_disk, 0);
  EXPECT_EQ((*pool)->host_allocator().num_used(), 6);
  // Overwrite the freed blocks, so the swap-in must bring the bytes back from the host tier.
  for (int l = 0; l < shape.num_layers; ++l)
    ASSERT_TRUE((*be)->memset_zero((*pool)->layer(l).data, layer_bytes).ok());
  auto in = kv::swap_in(**pool, t, &st);
  ASSERT_TRUE(in.ok() && *in);
  EXPECT_EQ(read_pages(), before);
  EXPECT_EQ((*pool)->host_allocator().num_used(), 0);
  (*pool)->release(t);
  EXPECT_EQ((*pool)->used_blocks(), 0);
}

}  // namespace
}  // namespace kvsplit::testing
