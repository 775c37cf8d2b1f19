// Block ids and reference counts; no memory (the KvPool owns that). "Cannot fit" is a return
// value, not an error. Not thread-safe: one owner (a worker) drives it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kv/page_entry.h"

namespace kvsplit::kv {

// Told when a watched block's reference count crosses 1 (becomes shared, or sole again): the
// prefix cache keeps the pages only it holds (its evictable ones) in order without scanning.
class BlockWatcher {
 public:
  virtual void on_sharing_changed(int32_t block) = 0;

 protected:
  ~BlockWatcher() = default;
};

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  // n fresh blocks with refcount 1, or nullopt (nothing allocated) when fewer than n are free.
  std::optional<std::vector<int32_t>> allocate(int n);
  void incref(int32_t block);
  // Drops one reference; the block is free again when its count reaches 0.
  void decref(int32_t block);
  int refcount(int32_t block) const;
  // One watcher at most (null: none). A watched block's count going 1 -> 2 or 2 -> 1 calls
  // `watcher->on_sharing_changed(block)` after the change; other blocks cost one flag test.
  void set_watcher(BlockWatcher* watcher) { watcher_ = watcher; }
  void watch(int32_t block, bool on);

  int num_blocks() const { return static_cast<int>(refcount_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks() - num_free(); }

 private:
  std::vector<int32_t> free_;      // stack of free ids
  std::vector<int32_t> refcount_;  // [num_blocks]
  std::vector<uint8_t> watched_;   // [num_blocks]
  BlockWatcher* watcher_ = nullptr;
};

// Logical -> physical block ids of one sequence (block i holds its tokens
// [i * block_size, (i + 1) * block_size)). How many tokens are written is the owner's (a
// Sequence's num_computed), not the table's.
//
// `pages` is empty while every page is full precision and resident (the only state before a cut
// acts), else it has one entry per block: blocks[i] is then the page's id in the arena of
// pages[i].precision (the KvPool's full pool, int8 or int4 arena), or -1 when evicted.
// A restore of one page to full precision whose copy is in flight (kv/page_ops.h): the block it
// goes to, allocated on `shard`, and the copy's Backend fence. The page keeps its old state
// (PageEntry::restoring) until complete_restores commits it.
struct PendingRestore {
  int32_t page = 0;
  int32_t block = -1;
  uint8_t shard = 0;
  uint64_t fence = 0;
  int64_t started_ns = 0;  // steady clock, when the copy was queued
  bool late = false;       // a bounded wait already expired on it (counted once)
  bool failed = false;     // its copy failed (a host prefetch's: swap_in copies it again)
  // A recall at a quantized rung (the semantic cut's recall_precision): `block` is a full block
  // the original lands in, quantized into page `arena` of that rung's arena on `shard` once it
  // has landed, then freed. kFull: `block` is the page's new home.
  kernels::KvPrecision precision = kernels::KvPrecision::kFull;
  int32_t arena = -1;
};

struct BlockTable {
  std::vector<int32_t> blocks;
  std::vector<PageEntry> pages;
  // Restores in flight (the semantic cut's asynchronous recall). Whoever moves or frees the
  // table's pages settles them first (complete_restores with no bound; KvPool::release waits and
  // frees their blocks).
  std::vector<PendingRestore> restoring;
  // The temporal cut's host-tier prefetch (kv/swap.h, start_host_prefetch): for each kHost page
  // of a swapped-out table, the device block reserved for it a step before its swap-in and the
  // fence of the copy of its host slot into that block (one fenced batch per shard). The pages
  // keep their host state (the slot is their copy) until swap_in commits them; dropping the
  // prefetch (drop_host_prefetch, KvPool::release) waits for the fences and frees the blocks.
  std::vector<PendingRestore> swap_prefetch;
  // The temporal cut's disk record holding the table's kDisk pages (page i at record index
  // pages[i].original); 0: none. Freed with the table (KvPool::release).
  uint64_t disk_record = 0;
  // The spatial cut: whether new pages are placed across the pool's shard group (in chunks,
  // KvPool::reserve) rather than on its home shard first. A property of the sequence, kept by
  // KvPool::release.
  bool spread = false;
  // Sliding windows: pages [0, window_dropped) were dropped because every layer's window had
  // passed them (kv::drop_behind_window): no copy of them is left anywhere and no query reads
  // them again. Their blocks are -1 and their entries evicted. Reset by KvPool::release.
  int window_dropped = 0;

  // The entry of page i: `pages[i]`, or the default (full precision on the home device) while
  // `pages` is empty.
  PageEntry page(size_t i) const { return pages.empty() ? PageEntry{} : pages[i]; }
  // True when some page lives on a shard other than the home one (PageEntry::shard).
  bool sharded() const {
    for (const PageEntry& p : pages)
      if (p.shard != 0) return true;
    return false;
  }
  // How many distinct shards hold this table's device pages (1 without a shard group; 0 when
  // it holds none).
  int shards_used() const {
    if (blocks.empty()) return 0;
    uint64_t seen = pages.empty() ? 1 : 0;
    for (const PageEntry& p : pages)
      if (p.resident()) seen |= uint64_t{1} << (p.shard & 63);
    return __builtin_popcountll(seen);
  }

  // Blocks of the full-precision pool the table holds (all of them until a cut moved pages out).
  int full_blocks() const {
    if (pages.empty()) return static_cast<int>(blocks.size());
    int n = 0;
    for (const PageEntry& p : pages)
      n += p.resident() && p.precision == kernels::KvPrecision::kFull;
    return n;
  }
  // True when every page is full precision and resident (pages empty or all kFull on device),
  // those dropped behind the window aside (never read).
  bool all_full() const {
    for (size_t i = static_cast<size_t>(window_dropped); i < pages.size(); ++i)
      if (pages[i].precision != kernels::KvPrecision::kFull || !pages[i].resident()) return false;
    return true;
  }

  // Blocks needed to hold `tokens` tokens.
  static int blocks_for(int tokens, int block_size) {
    return (tokens + block_size - 1) / block_size;
  }
};

}  // namespace kvsplit::kv
