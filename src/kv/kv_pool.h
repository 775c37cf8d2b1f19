// KvPool: the KV memory of one device, for every layer of one model, plus its block allocator.
// Memory per layer: [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim] of `dtype`.
// A block id names the same page in every layer. Not thread-safe: one owner (a worker).
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "kv/block_allocator.h"
#include "kv/disk_tier.h"
#include "kv/prefix_cache.h"

namespace kvsplit::kv {

struct KvPoolConfig {
  int num_blocks = 0;                           // 0: derive from capacity_bytes
  int block_size = 16;                          // tokens per page
  int64_t capacity_bytes = 0;                   // used when num_blocks == 0
  backend::DType dtype = backend::DType::kF32;  // the CPU backend computes with f32 pages
  // Semantic-cut tiers (kv-cuts.md §1-2); 0 turns each off. Pages demoted to int8 / int4 move to
  // arenas of that many smaller pages, so the full pages they leave are free for other sequences.
  int int8_blocks = 0;
  int int4_blocks = 0;
  // Key summaries (per-channel min/max of every layer) of pages that are not full precision.
  int summary_slots = 0;
  // Each summary covers its page in this many equal parts (kv_quant.h "key summaries"): a tighter
  // recall bound for summary_parts times the bytes. >= 1, divides block_size.
  int summary_parts = 1;
  // Host tier for the full-precision originals of demoted or evicted pages, in bytes (whole
  // pages of all layers; a page that cannot get a slot is not demoted).
  int64_t host_bytes = 0;
  // Prefix cache spill-ahead (PrefixCache::spill_ahead): between steps, keep this many device
  // blocks free by copying the cache's least recently used pages to free host slots ahead of
  // need; 0: off (evicted pages spill on the allocation path only).
  int prefix_free_target = 0;
};

struct KvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

class KvPool {
 public:
  // Full-precision blocks per pool at most (kv.blocks_per_worker's bound; a 140 GB pool of the
  // smallest real model's blocks is far below it).
  static constexpr int kMaxBlocks = 1 << 26;

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
  // Bytes of one full-precision block of every layer for `config` and `shape` (what
  // bytes_per_block() of such a pool returns), e.g. to size the pool before creating it.
  static int64_t block_bytes(const KvPoolConfig& config, const KvShape& shape);
  backend::Backend& backend() const { return backend_; }

  // Grows `table` so it can hold `new_num_tokens` tokens. Returns false (and changes nothing)
  // when the pool has too few free blocks (prefix-cache pages nobody else holds count as free:
  // they are evicted, least recently used first). With a shard group, each new page goes to its
  // preferred_shard, or the next shard with a free block, and the group's free blocks count.
  bool reserve(BlockTable& table, int new_num_tokens);
  // n fresh blocks (refcount 1), evicting unshared prefix-cache pages if needed; nullopt (nothing
  // changed) when fewer are available.
  std::optional<std::vector<int32_t>> allocate_blocks(int n);
  // This pool's own free blocks plus its evictable prefix-cache pages (no peers).
  int local_available() const;
  // What shard `s` can give a placement: its free blocks, and with `evict` its evictable
  // prefix-cache pages too (allocate_placed's count).
  int shard_room(int s, bool evict) const {
    return evict ? shard(s).local_available() : shard(s).allocator().num_free();
  }
  // Free blocks plus the prefix-cache pages only the cache holds: what a scheduler may reserve
  // (over every shard of a shard group).
  int available_blocks() const;
  // Blocks of `table` that release() would make available: full device pages no other table
  // holds (a page the prefix cache also holds becomes evictable).
  int releasable_blocks(const BlockTable& table) const;

  // ---- prefix cache (kv/prefix_cache.h; off unless enabled) ----
  // Its evicted pages spill to this pool's host tier and disk tier when it has them. With a
  // shard group (before or after add_shards) every shard has a cache of the pages on its device,
  // and the peers' caches spill to this (home) pool's tiers.
  void enable_prefix_cache();
  // The home shard's cache (null when off); shard_prefix_cache(s): shard s's.
  PrefixCache* prefix_cache() const { return prefix_.get(); }
  PrefixCache* shard_prefix_cache(int s) const;
  // The caches of every shard together: their stats summed (lookups are the home's), and their
  // pages by tier.
  PrefixCacheStats prefix_stats() const;
  struct PrefixPages {
    int total = 0, device = 0, host = 0, disk = 0, spilling = 0;
  };
  PrefixPages prefix_pages() const;
  // Finishes the prefix caches' spill writes and spill-ahead copies that completed (never
  // blocks; a step boundary).
  void poll_prefix_spills();
  // Between steps: starts the prefix cache's spill-ahead toward config().prefix_free_target free
  // blocks (PrefixCache::spill_ahead). Returns the copies started.
  void set_prefix_free_target(int blocks) { config_.prefix_free_target = blocks; }
  int spill_prefix_ahead() {
    return prefix_ ? prefix_->spill_ahead(config_.prefix_free_target, allocator_) : 0;
  }
  // `table` must be empty: points it at the longest cached prefix of `tokens` (whole pages, at
  // most max_pages), taking a reference on each; spilled pages are swapped back into device
  // blocks first (PrefixCache::acquire). With a shard group each page stays on the shard that
  // cached it (its page entry names it), whatever the sequence's placement would choose.
  // Returns the pages taken (0 without a cache).
  // With `window` > 0 (every layer reads at most that many keys back): the cached pages behind
  // the window of the hit's end are not taken (blocks -1, evicted entries, window_dropped: as
  // kv::drop_behind_window leaves a table), so a hit holds about a window's pages however long
  // the prompt; all or nothing when one the window reads cannot come back.
  int share_prefix(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens, int max_pages,
                   int window = 0);
  // For a KV handoff's destination: `table` must be empty; points it at the leading pages of
  // `tokens` (at most max_pages) that the cache holds on the device, taking a reference on each;
  // nothing is swapped back in, since the handoff's source copies a page at least as fast as a
  // lower tier restores it. Counted as a lookup. 0 without a cache, and on a shard group (a
  // handoff into one takes no cached pages).
  int share_device_prefix(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                          int max_pages);
  // The leading pages share_device_prefix would take now that a sequence already holds: they need
  // no block (PrefixCache::shared_device_pages). 0 where share_device_prefix takes none.
  int shared_device_prefix_pages(uint64_t salt, std::span<const int32_t> tokens,
                                 int max_pages) const;
  // The most pages share_prefix may serve a sequence that must compute `target` positions, of
  // which the first `num_prompt` may be cached (a prompt's; a restart after a recompute
  // preemption under full KV passes its target, sched::cacheable_tokens): whole pages, leaving
  // at least the last position to compute (a first prefill samples from its logits).
  int shareable_prefix_pages(int target, int num_prompt) const {
    return std::max(0, std::min(target - 1, num_prompt)) / block_size();
  }
  // Caches pages [0, num_pages) of `table` (full precision on the device) holding `tokens`, each
  // in the cache of the shard that holds it. With `cursor` (a chunked prefill's, kept by the
  // sequence across its chunks: PrefixCache::Cursor) the walk resumes where the last call left
  // it; a shard group walks from page 0 whatever the cursor.
  void cache_prefix(const BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                    int num_pages, PrefixCache::Cursor* cursor = nullptr);
  // Ends a chunked prefill's cursor: the pages before it get the use of its last call
  // (PrefixCache::settle), and it is reset. When the prefill completes, and before its table is
  // released between chunks.
  void settle_prefix(PrefixCache::Cursor& cursor);
  // Releases every block of `table` (decref) and every quantized page, summary and host slot its
  // page entries hold, and clears it. Restores in flight (BlockTable::restoring) are waited for
  // and their blocks freed; so is a host-tier swap-in prefetch (BlockTable::swap_prefetch).
  void release(BlockTable& table);
  // Releases the pages of `table` past its first BlockTable::blocks_for(num_tokens), each as
  // release() would (speculative decoding: the pages reserved for draft tokens that were
  // rejected). Those pages must be resident and not being restored.
  void release_tail(BlockTable& table, int num_tokens);

  // ---- semantic-cut tiers (empty unless configured) ----
  kernels::QuantPageLayout quant_layout() const {
    return kernels::QuantPageLayout{shape_.num_kv_heads, config_.block_size, shape_.head_dim,
                                    config_.summary_parts};
  }
  // Bytes of one page of one layer at `p` (kFull: the pool's dtype; kEvicted: 0).
  int64_t page_layer_bytes(kernels::KvPrecision p) const;
  // One layer of one page's key summary (f16 min and max per kv head and channel): device memory
  // a page holds beside its quantized copy while it is not full precision, evicted ones included.
  int64_t summary_layer_bytes() const;
  // Base of layer `layer`'s int8 / int4 arena: [num_blocks, quant_layout().bytes(p)] bytes.
  void* arena(kernels::KvPrecision p, int layer) const;
  BlockAllocator& arena_allocator(kernels::KvPrecision p);
  const BlockAllocator& arena_allocator(kernels::KvPrecision p) const;
  // Layer `layer`'s summaries: f16 bits [summary_slots, summary_parts, 2 (min, max),
  // num_kv_heads, head_dim].
  kernels::KvSummaryElem* summaries(int layer) const;
  BlockAllocator& summary_allocator() { return summary_alloc_; }
  const BlockAllocator& summary_allocator() const { return summary_alloc_; }
  // Host tier: slot `slot` holds one full-precision page of every layer, layer after layer.
  std::byte* host_slot(int32_t slot);
  // Device memory of full-precision block `block`, layer `layer`.
  std::byte* full_page(int layer, int32_t block) const;
  // Appends to `out` one copy per layer between device block `block` and `host`
  // (bytes_per_block() bytes, layer after layer: a host slot's layout). Queue them with
  // backend().copy_batch_async(dir, ...); they are done after backend().synchronize().
  void add_page_copies(int32_t block, std::byte* host, backend::Backend::CopyDir dir,
                       std::vector<backend::Backend::CopyRange>* out) const;
  BlockAllocator& host_allocator() { return host_alloc_; }
  // Host slots for the temporal or semantic cut: free slots plus the prefix cache's spilled host
  // pages, which give way first (moved to free disk space, else dropped). allocate_host_slots:
  // n slots (refcount 1), nullopt (nothing changed but reclaimed cache pages) when fewer.
  int available_host_slots() const;
  std::optional<std::vector<int32_t>> allocate_host_slots(int n);
  // Frees the prefix cache's disk records, least recently used first, until the disk tier could
  // hold a record of `payload_bytes` (or the cache has none): swap's records come first.
  void make_disk_room(int64_t payload_bytes);
  const BlockAllocator& host_allocator() const { return host_alloc_; }
  // One full-precision page of every layer on the device (staging for requantization).
  void* scratch_page(int layer) const;

  // The temporal cut's disk tier below the host tier (none unless attached): swapped-out pages
  // go there when the host tier is full, and release() frees a table's record.
  void attach_disk(std::unique_ptr<DiskTier> disk) { disk_ = std::move(disk); }
  // Opens a disk tier of `capacity_bytes` under `path` with extents of about one page of every
  // layer (a swapped sequence is one record) and attaches it. DiskTier::open's errors.
  Status open_disk_tier(const std::string& path, int64_t capacity_bytes, bool direct_io = false);
  DiskTier* disk() const { return disk_.get(); }

  // ---- disk swap write-behind (kv/swap.h, swap_out; docs/kv-tiers.md) ----
  // A disk swap-out's record being written after swap_out returned: the pages' bytes in `staging`
  // (a host buffer the write reads), their device blocks already free. The staging is freed once
  // the write has succeeded (the record is then the copy); a failed write keeps it as the only
  // copy until the swap-in or release. `detached`: the table was released meanwhile, and the
  // record is freed when the write ends.
  struct HostFree {
    backend::Backend* backend;  // no initializer: default-constructible inside the class
    void operator()(std::byte* p) const { backend->free_host(p); }
  };
  using HostBuffer = std::unique_ptr<std::byte, HostFree>;
  struct SwapWrite {
    uint64_t record = 0;
    HostBuffer staging;    // backend alloc_host memory (pinned on CUDA)
    int64_t capacity = 0;  // its size (at least the record's payload)
    DiskOp op;             // reserved by swap_out, then the writer's until it ended
    // Checksums the staging, submits the write and waits for it (DiskTier::submit_write), so
    // the swap-out itself only copies the pages; `status` is its verdict once `ended`.
    std::thread writer;
    std::atomic<bool> ended{false};
    Status status = ok_status();
    std::optional<Status> result;  // once the write ended and the writer was joined
    bool fault_counted = false;
    bool detached = false;
  };
  // Off by default (the swap-out returns once its record is written); the engine turns it on
  // (kv.disk.write_behind).
  void set_disk_write_behind(bool on) { disk_write_behind_ = on; }
  bool disk_write_behind() const { return disk_write_behind_; }
  // Swap writes staged at once at most (in flight or failed): a swap-out past it is written
  // before it returns.
  static constexpr int kMaxSwapWrites = 4;
  std::list<SwapWrite>& swap_writes() { return swap_writes_; }
  // The staged write of record `record`, or null.
  SwapWrite* swap_write(uint64_t record);
  // Whether `w`'s write has ended, never blocking (then its writer is joined and w.result set);
  // wait_swap_write blocks until it has.
  bool poll_swap_write(SwapWrite& w);
  void wait_swap_write(SwapWrite& w);
  // Ends staged write `w` (its write must have ended): its staging is kept as the spare for the
  // next swap write when it is the larger one (one spare at most: a fresh buffer of a record's size
  // costs its page faults, and on CUDA a pinned allocation), and it leaves the list.
  void drop_swap_write(SwapWrite* w);
  // A staging buffer of at least `bytes` and its size: the spare when it is big enough, else a
  // new one (backend alloc_host). give_staging keeps `buf` as the spare when it is the larger.
  StatusOr<std::pair<HostBuffer, int64_t>> take_staging(int64_t bytes);
  void give_staging(HostBuffer buf, int64_t capacity);

  // ---- the spatial cut's shard group (kv-cuts.md §4; none unless added) ----
  // Adds one peer shard per backend: a KvPool of this pool's num_blocks, block_size, dtype,
  // int8 / int4 arenas and summary slots (no host tier, disk or prefix cache: those are the
  // home's) on that backend, which the pool owns.
  // This pool is shard 0 (home). `chunk_tokens` (a positive multiple of block_size) is the unit
  // of placement. Call once, before any table holds pages. kInvalidArgument for bad arguments,
  // the allocation's error when a shard cannot hold its pool.
  Status add_shards(std::vector<std::unique_ptr<backend::Backend>> backends, int chunk_tokens);
  int num_shards() const { return 1 + static_cast<int>(peers_.size()); }
  // Shard s's pool (0: this one).
  KvPool& shard(int s);
  const KvPool& shard(int s) const;
  int chunk_tokens() const { return chunk_tokens_; }
  // The group's backends in shard order (0: this pool's), e.g. for make_shard_communicator.
  std::vector<backend::Backend*> shard_backends() const;
  // The group's communicator (backend/communicator.h), through which the model's sharded
  // attention exchanges; null until set (the model then uses an in-process one of its own). Set
  // once, after add_shards, by whoever assembles the group (the engine, the CLI). Owned by the
  // pool and destroyed before the peers' backends; it may reference only the group's backends
  // (this pool's backend outlives the pool).
  void set_communicator(std::unique_ptr<backend::Communicator> comm) { comm_ = std::move(comm); }
  backend::Communicator* communicator() const { return comm_.get(); }
  // Blocks of the full-precision pool over every shard (what a scheduler may ever reserve), and
  // those in use.
  int total_blocks() const;
  int used_blocks() const;
  // The shard a new page `page` of a table prefers (kv-cuts.md §4 placement): with `spread`,
  // round-robin over the shards in chunks of chunk_tokens (page p is in chunk
  // p * block_size / chunk_tokens, on shard chunk % num_shards); else the home shard. reserve()
  // takes the next shard with room when the preferred one is full.
  int preferred_shard(int page, bool spread) const;
  // A block of the full pool on some shard.
  struct PlacedBlock {
    int shard = 0;
    int32_t block = -1;
  };
  // n fresh blocks for pages first_page .. first_page + n - 1 of a table, each on its
  // preferred_shard or the next shard with room (reserve()'s placement); nullopt (nothing
  // allocated) when the group has fewer than n available. `evict` false: only free blocks count
  // and no shard's prefix-cache page is evicted (a host prefetch, which must not push cached
  // prompts out for a sequence that has not resumed yet).
  std::optional<std::vector<PlacedBlock>> allocate_placed(int first_page, int n, bool spread,
                                                          bool evict = true);
  // Drops one reference on `block` of shard `shard`'s full pool.
  void decref_block(int shard, int32_t block) { shard_alloc(shard).decref(block); }
  // Step scratch on this pool's backend, numbered by the caller (slot >= 0), grown to at least
  // `bytes` (contents not kept when it grows) and freed with the pool: buffers that live on a
  // shard's device belong to the shard, so they never outlive its backend.
  StatusOr<void*> workspace(int slot, size_t bytes);

 private:
  KvPool(backend::Backend& backend, const KvPoolConfig& config, const KvShape& shape);
  // One page of a table being released: its block (on its shard, at its precision), host
  // original and summary.
  void release_page(const PageEntry& page, int32_t block);

  backend::Backend& backend_;
  KvPoolConfig config_;
  KvShape shape_;
  BlockAllocator allocator_;
  std::vector<backend::DeviceBuffer> layers_;  // one buffer per layer
  BlockAllocator int8_alloc_{0}, int4_alloc_{0}, summary_alloc_{0}, host_alloc_{0};
  std::vector<backend::DeviceBuffer> int8_layers_, int4_layers_, summary_layers_;
  backend::DeviceBuffer scratch_;  // [num_layers] full pages
  // The host tier, [host slots, num_layers, full page bytes]: backend_.alloc_host memory (pinned
  // on CUDA, so swaps copy asynchronously at the link's bandwidth).
  HostBuffer host_tier_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<PrefixCache> prefix_;  // after disk_: destroyed first (waits for its writes)
  bool disk_write_behind_ = false;
  std::list<SwapWrite> swap_writes_;  // oldest first; ~KvPool waits for them before disk_ goes
  HostBuffer spare_staging_;
  int64_t spare_capacity_ = 0;
  struct Peer {
    std::unique_ptr<backend::Backend> backend;  // declared first: outlives the pool
    std::unique_ptr<KvPool> pool;
  };
  std::vector<Peer> peers_;
  std::unique_ptr<backend::Communicator> comm_;  // after peers_: destroyed before their backends
  std::vector<backend::DeviceBuffer> workspace_;
  int chunk_tokens_ = 0;

  // share_prefix's walks: appends to `table` the cached pages from `pos` (on shard s's cache)
  // on, cache after cache, at most up to page `pages`; returns how many.
  int take_cached(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens, int pages,
                  PrefixCache::ChainPos pos, int s);
  // The first shard other than `except` whose cache holds `pos`'s page; -1 when none.
  int cache_holding(uint64_t salt, std::span<const int32_t> tokens, PrefixCache::ChainPos pos,
                    int except) const;
  int share_windowed_prefix(BlockTable& table, uint64_t salt, std::span<const int32_t> tokens,
                            int pages, int window);
  BlockAllocator& shard_alloc(int s) { return shard(s).allocator_; }
};

}  // namespace kvsplit::kv
