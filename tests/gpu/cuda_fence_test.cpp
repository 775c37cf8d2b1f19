// Fenced copies on CUDA (the copy stream beside the compute stream, an event per fence) and the
// semantic cut's asynchronous recall through them: the copy lands, wait_fence reports it once,
// and a restored page is byte-exact.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "kernel_test_util.h"
#include "kv/kv_pool.h"
#include "kv/page_ops.h"

namespace kvsplit::testing {
namespace {

TEST(CudaFence, FencedBatchLandsAndIsReportedOnce) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = backend::create_cuda_backend(0);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  const size_t bytes = size_t{64} << 20;
  auto host = (*be)->alloc_host(bytes);
  ASSERT_TRUE(host.ok());
  auto dev = (*be)->alloc(bytes);
  ASSERT_TRUE(dev.ok());
  auto* h = static_cast<unsigned char*>(*host);
  for (size_t i = 0; i < bytes; ++i) h[i] = static_cast<unsigned char>(i * 131 + 7);
  const backend::Backend::CopyRange r[] = {
      {*dev, h, bytes / 2}, {static_cast<char*>(*dev) + bytes / 2, h + bytes / 2, bytes / 2}};
  auto fence = (*be)->copy_batch_fenced(backend::Backend::CopyDir::kHostToDevice, r, 2);
  ASSERT_TRUE(fence.ok()) << fence.status().to_string();
  EXPECT_NE(*fence, 0u);
  auto polled = (*be)->wait_fence(*fence, 0);
  ASSERT_TRUE(polled.ok()) << polled.status().to_string();
  auto landed = (*be)->wait_fence(*fence, -1);
  ASSERT_TRUE(landed.ok() && *landed);
  auto again = (*be)->wait_fence(*fence, 0);
  ASSERT_TRUE(again.ok() && *again);
  std::vector<unsigned char> back(bytes);
  ASSERT_TRUE((*be)->copy_d2h(back.data(), *dev, bytes).ok());
  EXPECT_EQ(std::memcmp(back.data(), h, bytes), 0);
  EXPECT_FALSE((*be)->wait_fence(*fence + 100, 0).ok());  // never handed out
  (*be)->free(*dev);
  (*be)->free_host(*host);
}

TEST(CudaFence, AsynchronousRecallIsByteExact) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = backend::create_cuda_backend(0);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  const kv::KvShape shape{2, 2, 64};
  kv::KvPoolConfig pc;
  pc.block_size = 16;
  pc.num_blocks = 8;
  pc.int8_blocks = pc.int4_blocks = pc.summary_slots = 8;
  pc.host_bytes = 8 * kv::KvPool::block_bytes(pc, shape);
  auto pool = kv::KvPool::create(**be, pc, shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const size_t page = static_cast<size_t>((*pool)->page_layer_bytes(kernels::KvPrecision::kFull));
  std::mt19937 rng(11);
  for (int l = 0; l < shape.num_layers; ++l) {
    std::vector<float> fill(page * pc.num_blocks / 4);
    std::normal_distribution<float> n(0.f, 1.f);
    for (float& x : fill) x = n(rng);
    ASSERT_TRUE((*be)->copy_h2d((*pool)->layer(l).data, fill.data(), fill.size() * 4).ok());
  }
  kv::BlockTable t;
  ASSERT_TRUE((*pool)->reserve(t, 4 * 16));
  auto read_page = [&](int i) {
    std::vector<char> out;
    for (int l = 0; l < shape.num_layers; ++l) {
      std::vector<char> p(page);
      EXPECT_TRUE((*be)
                      ->copy_d2h(p.data(),
                                 static_cast<char*>((*pool)->layer(l).data) + t.blocks[i] * page,
                                 page)
                      .ok());
      out.insert(out.end(), p.begin(), p.end());
    }
    return out;
  };
  const std::vector<char> before = read_page(1);
  kv::PageOpStats st;
  using kv::PageOp;
  ASSERT_TRUE(kv::apply_page_transitions(**pool, t, 64,
                                         {{{1, PageOp::kDemote, kernels::KvPrecision::kInt4}}}, &st)
                  .ok());
  ASSERT_TRUE(kv::apply_page_transitions(
                  **pool, t, 64, {{{1, PageOp::kRestore, kernels::KvPrecision::kFull}}}, &st)
                  .ok());
  ASSERT_EQ(t.restoring.size(), 1u);  // queued on the copy stream, not yet committed
  ASSERT_TRUE(kv::complete_restores(**pool, t, -1, &st).ok());
  EXPECT_TRUE(t.restoring.empty());
  EXPECT_EQ(st.restored, 1);
  EXPECT_EQ(read_page(1), before);
  (*pool)->release(t);
  EXPECT_EQ((*pool)->used_blocks(), 0);
  EXPECT_EQ((*pool)->host_allocator().num_used(), 0);
}

}  // namespace
}  // namespace kvsplit::testing
