// The spatial cut's migration hook (kv-cuts.md §4; issue: "move KV from host memory to another
// GPU when the link is idle"): moves a range of a sequence's pages to one shard of its pool's
// shard group, from other shards' device memory or from the host tier. The KV cache manager
// calls it (through a worker's inbox, sched::MigrateKv) between steps; nothing reads the pages
// meanwhile. Quantized and evicted pages (semantic cut) and pages on disk stay where they are.
#pragma once

#include <cstdint>

#include "kv/block_allocator.h"
#include "kv/kv_pool.h"
#include "kvsplit/status.h"

namespace kvsplit::kv {

struct MigrateStats {
  int64_t pages = 0;      // pages moved
  int64_t from_host = 0;  // of which from the host tier
  int64_t bytes = 0;      // bytes copied (all layers)
  double seconds = 0;     // wall time, copies included
  void add(const MigrateStats& o) {
    pages += o.pages;
    from_host += o.from_host;
    bytes += o.bytes;
    seconds += o.seconds;
  }
};

// Moves pages [first_page, end_page) of `table` that are full precision on another shard's
// device, or in the host tier (swapped out), to shard `to_shard`, page by page into fresh blocks
// there; each source block or host slot is released after its copy. All or nothing: returns the
// pages moved, or kResourceExhausted (nothing changed) when the shard has too few free blocks,
// kInvalidArgument for a bad range or shard, a backend's error (nothing changed) when a copy
// fails.
// `max_pages` > 0: only the first that many of those pages (the others stay where they are).
StatusOr<int> migrate_pages(KvPool& pool, BlockTable& table, int first_page, int end_page,
                            int to_shard, MigrateStats* stats = nullptr, int max_pages = 0);

}  // namespace kvsplit::kv
