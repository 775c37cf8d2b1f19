#include "kv/kv_pool.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/check.h"
#include "common/log.h"

namespace kvsplit::kv {
namespace {

// Bytes of one block of one layer: 2 (K, V) x num_kv_heads x block_size x head_dim x dtype.
int64_t layer_block_bytes(const KvPoolConfig& config, const KvShape& shape) {
  return int64_t{2} * shape.num_kv_heads * config.block_size * shape.head_dim *
         static_cast<int64_t>(backend::dtype_size(config.dtype));
}

Status validate(const KvPoolConfig& config, const KvShape& shape) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return invalid_argument("KvPool: bad shape (num_layers " + std::to_string(shape.num_layers) +
                            ", num_kv_heads " + std::to_string(shape.num_kv_heads) + ", head_dim " +
                            std::to_string(shape.head_dim) + "); all must be positive");
  }
  if (config.block_size <= 0) {
    return invalid_argument("KvPool: block_size must be positive, got " +
                            std::to_string(config.block_size));
  }
  if (config.num_blocks < 0) {
    return invalid_argument("KvPool: num_blocks must be >= 0, got " +
                            std::to_string(config.num_blocks));
  }
  if (config.num_blocks == 0 && config.capacity_bytes <= 0) {
    return invalid_argument("KvPool: set num_blocks or a positive capacity_bytes");
  }
  return ok_status();
}

}  // namespace

KvPool::KvPool(backend::Backend& backend, const KvPoolConfig& config, const KvShape& shape)
    : backend_(backend), config_(config), shape_(shape), allocator_(config.num_blocks) {}

KvPool::~KvPool() = default;

StatusOr<std::unique_ptr<KvPool>> KvPool::create(backend::Backend& backend,
                                                 const KvPoolConfig& config, const KvShape& shape) {
  KVSPLIT_RETURN_IF_ERROR(validate(config, shape));
  KvPoolConfig cfg = config;
  const int64_t layer_bytes = layer_block_bytes(cfg, shape);
  const int64_t block_bytes = layer_bytes * shape.num_layers;
  if (cfg.num_blocks == 0) {
    const int64_t n = cfg.capacity_bytes / block_bytes;
    if (n < 1) {
      return invalid_argument("KvPool: capacity_bytes " + std::to_string(cfg.capacity_bytes) +
                              " is smaller than one block (" + std::to_string(block_bytes) +
                              " bytes over " + std::to_string(shape.num_layers) + " layers)");
    }
    cfg.num_blocks = static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int32_t>::max()));
  }
  const int64_t per_layer = layer_bytes * cfg.num_blocks;
  if (per_layer / cfg.num_blocks != layer_bytes ||
      per_layer > static_cast<int64_t>(std::numeric_limits<size_t>::max() / 2)) {
    return invalid_argument("KvPool: " + std::to_string(cfg.num_blocks) +
                            " blocks overflow the addressable size");
  }

  std::unique_ptr<KvPool> pool(new KvPool(backend, cfg, shape));
  pool->layers_.reserve(shape.num_layers);
  for (int l = 0; l < shape.num_layers; ++l) {
    auto buf = backend::DeviceBuffer::make(backend, static_cast<size_t>(per_layer));
    if (!buf.ok()) {
      return buf.status().with_prefix("KvPool: allocating layer " + std::to_string(l) + " (" +
                                      std::to_string(per_layer) + " bytes)");
    }
    KVSPLIT_RETURN_IF_ERROR(backend.memset_zero(buf->get(), buf->bytes()));
    pool->layers_.push_back(std::move(*buf));
  }
  KVSPLIT_LOG_DEBUG("KvPool: {} blocks x {} tokens, {} bytes per block ({} layers, {})",
                    cfg.num_blocks, cfg.block_size, block_bytes, shape.num_layers,
                    backend::dtype_name(cfg.dtype));
  return pool;
}

backend::LayerKv KvPool::layer(int layer) const {
  KVSPLIT_CHECK_MSG(layer >= 0 && layer < shape_.num_layers, "KvPool::layer out of range");
  backend::LayerKv kv;
  kv.data = layers_[layer].get();
  kv.dtype = config_.dtype;
  kv.num_blocks = config_.num_blocks;
  kv.num_kv_heads = shape_.num_kv_heads;
  kv.block_size = config_.block_size;
  kv.head_dim = shape_.head_dim;
  return kv;
}

int64_t KvPool::bytes_per_block() const {
  return layer_block_bytes(config_, shape_) * shape_.num_layers;
}

bool KvPool::reserve(BlockTable& table, int new_num_tokens) {
  KVSPLIT_CHECK(new_num_tokens >= 0);
  const int need = BlockTable::blocks_for(new_num_tokens, config_.block_size) -
                   static_cast<int>(table.blocks.size());
  if (need <= 0) return true;
  auto ids = allocator_.allocate(need);
  if (!ids) return false;
  table.blocks.insert(table.blocks.end(), ids->begin(), ids->end());
  return true;
}

void KvPool::release(BlockTable& table) {
  for (int32_t id : table.blocks) allocator_.decref(id);
  table.blocks.clear();
}

}  // namespace kvsplit::kv
