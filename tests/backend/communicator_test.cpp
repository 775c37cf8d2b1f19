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

// host_bytes counts the sends staged through host memory only: `b` refuses direct reads (the
// route of GPUs without peer access), so what it receives is staged; what `a` receives from it is
// a direct copy between CPU backends, in one memory.
TEST(InProcessCommunicator, CountsOnlyHostStagedBytesAsHostBytes) {
  auto a = backend::make_cpu_backend(1, -1, 0);
  auto b = backend::make_cpu_backend(1, -1, 1, /*emulate_no_peer_access=*/true);
  auto c = backend::make_cpu_backend(1, -1, 2);
  auto comm = backend::make_in_process_communicator();
  std::vector<float> src(8, 1.f), dst(8, 0.f);
  ASSERT_TRUE(comm->send(*a, dst.data(), *c, src.data(), 16).ok());  // direct
  EXPECT_EQ(comm->stats().host_bytes, 0);
  ASSERT_TRUE(comm->send(*a, dst.data(), *b, src.data(), 8).ok());  // a reads b directly
  EXPECT_EQ(comm->stats().host_bytes, 0);
  ASSERT_TRUE(comm->send(*b, dst.data(), *a, src.data(), 12).ok());  // b does not: staged
  EXPECT_EQ(comm->stats().host_bytes, 12);
  EXPECT_EQ(comm->stats().bytes, 36);
  backend::ExchangeStats sum;
  sum.add(comm->stats());
  sum.add(comm->stats());
  EXPECT_EQ(sum.host_bytes, 24);
}

// ---- which link an exchange crosses (exchange_link), on every case ----

TEST(ExchangeLinkRule, OnlyStagedSendsCrossTheHostLink) {
  using backend::DeviceKind;
  using backend::ExchangeLink;
  struct Case {
    backend::ShardDeviceInfo from, to;
    bool direct;
    ExchangeLink link;
  };
  const Case cases[] = {
      {{DeviceKind::kCpu, 0}, {DeviceKind::kCpu, 1}, true, ExchangeLink::kLocal},  // CPU shards
      {{DeviceKind::kCpu, 0}, {DeviceKind::kCpu, 0}, true, ExchangeLink::kLocal},
      {{DeviceKind::kCuda, 0}, {DeviceKind::kCuda, 0}, true, ExchangeLink::kLocal},  // virtual
      {{DeviceKind::kCuda, 0}, {DeviceKind::kCuda, 1}, true, ExchangeLink::kPeer},   // NVLink/P2P
      {{DeviceKind::kCuda, 1}, {DeviceKind::kCuda, 0}, false, ExchangeLink::kHost},  // no P2P
      {{DeviceKind::kCpu, 0}, {DeviceKind::kCpu, 1}, false, ExchangeLink::kHost},    // emulated
      {{DeviceKind::kCpu, 0}, {DeviceKind::kCuda, 0}, false, ExchangeLink::kHost},
  };
  for (const Case& k : cases) {
    EXPECT_EQ(backend::exchange_link(k.from, k.to, k.direct), k.link)
        << backend::exchange_link_name(k.link) << " expected, devices " << k.from.device << " -> "
        << k.to.device << ", direct " << k.direct;
  }
  EXPECT_STREQ(backend::exchange_link_name(ExchangeLink::kHost), "host");
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

// ---- the group's communicator rule (choose_communicator), on every case ----

using backend::choose_communicator;
using backend::DeviceKind;
using backend::ShardDeviceInfo;

std::vector<ShardDeviceInfo> cuda_on(std::vector<int> devices) {
  std::vector<ShardDeviceInfo> out;
  for (int d : devices) out.push_back({DeviceKind::kCuda, d});
  return out;
}

std::vector<ShardDeviceInfo> cpu_shards(int n) {
  std::vector<ShardDeviceInfo> out;
  for (int s = 0; s < n; ++s) out.push_back({DeviceKind::kCpu, s});  // virtual device ids
  return out;
}

TEST(CommunicatorRule, InProcessIsAlwaysInProcess) {
  for (bool built : {false, true}) {
    for (const auto& shards : {cpu_shards(2), cuda_on({0, 1}), cuda_on({0, 0})}) {
      auto c = choose_communicator(SpatialCommunicator::kInProcess, shards, built);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      EXPECT_FALSE(c->nccl);
      EXPECT_NE(c->reason.find("in_process"), std::string::npos) << c->reason;
    }
  }
}

TEST(CommunicatorRule, AutoPicksNcclOnlyForCudaShardsOnDistinctDevicesWithNccl) {
  struct Case {
    std::vector<ShardDeviceInfo> shards;
    bool built;
    bool nccl;
    const char* why;  // in the reason
  };
  const Case cases[] = {
      {cuda_on({0, 1}), true, true, "distinct devices"},
      {cuda_on({2, 0, 1, 3}), true, true, "4 CUDA shards"},
      {cuda_on({0}), true, true, "1 CUDA shards"},  // a one-rank group is legal
      {cpu_shards(2), true, false, "shard 0 is not a CUDA backend"},
      {cpu_shards(3), false, false, "built without NCCL"},
      // A CPU shard among CUDA ones (not a configuration the engine builds; the rule still holds).
      {{{DeviceKind::kCuda, 0}, {DeviceKind::kCpu, 1}}, true, false, "shard 1 is not a CUDA"},
      // Virtual shards: two shards on one GPU.
      {cuda_on({0, 0}), true, false, "shards 0 and 1 are both on CUDA device 0"},
      {cuda_on({0, 1, 0, 1}), true, false, "shards 0 and 2 are both on CUDA device 0"},
      {cuda_on({1, 2, 2}), true, false, "shards 1 and 2 are both on CUDA device 2"},
      // Distinct GPUs but no NCCL in the binary.
      {cuda_on({0, 1}), false, false, "built without NCCL"},
  };
  for (const Case& k : cases) {
    auto c = choose_communicator(SpatialCommunicator::kAuto, k.shards, k.built);
    ASSERT_TRUE(c.ok()) << k.why << ": " << c.status().to_string();
    EXPECT_EQ(c->nccl, k.nccl) << k.why << ": " << c->reason;
    EXPECT_NE(c->reason.find(k.why), std::string::npos) << c->reason;
    EXPECT_NE(c->reason.find("auto"), std::string::npos) << c->reason;
    EXPECT_NE(c->reason.find(k.nccl ? "nccl" : "in-process"), std::string::npos) << c->reason;
  }
}

TEST(CommunicatorRule, NcclIsNcclOrAClearErrorNeverAFallback) {
  auto ok = choose_communicator(SpatialCommunicator::kNccl, cuda_on({0, 1, 2}), true);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE(ok->nccl);
  struct Case {
    std::vector<ShardDeviceInfo> shards;
    bool built;
    StatusCode code;
    const char* why;
  };
  const Case cases[] = {
      {cuda_on({0, 1}), false, StatusCode::kUnimplemented, "built without NCCL"},
      {cpu_shards(2), false, StatusCode::kUnimplemented, "built without NCCL"},
      {cpu_shards(2), true, StatusCode::kInvalidArgument, "shard 0 is not a CUDA backend"},
      {cuda_on({0, 0}), true, StatusCode::kInvalidArgument, "both on CUDA device 0"},
      {cuda_on({3, 1, 3}), true, StatusCode::kInvalidArgument, "shards 0 and 2"},
  };
  for (const Case& k : cases) {
    auto c = choose_communicator(SpatialCommunicator::kNccl, k.shards, k.built);
    ASSERT_FALSE(c.ok()) << k.why;
    EXPECT_EQ(c.status().code(), k.code) << c.status().to_string();
    const std::string msg = c.status().to_string();
    EXPECT_NE(msg.find("kv.cuts.spatial.communicator"), std::string::npos) << msg;
    EXPECT_NE(msg.find(k.why), std::string::npos) << msg;
  }
  EXPECT_EQ(choose_communicator(SpatialCommunicator::kAuto, {}, true).status().code(),
            StatusCode::kInvalidArgument);
}

// make_shard_communicator applies the rule to real backends: on CPU backends auto and in_process
// give the in-process communicator, nccl the rule's error for this build.
TEST(CommunicatorRule, ShardCommunicatorOnCpuBackends) {
  auto a = backend::make_cpu_backend(1, -1, 0);
  auto b = backend::make_cpu_backend(1, -1, 1);
  backend::Backend* shards[] = {a.get(), b.get()};
  for (SpatialCommunicator mode : {SpatialCommunicator::kAuto, SpatialCommunicator::kInProcess}) {
    auto c = backend::make_shard_communicator(mode, shards);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_NE(c->comm, nullptr);
    EXPECT_STREQ(c->comm->name(), "in-process");
    float x = 3, y = 0;
    ASSERT_TRUE(c->comm->send(*b, &y, *a, &x, sizeof(x)).ok());
    EXPECT_EQ(y, 3);
  }
  auto n = backend::make_shard_communicator(SpatialCommunicator::kNccl, shards);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), backend::nccl_communicator_built() ? StatusCode::kInvalidArgument
                                                                  : StatusCode::kUnimplemented)
      << n.status().to_string();
#if defined(KVSPLIT_WITH_NCCL)
  EXPECT_TRUE(backend::nccl_communicator_built());
#else
  EXPECT_FALSE(backend::nccl_communicator_built());
#endif
}

}  // namespace
}  // namespace kvsplit::testing
