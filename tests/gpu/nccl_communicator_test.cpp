// The NCCL communicator (backend/communicator.h) between CUDA backends: bytes arrive and are
// counted with two GPUs; the argument checks need one. Skips with the reason when built without
// NCCL, without a device, or (two-GPU cases) with fewer than two devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "kernel_test_util.h"

namespace kvsplit::testing {
namespace {

#if defined(KVSPLIT_WITH_NCCL)
#define KVSPLIT_REQUIRE_NCCL() \
  do {                         \
  } while (0)
#else
#define KVSPLIT_REQUIRE_NCCL() GTEST_SKIP() << "built without NCCL (KVSPLIT_WITH_NCCL off)"
#endif

#define KVSPLIT_REQUIRE_DEVICES(n)                                                  \
  do {                                                                              \
    KVSPLIT_REQUIRE_DEVICE();                                                       \
    const int kvsplit_count_ = backend::cuda_device_count();                        \
    if (kvsplit_count_ < (n))                                                       \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << kvsplit_count_; \
  } while (0)

// A device buffer of `from`, freed by its backend.
struct DeviceBuffer {
  backend::Backend* owner = nullptr;
  void* ptr = nullptr;
  DeviceBuffer(backend::Backend& b, size_t bytes) : owner(&b) {
    auto p = b.alloc(bytes);
    if (p.ok()) ptr = *p;
  }
  ~DeviceBuffer() {
    if (ptr) owner->free(ptr);
  }
};

TEST(NcclCommunicator, SendsBetweenTwoGpusAndCounts) {
  KVSPLIT_REQUIRE_NCCL();
  KVSPLIT_REQUIRE_DEVICES(2);
  auto a = backend::create_cuda_backend(0);
  auto b = backend::create_cuda_backend(1);
  ASSERT_TRUE(a.ok() && b.ok());
  backend::Backend* devices[] = {a->get(), b->get()};
  auto comm = backend::make_nccl_communicator(devices);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  EXPECT_STREQ((*comm)->name(), "nccl");

  const size_t n = (1 << 20) + 13;  // not a multiple of any vector width
  std::mt19937 rng(5);
  std::vector<unsigned char> host(n), back(n);
  for (auto& c : host) c = static_cast<unsigned char>(rng());
  DeviceBuffer src(**a, n), mid(**b, n), dst(**a, n);
  ASSERT_TRUE(src.ptr && mid.ptr && dst.ptr);
  ASSERT_TRUE((*a)->copy_h2d(src.ptr, host.data(), n).ok());

  // 0 -> 1, then 1 -> 0 (the partials' way back), each read on the receiver's stream.
  ASSERT_TRUE((*comm)->send(**b, mid.ptr, **a, src.ptr, n).ok());
  ASSERT_TRUE((*b)->copy_d2h(back.data(), mid.ptr, n).ok());
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n), 0) << "device 0 -> 1";
  ASSERT_TRUE((*comm)->send(**a, dst.ptr, **b, mid.ptr, n).ok());
  std::fill(back.begin(), back.end(), 0);
  ASSERT_TRUE((*a)->copy_d2h(back.data(), dst.ptr, n).ok());
  EXPECT_EQ(std::memcmp(back.data(), host.data(), n), 0) << "device 1 -> 0";

  EXPECT_EQ((*comm)->stats().transfers, 2);
  EXPECT_EQ((*comm)->stats().bytes, static_cast<int64_t>(2 * n));
  EXPECT_GT((*comm)->stats().seconds, 0.0);
  std::printf("nccl: %zu bytes each way, %.3f ms per send\n", n,
              1e3 * (*comm)->stats().seconds / 2);

  // Same backend: the caller's bug; zero bytes: nothing moved. Neither is counted.
  EXPECT_EQ((*comm)->send(**a, dst.ptr, **a, src.ptr, n).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->send(**b, mid.ptr, **a, src.ptr, 0).ok());
  EXPECT_EQ((*comm)->stats().transfers, 2);
  (*comm)->reset_stats();
  EXPECT_EQ((*comm)->stats().bytes, 0);
}

TEST(NcclCommunicator, UnsynchronizedSendIsOrderedOnTheReceiver) {
  KVSPLIT_REQUIRE_NCCL();
  KVSPLIT_REQUIRE_DEVICES(2);
  auto a = backend::create_cuda_backend(0);
  auto b = backend::create_cuda_backend(1);
  ASSERT_TRUE(a.ok() && b.ok());
  backend::Backend* devices[] = {a->get(), b->get()};
  backend::NcclCommunicatorOptions options;
  options.synchronize = false;
  auto comm = backend::make_nccl_communicator(devices, options);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  const size_t n = 4096;
  std::vector<unsigned char> host(n), back(n, 0);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 7 + 1);
  DeviceBuffer src(**a, n), dst(**b, n);
  ASSERT_TRUE(src.ptr && dst.ptr);
  ASSERT_TRUE((*a)->copy_h2d(src.ptr, host.data(), n).ok());
  ASSERT_TRUE((*b)->memset_zero(dst.ptr, n).ok());
  ASSERT_TRUE((*comm)->send(**b, dst.ptr, **a, src.ptr, n).ok());
  ASSERT_TRUE((*b)->copy_d2h(back.data(), dst.ptr, n).ok());  // queued after the recv
  EXPECT_EQ(back, host);
  EXPECT_EQ((*comm)->stats().bytes, static_cast<int64_t>(n));
}

TEST(NcclCommunicator, RejectsSameDeviceNonCudaAndStrangers) {
  KVSPLIT_REQUIRE_NCCL();
  KVSPLIT_REQUIRE_DEVICES(1);
  auto a = backend::create_cuda_backend(0);
  auto a2 = backend::create_cuda_backend(0);
  ASSERT_TRUE(a.ok() && a2.ok());
  auto cpu = backend::make_cpu_backend(1);

  backend::Backend* same_device[] = {a->get(), a2->get()};
  auto r = backend::make_nccl_communicator(same_device);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().to_string().find("both on CUDA device 0"), std::string::npos)
      << r.status().to_string();
  backend::Backend* mixed[] = {a->get(), cpu.get()};
  r = backend::make_nccl_communicator(mixed);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().to_string().find("not a CUDA backend"), std::string::npos)
      << r.status().to_string();

  // One rank: valid, but it has no one to send to.
  backend::Backend* one[] = {a->get()};
  auto comm = backend::make_nccl_communicator(one);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  DeviceBuffer x(**a, 64), y(**a2, 64);
  ASSERT_TRUE(x.ptr && y.ptr);
  EXPECT_EQ((*comm)->send(**a, x.ptr, **a, x.ptr, 64).code(), StatusCode::kInvalidArgument);
  const Status stranger = (*comm)->send(**a2, y.ptr, **a, x.ptr, 64);
  EXPECT_EQ(stranger.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(stranger.to_string().find("is not one of its 1 ranks"), std::string::npos)
      << stranger.to_string();
  EXPECT_EQ((*comm)->stats().transfers, 0);
}

}  // namespace
}  // namespace kvsplit::testing
