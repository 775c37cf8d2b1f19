// Where the shards of a spatial-cut shard group run (docs/kv-cuts.md "Shards on the CUDA backend").
// A pure host function, shared by the engine and the CLI.
#pragma once

#include <cstdint>
#include <vector>

#include "kvsplit/status.h"

namespace kvsplit::backend {

// The device of shard `shard` (0: the home) of a group whose home runs on entry `home_index` of
// `devices` (the devices the group may use, in order): entry (home_index + shard) mod
// devices.size(). With one device every shard is a virtual shard on it (its own backend, so its
// own stream and memory pools); with at least as many devices as shards, each shard of a group
// has a device of its own, and with several groups (workers) they start one device apart.
// kInvalidArgument for an empty list or a negative index.
inline StatusOr<int32_t> shard_device(const std::vector<int32_t>& devices, int home_index,
                                      int shard) {
  if (devices.empty()) return invalid_argument("shard_device: no devices");
  if (home_index < 0 || shard < 0)
    return invalid_argument("shard_device: negative home index or shard");
  const size_t n = devices.size();
  return devices[(static_cast<size_t>(home_index) % n + static_cast<size_t>(shard) % n) % n];
}

}  // namespace kvsplit::backend
