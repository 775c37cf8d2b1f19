// KV handoff between workers: the message types and the page copy.
//
// Protocol (prefill worker P -> decode worker D), designed so a cancel at any instant frees every
// block on both sides exactly once and no wait is unbounded:
//  1. P samples the first token, moves the sequence's block table into its `pinned` map (the
//     pages stay allocated and untouched), puts the Sequence into a HandoffTicket and posts a
//     HandoffOffer to D.
//  2. Delivery (bounded by handoff_timeout_ms): D takes the ticket (kPosted -> kReceived) when it
//     drains its inbox, at its next step boundary. If D has not taken it by the deadline (a
//     destination that hangs or died), P takes it back (kPosted -> kReclaimed), marks D down
//     (Worker::mark_down) and offers it to another decode worker that has not had it (a new
//     ticket, the same pinned pages); when every one has had it, P releases the pinned pages and
//     fails the request with DEADLINE_EXCEEDED. D later drops the dead offer. Exactly one side
//     wins the compare-exchange, so exactly one side owns the Sequence. P also takes back, before
//     their deadlines, its other offers in flight to a D marked down (by any worker), as long as a
//     decode worker that is up has not had them.
//  3. Waiting for room (back-pressure, not an error): once received, the offer waits in D's
//     queue until D has a free sequence slot and enough free blocks, however long decode is busy
//     (a higher-priority offer may preempt lower-priority running sequences). The wait ends with
//     admission, a cancel, the request's SLA-class queue timeout, or engine shutdown. While it
//     waits, D passes it on to another decode worker E that has room for it now
//     (Worker::forward_offers): a new ticket, with D in E's place of P for delivery (D takes
//     it back into its queue if E has not received it within handoff_timeout_ms, and marks E
//     down; or sooner, once E is marked down). Whoever finally admits or finishes it posts the one
//     HandoffDone to P.
//  4. On admission D reserves blocks in its own pool and copies the pages (copy_kv_blocks); in
//     every case after receipt (admitted, copy error, cancelled, timed out, shutdown) D posts
//     exactly one HandoffDone to P, which then releases the pinned pages (and, when D passed the
//     offer on, learns from it which worker took the pages, for its cache-aware routing).
// Within one worker (colocated) there is no handoff: ownership stays, nothing is copied.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_pool.h"
#include "kvsplit/status.h"
#include "sched/sequence.h"

namespace kvsplit::sched {

class Worker;

// Shared by the source and the destination of one handoff; decides who owns the Sequence.
struct HandoffTicket {
  enum State : int { kPosted = 0, kReceived = 1, kReclaimed = 2 };
  std::atomic<int> state{kPosted};
  // Set by the source before posting; read only by the side whose compare-exchange moved `state`
  // out of kPosted (acq_rel), so it is never touched by both.
  std::unique_ptr<Sequence> seq;

  // Each returns true for exactly one caller over the ticket's life.
  bool receive() { return claim(kReceived); }
  bool reclaim() { return claim(kReclaimed); }

 private:
  bool claim(int to) {
    int expected = kPosted;
    return state.compare_exchange_strong(expected, to, std::memory_order_acq_rel);
  }
};

struct HandoffOffer {
  uint64_t handoff_id = 0;   // unique per source worker
  Worker* source = nullptr;  // receives the HandoffDone
  const kv::KvPool* source_pool = nullptr;
  std::vector<int32_t> source_blocks;  // pinned by the source until HandoffDone
  // The shard of each source block in the source pool's shard group (spatial cut); empty: all
  // on the home shard.
  std::vector<uint8_t> source_shards;
  int num_tokens = 0;  // tokens of KV in those blocks
  // Sliding windows: the first pages, which every layer's window had passed, were dropped on the
  // source (kv::drop_behind_window): their source_blocks are -1 and nothing of them is copied.
  int window_dropped = 0;
  std::shared_ptr<HandoffTicket> ticket;  // holds the Sequence until the destination receives it
  // Decode workers that received it and passed it on for want of room (Worker::forward_offers):
  // it is not passed to them again, so it moves at most once per decode worker.
  std::vector<const Worker*> visited;
  // Set by the destination on receipt:
  std::unique_ptr<Sequence> seq;  // the request itself (its table is empty in flight)
  // The first receipt + the class's queue_timeout_ms (waiting for room; kept when passed on).
  Clock::time_point wait_deadline;

  // A copy of everything but the request and the ticket (a forwarded offer's way back).
  HandoffOffer without_request() const {
    HandoffOffer o;
    o.handoff_id = handoff_id;
    o.source = source;
    o.source_pool = source_pool;
    o.source_blocks = source_blocks;
    o.source_shards = source_shards;
    o.num_tokens = num_tokens;
    o.window_dropped = window_dropped;
    o.visited = visited;
    o.wait_deadline = wait_deadline;
    return o;
  }

  // Blocks the destination needs for the pages it receives, and with its first decode token.
  int blocks(int block_size) const {
    return kv::BlockTable::blocks_for(num_tokens, block_size) - window_dropped;
  }
  int incoming_blocks(int block_size) const {
    return incoming_blocks_for(num_tokens, window_dropped, block_size);
  }
  // The same for a sequence about to be offered (its offer not built yet).
  static int incoming_blocks_for(int num_tokens, int window_dropped, int block_size) {
    return kv::BlockTable::blocks_for(num_tokens + 1, block_size) - window_dropped;
  }
};

struct HandoffDone {
  uint64_t handoff_id = 0;
  // The decode worker whose pool took the pages (and caches them), when they were copied; null
  // when the offer ended otherwise. It differs from where the source sent the offer when a decode
  // worker passed it on: the source's cache-aware routing then learns where the pages went.
  const Worker* admitted_by = nullptr;
};

// A handoff moves full-precision resident pages only (copy_kv_blocks copies block ids of the full
// pool): pages are demoted or evicted only on the workers that decode, never before a handoff.
// kInternal (naming the first such page) when `table` has a page that is quantized or not
// resident, so that such a table is never copied as if it were full precision. The pages dropped
// behind a sliding window (the first table.window_dropped) are not handed off and not checked.
Status check_handoff_table(const kv::BlockTable& table);

// How a KV handoff's pages travel between two workers' pools (a pure plan, unit-tested without
// a second GPU): the same device -> one device copy; different devices with direct access (CUDA
// peer access) -> a peer copy; otherwise -> staged through host memory (device -> host -> device).
enum class KvCopyRoute : uint8_t { kSameDevice, kPeer, kStaged };
KvCopyRoute plan_kv_copy(int src_device, int dst_device, bool direct_access);
const char* kv_copy_route_name(KvCopyRoute route);

// Copies pages `src_blocks[i]` of `src` to `dst_blocks[i]` of `dst` for every layer by the route
// plan_kv_copy picks for the two pools' backends (copy_from for kSameDevice / kPeer on the
// destination's stream; copy_d2h + copy_h2d through one host buffer for kStaged), coalescing runs
// of consecutive ids, then synchronizes. Returns the route taken. kInvalidArgument when the
// pools' shapes, block sizes or dtypes differ or the spans' sizes differ. The caller guarantees
// nobody writes those pages meanwhile.
StatusOr<KvCopyRoute> copy_kv_blocks(const kv::KvPool& src, std::span<const int32_t> src_blocks,
                                     kv::KvPool& dst, std::span<const int32_t> dst_blocks);

// copy_kv_blocks between two shard groups (the spatial cut): source page i is block
// src_blocks[i] of shard src_shards[i] (empty: every page on the home shard) of `src`; it goes to
// page i of `dst_table` (reserved in `dst`, on the shard its page entry names). Pages before
// dst_table.window_dropped (dropped behind a sliding window on both sides) are skipped, and so
// are those before `first_page` (the destination's prefix cache served them:
// KvPool::share_device_prefix). One copy_kv_blocks per (source shard, destination shard) pair.
// Returns the route of the home pair.
StatusOr<KvCopyRoute> copy_kv_pages(const kv::KvPool& src, std::span<const int32_t> src_blocks,
                                    std::span<const uint8_t> src_shards, kv::KvPool& dst,
                                    const kv::BlockTable& dst_table, int first_page = 0);

// Tests: asked by a decode worker before each KV handoff copy (Worker::admit_offers), with the
// request's id, on that worker's thread (decode workers may ask at once). A Status that is not OK
// is taken as the copy's error instead of copying (the request fails with it; the destination's
// reserved blocks and the source's pinned pages are released). Unset (the default): no fault.
using HandoffCopyFaultHook = std::function<Status(const std::string& request_id)>;
// A hook that fails the handoff copies number `first` .. `first + n - 1` (counted from 0 over
// every worker that asks it, in the order they ask) with kInternal.
HandoffCopyFaultHook fail_handoff_copies(int first, int n);

}  // namespace kvsplit::sched
