// KvPool: the KV memory of one device, for every layer of one model, plus its block allocator.
// Memory per layer: [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim] of `dtype`.
// A block id names the same page in every layer. Not thread-safe: one owner (a worker).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kv/block_allocator.h"

namespace kvsplit::kv {

struct KvPoolConfig {
  int num_blocks = 0;                           // 0: derive from capacity_bytes
  int block_size = 16;                          // tokens per page
  int64_t capacity_bytes = 0;                   // used when num_blocks == 0
  backend::DType dtype = backend::DType::kF32;  // the CPU backend computes with f32 pages
};

struct KvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

class KvPool {
 public:
  // Allocates the pages on `backend` (which must outlive the pool). kInvalidArgument for a bad
  // config, kResourceExhausted when the device cannot hold it.
  static StatusOr<std::unique_ptr<KvPool>> create(backend::Backend& backend,
                                                  const KvPoolConfig& config, const KvShape& shape);
  ~KvPool();

  backend::LayerKv layer(int layer) const;
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }
  const KvPoolConfig& config() const { return config_; }
  const KvShape& shape() const { return shape_; }
  int block_size() const { return config_.block_size; }
  int64_t bytes_per_block() const;  // all layers
  backend::Backend& backend() const { return backend_; }

  // Grows `table` so it can hold `new_num_tokens` tokens. Returns false (and changes nothing)
  // when the pool has too few free blocks.
  bool reserve(BlockTable& table, int new_num_tokens);
  // Releases every block of `table` (decref) and clears it.
  void release(BlockTable& table);

 private:
  KvPool(backend::Backend& backend, const KvPoolConfig& config, const KvShape& shape);

  backend::Backend& backend_;
  KvPoolConfig config_;
  KvShape shape_;
  BlockAllocator allocator_;
  std::vector<backend::DeviceBuffer> layers_;  // one buffer per layer
};

}  // namespace kvsplit::kv
