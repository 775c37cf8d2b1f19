// backend::shard_device: the device rule of a shard group (docs/kv-cuts.md "Shards on the CUDA
// backend").
#include "backend/shard_placement.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvsplit::backend {
namespace {

TEST(ShardDevice, OneDeviceGivesVirtualShards) {
  for (int s = 0; s < 5; ++s) EXPECT_EQ(*shard_device({0}, 0, s), 0) << s;
  for (int s = 0; s < 5; ++s) EXPECT_EQ(*shard_device({3}, 2, s), 3) << s;  // any worker
}

TEST(ShardDevice, SeveralDevicesGiveOneDevicePerShard) {
  const std::vector<int32_t> four{0, 1, 2, 3};
  for (int s = 0; s < 4; ++s) EXPECT_EQ(*shard_device(four, 0, s), s);
  // Worker 1's group starts on its own device, one further along, and wraps around.
  EXPECT_EQ(*shard_device(four, 1, 0), 1);
  EXPECT_EQ(*shard_device(four, 1, 3), 0);
  // More shards than devices: round robin.
  const std::vector<int32_t> two{4, 6};
  EXPECT_EQ(*shard_device(two, 0, 0), 4);
  EXPECT_EQ(*shard_device(two, 0, 1), 6);
  EXPECT_EQ(*shard_device(two, 0, 2), 4);
  EXPECT_EQ(*shard_device(two, 5, 0), 6);  // worker 5: devices[5 % 2]
}

TEST(ShardDevice, BadArguments) {
  EXPECT_EQ(shard_device({}, 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_device({0}, -1, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_device({0}, 0, -1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvsplit::backend
