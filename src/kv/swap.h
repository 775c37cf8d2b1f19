// Swapping a sequence's pages between the device pool and the host tier (the temporal cut,
// kv-cuts.md §3): a paused sequence gives its full-precision device pages back to the pool and
// resumes later, bit-exactly, without recompute.
//
// Page states (kv/page_entry.h): a swapped-out page has location kHost, precision kFull, its
// block set to -1 and `original` naming the host slot that holds it (its only copy). Pages the
// semantic cut moved into the int8 / int4 arenas stay there (they are small and hold no full-pool
// block); evicted pages stay evicted. So a swap out and in leaves every page bit-exact.
//
// A table spread over a shard group (the spatial cut) swaps the same way: each page is copied out
// of the shard that holds it (PageEntry::shard) into the home pool's host tier or disk record, and
// swap_in places it again by the group's placement rule (KvPool::allocate_placed), possibly on
// another shard (PageEntry::shard and blocks[i] updated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::kv {

struct SwapStats {
  int64_t swaps_out = 0;          // sequences swapped out
  int64_t swaps_in = 0;           // sequences swapped back in
  int64_t pages_out = 0;          // pages copied device -> host
  int64_t pages_in = 0;           // pages copied host -> device
  int64_t bytes_out = 0;          // bytes copied device -> host (all layers)
  int64_t bytes_in = 0;           // bytes copied host -> device
  int64_t refused_host_full = 0;  // swap-outs refused: too few free host slots and no disk room
  int64_t to_disk = 0;            // swap-outs that went to the disk tier (host tier full)
  int64_t from_disk = 0;          // swap-ins read back from the disk tier
  int64_t disk_faults = 0;        // disk writes or reads that failed (the caller recomputes)
  int64_t fallbacks = 0;          // swap-ins that failed and were recomputed (callers count)
  int64_t refused_no_blocks = 0;  // swap-ins refused: too few free device blocks
  // Prefetch (SwapPrefetch): disk reads started ahead of a swap-in, and of the swap-ins from the
  // disk tier, those whose read had completed when they ran (hits) and those that read or
  // waited then, or whose read failed (misses). Host-tier swap-ins are neither (no I/O to wait).
  int64_t prefetches = 0;
  int64_t prefetch_hits = 0;
  int64_t prefetch_misses = 0;
  int64_t prefetch_dropped = 0;  // prefetches dropped unused (the sequence ended; callers count)
  // Host-tier prefetch (start_host_prefetch): device blocks reserved and the host -> device copy
  // started a step ahead of a swap-in from the host tier. Of the swap-ins from the host tier
  // (with pages to copy), hits found their copy landed, misses waited for it, had none (copied
  // at the swap-in) or redid a copy that failed (host_prefetch_faults). So hits + misses = those
  // swap-ins. Dropped: prefetches given up unused (the sequence ended, was not resumed, or its
  // blocks were needed); the host copy stays. Deferred (the worker counts): swap-ins put off to
  // the next step because their prefetch's copy was still in flight while the step had other
  // rows to run; the step runs without waiting for the copy, and the sequence resumes a step later.
  int64_t host_prefetches = 0;
  int64_t host_prefetch_hits = 0;
  int64_t host_prefetch_misses = 0;
  int64_t host_prefetch_dropped = 0;
  int64_t host_prefetch_faults = 0;
  int64_t host_prefetch_deferred = 0;
  // Disk write-behind (KvPool::set_disk_write_behind): disk swap-outs that returned with their
  // record still being written; swap-ins and read-aheads that had to wait for such a write; and
  // swap-ins served from the staging of a write that failed (its fault is in disk_faults: the
  // sequence resumed without recompute).
  int64_t write_behind = 0;
  int64_t write_behind_waits = 0;
  int64_t write_behind_rescues = 0;
  double out_seconds = 0;  // wall time of the swap-outs (copies included)
  double in_seconds = 0;   // wall time of the swap-ins

  void add(const SwapStats& o);
};

// Pages of `table` that a swap_out would copy to the host (full precision, on the device).
int swappable_pages(const BlockTable& table);
// Pages of `table` on the host that a swap_in needs device blocks for.
int swapped_pages(const BlockTable& table);

// Copies every full-precision device page of `table` to host-tier slots and frees their blocks;
// when the host tier has too few free slots and the pool has a disk tier, to one checksummed disk
// record instead (one large write; pages kDisk). All or nothing: false (counted, the table
// unchanged) when neither has room or the disk write fails (a fault, counted: the caller
// recomputes). A backend error leaves the table unchanged too.
// With write-behind on (KvPool::set_disk_write_behind), a disk swap-out copies the pages into a
// staging buffer, frees their blocks and returns while the record is written on the tier's I/O
// thread (KvPool::SwapWrite; at most KvPool::kMaxSwapWrites staged, else written before
// returning). A write that fails later loses nothing: its staging stays the copy (swap_in takes
// it), and the fault is counted once.
StatusOr<bool> swap_out(KvPool& pool, BlockTable& table, SwapStats* stats);

// Finishes the staged swap writes that have ended, never blocking (a step boundary): a
// successful one frees its staging (the record is the copy now; a released table's record is
// freed), a failed one is counted in disk_faults and keeps its staging. Returns how many ended.
int poll_swap_writes(KvPool& pool, SwapStats* stats);

// A swap-in's disk read started ahead of the step that resumes the table (the temporal cut's
// prefetch, docs/kv-tiers.md): the table's disk record is read into `staging` on the tier's I/O
// thread while the worker runs other steps; swap_in then copies from `staging` without waiting.
// Owned with the table (one per table). Destroying it waits for its read; a record with a read
// in flight cannot be freed, so drop the prefetch before releasing the table.
struct SwapPrefetch {
  uint64_t record = 0;  // the disk record being read (the table's disk_record)
  // Its payload (every page, every layer): the pool's backend's host memory (KvPool::take_staging:
  // pinned on CUDA, so the swap-in's copies to the device run at the link's speed, queued
  // asynchronously), `capacity` bytes; swap_in hands it back to the pool as its spare.
  KvPool::HostBuffer staging;
  int64_t capacity = 0;
  DiskOp op;                     // the read (declared after staging: destroyed, so waited, first)
  std::optional<Status> result;  // how the read ended, once polled
};

// Starts reading `table`'s disk record into `*pf` (which must be unused: record 0). false:
// nothing to read (no disk record, or its write-behind failed: the swap-in takes the staging).
// A record still being written is waited for first (counted in write_behind_waits). An error
// starting the read is returned (pf left unused): the swap-in reads the record itself then, and
// meets the same fault there.
StatusOr<bool> start_prefetch(KvPool& pool, const BlockTable& table, SwapPrefetch* pf,
                              SwapStats* stats);
// True once `pf`'s read has ended (ok or not); never blocks.
bool prefetch_ready(KvPool& pool, SwapPrefetch& pf);

// The host tier's prefetch: one step before the swap-in that resumes `table` (its pages on the
// host tier), reserves a device block for each kHost page, placed as swap_in would place it
// (KvPool::allocate_placed: the spatial cut's shards), and queues the copies of the host slots
// into them as one fenced batch per shard (Backend::copy_batch_fenced: the CUDA backend's copy
// stream, the CPU backend's copy thread with async_copies, else copied at once). It lives in
// BlockTable::swap_prefetch; the pages stay kHost until swap_in commits them. Pages the semantic
// cut quantized or evicted hold no host slot and are not touched. Takes at most `max_blocks`
// free blocks (no shard's prefix-cache page is evicted for a prefetch): false (nothing changed)
// when the pages need more, fewer are free, there is
// nothing on the host tier (a disk record, or no swapped pages) or a prefetch is already held.
// A backend error queuing a batch is returned with nothing held (what was queued landed first).
StatusOr<bool> start_host_prefetch(KvPool& pool, BlockTable& table, int max_blocks,
                                   SwapStats* stats);
// Blocks `table`'s host prefetch holds (0: none).
inline int host_prefetch_blocks(const BlockTable& table) {
  return static_cast<int>(table.swap_prefetch.size());
}
// True once every copy of `table`'s host prefetch has landed (or failed); never blocks. False
// without one.
bool host_prefetch_landed(KvPool& pool, BlockTable& table);
// Gives up `table`'s host prefetch: waits for its copies (the blocks may be handed out next, and
// the host slots must not be freed under a copy), frees its blocks and keeps the host copy (the
// pages stay kHost). Counted in host_prefetch_dropped when one was held. KvPool::release does
// the same, uncounted.
void drop_host_prefetch(KvPool& pool, BlockTable& table, SwapStats* stats);

// Inverse of swap_out: allocates a device block for every swapped-out page, copies it back and
// frees its host slot or disk record. All or nothing: false (counted, the table unchanged) when
// the pool has too few free blocks. A backend error, or a disk fault (checksum, I/O: counted),
// returns its Status with the table unchanged: the caller releases it and recomputes. A staging
// buffer that cannot be allocated (host memory; backends that stage) is returned the same way
// but is no disk fault (not counted in disk_faults; the record is sound).
// A record still being written (write-behind) is waited for and then read as any other; when
// that write failed, the pages come from its staging instead (write_behind_rescues).
// `prefetch` (may be null): a prefetch of this table's record; its data is used (waiting for the
// read if it is still in flight) and it is left unused (record 0) once the swap-in ran.
// A host prefetch (BlockTable::swap_prefetch) is used the same way: its blocks are the pages'
// (none allocated), its fences are waited for (a hit when all had landed), a failed copy is
// redone synchronously into the same blocks (an error there: its blocks freed, the Status
// returned, the host copy kept), and the host slots are freed only once the copies landed.
StatusOr<bool> swap_in(KvPool& pool, BlockTable& table, SwapStats* stats,
                       SwapPrefetch* prefetch = nullptr);

}  // namespace kvsplit::kv
