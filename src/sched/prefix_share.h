// Taking a new prompt's cached prefix pages at admission (the temporal cut's prefix cache), for
// both owners of sequences: a Worker and sched::generate_batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "kv/kv_pool.h"
#include "kvsplit/kv_cuts.h"
#include "sched/scheduler.h"

namespace kvsplit::sched {

// Of a sequence's first `computed` positions, how many a recompute preemption may leave in the
// prefix cache for its restart (and the restart may take back): all of them under full KV, where
// a page's KV is a function of the tokens alone; under a KV policy that degrades pages (the
// semantic cut, StreamingLLM, H2O) only the prompt's, since a generated page was computed
// attending to degraded KV and would not equal the same tokens computed afresh.
inline int cacheable_tokens(KvPolicy policy, int computed, int num_prompt) {
  return policy == KvPolicy::kFull ? computed : std::min(computed, num_prompt);
}

// Points the empty `table` of a prompt of `num_prompt` tokens (`tokens`), to be computed up to
// `target` positions, at its cached prompt pages (KvPool::share_prefix; never the page of the
// last prompt token, which is computed to sample). With a sliding window (sc.kv_window) only the
// pages the window still reads are taken, and only when the pool has room for the first chunk
// beside them: the admission counted the chunk's pages alone. Returns the pages served (0: the
// table is empty and the prompt is computed).
int share_prompt_pages(kv::KvPool& pool, const SchedulerConfig& sc, kv::BlockTable& table,
                       uint64_t salt, std::span<const int32_t> tokens, int target, int num_prompt);

}  // namespace kvsplit::sched
