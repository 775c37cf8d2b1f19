#include "kv/swap.h"

#include <chrono>
#include <memory>
#include <span>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kv/page_ops.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

bool on_device_full(const BlockTable& t, size_t i) {
  if (t.pages.empty()) return true;
  return t.pages[i].resident() && t.pages[i].precision == KvPrecision::kFull;
}

// Waits for the copies out of every shard that holds one of the pages `idx` of `table`.
Status synchronize_shards(KvPool& pool, const BlockTable& table, const std::vector<int>& idx) {
  uint64_t seen = 0;
  for (int i : idx) seen |= uint64_t{1} << table.page(i).shard;
  for (int s = 0; s < pool.num_shards(); ++s)
    if ((seen >> s) & 1) KVSPLIT_RETURN_IF_ERROR(pool.shard(s).backend().synchronize());
  return ok_status();
}

using CopyDir = backend::Backend::CopyDir;
using CopyRange = backend::Backend::CopyRange;

// Queues batches[s] on shard s's backend, for every shard; the first error.
Status run_batches(KvPool& pool, const std::vector<std::vector<CopyRange>>& batches, CopyDir dir) {
  for (size_t s = 0; s < batches.size(); ++s)
    if (!batches[s].empty())
      KVSPLIT_RETURN_IF_ERROR(pool.shard(static_cast<int>(s))
                                  .backend()
                                  .copy_batch_async(dir, batches[s].data(), batches[s].size()));
  return ok_status();
}

// The CPU backend's device memory is host memory: the disk tier then writes and reads a
// record's pages in place, one span per page and layer in the record's layout (page after page,
// layer after layer), with no staging buffer (its allocation, page faults and zeroing) and no
// second copy. Other backends go through a host staging buffer.
bool pages_in_host_memory(KvPool& pool) {
  for (int s = 0; s < pool.num_shards(); ++s)
    if (pool.shard(s).backend().kind() != backend::DeviceKind::kCpu) return false;
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void SwapStats::add(const SwapStats& o) {
  swaps_out += o.swaps_out;
  swaps_in += o.swaps_in;
  pages_out += o.pages_out;
  pages_in += o.pages_in;
  bytes_out += o.bytes_out;
  bytes_in += o.bytes_in;
  refused_host_full += o.refused_host_full;
  refused_no_blocks += o.refused_no_blocks;
  to_disk += o.to_disk;
  from_disk += o.from_disk;
  disk_faults += o.disk_faults;
  fallbacks += o.fallbacks;
  prefetches += o.prefetches;
  prefetch_hits += o.prefetch_hits;
  prefetch_misses += o.prefetch_misses;
  prefetch_dropped += o.prefetch_dropped;
  host_prefetches += o.host_prefetches;
  host_prefetch_hits += o.host_prefetch_hits;
  host_prefetch_misses += o.host_prefetch_misses;
  host_prefetch_dropped += o.host_prefetch_dropped;
  host_prefetch_faults += o.host_prefetch_faults;
  host_prefetch_deferred += o.host_prefetch_deferred;
  write_behind += o.write_behind;
  write_behind_waits += o.write_behind_waits;
  write_behind_rescues += o.write_behind_rescues;
  out_seconds += o.out_seconds;
  in_seconds += o.in_seconds;
}

int swappable_pages(const BlockTable& table) {
  int n = 0;
  for (size_t i = 0; i < table.blocks.size(); ++i) n += on_device_full(table, i);
  return n;
}

int swapped_pages(const BlockTable& table) {
  int n = 0;
  for (const PageEntry& p : table.pages)
    n += p.location == PageLocation::kHost || p.location == PageLocation::kDisk;
  return n;
}

namespace {

// The disk record's key: the table's address is no identity across a restart, but records never
// outlive their DiskTier (docs/kv-tiers.md); the page count guards the layout.
RecordKey disk_key(size_t pages) { return RecordKey{0x6b7673706c6974ull, pages}; }

// Counts a staged write's failure once.
void note_write_result(KvPool::SwapWrite& w, SwapStats* stats) {
  if (w.result && !w.result->ok() && !w.fault_counted) {
    w.fault_counted = true;
    ++stats->disk_faults;
  }
}

// Room for one more staged write: finishes the ended ones, then waits for the oldest in flight
// while at the cap. False when the staged writes that remain are all failed ones (their staging
// is a table's only copy): the swap-out then writes synchronously.
bool room_for_swap_write(KvPool& pool, SwapStats* stats) {
  poll_swap_writes(pool, stats);
  std::list<KvPool::SwapWrite>& writes = pool.swap_writes();
  while (static_cast<int>(writes.size()) >= KvPool::kMaxSwapWrites) {
    auto oldest = std::find_if(writes.begin(), writes.end(),
                               [](const KvPool::SwapWrite& w) { return !w.result; });
    if (oldest == writes.end()) return false;
    pool.wait_swap_write(*oldest);
    poll_swap_writes(pool, stats);
  }
  return true;
}

// The pages of `idx` leave the device for record `record` (page k at record index k).
void pages_to_disk(KvPool& pool, BlockTable& table, const std::vector<int>& idx, uint64_t record) {
  if (table.pages.empty()) table.pages.resize(table.blocks.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const int i = idx[k];
    pool.decref_block(table.pages[i].shard, table.blocks[i]);
    table.blocks[i] = -1;
    table.pages[i].location = PageLocation::kDisk;
    table.pages[i].original = static_cast<int32_t>(k);
    table.pages[i].shard = 0;  // swap_in places it again
  }
  table.disk_record = record;
}

// swap_out's second choice: every page of `idx` in one record, through a host staging buffer.
StatusOr<bool> swap_out_to_disk(KvPool& pool, BlockTable& table, const std::vector<int>& idx,
                                SwapStats* stats) {
  DiskTier& disk = *pool.disk();
  const int64_t page_bytes = pool.page_layer_bytes(KvPrecision::kFull);
  const int layers = pool.shape().num_layers;
  const int64_t per_page = page_bytes * layers;
  const int64_t record_bytes = per_page * static_cast<int64_t>(idx.size());
  KvPool::HostBuffer staging;
  int64_t staging_capacity = 0;
  std::vector<std::span<const std::byte>> payload;
  const bool behind = pool.disk_write_behind() && room_for_swap_write(pool, stats);
  if (pages_in_host_memory(pool) && !behind) {
    // In place: copies still queued on the pages' shards finish first.
    KVSPLIT_RETURN_IF_ERROR(synchronize_shards(pool, table, idx));
    payload.reserve(idx.size() * static_cast<size_t>(layers));
    for (int i : idx) {
      const KvPool& shard = pool.shard(table.page(i).shard);
      for (int l = 0; l < layers; ++l)
        payload.emplace_back(shard.full_page(l, table.blocks[i]), static_cast<size_t>(page_bytes));
    }
  } else {
    // alloc_host memory (pinned on CUDA: the copies run at the link's rate), the pool's spare
    // when it is big enough (no page faults, no pinning).
    KVSPLIT_ASSIGN_OR_RETURN(std::tie(staging, staging_capacity), pool.take_staging(record_bytes));
    std::vector<std::vector<CopyRange>> batches(static_cast<size_t>(pool.num_shards()));
    for (size_t k = 0; k < idx.size(); ++k) {
      const int s = table.page(idx[k]).shard;
      pool.shard(s).add_page_copies(table.blocks[idx[k]], staging.get() + k * per_page,
                                    CopyDir::kDeviceToHost, &batches[s]);
    }
    const Status queued = run_batches(pool, batches, CopyDir::kDeviceToHost);
    const Status synced = synchronize_shards(pool, table, idx);  // before `staging` can go
    if (!queued.ok() || !synced.ok()) pool.give_staging(std::move(staging), staging_capacity);
    KVSPLIT_RETURN_IF_ERROR(queued);
    KVSPLIT_RETURN_IF_ERROR(synced);
    payload.emplace_back(staging.get(), static_cast<size_t>(record_bytes));
  }
  pool.make_disk_room(record_bytes);  // prefix-cache records give way
  if (behind) {
    // Write-behind: the pages are in `staging` now, so their blocks are free at once, and a
    // writer thread checksums and writes the record. A full tier refuses at begin_write:
    // nothing was allocated, the table is unchanged.
    auto op = disk.begin_write(record_bytes, disk_key(idx.size()));
    if (!op.ok()) {
      pool.give_staging(std::move(staging), staging_capacity);
      ++stats->disk_faults;
      return false;
    }
    KvPool::SwapWrite& w = pool.swap_writes().emplace_back();
    w.record = op->record();
    w.staging = std::move(staging);
    w.capacity = staging_capacity;
    w.op = std::move(op).value();
    // The checksum, the O_DIRECT copy and the wait run on the writer; the list never moves `w`.
    auto write = [&disk, &w, payload] {
      disk.submit_write(w.op, payload);
      w.status = disk.wait(w.op);
      w.ended.store(true, std::memory_order_release);
    };
    try {
      w.writer = std::thread(write);
    } catch (const std::system_error&) {
      write();  // no thread to be had: written here, as without write-behind
    }
    pages_to_disk(pool, table, idx, w.record);
    ++stats->to_disk;
    ++stats->write_behind;
    return true;
  }
  auto id = disk.write_sync(payload, disk_key(idx.size()));
  if (staging) pool.give_staging(std::move(staging), staging_capacity);
  if (!id.ok()) {
    // Capacity, ENOSPC, EIO, short write: nothing was kept (the tier frees a failed write). A disk
    // fault, not a full host tier: counted once, as what it is.
    ++stats->disk_faults;
    return false;
  }
  pages_to_disk(pool, table, idx, *id);
  ++stats->to_disk;
  return true;
}

}  // namespace

StatusOr<bool> swap_out(KvPool& pool, BlockTable& table, SwapStats* stats) {
  KVSPLIT_CHECK(stats != nullptr);
  KVSPLIT_CHECK(table.pages.empty() || table.pages.size() == table.blocks.size());
  const auto t0 = std::chrono::steady_clock::now();
  // Restores in flight land first: their pages move with the rest. (The owner usually settles
  // them itself, where they are counted.)
  PageOpStats settled;
  KVSPLIT_RETURN_IF_ERROR(complete_restores(pool, table, -1, &settled));
  std::vector<int> idx;
  for (size_t i = 0; i < table.blocks.size(); ++i)
    if (on_device_full(table, i)) idx.push_back(static_cast<int>(i));
  if (idx.empty()) return true;
  if (table.disk_record != 0) return false;  // one record per table (resume it first)
  // A table spread over a shard group (the spatial cut) swaps each page out of the shard that
  // holds it, into the home pool's host tier or disk record; swap_in places them again.
  // Spilled prefix-cache pages count as free host slots: they give way (allocate_host_slots).
  if (pool.available_host_slots() < static_cast<int>(idx.size())) {
    // A table with pages in the host tier already (a swap-out partly migrated back) is not split
    // across host and disk: swap_in reads a table from one tier.
    if (pool.disk() == nullptr || swapped_pages(table) > 0) {
      ++stats->refused_host_full;
      return false;
    }
    KVSPLIT_ASSIGN_OR_RETURN(const bool done, swap_out_to_disk(pool, table, idx, stats));
    if (!done) return false;
    ++stats->swaps_out;
    stats->pages_out += static_cast<int64_t>(idx.size());
    stats->bytes_out += static_cast<int64_t>(idx.size()) *
                        pool.page_layer_bytes(KvPrecision::kFull) * pool.shape().num_layers;
    stats->out_seconds += seconds_since(t0);
    return true;
  }
  auto slots = pool.allocate_host_slots(static_cast<int>(idx.size()));
  if (!slots) {
    ++stats->refused_host_full;
    return false;
  }
  const int64_t page_bytes = pool.page_layer_bytes(KvPrecision::kFull);
  // One batch of copies per shard, queued on its stream (the host tier is pinned on CUDA), and
  // one wait for them all.
  std::vector<std::vector<CopyRange>> batches(static_cast<size_t>(pool.num_shards()));
  for (size_t k = 0; k < idx.size(); ++k) {
    const int s = table.page(idx[k]).shard;
    pool.shard(s).add_page_copies(table.blocks[idx[k]], pool.host_slot((*slots)[k]),
                                  CopyDir::kDeviceToHost, &batches[s]);
  }
  Status st = run_batches(pool, batches, CopyDir::kDeviceToHost);
  // The device blocks are freed below; on an error the slots are, so the copies queued before it
  // must be done either way.
  const Status synced = synchronize_shards(pool, table, idx);
  if (st.ok()) st = synced;
  if (!st.ok()) {
    for (int32_t s : *slots) pool.host_allocator().decref(s);
    return st.with_prefix("swap out");
  }
  if (table.pages.empty()) table.pages.resize(table.blocks.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const int i = idx[k];
    PageEntry& p = table.pages[i];
    pool.decref_block(p.shard, table.blocks[i]);
    table.blocks[i] = -1;
    p.location = PageLocation::kHost;
    p.original = (*slots)[k];
    p.shard = 0;  // swap_in places it again
  }
  ++stats->swaps_out;
  stats->pages_out += static_cast<int64_t>(idx.size());
  stats->bytes_out += static_cast<int64_t>(idx.size()) * page_bytes * pool.shape().num_layers;
  stats->out_seconds += seconds_since(t0);
  return true;
}

int poll_swap_writes(KvPool& pool, SwapStats* stats) {
  KVSPLIT_CHECK(stats != nullptr);
  int ended = 0;
  std::list<KvPool::SwapWrite>& writes = pool.swap_writes();
  for (auto w = writes.begin(); w != writes.end();) {
    if (!w->result) {
      if (!pool.poll_swap_write(*w)) {
        ++w;
        continue;
      }
      ++ended;
    }
    note_write_result(*w, stats);
    // Succeeded: the record is the copy (a released table's is freed). Failed: the staging is
    // the copy until the swap-in or release, unless the table is gone.
    if (w->result->ok() && w->detached) (void)pool.disk()->free(w->record);
    const auto next = std::next(w);
    if (w->result->ok() || w->detached) pool.drop_swap_write(&*w);
    w = next;
  }
  return ended;
}

namespace {

enum class StagedWrite { kNone, kInFlight, kFailed };

// `table`'s staged write (write-behind), if any: still in flight (waited for with `wait`,
// counted), failed (its staging is the copy: `*failed`), or succeeded and erased (the record is
// read as any other: kNone).
StagedWrite settle_swap_write(KvPool& pool, const BlockTable& table, bool wait, SwapStats* stats,
                              KvPool::SwapWrite** failed = nullptr) {
  KvPool::SwapWrite* w = pool.swap_write(table.disk_record);
  if (w == nullptr) return StagedWrite::kNone;
  if (!pool.poll_swap_write(*w)) {
    if (!wait) return StagedWrite::kInFlight;
    ++stats->write_behind_waits;
    pool.wait_swap_write(*w);
  }
  note_write_result(*w, stats);
  if (!w->result->ok()) {
    if (failed != nullptr) *failed = w;
    return StagedWrite::kFailed;
  }
  pool.drop_swap_write(w);
  return StagedWrite::kNone;
}

}  // namespace

StatusOr<bool> start_prefetch(KvPool& pool, const BlockTable& table, SwapPrefetch* pf,
                              SwapStats* stats) {
  KVSPLIT_CHECK(pf != nullptr && stats != nullptr && pf->record == 0);
  if (table.disk_record == 0) return false;
  KVSPLIT_CHECK(pool.disk() != nullptr);
  // A write still going on is read once it ended (a later step); a failed one's staging is the
  // copy: nothing to read.
  if (settle_swap_write(pool, table, /*wait=*/false, stats) != StagedWrite::kNone) return false;
  const int pages = swapped_pages(table);
  const int64_t bytes =
      int64_t{pages} * pool.page_layer_bytes(KvPrecision::kFull) * pool.shape().num_layers;
  if (!pf->staging || pf->capacity < bytes) {
    pool.give_staging(std::move(pf->staging), pf->capacity);
    pf->capacity = 0;
    KVSPLIT_ASSIGN_OR_RETURN(std::tie(pf->staging, pf->capacity), pool.take_staging(bytes));
  }
  const std::span<std::byte> dst[] = {{pf->staging.get(), static_cast<size_t>(bytes)}};
  KVSPLIT_ASSIGN_OR_RETURN(
      pf->op, pool.disk()->read(table.disk_record, dst, disk_key(static_cast<size_t>(pages))));
  pf->record = table.disk_record;
  pf->result.reset();
  ++stats->prefetches;
  return true;
}

bool prefetch_ready(KvPool& pool, SwapPrefetch& pf) {
  if (pf.record == 0 || pf.result) return pf.record != 0;
  pf.result = pool.disk()->poll(pf.op);
  return pf.result.has_value();
}

namespace {

// A block for each page of `idx` (ascending), placed as reserve() places those pages: one
// placement per run of consecutive pages. nullopt (nothing changed, no cached page evicted) when
// the group is short.
// `evict`: KvPool::allocate_placed's (false: free blocks only).
std::optional<std::vector<KvPool::PlacedBlock>> allocate_pages(KvPool& pool,
                                                               const std::vector<int>& idx,
                                                               bool spread, bool evict = true) {
  // The group's total first: a run placed and then rolled back may have evicted a cached page.
  // With enough in all, each run finds room (placement falls back to any shard with some).
  int64_t room = 0;
  for (int s = 0; s < pool.num_shards(); ++s) room += pool.shard_room(s, evict);
  if (room < static_cast<int64_t>(idx.size())) return std::nullopt;
  std::vector<KvPool::PlacedBlock> out;
  out.reserve(idx.size());
  for (size_t k = 0; k < idx.size();) {
    size_t e = k + 1;
    while (e < idx.size() && idx[e] == idx[e - 1] + 1) ++e;
    auto run = pool.allocate_placed(idx[k], static_cast<int>(e - k), spread, evict);
    if (!run) {
      for (const KvPool::PlacedBlock& b : out) pool.decref_block(b.shard, b.block);
      return std::nullopt;
    }
    out.insert(out.end(), run->begin(), run->end());
    k = e;
  }
  return out;
}

// Marks every entry of `table`'s host prefetch whose copy sits behind fence `fence` of shard
// `shard` as landed (fence 0), and failed when `ok` is false.
void settle_fence(BlockTable& table, uint8_t shard, uint64_t fence, bool ok) {
  for (PendingRestore& r : table.swap_prefetch) {
    if (r.shard != shard || r.fence != fence) continue;
    r.fence = 0;
    r.failed = r.failed || !ok;
  }
}

// Waits at most `timeout_us` (0: polls; < 0: until it lands) for each copy of `table`'s host
// prefetch still in flight; true when none is left in flight (landed or failed).
bool wait_host_prefetch(KvPool& pool, BlockTable& table, int64_t timeout_us) {
  bool all = true;
  for (size_t k = 0; k < table.swap_prefetch.size(); ++k) {
    const PendingRestore r = table.swap_prefetch[k];
    if (r.fence == 0) continue;
    StatusOr<bool> landed = pool.shard(r.shard).backend().wait_fence(r.fence, timeout_us);
    if (!landed.ok()) {
      settle_fence(table, r.shard, r.fence, false);
    } else if (*landed) {
      settle_fence(table, r.shard, r.fence, true);
    } else {
      all = false;
    }
  }
  return all;
}

}  // namespace

StatusOr<bool> start_host_prefetch(KvPool& pool, BlockTable& table, int max_blocks,
                                   SwapStats* stats) {
  KVSPLIT_CHECK(stats != nullptr);
  KVSPLIT_CHECK(table.pages.empty() || table.pages.size() == table.blocks.size());
  if (!table.swap_prefetch.empty() || table.disk_record != 0) return false;
  std::vector<int> idx;
  for (size_t i = 0; i < table.pages.size(); ++i)
    if (table.pages[i].location == PageLocation::kHost) idx.push_back(static_cast<int>(i));
  if (idx.empty() || static_cast<int>(idx.size()) > max_blocks) return false;
  // Free blocks only: a prefetch for a sequence not yet resumed evicts no cached prompt page.
  auto blocks = allocate_pages(pool, idx, table.spread, /*evict=*/false);
  if (!blocks) return false;
  std::vector<std::vector<CopyRange>> batches(static_cast<size_t>(pool.num_shards()));
  for (size_t k = 0; k < idx.size(); ++k) {
    const KvPool::PlacedBlock& b = (*blocks)[k];
    pool.shard(b.shard).add_page_copies(b.block, pool.host_slot(table.pages[idx[k]].original),
                                        CopyDir::kHostToDevice, &batches[b.shard]);
  }
  std::vector<uint64_t> fences(batches.size(), 0);
  Status st = ok_status();
  for (size_t s = 0; s < batches.size() && st.ok(); ++s) {
    if (batches[s].empty()) continue;
    StatusOr<uint64_t> f =
        pool.shard(static_cast<int>(s))
            .backend()
            .copy_batch_fenced(CopyDir::kHostToDevice, batches[s].data(), batches[s].size());
    if (f.ok())
      fences[s] = *f;
    else
      st = f.status();
  }
  if (!st.ok()) {
    // What was queued lands before its blocks go back.
    for (size_t s = 0; s < fences.size(); ++s)
      if (fences[s] != 0) (void)pool.shard(static_cast<int>(s)).backend().wait_fence(fences[s], -1);
    for (const KvPool::PlacedBlock& b : *blocks) pool.decref_block(b.shard, b.block);
    return st.with_prefix("host prefetch");
  }
  table.swap_prefetch.reserve(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const KvPool::PlacedBlock& b = (*blocks)[k];
    PendingRestore r;
    r.page = idx[k];
    r.block = b.block;
    r.shard = static_cast<uint8_t>(b.shard);
    r.fence = fences[static_cast<size_t>(b.shard)];
    table.swap_prefetch.push_back(r);
  }
  ++stats->host_prefetches;
  return true;
}

bool host_prefetch_landed(KvPool& pool, BlockTable& table) {
  if (table.swap_prefetch.empty()) return false;
  return wait_host_prefetch(pool, table, 0);
}

void drop_host_prefetch(KvPool& pool, BlockTable& table, SwapStats* stats) {
  if (table.swap_prefetch.empty()) return;
  (void)wait_host_prefetch(pool, table, -1);  // a failed copy wrote nothing anyone reads
  for (const PendingRestore& r : table.swap_prefetch) pool.decref_block(r.shard, r.block);
  table.swap_prefetch.clear();
  if (stats != nullptr) ++stats->host_prefetch_dropped;
}

StatusOr<bool> swap_in(KvPool& pool, BlockTable& table, SwapStats* stats, SwapPrefetch* prefetch) {
  KVSPLIT_CHECK(stats != nullptr);
  KVSPLIT_CHECK(table.pages.empty() || table.pages.size() == table.blocks.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> idx;
  for (size_t i = 0; i < table.pages.size(); ++i)
    if (table.pages[i].location == PageLocation::kHost ||
        table.pages[i].location == PageLocation::kDisk)
      idx.push_back(static_cast<int>(i));
  if (idx.empty()) {
    // Every page is on the device already (MigrateKv brought them back): the sequence resumes
    // all the same, and counts as swapped in so that swaps in keep pace with swaps out.
    ++stats->swaps_in;
    return true;
  }
  bool from_disk = table.disk_record != 0;
  // Write-behind: a record still being written is waited for; when its write failed, the pages
  // come from its staging, the only copy (a rescue: no disk read, no recompute).
  KvPool::SwapWrite* rescue = nullptr;
  if (from_disk &&
      settle_swap_write(pool, table, /*wait=*/true, stats, &rescue) == StagedWrite::kFailed) {
    from_disk = false;
  }
  // A host prefetch names the same pages in the same order unless the table changed since (it
  // cannot: every owner drops it first); otherwise it is of no use.
  bool prefetched =
      !table.swap_prefetch.empty() && !from_disk && table.swap_prefetch.size() == idx.size();
  for (size_t k = 0; prefetched && k < idx.size(); ++k)
    prefetched = table.swap_prefetch[k].page == idx[k];
  if (!prefetched) drop_host_prefetch(pool, table, stats);
  std::optional<std::vector<KvPool::PlacedBlock>> blocks;
  Status st = ok_status();
  bool copied = false;  // the pages are in their blocks already (a landed host prefetch)
  if (prefetched) {
    // Its blocks are the pages' (placed when it started). A hit when every copy had landed; a
    // copy that failed is redone below, synchronously, into the same blocks (a miss).
    const bool landed = wait_host_prefetch(pool, table, 0);
    (void)wait_host_prefetch(pool, table, -1);
    bool failed = false;
    blocks.emplace();
    for (const PendingRestore& r : table.swap_prefetch) {
      failed = failed || r.failed;
      blocks->push_back(KvPool::PlacedBlock{r.shard, r.block});
    }
    table.swap_prefetch.clear();
    ++(landed && !failed ? stats->host_prefetch_hits : stats->host_prefetch_misses);
    if (failed) ++stats->host_prefetch_faults;
    copied = !failed;
  } else {
    // With a shard group the pages come back wherever reserve() would place them now (each
    // page's preferred shard, or the next with room), not necessarily where they were.
    blocks = allocate_pages(pool, idx, table.spread);
    if (!blocks) {
      ++stats->refused_no_blocks;
      return false;
    }
    if (!from_disk && rescue == nullptr) ++stats->host_prefetch_misses;  // copied now, waited for
  }
  const int64_t page_bytes = pool.page_layer_bytes(KvPrecision::kFull);
  const int layers = pool.shape().num_layers;
  // The record's bytes on their way to the device: the pool's staging memory (pinned on CUDA).
  KvPool::HostBuffer staging;
  int64_t staging_capacity = 0;
  bool in_place = copied;   // the record was read straight into the blocks, or prefetched
  bool no_staging = false;  // the staging buffer could not be allocated
  if (from_disk) {
    // One read of the whole record; the tier checks its header, key and checksum.
    const int64_t per_page = page_bytes * layers;
    if (prefetch != nullptr && prefetch->record == table.disk_record) {
      // Read ahead: a hit when the read had completed (and succeeded) by now.
      const bool ready = prefetch_ready(pool, *prefetch);
      if (!ready) prefetch->result = pool.disk()->wait(prefetch->op);
      st = *prefetch->result;
      ++(ready && st.ok() ? stats->prefetch_hits : stats->prefetch_misses);
      staging = std::move(prefetch->staging);
      staging_capacity = std::exchange(prefetch->capacity, 0);
      prefetch->record = 0;
      prefetch->result.reset();
    } else if (pages_in_host_memory(pool)) {
      // In place, into the blocks just allocated (record page `original`, layer after layer).
      std::vector<std::span<std::byte>> dst(idx.size() * static_cast<size_t>(layers));
      for (size_t k = 0; k < idx.size(); ++k) {
        const KvPool::PlacedBlock& b = (*blocks)[k];
        const int32_t at = table.pages[idx[k]].original;
        KVSPLIT_CHECK(at >= 0 && static_cast<size_t>(at) < idx.size());
        for (int l = 0; l < layers; ++l)
          dst[static_cast<size_t>(at) * layers + l] = {pool.shard(b.shard).full_page(l, b.block),
                                                       static_cast<size_t>(page_bytes)};
      }
      st = pool.disk()->read_sync(table.disk_record, dst, disk_key(idx.size()));
      in_place = true;
      ++stats->prefetch_misses;
    } else {
      const int64_t bytes = per_page * static_cast<int64_t>(idx.size());
      auto taken = pool.take_staging(bytes);
      if (taken.ok()) {
        std::tie(staging, staging_capacity) = std::move(taken).value();
        const std::span<std::byte> dst[] = {{staging.get(), static_cast<size_t>(bytes)}};
        st = pool.disk()->read_sync(table.disk_record, dst, disk_key(idx.size()));
      } else {
        // Host memory, not the disk: no disk fault, and the record is kept (the table unchanged).
        no_staging = true;
        st = taken.status().with_prefix("no staging buffer for the disk record (" +
                                        std::to_string(bytes) + " bytes)");
      }
      ++stats->prefetch_misses;
    }
    if (!st.ok() && !no_staging) ++stats->disk_faults;
  }
  if (st.ok() && !in_place) {
    // One batch per shard: from the record's staging buffer (page `original` of the record) or
    // from the page's host slot.
    std::vector<std::vector<CopyRange>> batches(static_cast<size_t>(pool.num_shards()));
    for (size_t k = 0; k < idx.size(); ++k) {
      const KvPool::PlacedBlock& b = (*blocks)[k];
      const int32_t at = table.pages[idx[k]].original;
      std::byte* src = from_disk           ? staging.get() + at * page_bytes * layers
                       : rescue != nullptr ? rescue->staging.get() + at * page_bytes * layers
                                           : pool.host_slot(at);
      pool.shard(b.shard).add_page_copies(b.block, src, CopyDir::kHostToDevice, &batches[b.shard]);
    }
    st = run_batches(pool, batches, CopyDir::kHostToDevice);
  }
  // Every queued copy is done before the host slots or `staging` can go (or, on an error, the
  // blocks are given back).
  for (int s = 0; s < pool.num_shards(); ++s) {
    const Status synced = pool.shard(s).backend().synchronize();
    if (st.ok()) st = synced;
  }
  pool.give_staging(std::move(staging), staging_capacity);  // kept as the spare if the larger
  if (!st.ok()) {
    for (const KvPool::PlacedBlock& b : *blocks) pool.decref_block(b.shard, b.block);
    return st.with_prefix("swap in");
  }
  for (size_t k = 0; k < idx.size(); ++k) {
    const int i = idx[k];
    PageEntry& p = table.pages[i];
    if (!from_disk && rescue == nullptr) pool.host_allocator().decref(p.original);
    table.blocks[i] = (*blocks)[k].block;
    p.shard = static_cast<uint8_t>((*blocks)[k].shard);
    p.location = PageLocation::kDevice;
    p.original = -1;
  }
  if (from_disk) {
    (void)pool.disk()->free(table.disk_record);
    table.disk_record = 0;
    ++stats->from_disk;
  }
  if (rescue != nullptr) {
    // The failed write's record was freed by the tier; its staging goes now.
    pool.drop_swap_write(rescue);
    table.disk_record = 0;
    ++stats->write_behind_rescues;
  }
  ++stats->swaps_in;
  stats->pages_in += static_cast<int64_t>(idx.size());
  stats->bytes_in += static_cast<int64_t>(idx.size()) * page_bytes * pool.shape().num_layers;
  stats->in_seconds += seconds_since(t0);
  return true;
}

}  // namespace kvsplit::kv
