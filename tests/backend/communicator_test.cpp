// backend::Communicator on the CPU: the in-process communicator moves and counts bytes; the NCCL
// communicator's factory answers with a clear error on any build (kUnimplemented without NCCL,
// kInvalidArgument for backends that are not CUDA backends with it), never a crash.
#include "backend/communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace kvsplit::testing {
namespace {

TEST(InProcessCommunicator, MovesAndCountsBytes) {
  auto a = backend::make_cpu_backend(1, -1, 0);
  auto b = backend::make_cpu_backend(1, -1, 1, /*emulate_no_peer_access=*/true);
  auto comm = backend::make_in_process_communicator();
  std::vector<float> src = {1, 2, 3, 4, 5}, dst(5, 0), dst2(5, 0);
  const size_t bytes = src.size() * sizeof(float);
  ASSERT_TRUE(comm->send(*b, dst.data(), *a, src.data(), bytes).ok());
  EXPECT_EQ(dst, src);
  ASSERT_TRUE(comm->send(*a, dst2.data(), *b, dst.data(), bytes).ok());
  EXPECT_EQ(dst2, src);
  EXPECT_EQ(comm->stats().transfers, 2);
  EXPECT_EQ(comm->stats().bytes, static_cast<int64_t>(2 * bytes));
  EXPECT_EQ(comm->send(*a, dst.data(), *a, src.data(), bytes).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->send(*b, dst.data(), *a, src.data(), 0).ok());
  EXPECT_EQ(comm->stats().transfers, 2);
}

TEST(NcclCommunicator, FactoryErrorsClearlyWithoutCudaBackends) {
  auto a = backend::make_cpu_backend(1, -1, 0);
  auto b = backend::make_cpu_backend(1, -1, 1);
  backend::Backend* devices[] = {a.get(), b.get()};
  auto comm = backend::make_nccl_communicator(devices);
  ASSERT_FALSE(comm.ok());
  const std::string msg = comm.status().to_string();
#if defined(KVSPLIT_WITH_NCCL)
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find("not a CUDA backend"), std::string::npos) << msg;
  EXPECT_EQ(backend::make_nccl_communicator({}).status().code(), StatusCode::kInvalidArgument);
#else
  EXPECT_EQ(comm.status().code(), StatusCode::kUnimplemented) << msg;
  EXPECT_NE(msg.find("not built into this binary"), std::string::npos) << msg;
  EXPECT_EQ(backend::make_nccl_communicator({}).status().code(), StatusCode::kUnimplemented);
#endif
}

}  // namespace
}  // namespace kvsplit::testing
