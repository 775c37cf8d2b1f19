// Taking a new prompt's cached prefix pages at admission (the temporal cut's prefix cache), for
// both owners of sequences: a Worker and sched::generate_batch.
#pragma once

#include <cstdint>
#include <span>

#include "kv/kv_pool.h"
#include "sched/scheduler.h"

namespace kvsplit::sched {

// Points the empty `table` of a prompt of `num_prompt` tokens (`tokens`), to be computed up to
// `target` positions, at its cached prompt pages (KvPool::share_prefix; never the page of the
// last prompt token, which is computed to sample). With a sliding window (sc.kv_window) only the
// pages the window still reads are taken, and only when the pool has room for the first chunk
// beside them: the admission counted the chunk's pages alone. Returns the pages served (0: the
// table is empty and the prompt is computed).
int share_prompt_pages(kv::KvPool& pool, const SchedulerConfig& sc, kv::BlockTable& table,
                       uint64_t salt, std::span<const int32_t> tokens, int target, int num_prompt);

}  // namespace kvsplit::sched
