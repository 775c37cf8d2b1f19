// KV handoff between workers: the message types and the page copy.
//
// Protocol (prefill worker P -> decode worker D), designed so a cancel at any instant frees every
// block on both sides exactly once and no wait is unbounded:
//  1. P samples the first token, moves the sequence's block table into its `pinned` map (the
//     pages stay allocated and untouched) and posts a HandoffOffer (owning the Sequence) to D.
//  2. D, between steps, reserves blocks in its own pool (waiting at most handoff_timeout_ms),
//     copies the pages (copy_kv_blocks) and takes ownership; or, when cancelled / timed out /
//     shutting down, finishes the request itself.
//  3. In every case D posts exactly one HandoffDone to P, which then releases the pinned pages.
// Within one worker (colocated) there is no handoff: ownership stays, nothing is copied.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/kv_pool.h"
#include "kvsplit/status.h"
#include "sched/sequence.h"

namespace kvsplit::sched {

class Worker;

struct HandoffOffer {
  uint64_t handoff_id = 0;          // unique per source worker
  Worker* source = nullptr;         // receives the HandoffDone
  const kv::KvPool* source_pool = nullptr;
  std::vector<int32_t> source_blocks;  // pinned by the source until HandoffDone
  int num_tokens = 0;               // tokens of KV in those blocks
  Clock::time_point deadline;       // the destination gives up (DEADLINE_EXCEEDED) after this
  std::unique_ptr<Sequence> seq;    // the request itself (its table is empty in flight)
};

struct HandoffDone {
  uint64_t handoff_id = 0;
};

// Copies pages `src_blocks[i]` of `src` to `dst_blocks[i]` of `dst` for every layer, through the
// destination backend's copy_d2d (memcpy on CPU; a CUDA backend maps it to cudaMemcpyPeerAsync
// between devices), coalescing runs of consecutive ids, then synchronizes the destination.
// kInvalidArgument when the pools' shapes, block sizes or dtypes differ or the spans' sizes differ.
// The caller guarantees nobody writes those pages meanwhile.
Status copy_kv_blocks(const kv::KvPool& src, std::span<const int32_t> src_blocks, kv::KvPool& dst,
                      std::span<const int32_t> dst_blocks);

}  // namespace kvsplit::sched
