// Fenced copies (Backend::copy_batch_fenced / wait_fence): synchronous by default on the CPU
// backend; with BackendOptions::async_copies they run on a copy thread, land in order, and a
// bounded wait expires while a (test-delayed) copy is in flight.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"

namespace kvsplit::backend {
namespace {

using CopyRange = Backend::CopyRange;
using CopyDir = Backend::CopyDir;

std::unique_ptr<Backend> cpu(bool async, int64_t delay_us = 0) {
  BackendOptions o;
  o.threads = 1;
  o.async_copies = async;
  o.fenced_copy_delay_us = delay_us;
  return std::move(create_backend("cpu", o)).value();
}

TEST(CopyFence, SynchronousByDefault) {
  auto be = cpu(false);
  std::vector<int> src(1000), dst(1000, 0);
  std::iota(src.begin(), src.end(), 1);
  const CopyRange r{dst.data(), src.data(), src.size() * sizeof(int)};
  auto fence = be->copy_batch_fenced(CopyDir::kHostToDevice, &r, 1);
  ASSERT_TRUE(fence.ok()) << fence.status().to_string();
  EXPECT_EQ(*fence, 0u);  // landed on return
  EXPECT_EQ(dst, src);
  auto done = be->wait_fence(*fence, 0);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

TEST(CopyFence, AsyncCopiesLandInOrderAndABoundedWaitExpiresBeforeThat) {
  // Each batch starts 1 s after it was queued: far longer than the bounded waits below, and than
  // a loaded machine's scheduling delays between the queueing and the polls.
  auto be = cpu(true, 1'000'000);
  std::vector<float> a(4096), b(4096), da(4096, 0.f), db(4096, 0.f);
  std::iota(a.begin(), a.end(), 0.5f);
  std::iota(b.begin(), b.end(), -7.f);
  const CopyRange ra[] = {{da.data(), a.data(), 2048 * sizeof(float)},
                          {da.data() + 2048, a.data() + 2048, 2048 * sizeof(float)}};
  const CopyRange rb{db.data(), b.data(), b.size() * sizeof(float)};
  auto fa = be->copy_batch_fenced(CopyDir::kHostToDevice, ra, 2);
  auto fb = be->copy_batch_fenced(CopyDir::kDeviceToHost, &rb, 1);
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_NE(*fa, 0u);
  EXPECT_GT(*fb, *fa);
  auto polled = be->wait_fence(*fa, 0);
  ASSERT_TRUE(polled.ok());
  EXPECT_FALSE(*polled);
  auto bounded = be->wait_fence(*fa, 2000);  // 2 ms: the copy starts only after 1 s
  ASSERT_TRUE(bounded.ok());
  EXPECT_FALSE(*bounded);
  auto until = be->wait_fence(*fb, -1);  // the later fence landed means the earlier did too
  ASSERT_TRUE(until.ok());
  EXPECT_TRUE(*until);
  auto earlier = be->wait_fence(*fa, 0);
  ASSERT_TRUE(earlier.ok());
  EXPECT_TRUE(*earlier);
  EXPECT_EQ(da, a);
  EXPECT_EQ(db, b);
  auto again = be->wait_fence(*fa, 0);  // reported once, still done
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again);
}

TEST(CopyFence, UnknownFenceAndNullPointersAreErrors) {
  auto be = cpu(true);
  auto unknown = be->wait_fence(12345, 0);
  EXPECT_FALSE(unknown.ok());
  std::vector<char> dst(16);
  const CopyRange bad{dst.data(), nullptr, 16};
  auto f = be->copy_batch_fenced(CopyDir::kHostToDevice, &bad, 1);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
}

TEST(CopyFence, DestroyingTheBackendLandsQueuedCopiesFirst) {
  std::vector<int> src(1 << 16), dst(1 << 16, 0);
  std::iota(src.begin(), src.end(), 3);
  {
    auto be = cpu(true, 20'000);
    const CopyRange r{dst.data(), src.data(), src.size() * sizeof(int)};
    for (int i = 0; i < 4; ++i)
      ASSERT_TRUE(be->copy_batch_fenced(CopyDir::kHostToDevice, &r, 1).ok());
  }
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace kvsplit::backend
