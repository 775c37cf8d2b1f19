// The KV host tier on CUDA: page-locked (pinned, portable, mapped) memory from
// Backend::alloc_host, and a swap out and back in through it is byte-exact on every layer, by the
// copy kernel (kernels/kv_pages/copy_pieces.h) and by the copy engines alike.
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
  EXPECT_NE(flags & cudaHostAllocMapped, 0u);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, *p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(attr.devicePointer, *p);  // the copy kernel takes the host address as it is
  (*be)->free_host(*p);
}

void swap_round_trip(backend::Backend::BatchCopyMethod method) {
  auto be = backend::create_cuda_backend(0);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  (*be)->set_batch_copy_method(method);
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

TEST(CudaHostTier, SwapRoundTripThroughPinnedSlotsIsByteExact) {
  KVSPLIT_REQUIRE_DEVICE();
  using M = backend::Backend::BatchCopyMethod;
  for (const M m : {M::kAuto, M::kKernel, M::kDma}) {
    SCOPED_TRACE(static_cast<int>(m));
    swap_round_trip(m);
  }
}

// The copy kernel takes only host memory from alloc_host (mapped): a pageable buffer goes to the
// copy engines under kAuto and is refused under kKernel; the bytes land either way they run.
TEST(CudaHostTier, CopyKernelTakesOnlyMappedHostMemory) {
  KVSPLIT_REQUIRE_DEVICE();
  auto be = backend::create_cuda_backend(0);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  backend::Backend& b = **be;
  constexpr size_t kBytes = 96 * 1024 + 48;
  auto dev = backend::DeviceBuffer::make(b, 2 * kBytes);
  ASSERT_TRUE(dev.ok());
  std::vector<unsigned char> src(kBytes);
  std::mt19937 rng(9);
  for (auto& c : src) c = static_cast<unsigned char>(rng());
  ASSERT_TRUE(b.copy_h2d(dev->get(), src.data(), kBytes).ok());
  std::vector<unsigned char> pageable(kBytes + 16);
  auto* host = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(pageable.data()) + 15) & ~uintptr_t{15});
  const backend::Backend::CopyRange r{host, dev->get(), kBytes};
  using M = backend::Backend::BatchCopyMethod;
  b.set_batch_copy_method(M::kKernel);
  const Status refused = b.copy_batch_async(backend::Backend::CopyDir::kDeviceToHost, &r, 1);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  b.set_batch_copy_method(M::kAuto);
  ASSERT_TRUE(b.copy_batch_async(backend::Backend::CopyDir::kDeviceToHost, &r, 1).ok());
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(std::memcmp(host, src.data(), kBytes), 0);
  // Pinned: the kernel moves it, in both directions, at an offset inside the allocation.
  auto pinned = b.alloc_host(kBytes + 64);
  ASSERT_TRUE(pinned.ok());
  auto* ph = static_cast<unsigned char*>(*pinned) + 32;
  b.set_batch_copy_method(M::kKernel);
  const backend::Backend::CopyRange out{ph, dev->get(), kBytes};
  ASSERT_TRUE(b.copy_batch_async(backend::Backend::CopyDir::kDeviceToHost, &out, 1).ok());
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(std::memcmp(ph, src.data(), kBytes), 0);
  const backend::Backend::CopyRange in{dev->get<unsigned char>() + kBytes, ph, kBytes};
  ASSERT_TRUE(b.copy_batch_async(backend::Backend::CopyDir::kHostToDevice, &in, 1).ok());
  std::vector<unsigned char> back(kBytes);
  ASSERT_TRUE(b.copy_d2h(back.data(), dev->get<unsigned char>() + kBytes, kBytes).ok());
  EXPECT_EQ(back, src);
  // A range running past the allocation's end is not the kernel's.
  const backend::Backend::CopyRange past{ph + 64, dev->get(), kBytes};
  EXPECT_EQ(b.copy_batch_async(backend::Backend::CopyDir::kDeviceToHost, &past, 1).code(),
            StatusCode::kInvalidArgument);
  b.free_host(*pinned);
}

}  // namespace
}  // namespace kvsplit::testing
