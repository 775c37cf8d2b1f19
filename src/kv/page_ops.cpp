#include "kv/page_ops.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/check.h"

namespace kvsplit::kv {
namespace {

using kernels::KvPrecision;

int rung(KvPrecision p) { return static_cast<int>(p); }  // full 0 < int8 1 < int4 2 < evicted 3

// Runs each transition on the shard that holds the page (KvPool::shard(page.shard): its
// backend, arenas and summaries); full-precision originals go to the home pool's host tier.
class Executor {
 public:
  Executor(KvPool& pool, BlockTable& table, PageOpStats& stats)
      : home_(pool), table_(table), stats_(stats) {}

  Status demote(int i, KvPrecision to) {
    PageEntry& page = table_.pages[i];
    // Evicted: nothing to demote; restoring: on its way back to full, left alone.
    if (!page.resident() || page.restoring) return ok_status();
    if (rung(to) <= rung(page.precision)) {
      if (to == page.precision) return ok_status();
      return invalid_argument("page " + std::to_string(i) + ": kDemote cannot go up the ladder");
    }
    KvPool& at = home_.shard(page.shard);
    backend::Backend& be = at.backend();
    // The destination page first: a refused demotion must not take a host slot or a summary.
    auto id = at.arena_allocator(to).allocate(1);
    if (!id && to == KvPrecision::kInt8) {
      // The int8 arena is full: straight to int4 (still reversible: the original is kept).
      to = KvPrecision::kInt4;
      id = at.arena_allocator(to).allocate(1);
    }
    if (!id) {
      ++stats_.refused_no_space;
      return ok_status();
    }
    const int32_t dst = (*id)[0];
    const bool from_full = page.precision == KvPrecision::kFull;
    const bool writes_original = from_full && page.original < 0;
    if (from_full && !write_original(i)) {
      at.arena_allocator(to).decref(dst);
      return ok_status();
    }
    // A full page is read where it is. A quantized one is requantized from its original, never
    // from a lossy copy (errors do not compound); its block is an arena slot, not a full block.
    Status st;
    if (from_full) {
      for (int l = 0; l < at.shape().num_layers && st.ok(); ++l)
        st = be.quantize_kv_page(at.full_page(l, table_.blocks[i]), at.config().dtype,
                                 at.quant_layout(), to, arena_page(at, to, l, dst));
    } else {
      st = requantize(at, page.original, to, dst);
    }
    if (!st.ok()) {
      // The page stays as it was: the new slot goes back, and so do the original and summary
      // this call wrote (a full page with them would look half demoted to swap and release).
      at.arena_allocator(to).decref(dst);
      if (writes_original) {
        home_.host_allocator().decref(page.original);
        at.summary_allocator().decref(page.summary);
        page.original = -1;
        page.summary = -1;
      }
      return st;
    }
    drop_resident(i);
    table_.blocks[i] = dst;
    page.precision = to;
    (to == KvPrecision::kInt8 ? stats_.demoted_to_int8 : stats_.demoted_to_int4)++;
    return ok_status();
  }

  // Brings evicted page i back at quantized rung `to`, requantized from its host original; the
  // original and summary stay, and the page re-enters the ladder with fresh step counters and
  // its relevance so far. An arena with no free page passes the recall to the next rung, and
  // int4's to a full restore. The original's copy is asynchronous, as a full restore's is: it
  // lands in a full block of the page's shard (a fenced batch on the copy stream) and is
  // quantized from there once landed (commit_quantized, from complete_restores; at once on a
  // backend whose fenced copies are synchronous). With no full block free, it is requantized
  // synchronously through the shard's scratch page instead.
  Status recall_quantized(int i, KvPrecision to) {
    PageEntry& page = table_.pages[i];
    if (page.resident() || page.restoring) return ok_status();
    if (page.original < 0) {
      ++stats_.refused_no_original;
      return ok_status();
    }
    const int64_t t0 = now_ns();
    KvPool& at = home_.shard(page.shard);
    auto id = at.arena_allocator(to).allocate(1);
    if (!id && to == KvPrecision::kInt8) {
      to = KvPrecision::kInt4;
      id = at.arena_allocator(to).allocate(1);
    }
    if (!id) return restore(i);
    PendingRestore r;
    r.page = i;
    r.shard = page.shard;
    r.started_ns = t0;
    r.precision = to;
    r.arena = (*id)[0];
    if (auto staging = at.allocate_blocks(1)) {
      r.block = (*staging)[0];
      StatusOr<uint64_t> fence = copy_original(at, page.original, r.block);
      if (!fence.ok()) {
        at.arena_allocator(to).decref(r.arena);
        home_.decref_block(r.shard, r.block);
        return fence.status();
      }
      r.fence = *fence;
      if (r.fence != 0) {
        page.restoring = true;
        table_.restoring.push_back(r);
        return ok_status();
      }
      return commit_quantized(r);
    }
    if (Status st = requantize(at, page.original, to, r.arena); !st.ok()) {
      at.arena_allocator(to).decref(r.arena);
      return st;
    }
    place_quantized(r);
    return ok_status();
  }

  // A quantized recall whose original has landed in r.block: quantized into its arena page,
  // the full block freed, the page placed. On an error the page stays evicted (nothing kept).
  Status commit_quantized(const PendingRestore& r) {
    KvPool& at = home_.shard(r.shard);
    backend::Backend& be = at.backend();
    Status st;
    for (int l = 0; l < at.shape().num_layers && st.ok(); ++l)
      st = be.quantize_kv_page(at.full_page(l, r.block), at.config().dtype, at.quant_layout(),
                               r.precision, arena_page(at, r.precision, l, r.arena));
    // The block is handed out next (a copy on another stream may write it): read first.
    const Status synced = be.synchronize();
    if (st.ok()) st = synced;
    home_.decref_block(r.shard, r.block);
    table_.pages[r.page].restoring = false;
    if (!st.ok()) {
      at.arena_allocator(r.precision).decref(r.arena);
      return st;
    }
    place_quantized(r);
    return ok_status();
  }

  void place_quantized(const PendingRestore& r) {
    PageEntry& page = table_.pages[r.page];
    table_.blocks[r.page] = r.arena;
    page.location = PageLocation::kDevice;
    page.precision = r.precision;
    page.low_steps = 0;
    page.very_low_steps = 0;
    page.probed = true;
    page.recalled = true;
    page.rescore = true;
    ++stats_.restored;
    ++stats_.restored_quantized;
    stats_.restore_seconds += static_cast<double>(now_ns() - r.started_ns) * 1e-9;
  }

  Status evict(int i, bool keep_original) {
    PageEntry& page = table_.pages[i];
    if (!page.resident() || page.restoring) return ok_status();
    if (keep_original && page.precision == KvPrecision::kFull && !write_original(i))
      return ok_status();
    drop_resident(i);
    table_.blocks[i] = -1;
    if (page.probed) ++stats_.recalls_cold;
    page.probed = false;
    page.location = PageLocation::kEvicted;  // keeps its shard: its summary lives there
    page.precision = KvPrecision::kEvicted;
    ++stats_.evicted;
    return ok_status();
  }

  // kDrop: irreversible. The resident copy goes, and so do the host original and the key summary
  // of a page that went down the ladder before (they kept it restorable: a later kRestore brought
  // a dropped page back).
  Status drop(int i) {
    PageEntry& page = table_.pages[i];
    if (page.restoring) return ok_status();
    KVSPLIT_RETURN_IF_ERROR(evict(i, false));
    release_original_and_summary(page);
    return ok_status();
  }

  // Gives back the page's host original and key summary, if it has them.
  void release_original_and_summary(PageEntry& page) {
    if (page.original >= 0) home_.host_allocator().decref(page.original);
    if (page.summary >= 0) home_.shard(page.shard).summary_allocator().decref(page.summary);
    page.original = -1;
    page.summary = -1;
  }

  // Queues the copy of page i's host original into a new full block as a fenced batch. A
  // backend whose fenced copies are synchronous (fence 0) has it landed: committed at once.
  // Otherwise the page is restoring until complete_restores commits it.
  Status restore(int i) {
    PageEntry& page = table_.pages[i];
    if (page.restoring) return ok_status();  // already on its way
    if (page.resident() && page.precision == KvPrecision::kFull) return ok_status();
    if (page.original < 0) {
      ++stats_.refused_no_original;
      return ok_status();
    }
    const int64_t t0 = now_ns();
    // With a shard group the page comes back where reserve() would place it now (the placement
    // rule, or the next shard with room), not necessarily on the shard it left.
    KvPool::PlacedBlock dst;
    if (home_.num_shards() > 1) {
      auto placed = home_.allocate_placed(i, 1, table_.spread);
      if (placed) dst = (*placed)[0];
    } else if (auto id = home_.allocate_blocks(1)) {
      dst.block = (*id)[0];
    }
    if (dst.block < 0) {
      ++stats_.refused_no_space;
      return ok_status();
    }
    StatusOr<uint64_t> fence = copy_original(home_.shard(dst.shard), page.original, dst.block);
    if (!fence.ok()) {
      home_.decref_block(dst.shard, dst.block);
      return fence.status();
    }
    PendingRestore r;
    r.page = i;
    r.block = dst.block;
    r.shard = static_cast<uint8_t>(dst.shard);
    r.fence = *fence;
    r.started_ns = t0;
    if (r.fence == 0) {
      commit(r);
      return ok_status();
    }
    page.restoring = true;
    table_.restoring.push_back(r);
    return ok_status();
  }

  // A landed restore: the page now lives in r.block at full precision; its old resident copy,
  // host original and summary are freed.
  void commit(const PendingRestore& r) {
    PageEntry& page = table_.pages[r.page];
    if (page.resident()) drop_resident(r.page);
    table_.blocks[r.page] = r.block;
    home_.host_allocator().decref(page.original);
    if (page.summary >= 0) home_.shard(page.shard).summary_allocator().decref(page.summary);
    if (page.probed) ++stats_.recalls_confirmed;
    page = PageEntry{};
    page.shard = r.shard;
    page.recalled = true;
    ++stats_.restored;
    stats_.restore_seconds += static_cast<double>(now_ns() - r.started_ns) * 1e-9;
  }

  // Frees everything page i holds (resident copy, host original, summary): it is never read again.
  void forget(int i) {
    PageEntry& page = table_.pages[i];
    if (page.resident()) drop_resident(i);
    release_original_and_summary(page);
    table_.blocks[i] = -1;
    const uint8_t shard = page.shard;
    page = PageEntry{};
    page.shard = shard;
    page.location = PageLocation::kEvicted;
    page.precision = KvPrecision::kEvicted;
  }

  // Frees a restore's block (and a quantized recall's arena page) whose copy failed; the page
  // keeps its state.
  void abandon(const PendingRestore& r) {
    home_.decref_block(r.shard, r.block);
    if (r.arena >= 0) home_.shard(r.shard).arena_allocator(r.precision).decref(r.arena);
    table_.pages[r.page].restoring = false;
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  static void* arena_page(const KvPool& at, KvPrecision p, int layer, int32_t block) {
    return static_cast<std::byte*>(at.arena(p, layer)) + int64_t{block} * at.page_layer_bytes(p);
  }

  // Queues the copy of host slot `original` (every layer) into full block `block` of shard pool
  // `at` as one fenced batch (the copy stream on CUDA); its fence, 0 when it has landed already.
  StatusOr<uint64_t> copy_original(KvPool& at, int32_t original, int32_t block) {
    std::vector<backend::Backend::CopyRange> copies;
    at.add_page_copies(block, home_.host_slot(original), backend::Backend::CopyDir::kHostToDevice,
                       &copies);
    return at.backend().copy_batch_fenced(backend::Backend::CopyDir::kHostToDevice, copies.data(),
                                          copies.size());
  }

  // Quantizes the full-precision original in host slot `original` into arena page `dst` of rung
  // `to` on shard pool `at`, layer by layer through the shard's scratch page.
  Status requantize(KvPool& at, int32_t original, KvPrecision to, int32_t dst) {
    backend::Backend& be = at.backend();
    const int64_t full_bytes = at.page_layer_bytes(KvPrecision::kFull);
    Status st;
    for (int l = 0; l < at.shape().num_layers && st.ok(); ++l) {
      st = be.copy_h2d(at.scratch_page(l), home_.host_slot(original) + l * full_bytes,
                       static_cast<size_t>(full_bytes));
      if (st.ok())
        st = be.quantize_kv_page(at.scratch_page(l), at.config().dtype, at.quant_layout(), to,
                                 arena_page(at, to, l, dst));
    }
    return st;
  }

  // Frees the page's resident copy (its full block or arena page) on its shard.
  void drop_resident(int i) {
    const PageEntry& page = table_.pages[i];
    if (page.precision == KvPrecision::kFull)
      home_.decref_block(page.shard, table_.blocks[i]);
    else
      home_.shard(page.shard).arena_allocator(page.precision).decref(table_.blocks[i]);
  }

  // Writes page i's full-precision copy to the home host tier and its key summary (on the
  // page's shard), once. False (and counted) when the host tier or the summary slots are full.
  bool write_original(int i) {
    PageEntry& page = table_.pages[i];
    if (page.original >= 0) return true;
    KvPool& at = home_.shard(page.shard);
    backend::Backend& be = at.backend();
    auto slot = home_.allocate_host_slots(1);  // spilled prefix-cache pages give way
    if (!slot) {
      ++stats_.refused_host_full;
      return false;
    }
    auto summary = at.summary_allocator().allocate(1);
    if (!summary) {
      home_.host_allocator().decref((*slot)[0]);
      ++stats_.refused_host_full;
      return false;
    }
    const kernels::QuantPageLayout layout = at.quant_layout();
    const int64_t summary_elems = layout.summary_elems();
    // Every layer's copy in one batch, the summaries beside them on the same stream, then one
    // wait: the slot may be read next from another shard's stream (a restore elsewhere).
    std::vector<backend::Backend::CopyRange> copies;
    at.add_page_copies(table_.blocks[i], home_.host_slot((*slot)[0]),
                       backend::Backend::CopyDir::kDeviceToHost, &copies);
    status_ =
        be.copy_batch_async(backend::Backend::CopyDir::kDeviceToHost, copies.data(), copies.size());
    for (int l = 0; l < at.shape().num_layers && status_.ok(); ++l)
      status_ = be.summarize_kv_page(at.full_page(l, table_.blocks[i]), at.config().dtype, layout,
                                     at.summaries(l) + (*summary)[0] * summary_elems);
    const Status synced = be.synchronize();
    if (status_.ok()) status_ = synced;
    if (!status_.ok()) {
      home_.host_allocator().decref((*slot)[0]);
      at.summary_allocator().decref((*summary)[0]);
      return false;
    }
    page.original = (*slot)[0];
    page.summary = (*summary)[0];
    ++stats_.originals_written;
    return true;
  }

 public:
  Status status_ = ok_status();  // a backend error inside write_original

 private:
  KvPool& home_;
  BlockTable& table_;
  PageOpStats& stats_;
};

}  // namespace

void PageOpStats::add(const PageOpStats& o) {
  demoted_to_int8 += o.demoted_to_int8;
  demoted_to_int4 += o.demoted_to_int4;
  evicted += o.evicted;
  restored += o.restored;
  restored_quantized += o.restored_quantized;
  recalls_confirmed += o.recalls_confirmed;
  recalls_cold += o.recalls_cold;
  originals_written += o.originals_written;
  refused_host_full += o.refused_host_full;
  refused_no_space += o.refused_no_space;
  refused_no_original += o.refused_no_original;
  restore_seconds += o.restore_seconds;
  restores_late += o.restores_late;
  window_dropped += o.window_dropped;
}

Status apply_page_transitions(KvPool& pool, BlockTable& table, int num_tokens,
                              std::span<const PageTransition> transitions, PageOpStats* stats) {
  KVSPLIT_CHECK(stats != nullptr);
  if (transitions.empty()) return ok_status();
  if (table.pages.empty()) table.pages.resize(table.blocks.size());
  KVSPLIT_CHECK(table.pages.size() == table.blocks.size());
  const int full_pages = num_tokens / pool.block_size();
  Executor ex(pool, table, *stats);
  for (const PageTransition& t : transitions) {
    if (t.page < 0 || t.page >= static_cast<int>(table.blocks.size())) {
      return invalid_argument("page transition for page " + std::to_string(t.page) +
                              " of a table of " + std::to_string(table.blocks.size()) + " pages");
    }
    // A swapped-out page (the temporal cut's) is on no rung: its `original` is its swap slot or
    // its place in the table's disk record, which a restore would read as a host original.
    const PageLocation at = table.pages[t.page].location;
    if (at == PageLocation::kHost || at == PageLocation::kDisk) {
      return failed_precondition("page transition for page " + std::to_string(t.page) +
                                 ", which is swapped out (swap the table in first)");
    }
    switch (t.op) {
      case PageOp::kDemote:
        if (t.to != KvPrecision::kInt8 && t.to != KvPrecision::kInt4)
          return invalid_argument("kDemote goes to int8 or int4");
        if (t.page >= full_pages) continue;  // a partial page is never degraded
        KVSPLIT_RETURN_IF_ERROR(ex.demote(t.page, t.to));
        break;
      case PageOp::kEvict:
        if (t.page >= full_pages) continue;
        KVSPLIT_RETURN_IF_ERROR(ex.evict(t.page, true));
        break;
      case PageOp::kDrop:
        if (t.page >= full_pages) continue;
        KVSPLIT_RETURN_IF_ERROR(ex.drop(t.page));
        break;
      case PageOp::kRestore:
        if (t.to == KvPrecision::kEvicted)
          return invalid_argument("kRestore goes to full, int8 or int4");
        if (t.to == KvPrecision::kFull)
          KVSPLIT_RETURN_IF_ERROR(ex.restore(t.page));
        else
          KVSPLIT_RETURN_IF_ERROR(ex.recall_quantized(t.page, t.to));
        break;
    }
    KVSPLIT_RETURN_IF_ERROR(ex.status_);
  }
  for (int sh = 0; sh < pool.num_shards(); ++sh)
    KVSPLIT_RETURN_IF_ERROR(pool.shard(sh).backend().synchronize());
  return ok_status();
}

Status complete_restores(KvPool& pool, BlockTable& table, int64_t wait_us, PageOpStats* stats) {
  KVSPLIT_CHECK(stats != nullptr);
  if (table.restoring.empty()) return ok_status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(wait_us);
  Executor ex(pool, table, *stats);
  Status first_error = ok_status();
  std::vector<PendingRestore> still;
  // Moved out first: commit() and abandon() change the table, never this list.
  std::vector<PendingRestore> pending = std::move(table.restoring);
  table.restoring.clear();
  for (PendingRestore& r : pending) {
    int64_t timeout_us = -1;
    if (wait_us >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
          deadline - std::chrono::steady_clock::now());
      timeout_us = std::max<int64_t>(0, left.count());
    }
    StatusOr<bool> landed = pool.shard(r.shard).backend().wait_fence(r.fence, timeout_us);
    if (!landed.ok()) {
      ex.abandon(r);
      if (first_error.ok())
        first_error = landed.status().with_prefix("restore of page " + std::to_string(r.page));
    } else if (*landed && r.precision != KvPrecision::kFull) {
      const Status st = ex.commit_quantized(r);
      if (!st.ok() && first_error.ok())
        first_error = st.with_prefix("quantized recall of page " + std::to_string(r.page));
    } else if (*landed) {
      ex.commit(r);
    } else {
      if (!r.late) ++stats->restores_late;
      r.late = true;
      still.push_back(r);
    }
  }
  table.restoring = std::move(still);
  return first_error;
}

int drop_behind_window(KvPool& pool, BlockTable& table, int num_tokens, int window,
                       PageOpStats* stats) {
  KVSPLIT_CHECK(stats != nullptr);
  if (window <= 0) return 0;
  const int bs = pool.block_size();
  // The next query (position num_tokens) reads keys [num_tokens - window + 1, num_tokens].
  const int first_key = num_tokens - window + 1;
  const int dead =
      std::min(first_key > 0 ? first_key / bs : 0, static_cast<int>(table.blocks.size()));
  if (dead <= table.window_dropped) return 0;
  if (table.pages.empty()) table.pages.resize(table.blocks.size());
  Executor ex(pool, table, *stats);
  const int before = table.window_dropped;
  for (int i = table.window_dropped; i < dead; ++i) {
    const PageEntry& page = table.pages[i];
    // In flight or off the device: left for a later call (the prefix stays contiguous).
    if (page.restoring || page.location == PageLocation::kHost ||
        page.location == PageLocation::kDisk)
      break;
    ex.forget(i);
    table.window_dropped = i + 1;
    ++stats->window_dropped;
  }
  return table.window_dropped - before;
}

int64_t resident_bytes(const KvPool& pool, const BlockTable& table) {
  const int64_t layers = pool.shape().num_layers;
  if (table.pages.empty())
    return static_cast<int64_t>(table.blocks.size()) *
           pool.page_layer_bytes(kernels::KvPrecision::kFull) * layers;
  int64_t bytes = 0;
  for (const PageEntry& p : table.pages) {
    if (p.resident()) bytes += pool.page_layer_bytes(p.precision) * layers;
    if (p.summary >= 0) bytes += pool.summary_layer_bytes() * layers;  // on the device too
  }
  // A restore in flight holds its full block already (a quantized recall its arena page too).
  for (const PendingRestore& r : table.restoring) {
    bytes += pool.page_layer_bytes(kernels::KvPrecision::kFull) * layers;
    if (r.arena >= 0) bytes += pool.page_layer_bytes(r.precision) * layers;
  }
  return bytes;
}

}  // namespace kvsplit::kv
