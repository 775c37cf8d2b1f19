// Prefix cache (the temporal cut, kv-cuts.md §3): full KV pages of prompts, keyed by a hash
// chained over the token prefix and salted per tenant, shared across requests. A cached page on
// the device is a block of the owning KvPool that the cache holds one reference on; sequences
// that hit take their own reference. Shared pages are full and never written again (a hit never
// covers the position a sequence computes next), and every page transition (demote, evict, swap)
// replaces the sequence's reference with its own copy, so sharing is copy-on-write by
// construction.
//
// Tiers. Pages only the cache holds are evictable, least recently used first (deepest first on a
// tie, so a chain shrinks from its tail). With a pool attached (KvPool::enable_prefix_cache) an
// evicted page spills down instead of being dropped: to a free host-tier slot (the host slot
// holds every layer), else the host tier's least recently used prefix page moves on to the disk
// tier (one checksummed record per page) to make room; with no host tier, straight to disk. It is
// dropped only when no lower tier takes it. A lookup that reaches a spilled page swaps it back
// into a device block. The priority against the temporal and semantic cuts: the cache only takes
// free host slots and free disk space, and is the first thing reclaimed when swap or a semantic
// original needs a slot (KvPool::allocate_host_slots) or disk space (KvPool::make_disk_room).
//
// Never wrong: an entry names a lower tier only once its copy or write has completed; a failed
// store drops the entry. A disk record carries the page's salt, parent hash, chained hash and
// tokens in its checksummed payload and the salt / hash as its RecordKey; a restore checks all of
// them against the lookup, so a record is read back only for the tenant and prefix it was written
// for. A failed restore (I/O fault, checksum, a mismatch) drops that entry and ends the lookup
// there: the rest of the prompt is recomputed.
//
// Tenants never share pages: the salt (a tenant id or a request's cache_salt) seeds every hash
// and is stored and compared with the tokens, so a lookup never matches another tenant's page,
// even on a hash collision.
//
// Disk spills are asynchronous (docs/kv-tiers.md, "Prefix-cache spills"): a page bound for the
// disk tier is copied into a buffer the spill owns (from its device block or host slot, which are
// free again at once) and written through the tier's asynchronous I/O while the allocation that
// evicted it goes on. Until the write completes the entry is a host page served from that buffer
// (never from the record); completions are finished at the next cache operation or step boundary
// (poll_spills), a failed one drops the entry, and clear() / the destructor wait for the writes
// and free their records.
//
// Shard groups (kv-cuts.md, the spatial cut's "Prefix cache"): every shard's pool has a cache of
// the pages on its device, and a prompt's chain is walked from cache to cache (ChainPos); a peer's
// cache spills to the home pool's host and disk tiers.
//
// Not thread-safe: one owner (the worker that owns the pool).
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "kv/block_allocator.h"
#include "kv/disk_tier.h"

namespace kvsplit::kv {

class KvPool;

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t lookup_pages = 0;    // full pages asked for (the hit-rate denominator)
  int64_t hit_pages = 0;       // pages served from the cache, every tier
  int64_t hit_pages_host = 0;  // of those, swapped in from the host tier
  int64_t hit_pages_disk = 0;  // of those, read back from the disk tier
  int64_t inserted = 0;        // pages registered
  int64_t evicted = 0;         // pages dropped (from any tier), their KV gone
  int64_t spilled_host = 0;    // device pages copied to the host tier
  int64_t spilled_disk = 0;    // pages written to the disk tier (from the device or the host)
  int64_t spill_faults = 0;    // stores that failed (copy or disk write): the page was dropped
  int64_t restore_faults = 0;  // restores that failed (read, checksum, record mismatch): dropped
  int64_t reclaimed = 0;       // host slots / disk records given up for swap or the semantic cut
  // Of hit_pages_disk, those served from a spill's buffer (its disk write still in flight).
  int64_t hit_pages_spilling = 0;
  // Spills that had to wait for an older one's write (disk room, the in-flight cap).
  int64_t spill_waits = 0;
  // Spill-ahead (spill_ahead): device->host copies started between steps, those that landed and
  // freed their block (also counted in spilled_host), and those whose page was taken by a
  // sequence meanwhile (the page stays on the device, its host slot is freed).
  int64_t ahead_started = 0;
  int64_t ahead_spilled = 0;
  int64_t ahead_kept = 0;

  int64_t hit_pages_device() const { return hit_pages - hit_pages_host - hit_pages_disk; }
  PrefixCacheStats& operator+=(const PrefixCacheStats& o);
};

// Bookkeeping is indexed, never a scan of the cache: a server with a large host or disk tier
// caches hundreds of thousands of pages, and the pool asks for the evictable count several times
// per step. Three ordered indices (least recently used first, deepest first on a tie) hold the
// device pages only the cache holds (the allocator tells the cache when a page's count crosses
// 1: BlockWatcher), the host pages and the disk pages that may be moved; evictable(), lru(),
// evict() and spill_ahead() read them (bench_prefix_cache measures it).
class PrefixCache final : private BlockWatcher {
 public:
  // `pool` (may be null: device only, evicted pages are dropped) is the pool whose blocks the
  // cache holds; `tiers` (default: `pool`) the pool whose host tier and disk tier its evicted
  // pages spill to: a peer shard's cache spills to the home shard's tiers (KvPool::add_shards).
  // Both must outlive the cache.
  explicit PrefixCache(int block_size, KvPool* pool = nullptr, KvPool* tiers = nullptr)
      : block_size_(block_size), pool_(pool), tiers_(tiers != nullptr ? tiers : pool) {}
  // Waits for the spill writes in flight and frees their records (the pool's disk tier must still
  // exist: KvPool destroys its cache first).
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Disk spills asynchronous (the default) or written before the evicting allocation goes on (the
  // old path, kept for benchmarks: bench_temporal --spill-alloc compares them).
  void set_async_spills(bool on) { async_spills_ = on; }
  bool async_spills() const { return async_spills_; }
  // Finishes the spill writes that have completed, never blocking: a completed one makes its entry
  // a disk page, a failed one drops its entry. Every cache operation calls it first; the worker
  // calls it at each step boundary. Returns how many it finished.
  int poll_spills();
  // Waits for every spill write in flight and finishes it.
  void wait_spills();
  // Spill writes in flight (their entries count as host pages of no slot: pages_spilling()).
  int spills_in_flight() const { return static_cast<int>(spills_.size()); }
  // At most this many spill writes in flight; a spill past it waits for the oldest first.
  static constexpr int kMaxSpillsInFlight = 16;
  // At most this many disk reads of one acquire in flight, each into a page buffer (reused as the
  // spills' are); a lookup that cannot get a buffer stops there (a miss, the entry kept).
  static constexpr int kMaxRestoresInFlight = 16;

  // The salt of a tenant (or a request's cache_salt): one 64-bit value mixed into every hash.
  // Keyed with the process's secret (SipHash), so clients can neither compute nor collide it.
  static uint64_t salt_of(std::string_view tenant_or_salt);

  // A position in the hash chain of a prompt: page `page` comes next, after the page of hash
  // `parent` whose chain check is `check` (all 0 at the start). A shard group keeps one cache per
  // shard, each holding the pages on its shard's device, and walks a prompt across them:
  // acquire and insert start at a position and leave it where they stopped.
  struct ChainPos {
    int page = 0;
    uint64_t parent = 0;
    uint64_t check = 0;
  };
  // The position after `pos`'s page of `tokens` (which must hold that whole page).
  ChainPos next(uint64_t salt, std::span<const int32_t> tokens, ChainPos pos) const;
  // True when the cache holds `pos`'s page of `tokens` for `salt` (any tier, tokens checked).
  bool contains(uint64_t salt, std::span<const int32_t> tokens, ChainPos pos) const;
  // Counts one lookup of `pages` pages (lookup() and acquire() without a position do; a shard
  // group's walk counts it once, on the home cache), and `pages` hit pages served without being
  // taken (a windowed prompt's pages behind the window, KvPool::share_prefix).
  void note_lookup(int pages) {
    ++stats_.lookups;
    stats_.lookup_pages += std::max(0, pages);
  }
  void note_hits(int pages) { stats_.hit_pages += pages; }

  // Device blocks of the longest cached prefix of `tokens` in whole pages, at most `max_pages`,
  // in page order (each touched as most recently used); it stops at the first page that is not
  // on the device. The caller increfs the ones it keeps.
  std::vector<int32_t> lookup(uint64_t salt, std::span<const int32_t> tokens, int max_pages);
  // The leading run of `tokens`' cached device pages (at most `max_pages`) that a sequence holds
  // too (refcount above the cache's one): lookup() returns them, and taking them costs no block,
  // where an idle one costs one the pool could free. The run ends at the first idle page: an
  // allocation may evict that one, and lookup() would then stop there. Touches nothing and counts
  // nothing.
  int shared_device_pages(uint64_t salt, std::span<const int32_t> tokens, int max_pages,
                          const BlockAllocator& alloc) const;
  // The longest cached prefix of `tokens` (at most `max_pages`), every page brought to the
  // device: spilled pages are swapped back in (host: copied; disk: read, checksum and record
  // checked). Takes one reference on each returned block for the caller. Stops at the first page
  // that is not cached, cannot get a device block, or fails to come back (that entry is dropped).
  // With `at`: pages from at->page on (of tokens, max_pages counted from page 0), `at` is left
  // after the last page returned, and no lookup is counted (the caller counts it: note_lookup).
  std::vector<int32_t> acquire(uint64_t salt, std::span<const int32_t> tokens, int max_pages,
                               BlockAllocator& alloc, ChainPos* at = nullptr);
  // Registers pages [0, num_pages) of `tokens`, held in `blocks`, taking a reference on each page
  // newly cached. Pages already cached on the device are left as they are; a page cached on a
  // lower tier moves to the given block (its host slot or disk record is freed). Returns the
  // number of pages newly cached or brought back to the device. With `at`: pages
  // [at->page, num_pages) (blocks and tokens indexed from page 0), and `at` is left at the first
  // page not registered (num_pages when all were).
  int insert(uint64_t salt, std::span<const int32_t> tokens, std::span<const int32_t> blocks,
             int num_pages, BlockAllocator& alloc, ChainPos* at = nullptr);
  // A chunked prefill's place in its prompt's chain, kept by the sequence across its chunks, so
  // that each chunk's insert starts where the last one stopped instead of at page 0 (O(pages) for
  // a whole prompt, not O(pages^2 / chunk)). The cache checks it before it resumes there.
  struct Cursor {
    // The next page. At the last insert every page before it was a device page of the cache that
    // a sequence held too (never evicted meanwhile).
    ChainPos pos;
    std::vector<uint64_t> hashes;  // of the pages before pos.page, by page
    uint64_t salt = 0;
    uint64_t generation = 0;  // the cache it was left by (0: none)
    uint64_t events = 0;      // the cache's chain events then
    uint64_t tick = 0;        // the use that insert gave the pages it walked (settle)
  };
  // insert() of pages [0, num_pages), resumed at `cursor` when the cache still holds every page
  // before it as it did (a device page that a sequence holds too: no chain event since, see
  // below), so that a walk from page 0 would only touch them; else from page 0. `tokens` must
  // begin with those of the insert that left the cursor (a sequence's tokens only grow), under
  // the same salt. The cursor is left after the leading pages that are such pages. The pages
  // before the cursor are not touched: settle() gives them the use a walk from page 0 would have.
  int insert(uint64_t salt, std::span<const int32_t> tokens, std::span<const int32_t> blocks,
             int num_pages, BlockAllocator& alloc, Cursor& cursor);
  // Gives every page before `cursor` the use of its last insert where its own is older, as
  // inserts from page 0 would have: a sequence's pages then rank for eviction as one chain
  // (deepest first), not chunk by chunk (its first pages first). Call it when the chunks end and
  // before a sequence lets its pages go between chunks. A stale cursor settles too (its pages
  // still cached; one cached again since keeps its newer use); another cache's does nothing.
  void settle(const Cursor& cursor);
  // Chain events kept (below): a cursor that more than this many events happened after is stale.
  static constexpr uint64_t kChainEvents = 4096;
  // Frees `need` device blocks from least recently used pages that only the cache holds (or as
  // many as there are), spilling each down the tiers when it can (see above), else dropping it.
  // Returns how many blocks were freed.
  int evict(int need, BlockAllocator& alloc);
  // Spill-ahead: takes the device->host copy of evicted pages off the allocation path. Between
  // steps, while fewer than `free_target` device blocks are free (counting the copies in
  // flight), device pages only the cache holds, least recently used first, start their copy to a
  // free host slot as one fenced batch each (Backend::copy_batch_fenced: the CUDA copy stream,
  // the CPU backend's copy thread, or at once). Meanwhile the page stays a device page (hits take
  // it as usual). When the copy has landed (poll_landings) the page becomes a host page and its
  // block is free, unless a sequence took it meanwhile: then it stays on the device and the slot
  // is freed. Only free host slots are used (nothing is pushed to disk ahead of need). Returns
  // the copies started.
  int spill_ahead(int free_target, BlockAllocator& alloc);
  // Finishes the spill-ahead copies that have landed, waiting for each at most `wait_us` (< 0:
  // until it lands). Returns the blocks freed.
  int poll_landings(BlockAllocator& alloc, int64_t wait_us = 0);
  int landings_in_flight() const { return static_cast<int>(landing_.size()); }
  // Device pages only the cache holds (free for the asking). O(spill-ahead copies in flight).
  int evictable(const BlockAllocator& alloc) const;
  // Host slots the cache can give up (its host pages not being restored). O(1).
  int reclaimable_host() const;
  // Tests: the indices hold exactly the entries a scan would pick, in their order.
  bool index_consistent() const;
  // Frees `need` host slots by moving the cache's least recently used host pages to free disk
  // space (never making room there) or dropping them. Returns how many slots were freed.
  int reclaim_host(int need);
  // Drops the cache's least recently used disk records until the disk tier has `extents` free
  // extents or the cache has none left. Returns how many records were freed.
  // `whole_group`: the caller (KvPool::make_disk_room over a shard group's caches) has checked
  // that the caches' records together can make the room; else this cache gives up none of its
  // records when dropping all of them would still leave too little.
  int reclaim_disk(int64_t extents, bool whole_group = false);
  // Disk extents the cache's records hold (those being written included).
  int64_t disk_extents_held() const;
  // True when the cache holds a reference on device block `block`.
  bool holds(int32_t block) const { return by_block_.count(block) > 0; }
  int size() const { return static_cast<int>(entries_.size()); }
  int pages_host() const { return pages_host_; }          // in host slots
  int pages_disk() const { return pages_disk_; }          // on disk, their write completed
  int pages_spilling() const { return pages_spilling_; }  // in a spill's buffer, write in flight
  int pages_device() const { return size() - pages_host_ - pages_disk_ - pages_spilling_; }
  // Drops every page (the cache's references, host slots and disk records).
  void clear(BlockAllocator& alloc);
  const PrefixCacheStats& stats() const { return stats_; }
  // Payload bytes of one spilled page's disk record (KV of every layer + the page's key).
  int64_t disk_record_bytes() const;
  // The key that follows a spilled page's KV in its record, for pages of `block_size` tokens.
  static int64_t disk_key_bytes(int block_size);

 private:
  // Ordering of the indices: least recently used first, deepest first on a tie (a chain shrinks
  // from its tail), then the hash (unique).
  struct OrderKey {
    uint64_t last_use = 0;
    int32_t neg_depth = 0;
    uint64_t hash = 0;
    auto operator<=>(const OrderKey&) const = default;
  };
  enum class Index : uint8_t { kNone, kIdleDevice, kHost, kDisk };
  struct Spill;
  struct Entry {
    // kHost with `spill` set: the page is in that spill's buffer, its disk write in flight.
    PageLocation where = PageLocation::kDevice;
    int32_t block = -1;  // kDevice: the device block
    int32_t slot = -1;   // kHost: the host-tier slot (-1 while spilling)
    Spill* spill = nullptr;
    uint64_t record = 0;  // kDisk: the disk record
    uint64_t parent = 0;  // the previous page's hash (0 for the first page)
    uint64_t check = 0;   // chain_check of the prefix up to this page
    uint64_t salt = 0;
    std::vector<int32_t> tokens;  // the page's tokens, compared on every hit
    uint64_t last_use = 0;
    int32_t depth = 0;    // page index in its prompt
    bool pinned = false;  // being restored: never spilled or reclaimed meanwhile
    // A device page whose spill-ahead copy to host slot `landing_slot` is in flight behind
    // `landing_fence` (-1: none); still a device page until poll_landings finishes it.
    int32_t landing_slot = -1;
    uint64_t landing_fence = 0;
    // The index holding the entry, under the key of `indexed_use` (its last_use then).
    Index index = Index::kNone;
    uint64_t indexed_use = 0;
  };
  using Map = std::unordered_map<uint64_t, Entry>;
  // One disk write in flight. `buf` is the record's payload (the page's KV of every layer, as a
  // host slot holds it, then its RecordMeta and tokens) and belongs to the spill until the write
  // completes. `hash` is 0 once the entry left it (restored, recomputed, dropped): the record is
  // then freed when the write completes.
  // A record-sized buffer of the tiers pool's backend's host memory (alloc_host: pinned on CUDA,
  // so a spill's device-to-host copy and a restore's host-to-device copy run at the link's speed,
  // by the copy kernel).
  struct FreeHost {
    backend::Backend* backend;  // no initializer: default-constructible inside the class
    void operator()(std::byte* p) const { backend->free_host(p); }
  };
  using Buffer = std::unique_ptr<std::byte, FreeHost>;
  struct Spill {
    uint64_t hash = 0;
    Buffer buf;
    DiskOp op;
    std::optional<Status> result;  // once the write ended
  };

  // Chain events, for cursors: a device page that left the device (spilled, dropped) or that
  // only the cache holds now (idle), by hash and depth. The last kChainEvents are kept (a ring);
  // a cursor is stale once one of its pages had one, or once more than that many happened.
  struct ChainEvent {
    uint64_t hash = 0;
    int32_t depth = 0;
  };
  void note_chain_event(uint64_t hash, const Entry& e);
  bool cursor_valid(const Cursor& cursor, uint64_t salt) const;
  // insert(): pages [at->page, num_pages) (0 when null); with `cursor`, moved past each leading
  // page that ends as a device page some sequence holds too.
  int insert_chain(uint64_t salt, std::span<const int32_t> tokens, std::span<const int32_t> blocks,
                   int num_pages, BlockAllocator& alloc, ChainPos* at, Cursor* cursor);

  uint64_t page_hash(uint64_t parent, uint64_t salt, std::span<const int32_t> page) const;
  // A second chained hash of the prefix, seeded independently (page_hash and it: 128 bits).
  uint64_t chain_check(uint64_t parent_check, uint64_t salt, std::span<const int32_t> page) const;
  // Entries of the longest chain of `tokens` (salt, parent and tokens checked), touched.
  // From `from` on (its page .. max_pages - 1).
  std::vector<Map::iterator> walk(uint64_t salt, std::span<const int32_t> tokens, int max_pages,
                                  ChainPos from);
  // The entry of `pos`'s page when the cache holds it (salt, chain and tokens checked), else
  // end().
  Map::const_iterator find_page(uint64_t salt, std::span<const int32_t> page, ChainPos pos,
                                uint64_t* hash, uint64_t* check) const;
  // Frees whatever entry (`hash`, `e`) holds on its tier (device reference, host slot, disk
  // record) and takes it out of its index.
  void release_storage(uint64_t hash, Entry& e, BlockAllocator* alloc);
  void drop(Map::iterator it, BlockAllocator* alloc);
  // Spills device page `it` (refcount 1) down the tiers, or drops it; its block is freed.
  void spill(Map::iterator it, BlockAllocator& alloc);
  // A free host slot for a spill: a free one, else one freed by moving the cache's least recently
  // used host page to disk (making room there) or dropping it; -1 when the tier has none.
  int32_t host_slot_for_spill();
  // Moves host page `it` to the disk tier (`make_room`: dropping older disk pages first); drops
  // it when that fails. Its host slot is free afterwards.
  void host_to_disk(Map::iterator it, bool make_room);
  // Makes room on the disk tier for one page record (`make_room`: dropping the cache's older disk
  // pages, waiting for older spills when only they hold the space). False when it cannot.
  bool disk_room(bool make_room);
  // Writes entry `it`'s record from the KV that `fill` copies into the payload's first
  // bytes_per_block bytes; asynchronously unless async spills are off. On success the entry is a
  // spilling host page (or, synchronous, a disk page) and its previous storage is released; on
  // failure nothing changed. `alloc`: for a device entry's block.
  bool start_spill(Map::iterator it, bool make_room, BlockAllocator* alloc,
                   const std::function<Status(std::byte*)>& fill);
  // Finishes `s` (its result known): the entry becomes a disk page, or is dropped on a fault; a
  // detached spill frees its record. Erases it from spills_.
  void finish_spill(std::list<Spill>::iterator s);
  // Waits for the oldest spill whose entry is not pinned and finishes it; false when none.
  bool wait_oldest_spill();
  // The least recently used host page (not spilling) or disk page that is not pinned; end() when
  // none.
  Map::iterator lru(PageLocation where);
  // The index entry `e` belongs in now: device pages only the cache holds, not pinned and not
  // landing (evict and spill_ahead take them in order); host pages not spilling and not pinned;
  // disk pages not pinned.
  Index index_for(const Entry& e) const;
  std::set<OrderKey>* index_set(Index i);
  // Puts entry (`hash`, `e`) in the index its state calls for, under its last_use. Every change
  // of an entry's tier, spill, pin, landing, last_use or sharing is followed by it.
  void reindex(uint64_t hash, Entry& e);
  void unindex(uint64_t hash, Entry& e);
  // A device block the cache holds (by_block_, watched on the allocator) or lets go.
  void bind_block(int32_t block, uint64_t hash, BlockAllocator& alloc);
  void unbind_block(int32_t block);
  void on_sharing_changed(int32_t block) override;
  // Ends entry `e`'s spill-ahead: its copy landed (`landed`), or is abandoned (failed, or the
  // entry leaves). Landed and still only the cache's: a host page, its block freed (true).
  bool finish_landing(uint64_t hash, Entry& e, BlockAllocator* alloc, bool landed);
  // Waits for entry e's spill-ahead copy and frees its slot, keeping the page on the device.
  void cancel_landing(uint64_t hash, Entry& e);

  int block_size_;
  // Unique across caches: a cursor left by another cache is stale.
  uint64_t generation_ = next_generation();
  static uint64_t next_generation();
  std::vector<ChainEvent> chain_events_;  // the ring: event n at n % kChainEvents
  uint64_t num_chain_events_ = 0;
  KvPool* pool_;   // the device blocks
  KvPool* tiers_;  // the host tier and disk tier (pool_'s, or the home shard's)
  uint64_t tick_ = 0;
  Map entries_;                                     // by chained hash
  std::unordered_map<int32_t, uint64_t> by_block_;  // device block -> hash
  BlockAllocator* watched_ = nullptr;               // the device allocator (set at first bind)
  std::set<OrderKey> idle_, host_lru_, disk_lru_;   // the indices (Index)
  int pages_host_ = 0, pages_disk_ = 0, pages_spilling_ = 0;
  PrefixCacheStats stats_;
  bool async_spills_ = true;
  std::list<Spill> spills_;        // in flight, oldest first
  std::vector<uint64_t> landing_;  // hashes of the entries with a spill-ahead copy in flight
  // Buffers of finished spills and restores, reused (a fresh one costs an allocation, pinned on
  // CUDA, and page faults on the allocating path); at most kMaxSpillsInFlight kept.
  std::vector<Buffer> free_bufs_;
  // A buffer of disk_record_bytes(): a kept one, else a new one (null when the allocation fails).
  Buffer take_buffer();
  void give_buffer(Buffer buf);
};

}  // namespace kvsplit::kv
