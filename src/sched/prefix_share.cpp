#include "sched/prefix_share.h"

namespace kvsplit::sched {

int share_prompt_pages(kv::KvPool& pool, const SchedulerConfig& sc, kv::BlockTable& table,
                       uint64_t salt, std::span<const int32_t> tokens, int target, int num_prompt) {
  const int hits = pool.share_prefix(table, salt, tokens,
                                     pool.shareable_prefix_pages(target, num_prompt), sc.kv_window);
  if (hits == 0 || sc.kv_window <= 0) return hits;
  // A windowed hit holds its window's pages beside the first chunk's.
  const int need =
      kv::BlockTable::blocks_for(sc.prefill_reach(hits * sc.block_size, target), sc.block_size) -
      static_cast<int>(table.blocks.size());
  if (need <= pool.available_blocks()) return hits;
  pool.release(table);  // the pages stay cached
  return 0;
}

}  // namespace kvsplit::sched
