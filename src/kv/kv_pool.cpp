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
  if (config.num_blocks > KvPool::kMaxBlocks) {
    return invalid_argument("KvPool: num_blocks " + std::to_string(config.num_blocks) +
                            " is more than " + std::to_string(KvPool::kMaxBlocks) +
                            " blocks per pool");
  }
  if (config.int8_blocks < 0 || config.int4_blocks < 0 || config.summary_slots < 0 ||
      config.host_bytes < 0) {
    return invalid_argument(
        "KvPool: int8_blocks, int4_blocks, summary_slots and host_bytes must "
        "be >= 0");
  }
  if (config.summary_parts < 1 || config.block_size % config.summary_parts != 0) {
    return invalid_argument("KvPool: summary_parts " + std::to_string(config.summary_parts) +
                            " must be >= 1 and divide block_size " +
                            std::to_string(config.block_size));
  }
  if ((config.int8_blocks > 0 || config.int4_blocks > 0) && shape.head_dim % 2 != 0) {
    return invalid_argument("KvPool: quantized pages need an even head_dim, got " +
                            std::to_string(shape.head_dim));
  }
  return ok_status();
}

// Allocates `count` zeroed buffers of `bytes` each on `backend`.
Status make_layers(backend::Backend& backend, int count, int64_t bytes, const char* what,
                   std::vector<backend::DeviceBuffer>* out) {
  if (bytes <= 0) return ok_status();
  for (int l = 0; l < count; ++l) {
    auto buf = backend::DeviceBuffer::make(backend, static_cast<size_t>(bytes));
    if (!buf.ok()) {
      return buf.status().with_prefix(std::string("KvPool: allocating ") + what + " of layer " +
                                      std::to_string(l) + " (" + std::to_string(bytes) + " bytes)");
    }
    KVSPLIT_RETURN_IF_ERROR(backend.memset_zero(buf->get(), buf->bytes()));
    out->push_back(std::move(*buf));
  }
  return ok_status();
}

}  // namespace

KvPool::KvPool(backend::Backend& backend, const KvPoolConfig& config, const KvShape& shape)
    : backend_(backend),
      config_(config),
      shape_(shape),
      allocator_(config.num_blocks),
      int8_alloc_(config.int8_blocks),
      int4_alloc_(config.int4_blocks),
      summary_alloc_(config.summary_slots),
      host_alloc_(0) {}

KvPool::~KvPool() {
  // Swap writes still staged: the writes end before their buffers and the tier go, and a record
  // a write completed is freed (no table names it any more).
  for (SwapWrite& w : swap_writes_) {
    wait_swap_write(w);
    if (w.result->ok()) (void)disk_->free(w.record);
  }
  swap_writes_.clear();
}

KvPool::SwapWrite* KvPool::swap_write(uint64_t record) {
  for (SwapWrite& w : swap_writes_)
    if (w.record == record && !w.detached) return &w;
  return nullptr;
}

bool KvPool::poll_swap_write(SwapWrite& w) {
  if (w.result) return true;
  if (!w.ended.load(std::memory_order_acquire)) return false;
  if (w.writer.joinable()) w.writer.join();
  w.result = w.status;
  return true;
}

void KvPool::wait_swap_write(SwapWrite& w) {
  if (w.result) return;
  if (w.writer.joinable()) w.writer.join();
  w.result = w.status;
}

void KvPool::drop_swap_write(SwapWrite* w) {
  KVSPLIT_CHECK(w->result.has_value());  // the write no longer reads the staging
  give_staging(std::move(w->staging), w->capacity);
  swap_writes_.remove_if([w](const SwapWrite& x) { return &x == w; });
}

void KvPool::give_staging(HostBuffer buf, int64_t capacity) {
  if (buf && capacity > spare_capacity_) {
    spare_staging_ = std::move(buf);
    spare_capacity_ = capacity;
  }
}

StatusOr<std::pair<KvPool::HostBuffer, int64_t>> KvPool::take_staging(int64_t bytes) {
  if (spare_staging_ && spare_capacity_ >= bytes) {
    const int64_t capacity = spare_capacity_;
    spare_capacity_ = 0;
    return std::pair{std::move(spare_staging_), capacity};
  }
  KVSPLIT_ASSIGN_OR_RETURN(void* mem, backend_.alloc_host(static_cast<size_t>(bytes)));
  return std::pair{HostBuffer(static_cast<std::byte*>(mem), HostFree{&backend_}), bytes};
}

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
    // Checked before anything is allocated: the block allocator's bookkeeping alone for 2^31
    // blocks is gigabytes, allocated before the pool's memory could fail cleanly.
    if (n > kMaxBlocks) {
      return invalid_argument("KvPool: capacity_bytes " + std::to_string(cfg.capacity_bytes) +
                              " (kv.capacity_mb) gives " + std::to_string(n) + " blocks of " +
                              std::to_string(block_bytes) + " bytes, more than " +
                              std::to_string(kMaxBlocks) + " per pool");
    }
    cfg.num_blocks = static_cast<int>(n);
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
  const kernels::QuantPageLayout ql = pool->quant_layout();
  const int L = shape.num_layers;
  if (cfg.int8_blocks > 0) {
    KVSPLIT_RETURN_IF_ERROR(make_layers(backend, L,
                                        ql.bytes(kernels::KvPrecision::kInt8) * cfg.int8_blocks,
                                        "the int8 arena", &pool->int8_layers_));
  }
  if (cfg.int4_blocks > 0) {
    KVSPLIT_RETURN_IF_ERROR(make_layers(backend, L,
                                        ql.bytes(kernels::KvPrecision::kInt4) * cfg.int4_blocks,
                                        "the int4 arena", &pool->int4_layers_));
  }
  if (cfg.summary_slots > 0) {
    const int64_t per_slot = pool->summary_layer_bytes();
    KVSPLIT_RETURN_IF_ERROR(
        make_layers(backend, L, per_slot * cfg.summary_slots, "summaries", &pool->summary_layers_));
  }
  if (cfg.int8_blocks > 0 || cfg.int4_blocks > 0) {
    auto buf = backend::DeviceBuffer::make(backend, static_cast<size_t>(block_bytes));
    if (!buf.ok()) return buf.status().with_prefix("KvPool: allocating the staging page");
    pool->scratch_ = std::move(*buf);
  }
  const int64_t host_slots = cfg.host_bytes / block_bytes;
  if (host_slots > 0) {
    const int n = static_cast<int>(std::min<int64_t>(host_slots, 1 << 30));
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(block_bytes);
    StatusOr<void*> mem = backend.alloc_host(bytes);
    if (!mem.ok())
      return mem.status().with_prefix("KvPool: allocating the " + std::to_string(bytes) +
                                      "-byte host tier");
    pool->host_tier_ = HostBuffer(static_cast<std::byte*>(*mem), HostFree{&backend});
    pool->host_alloc_ = BlockAllocator(n);
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

int64_t KvPool::block_bytes(const KvPoolConfig& config, const KvShape& shape) {
  return layer_block_bytes(config, shape) * shape.num_layers;
}

bool KvPool::reserve(BlockTable& table, int new_num_tokens) {
  KVSPLIT_CHECK(new_num_tokens >= 0);
  const int need = BlockTable::blocks_for(new_num_tokens, config_.block_size) -
                   static_cast<int>(table.blocks.size());
  if (need <= 0) return true;
  if (peers_.empty()) {
    auto ids = allocate_blocks(need);
    if (!ids) return false;
    table.blocks.insert(table.blocks.end(), ids->begin(), ids->end());
    if (!table.pages.empty()) table.pages.resize(table.blocks.size());
    return true;
  }
  auto placed = allocate_placed(static_cast<int>(table.blocks.size()), need, table.spread);
  if (!placed) return false;
  if (table.pages.empty()) table.pages.resize(table.blocks.size());
  for (const PlacedBlock& p : *placed) {
    table.blocks.push_back(p.block);
    PageEntry pe;
    pe.shard = static_cast<uint8_t>(p.shard);
    table.pages.push_back(pe);
  }
  return true;
}

std::optional<std::vector<KvPool::PlacedBlock>> KvPool::allocate_placed(int first_page, int n,
                                                                        bool spread, bool evict) {
  // Place every page first, then allocate per shard (all or nothing).
  const int S = num_shards();
  std::vector<int> avail(S), count(S, 0), where(n);
  for (int s = 0; s < S; ++s) avail[s] = shard_room(s, evict);
  for (int k = 0; k < n; ++k) {
    int s = preferred_shard(first_page + k, spread);
    int tries = 0;
    while (avail[s] == 0 && tries++ < S) s = (s + 1) % S;
    if (avail[s] == 0) return std::nullopt;  // the group is full: nothing allocated yet
    --avail[s];
    ++count[s];
    where[k] = s;
  }
  std::vector<std::vector<int32_t>> ids(S);
  for (int s = 0; s < S; ++s) {
    if (count[s] == 0) continue;
    // With `evict`: the shard's cached pages make room.
    auto got = evict ? shard(s).allocate_blocks(count[s]) : shard(s).allocator().allocate(count[s]);
    KVSPLIT_CHECK_MSG(got.has_value(), "KvPool: a shard lost the blocks it counted");
    ids[s] = std::move(*got);
  }
  std::vector<PlacedBlock> out(n);
  std::vector<size_t> next(S, 0);
  for (int k = 0; k < n; ++k) out[k] = PlacedBlock{where[k], ids[where[k]][next[where[k]]++]};
  return out;
}

Status KvPool::add_shards(std::vector<std::unique_ptr<backend::Backend>> backends,
                          int chunk_tokens) {
  if (!peers_.empty()) return failed_precondition("KvPool::add_shards: already has shards");
  if (allocator_.num_used() != 0)
    return failed_precondition("KvPool::add_shards: the pool already holds pages");
  if (chunk_tokens <= 0 || chunk_tokens % config_.block_size != 0)
    return invalid_argument("spatial_chunk_size " + std::to_string(chunk_tokens) +
                            " must be a positive multiple of the block size " +
                            std::to_string(config_.block_size));
  // Sharded attention merges one partial per shard (Backend::kMaxMergeParts).
  if (backends.size() + 1 > static_cast<size_t>(backend::Backend::kMaxMergeParts))
    return invalid_argument("a shard group has at most " +
                            std::to_string(backend::Backend::kMaxMergeParts) +
                            " shards, asked for " + std::to_string(backends.size() + 1));
  KvPoolConfig pc;
  pc.num_blocks = config_.num_blocks;
  pc.block_size = config_.block_size;
  pc.dtype = config_.dtype;
  // The semantic cut's arenas and key summaries of the pages a shard holds live on that shard;
  // their full-precision originals go to the home host tier.
  pc.int8_blocks = config_.int8_blocks;
  pc.int4_blocks = config_.int4_blocks;
  pc.summary_slots = config_.summary_slots;
  pc.summary_parts = config_.summary_parts;
  // All or nothing: the group changes only once every peer's pool exists (a half-added group
  // would count shards with no chunk size to place pages by).
  for (const auto& be : backends)
    if (be == nullptr) return invalid_argument("KvPool::add_shards: null backend");
  std::vector<Peer> added;
  for (auto& be : backends) {
    Peer peer;
    peer.backend = std::move(be);
    KVSPLIT_ASSIGN_OR_RETURN(peer.pool, KvPool::create(*peer.backend, pc, shape_));
    added.push_back(std::move(peer));
  }
  for (Peer& p : added) peers_.push_back(std::move(p));
  chunk_tokens_ = chunk_tokens;
  if (prefix_) enable_prefix_cache();  // the peers' caches
  return ok_status();
}

KvPool& KvPool::shard(int s) {
  KVSPLIT_CHECK_MSG(s >= 0 && s < num_shards(), "KvPool::shard out of range");
  return s == 0 ? *this : *peers_[s - 1].pool;
}

const KvPool& KvPool::shard(int s) const { return const_cast<KvPool*>(this)->shard(s); }

std::vector<backend::Backend*> KvPool::shard_backends() const {
  std::vector<backend::Backend*> out{&backend_};
  for (const Peer& p : peers_) out.push_back(p.backend.get());
  return out;
}

int KvPool::total_blocks() const {
  int n = allocator_.num_blocks();
  for (const Peer& p : peers_) n += p.pool->allocator_.num_blocks();
  return n;
}

int KvPool::used_blocks() const {
  int n = allocator_.num_used();
  for (const Peer& p : peers_) n += p.pool->allocator_.num_used();
  return n;
}

StatusOr<void*> KvPool::workspace(int slot, size_t bytes) {
  KVSPLIT_CHECK(slot >= 0);
  if (static_cast<size_t>(slot) >= workspace_.size()) workspace_.resize(slot + 1);
  backend::DeviceBuffer& buf = workspace_[slot];
  if (buf.get() == nullptr || buf.bytes() < bytes) {
    buf.reset();
    KVSPLIT_ASSIGN_OR_RETURN(buf,
                             backend::DeviceBuffer::make(backend_, std::max<size_t>(bytes, 64)));
  }
  return buf.get();
}

int KvPool::preferred_shard(int page, bool spread) const {
  if (!spread || peers_.empty()) return 0;
  const int64_t chunk = int64_t{page} * config_.block_size / chunk_tokens_;
  return static_cast<int>(chunk % num_shards());
}

std::optional<std::vector<int32_t>> KvPool::allocate_blocks(int n) {
  if (prefix_ && allocator_.num_free() < n) {
    if (allocator_.num_free() + prefix_->evictable(allocator_) < n) return std::nullopt;
    prefix_->evict(n - allocator_.num_free(), allocator_);
  }
  return allocator_.allocate(n);
}

int KvPool::local_available() const {
  return allocator_.num_free() + (prefix_ ? prefix_->evictable(allocator_) : 0);
}

int KvPool::available_blocks() const {
  int n = local_available();
  for (const Peer& p : peers_) n += p.pool->local_available();
  return n;
}

int KvPool::releasable_blocks(const BlockTable& table) const {
  int n = 0;
  for (size_t i = 0; i < table.blocks.size(); ++i) {
    const int s = table.page(i).shard;
    if (!table.pages.empty() &&
        (!table.pages[i].resident() || table.pages[i].precision != kernels::KvPrecision::kFull))
      continue;
    const int32_t b = table.blocks[i];
    const KvPool& at = shard(s);
    const int others = at.allocator_.refcount(b) - 1 - (at.prefix_ && at.prefix_->holds(b) ? 1 : 0);
    n += others == 0;
  }
  return n;
}

Status KvPool::open_disk_tier(const std::string& path, int64_t capacity_bytes, bool direct_io) {
  DiskTierConfig dc;
  dc.path = path;
  dc.capacity_bytes = capacity_bytes;
  dc.direct_io = direct_io;
  // One extent holds a spilled prefix page (its KV and key); a swapped run of n pages takes at
  // most n extents.
  dc.extent_bytes =
      (bytes_per_block() + PrefixCache::disk_key_bytes(config_.block_size) + 4095) / 4096 * 4096;
  KVSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> disk, DiskTier::open(dc));
  attach_disk(std::move(disk));
  return ok_status();
}

void KvPool::enable_prefix_cache() {
  if (!prefix_) prefix_ = std::make_unique<PrefixCache>(config_.block_size, this);
  // A peer shard's cache holds the pages on its device and spills them to this (home) pool's
  // host and disk tiers; the home cache counts the lookups (share_prefix).
  for (Peer& p : peers_) {
    if (p.pool->prefix_) continue;
    p.pool->prefix_ = std::make_unique<PrefixCache>(config_.block_size, p.pool.get(), this);
  }
}

PrefixCache* KvPool::shard_prefix_cache(int s) const { return shard(s).prefix_.get(); }

PrefixCacheStats KvPool::prefix_stats() const {
  PrefixCacheStats sum;
  for (int s = 0; s < num_shards(); ++s)
    if (const PrefixCache* pc = shard(s).prefix_.get()) sum += pc->stats();
  return sum;
}

KvPool::PrefixPages KvPool::prefix_pages() const {
  PrefixPages n;
  for (int s = 0; s < num_shards(); ++s) {
    const PrefixCache* pc = shard(s).prefix_.get();
    if (pc == nullptr) continue;
    n.total += pc->size();
    n.device += pc->pages_device();
    n.host += pc->pages_host();
    n.disk += pc->pages_disk();
    n.spilling += pc->pages_spilling();
  }
  return n;
}

int KvPool::available_host_slots() const {
  int n = host_alloc_.num_free();
  for (int s = 0; s < num_shards(); ++s)
    if (const PrefixCache* pc = shard(s).prefix_.get()) n += pc->reclaimable_host();
  return n;
}

std::optional<std::vector<int32_t>> KvPool::allocate_host_slots(int n) {
  // Every shard's cache spills to this host tier: the home cache gives way first, then the
  // peers' in order.
  if (prefix_ && host_alloc_.num_free() < n && available_host_slots() >= n)
    for (int s = 0; s < num_shards() && host_alloc_.num_free() < n; ++s)
      if (PrefixCache* pc = shard(s).prefix_.get()) pc->reclaim_host(n - host_alloc_.num_free());
  return host_alloc_.allocate(n);
}

void KvPool::make_disk_room(int64_t payload_bytes) {
  if (!prefix_ || !disk_) return;
  if (peers_.empty()) {
    prefix_->reclaim_disk(DiskTier::extents_for(payload_bytes, disk_->stats().extent_bytes));
    return;
  }
  // Every shard's cache spills here: nothing is given up unless their records together can make
  // the room (the write would fail all the same), then the home cache's go first.
  prefix_->poll_spills();
  DiskTierStats ds = disk_->stats();
  const int64_t extents = DiskTier::extents_for(payload_bytes, ds.extent_bytes);
  int64_t held = 0;
  for (int s = 0; s < num_shards(); ++s) held += shard(s).prefix_->disk_extents_held();
  if (extents > ds.extents_total || ds.extents_total - ds.extents_used + held < extents) return;
  for (int s = 0; s < num_shards() && ds.extents_total - ds.extents_used < extents; ++s) {
    shard(s).prefix_->reclaim_disk(extents, /*whole_group=*/true);
    ds = disk_->stats();
  }
}

void KvPool::poll_prefix_spills() {
  for (int s = 0; s < num_shards(); ++s) {
    KvPool& at = shard(s);
    if (!at.prefix_) continue;
    at.prefix_->poll_spills();
    at.prefix_->poll_landings(at.allocator_, 0);
  }
}

int KvPool::share_prefix(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                         int max_pages, int window) {
  KVSPLIT_CHECK(table.blocks.empty());
  table.pages.clear();
  if (!prefix_ || max_pages <= 0) return 0;
  const int pages = std::min<int>(max_pages, static_cast<int>(tokens.size()) / block_size());
  if (window > 0) return share_windowed_prefix(table, salt, tokens, pages, window);
  if (peers_.empty()) {
    table.blocks = prefix_->acquire(salt, tokens, pages, allocator_);
    return static_cast<int>(table.blocks.size());
  }
  prefix_->note_lookup(pages);  // one lookup, counted by the home cache
  take_cached(table, salt, tokens, pages, PrefixCache::ChainPos{}, 0);
  if (!table.sharded()) table.pages.clear();  // every hit on the home shard: the default entries
  return static_cast<int>(table.blocks.size());
}

int KvPool::share_device_prefix(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                                int max_pages) {
  KVSPLIT_CHECK(table.blocks.empty());
  table.pages.clear();
  if (!prefix_ || !peers_.empty() || max_pages <= 0) return 0;
  table.blocks = prefix_->lookup(salt, tokens, max_pages);
  for (int32_t b : table.blocks) allocator_.incref(b);
  return static_cast<int>(table.blocks.size());
}

int KvPool::shared_device_prefix_pages(uint64_t salt, std::span<const int32_t> tokens,
                                       int max_pages) const {
  if (!prefix_ || !peers_.empty() || max_pages <= 0) return 0;
  return prefix_->shared_device_pages(salt, tokens, max_pages, allocator_);
}

int KvPool::take_cached(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                        int pages, PrefixCache::ChainPos pos, int s) {
  // Each page is cached by the shard whose device holds it: walk the prompt from cache to cache,
  // taking from each the run of pages it holds next.
  int taken = 0;
  while (pos.page < pages) {
    PrefixCache& pc = *shard(s).prefix_;
    for (int32_t b : pc.acquire(salt, tokens, pages, shard(s).allocator_, &pos)) {
      table.blocks.push_back(b);
      PageEntry pe;
      pe.shard = static_cast<uint8_t>(s);
      table.pages.push_back(pe);
      ++taken;
    }
    // Held here still, it could not come back (no block, a failed restore): the rest is
    // recomputed. Else the shard whose cache holds the next page goes on, if any.
    if (pos.page >= pages || pc.contains(salt, tokens, pos)) break;
    s = cache_holding(salt, tokens, pos, s);
    if (s < 0) break;
  }
  return taken;
}

int KvPool::cache_holding(uint64_t salt, std::span<const int32_t> tokens, PrefixCache::ChainPos pos,
                          int except) const {
  for (int t = 0; t < num_shards(); ++t)
    if (t != except && shard(t).prefix_->contains(salt, tokens, pos)) return t;
  return -1;
}

int KvPool::share_windowed_prefix(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                                  int pages, int window) {
  // How far the chain goes (nothing taken yet), then the pages the next query still reads: those
  // behind every layer's window (kv::drop_behind_window's rule at the hit's end) are skipped,
  // never brought to the device, exactly as if they had been computed and dropped.
  std::vector<PrefixCache::ChainPos> at{PrefixCache::ChainPos{}};
  for (int s = 0; at.back().page < pages;) {
    if (!shard(s).prefix_->contains(salt, tokens, at.back()))
      s = cache_holding(salt, tokens, at.back(), s);
    if (s < 0) break;
    at.push_back(prefix_->next(salt, tokens, at.back()));
  }
  const int hits = at.back().page;
  const int first_key = hits * block_size() - window + 1;
  const int skip = std::min(hits, first_key > 0 ? first_key / block_size() : 0);
  prefix_->note_lookup(pages);  // one lookup, counted by the home cache
  if (hits == 0) return 0;
  table.blocks.assign(static_cast<size_t>(skip), -1);
  PageEntry dropped;
  dropped.location = PageLocation::kEvicted;
  dropped.precision = kernels::KvPrecision::kEvicted;
  table.pages.assign(static_cast<size_t>(skip), dropped);
  table.window_dropped = skip;
  const int start = cache_holding(salt, tokens, at[static_cast<size_t>(skip)], -1);
  const int taken =
      start < 0 ? 0 : take_cached(table, salt, tokens, hits, at[static_cast<size_t>(skip)], start);
  if (skip + taken < hits) {
    // A page the window still reads did not come back: the skipped ones are of no use without
    // it. Nothing is taken (the pages stay cached); the prompt is computed.
    release(table);
    return 0;
  }
  prefix_->note_hits(skip);  // served by the cache too: never computed
  if (peers_.empty() && skip == 0) table.pages.clear();
  return hits;
}

void KvPool::cache_prefix(const BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                          int num_pages, PrefixCache::Cursor* cursor) {
  if (!prefix_) return;
  num_pages = std::min<int>(num_pages, static_cast<int>(table.blocks.size()));
  // Only the leading pages that are full precision on a device. Pages dropped behind a sliding
  // window were offered when they were computed: the cache touches those it still holds and
  // stops at the first it does not (PrefixCache::insert, block -1).
  int n = table.pages.empty() ? std::max(0, num_pages) : 0;
  while (n < num_pages &&
         (n < table.window_dropped ||
          (table.pages[n].resident() && table.pages[n].precision == kernels::KvPrecision::kFull)))
    ++n;
  if (peers_.empty()) {
    if (cursor != nullptr) {
      prefix_->insert(salt, tokens, table.blocks, n, allocator_, *cursor);
    } else {
      prefix_->insert(salt, tokens, table.blocks, n, allocator_);
    }
    return;
  }
  // A shard group: each page goes to the cache of the shard whose device holds it, in runs of
  // pages on one shard. A page some shard's cache holds already is touched there (its block, on
  // another shard maybe, is not offered: -1).
  n = std::min<int>(n, static_cast<int>(tokens.size()) / block_size());
  std::vector<int32_t> offered(static_cast<size_t>(n), -1);
  PrefixCache::ChainPos pos;
  while (pos.page < n) {
    const int i = pos.page;
    int t = -1;
    for (int u = 0; u < num_shards() && t < 0; ++u)
      if (shard(u).prefix_->contains(salt, tokens, pos)) t = u;
    const bool held = t >= 0;
    if (!held) t = table.page(static_cast<size_t>(i)).shard;
    // The run ends before a page another shard's cache holds: that one is touched there, never
    // cached a second time here.
    auto held_elsewhere = [&](const PrefixCache::ChainPos& q) {
      for (int u = 0; u < num_shards(); ++u)
        if (u != t && shard(u).prefix_->contains(salt, tokens, q)) return true;
      return false;
    };
    int j = i;
    PrefixCache::ChainPos q = pos;
    while (j < n && table.blocks[j] >= 0 && table.page(static_cast<size_t>(j)).shard == t) {
      if (j > i && held_elsewhere(q)) break;
      offered[j] = table.blocks[j];
      if (++j < n) q = prefix_->next(salt, tokens, q);
    }
    if (j == i) {
      if (!held) break;  // not on a device and not cached: nothing past it is reachable
      j = i + 1;         // touched where it is cached
    }
    shard(t).prefix_->insert(salt, tokens, offered, j, shard(t).allocator_, &pos);
    std::fill(offered.begin() + i, offered.begin() + j, -1);
    if (pos.page == i) break;  // a collision, or a page it could not take
  }
}

void KvPool::settle_prefix(PrefixCache::Cursor& cursor) {
  if (prefix_) prefix_->settle(cursor);
  cursor = {};
}

void KvPool::release_page(const PageEntry& page, int32_t block) {
  KvPool& at = shard(page.shard);  // arenas and summaries of the shard holding the page
  if (page.resident()) {
    if (page.precision == kernels::KvPrecision::kFull)
      at.allocator_.decref(block);
    else
      at.arena_allocator(page.precision).decref(block);
  }
  if (page.original >= 0 && page.location != PageLocation::kDisk) host_alloc_.decref(page.original);
  if (page.summary >= 0) at.summary_alloc_.decref(page.summary);
}

void KvPool::release_tail(BlockTable& table, int num_tokens) {
  KVSPLIT_CHECK(table.pages.empty() || table.pages.size() == table.blocks.size());
  const size_t keep = static_cast<size_t>(BlockTable::blocks_for(num_tokens, config_.block_size));
  if (table.blocks.size() <= keep) return;
  KVSPLIT_CHECK(static_cast<size_t>(table.window_dropped) <= keep);
  for (size_t i = keep; i < table.blocks.size(); ++i) {
    KVSPLIT_CHECK(table.page(i).resident() && !table.page(i).restoring);
    release_page(table.page(i), table.blocks[i]);
  }
  table.blocks.resize(keep);
  if (!table.pages.empty()) table.pages.resize(keep);
}

void KvPool::release(BlockTable& table) {
  KVSPLIT_CHECK(table.pages.empty() || table.pages.size() == table.blocks.size());
  // Restores in flight: their copies land (the host original is freed below, and the block may
  // be handed out next), then their blocks go back. A failed copy changes nothing here: the
  // block is freed unread either way.
  for (const PendingRestore& r : table.restoring) {
    KvPool& at = shard(r.shard);
    (void)at.backend().wait_fence(r.fence, -1);
    at.allocator_.decref(r.block);
    if (r.arena >= 0) at.arena_allocator(r.precision).decref(r.arena);  // a quantized recall's
    if (static_cast<size_t>(r.page) < table.pages.size()) table.pages[r.page].restoring = false;
  }
  table.restoring.clear();
  // A host-tier swap-in prefetch (kv/swap.h): its copies land first (they read the host slots
  // freed below and write blocks that may be handed out next), then its blocks go back.
  for (const PendingRestore& r : table.swap_prefetch) {
    KvPool& at = shard(r.shard);
    (void)at.backend().wait_fence(r.fence, -1);
    at.allocator_.decref(r.block);
  }
  table.swap_prefetch.clear();
  for (size_t i = 0; i < table.blocks.size(); ++i) release_page(table.page(i), table.blocks[i]);
  if (table.disk_record != 0) {
    KVSPLIT_CHECK(disk_ != nullptr);
    SwapWrite* w = swap_write(table.disk_record);
    if (w != nullptr && !poll_swap_write(*w)) {
      w->detached = true;  // still being written: the record is freed when the write ends
    } else {
      // kNotFound only if already freed (a failed write's record, freed by the tier).
      (void)disk_->free(table.disk_record);
      if (w != nullptr) drop_swap_write(w);
    }
    table.disk_record = 0;
  }
  table.blocks.clear();
  table.pages.clear();
  table.window_dropped = 0;
}

int64_t KvPool::summary_layer_bytes() const {
  return quant_layout().summary_elems() * static_cast<int64_t>(sizeof(kernels::KvSummaryElem));
}

int64_t KvPool::page_layer_bytes(kernels::KvPrecision p) const {
  switch (p) {
    case kernels::KvPrecision::kFull:
      return layer_block_bytes(config_, shape_);
    case kernels::KvPrecision::kInt8:
    case kernels::KvPrecision::kInt4:
      return quant_layout().bytes(p);
    case kernels::KvPrecision::kEvicted:
      return 0;
  }
  return 0;
}

void* KvPool::arena(kernels::KvPrecision p, int layer) const {
  KVSPLIT_CHECK_MSG(layer >= 0 && layer < shape_.num_layers, "KvPool::arena layer out of range");
  const auto& v = p == kernels::KvPrecision::kInt8 ? int8_layers_ : int4_layers_;
  KVSPLIT_CHECK_MSG(p == kernels::KvPrecision::kInt8 || p == kernels::KvPrecision::kInt4,
                    "KvPool::arena: int8 or int4 only");
  return v.empty() ? nullptr : v[layer].get();
}

BlockAllocator& KvPool::arena_allocator(kernels::KvPrecision p) {
  KVSPLIT_CHECK_MSG(p == kernels::KvPrecision::kInt8 || p == kernels::KvPrecision::kInt4,
                    "KvPool::arena_allocator: int8 or int4 only");
  return p == kernels::KvPrecision::kInt8 ? int8_alloc_ : int4_alloc_;
}

const BlockAllocator& KvPool::arena_allocator(kernels::KvPrecision p) const {
  return const_cast<KvPool*>(this)->arena_allocator(p);
}

kernels::KvSummaryElem* KvPool::summaries(int layer) const {
  KVSPLIT_CHECK_MSG(layer >= 0 && layer < shape_.num_layers, "KvPool::summaries out of range");
  return summary_layers_.empty() ? nullptr : summary_layers_[layer].get<kernels::KvSummaryElem>();
}

std::byte* KvPool::host_slot(int32_t slot) {
  KVSPLIT_CHECK_MSG(slot >= 0 && slot < host_alloc_.num_blocks(), "KvPool::host_slot out of range");
  return host_tier_.get() + static_cast<size_t>(slot) * static_cast<size_t>(bytes_per_block());
}

std::byte* KvPool::full_page(int layer, int32_t block) const {
  KVSPLIT_CHECK_MSG(
      layer >= 0 && layer < shape_.num_layers && block >= 0 && block < config_.num_blocks,
      "KvPool::full_page out of range");
  return static_cast<std::byte*>(layers_[layer].get()) +
         int64_t{block} * layer_block_bytes(config_, shape_);
}

void KvPool::add_page_copies(int32_t block, std::byte* host, backend::Backend::CopyDir dir,
                             std::vector<backend::Backend::CopyRange>* out) const {
  const int64_t lb = layer_block_bytes(config_, shape_);
  for (int l = 0; l < shape_.num_layers; ++l) {
    std::byte* dev = full_page(l, block);
    std::byte* h = host + l * lb;
    if (dir == backend::Backend::CopyDir::kDeviceToHost)
      out->push_back({h, dev, static_cast<size_t>(lb)});
    else
      out->push_back({dev, h, static_cast<size_t>(lb)});
  }
}

void* KvPool::scratch_page(int layer) const {
  KVSPLIT_CHECK_MSG(scratch_.get() != nullptr, "KvPool: no quantized arenas");
  return scratch_.get<std::byte>() + layer * layer_block_bytes(config_, shape_);
}

}  // namespace kvsplit::kv
