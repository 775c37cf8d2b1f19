// Builders of the Scheduler tests (tests/sched/scheduler_test.cpp, scheduler_window_test.cpp):
// running and waiting sequences on plain structs, and a config of 4-token blocks.
#pragma once

#include <cstdint>

#include "sched/scheduler.h"

namespace kvsplit::sched {

inline SchedSeq running(int id, int computed, int blocks, int32_t priority = 0,
                        int64_t arrival = 0) {
  SchedSeq s;
  s.id = id;
  s.num_computed = computed;
  s.num_blocks = blocks;
  s.priority = priority;
  s.arrival = arrival == 0 ? id : arrival;
  return s;
}

inline SchedSeq waiting(int id, int target, int computed = 0, int blocks = 0, int32_t priority = 0,
                        int64_t last_step = -1) {
  SchedSeq s;
  s.id = id;
  s.target = target;
  s.num_computed = computed;
  s.num_blocks = blocks;
  s.priority = priority;
  s.arrival = id;
  s.last_prefill_step = last_step;
  return s;
}

inline SchedulerConfig config(int max_batch_tokens, bool colocated, int min_chunk = 4) {
  SchedulerConfig c;
  c.block_size = 4;
  c.max_batch_tokens = max_batch_tokens;
  c.min_chunk_tokens = min_chunk;
  c.max_num_seqs = 16;
  c.decode_in_budget = colocated;
  return c;
}

}  // namespace kvsplit::sched
