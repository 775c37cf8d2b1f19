// The KV handoff copy between two CUDA backends: on one GPU the same-device route; with two or
// more, the peer route where the driver allows peer access, else the staged one. Bytes are
// checked against the source in every case.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "kernel_test_util.h"
#include "kv/kv_pool.h"
#include "sched/kv_handoff.h"

namespace kvsplit::testing {
namespace {

TEST(CudaKvCopy, RouteByDevicePairAndBytesIntact) {
  KVSPLIT_REQUIRE_DEVICE();
  const int count = backend::cuda_device_count();
  const int dst_device = count > 1 ? 1 : 0;
  auto a = backend::create_cuda_backend(0);
  auto b = backend::create_cuda_backend(dst_device);
  ASSERT_TRUE(a.ok() && b.ok());
  const kv::KvShape shape{2, 2, 64};
  auto pa = kv::KvPool::create(**a, kv::KvPoolConfig{16, 16}, shape);
  auto pb = kv::KvPool::create(**b, kv::KvPoolConfig{16, 16}, shape);
  ASSERT_TRUE(pa.ok() && pb.ok());
  const size_t block_bytes = (*pa)->bytes_per_block() / shape.num_layers;
  std::mt19937 rng(11);
  std::vector<std::vector<char>> host(shape.num_layers, std::vector<char>(16 * block_bytes));
  for (int l = 0; l < shape.num_layers; ++l) {
    for (char& c : host[l]) c = static_cast<char>(rng());
    ASSERT_TRUE((*a)->copy_h2d((*pa)->layer(l).data, host[l].data(), host[l].size()).ok());
  }
  ASSERT_TRUE((*a)->synchronize().ok());
  const std::vector<int32_t> src = {2, 3, 4, 9}, dst = {0, 1, 7, 15};
  auto route = sched::copy_kv_blocks(**pa, src, **pb, dst);
  ASSERT_TRUE(route.ok()) << route.status().to_string();
  if (dst_device == 0) {
    EXPECT_EQ(*route, sched::KvCopyRoute::kSameDevice);
  } else {
    EXPECT_NE(*route, sched::KvCopyRoute::kSameDevice);
    std::printf("devices 0 -> %d: %s\n", dst_device, sched::kv_copy_route_name(*route));
  }
  for (int l = 0; l < shape.num_layers; ++l) {
    std::vector<char> got(16 * block_bytes);
    ASSERT_TRUE((*b)->copy_d2h(got.data(), (*pb)->layer(l).data, got.size()).ok());
    ASSERT_TRUE((*b)->synchronize().ok());
    for (size_t i = 0; i < src.size(); ++i) {
      EXPECT_EQ(std::memcmp(host[l].data() + src[i] * block_bytes,
                            got.data() + dst[i] * block_bytes, block_bytes),
                0)
          << "layer " << l << " block " << src[i];
    }
  }
}

}  // namespace
}  // namespace kvsplit::testing
