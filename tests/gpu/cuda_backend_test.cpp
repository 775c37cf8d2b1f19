// CudaBackend through the Backend interface: creation, memory, GEMM against the CPU backend, and
// a clear error without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/cuda_util.h"
#include "kernel_test_util.h"
#include "oracle/attention_oracle.h"

namespace kvsplit::testing {
namespace {

TEST(CudaBackend, NoDeviceIsUnavailableElseCreates) {
  std::string why;
  auto b = backend::create_cuda_backend(0);
  if (!device_available(&why)) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().to_string();
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_GT((*b)->parallelism(), 0);
  EXPECT_EQ(backend::create_cuda_backend(1000).status().code(), StatusCode::kInvalidArgument);
}

// Only "the batch API is missing" turns cudaMemcpyBatchAsync off (then one copy per piece); any
// other error is the batch's own and is returned. cudaErrorInvalidValue once counted as missing,
// which hid real errors of a batch and left batching off for good; so did cudaErrorNotSupported,
// which the driver gives one batch for pageable host memory. Needs no device.
TEST(CudaBackend, OnlyAMissingBatchApiTurnsBatchedCopiesOff) {
  using backend::cuda::batch_copy_unsupported_here;
  using backend::cuda::kBatchNotSupportedRun;
  EXPECT_TRUE(backend::cuda::batch_copy_api_missing(cudaErrorCallRequiresNewerDriver));
  EXPECT_FALSE(backend::cuda::batch_copy_api_missing(cudaErrorNotSupported));
  // NotSupported turns it off only when every batch so far was refused, many in a row.
  EXPECT_FALSE(batch_copy_unsupported_here(cudaErrorNotSupported, 1, false));
  EXPECT_FALSE(
      batch_copy_unsupported_here(cudaErrorNotSupported, kBatchNotSupportedRun - 1, false));
  EXPECT_TRUE(batch_copy_unsupported_here(cudaErrorNotSupported, kBatchNotSupportedRun, false));
  EXPECT_FALSE(batch_copy_unsupported_here(cudaErrorNotSupported, kBatchNotSupportedRun, true));
  EXPECT_FALSE(batch_copy_unsupported_here(cudaErrorInvalidValue, kBatchNotSupportedRun, false));
  for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorIllegalAddress, cudaErrorMemoryAllocation,
                        cudaErrorInvalidDevicePointer, cudaErrorLaunchFailure}) {
    EXPECT_FALSE(backend::cuda::batch_copy_api_missing(e)) << cudaGetErrorName(e);
    const Status st = backend::cuda::cuda_status(e, "cudaMemcpyBatchAsync");
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(cudaGetErrorName(e)), std::string::npos) << st.to_string();
  }
}

// Time marks are CUDA events on the stream: the span between two marks is the device time of the
// work queued between them, read without synchronizing the stream in between.
TEST(CudaBackend, TimeMarksTimeTheQueuedWork) {
  KVSPLIT_REQUIRE_DEVICE();
  auto b = backend::create_cuda_backend(0);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  backend::Backend& be = **b;
  auto buf = backend::DeviceBuffer::make(be, size_t{1} << 30);
  ASSERT_TRUE(buf.ok());
  auto a = be.mark_time();
  auto m = be.mark_time();  // nothing between a and m
  ASSERT_TRUE(a.ok() && m.ok());
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(be.memset_zero(buf->get(), buf->bytes()).ok());
  auto z = be.mark_time();
  ASSERT_TRUE(z.ok());
  auto empty = be.seconds_between(*a, *m);
  auto work = be.seconds_between(*m, *z);  // waits for z
  ASSERT_TRUE(empty.ok() && work.ok()) << work.status().to_string();
  EXPECT_GE(*empty, 0.0);
  // 16 GiB written: well over 0.1 ms at any HBM bandwidth, well under 1 s. gpu-check.sh runs the
  // tests as shards that time-slice the GPU, and a slice can fall between a and m, so the empty
  // span is only asserted shorter than the work, not by a factor.
  EXPECT_GT(*work, 1e-4);
  EXPECT_LT(*work, 1.0);
  EXPECT_GT(*work, *empty);
  EXPECT_EQ(be.seconds_between(*a, *z + 1).status().code(), StatusCode::kInvalidArgument);
  be.release_time_marks();
  EXPECT_EQ(be.seconds_between(*a, *z).status().code(), StatusCode::kInvalidArgument);
  auto again = be.mark_time();  // events are reused
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0);
}

TEST(CudaBackend, GemmMatchesCpuForEachWeightType) {
  KVSPLIT_REQUIRE_DEVICE();
  const int m = 7, n = 96, k = 288;
  oracle::Rng rng(3);
  std::vector<float> x(m * k), w(n * k), bias(n);
  for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : w) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : bias) v = static_cast<float>(rng.uniform(-1, 1));
  auto cpu = backend::make_cpu_backend(1);
  std::vector<float> want(m * n);
  auto wv = cpu->upload_matrix(w.data(), backend::DType::kF32, n, k);
  ASSERT_TRUE(wv.ok());
  ASSERT_TRUE(cpu->gemm(x.data(), m, *wv, bias.data(), want.data(), false).ok());
  for (backend::DType dt : {backend::DType::kF32, backend::DType::kBF16, backend::DType::kF16}) {
    backend::CudaBackendOptions opt;
    opt.weight_dtype = dt;
    auto b = backend::create_cuda_backend(0, opt);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    backend::Backend& g = **b;
    auto gw = g.upload_matrix(w.data(), backend::DType::kF32, n, k);
    ASSERT_TRUE(gw.ok());
    auto dx = backend::DeviceBuffer::make(g, x.size() * 4);
    auto db = backend::DeviceBuffer::make(g, bias.size() * 4);
    auto dout = backend::DeviceBuffer::make(g, want.size() * 4);
    ASSERT_TRUE(dx.ok() && db.ok() && dout.ok());
    ASSERT_TRUE(g.copy_h2d(dx->get(), x.data(), x.size() * 4).ok());
    ASSERT_TRUE(g.copy_h2d(db->get(), bias.data(), bias.size() * 4).ok());
    ASSERT_TRUE(g.gemm(dx->get<float>(), m, *gw, db->get<float>(), dout->get<float>(), false).ok());
    std::vector<float> got(want.size());
    ASSERT_TRUE(g.copy_d2h(got.data(), dout->get(), got.size() * 4).ok());
    // bf16/f16 round x and w (8 / 11 significant bits); k = 288 terms of magnitude <= 1.
    const double atol =
        dt == backend::DType::kF32 ? 1e-4 : (dt == backend::DType::kF16 ? 2e-2 : 1.5e-1);
    const oracle::Comparison c =
        oracle::compare(got.data(), std::vector<double>(want.begin(), want.end()), atol, 0);
    EXPECT_TRUE(c.ok) << backend::dtype_name(dt) << ": " << c.message;
  }
}

}  // namespace
}  // namespace kvsplit::testing
