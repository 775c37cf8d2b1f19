#include "kv/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/random_id.h"
#include "common/siphash.h"
#include "kv/disk_tier.h"
#include "kv/kv_pool.h"

namespace kvsplit::kv {
namespace {

// The key a spilled page's disk record carries after its KV (inside the checksummed payload),
// followed by its block_size tokens.
struct RecordMeta {
  uint64_t magic;
  uint64_t salt;
  uint64_t parent;
  uint64_t hash;
  int32_t depth;
  int32_t num_tokens;
};
constexpr uint64_t kMetaMagic = 0x315846525053564bull;  // "KVSPRFX1"

// Every layer of device block `block` to or from `host` (bytes_per_block bytes, layer after
// layer: the host tier's slot layout), as one batch of copies and one wait: the caller frees the
// block, reuses the buffer or frees the source next.
Status copy_page(KvPool& pool, int32_t block, std::byte* host, backend::Backend::CopyDir dir) {
  std::vector<backend::Backend::CopyRange> copies;
  pool.add_page_copies(block, host, dir, &copies);
  KVSPLIT_RETURN_IF_ERROR(pool.backend().copy_batch_async(dir, copies.data(), copies.size()));
  return pool.backend().synchronize();
}

Status page_to_host(KvPool& pool, int32_t block, std::byte* dst) {
  return copy_page(pool, block, dst, backend::Backend::CopyDir::kDeviceToHost);
}

Status page_to_device(KvPool& pool, const std::byte* src, int32_t block) {
  return copy_page(pool, block, const_cast<std::byte*>(src),
                   backend::Backend::CopyDir::kHostToDevice);
}

// The process's secret keys (SipHash-2-4: salts, page hashes, chain checks), drawn once. Keyed,
// the hashes cannot be computed nor collided by a client: a tenant cannot choose a cache_salt
// that lands on another tenant's salt, nor craft a page whose hash takes the map slot of another
// tenant's page (an unkeyed hash of public inputs allows both, in principle). Records never
// outlive the process (the disk tier starts empty), so no key needs to persist.
struct Keys {
  uint64_t k[6];
  Keys() { random_bytes(k, sizeof(k)); }
};
const Keys& keys() {
  static const Keys k;
  return k;
}

}  // namespace

uint64_t PrefixCache::salt_of(std::string_view s) {
  // Never 0, so "no salt" and a salt never collide by construction.
  return SipHasher(keys().k[0], keys().k[1]).update(s.data(), s.size()).finish() | 1u;
}

uint64_t PrefixCache::page_hash(uint64_t parent, uint64_t salt,
                                std::span<const int32_t> page) const {
  return SipHasher(keys().k[2], keys().k[3])
      .update_u64(parent)
      .update_u64(salt)
      .update(page.data(), page.size_bytes())
      .finish();
}

uint64_t PrefixCache::chain_check(uint64_t parent_check, uint64_t salt,
                                  std::span<const int32_t> page) const {
  // Keyed independently of page_hash: with it, a 128-bit key of the whole prefix.
  return SipHasher(keys().k[4], keys().k[5])
      .update_u64(parent_check)
      .update_u64(salt)
      .update(page.data(), page.size_bytes())
      .finish();
}

int64_t PrefixCache::disk_key_bytes(int block_size) {
  return static_cast<int64_t>(sizeof(RecordMeta)) +
         int64_t{block_size} * static_cast<int64_t>(sizeof(int32_t));
}

int64_t PrefixCache::disk_record_bytes() const {
  KVSPLIT_CHECK(pool_ != nullptr);
  return pool_->bytes_per_block() + disk_key_bytes(block_size_);
}

PrefixCache::Map::const_iterator PrefixCache::find_page(uint64_t salt,
                                                        std::span<const int32_t> page, ChainPos pos,
                                                        uint64_t* hash, uint64_t* check) const {
  *hash = page_hash(pos.parent, salt, page);
  auto it = entries_.find(*hash);
  if (it == entries_.end()) return it;
  const Entry& e = it->second;
  *check = chain_check(pos.check, salt, page);
  // The hash is a key, not a proof: the tenant, the chain and the tokens must all match, and
  // the second chained hash too: a page cached after a parent that was dropped since (a failed
  // restore or spill) must not be served after another page of that parent's hash.
  if (e.salt != salt || e.parent != pos.parent || e.check != *check ||
      !std::equal(page.begin(), page.end(), e.tokens.begin(), e.tokens.end()))
    return entries_.end();
  return it;
}

PrefixCache::ChainPos PrefixCache::next(uint64_t salt, std::span<const int32_t> tokens,
                                        ChainPos pos) const {
  const auto page = tokens.subspan(static_cast<size_t>(pos.page) * block_size_, block_size_);
  return ChainPos{pos.page + 1, page_hash(pos.parent, salt, page),
                  chain_check(pos.check, salt, page)};
}

bool PrefixCache::contains(uint64_t salt, std::span<const int32_t> tokens, ChainPos pos) const {
  if (static_cast<int64_t>(pos.page + 1) * block_size_ > static_cast<int64_t>(tokens.size()))
    return false;
  uint64_t hash = 0, check = 0;
  const auto page = tokens.subspan(static_cast<size_t>(pos.page) * block_size_, block_size_);
  return find_page(salt, page, pos, &hash, &check) != entries_.end();
}

std::vector<PrefixCache::Map::iterator> PrefixCache::walk(uint64_t salt,
                                                          std::span<const int32_t> tokens,
                                                          int max_pages, ChainPos from) {
  std::vector<Map::iterator> chain;
  const int pages = std::min<int>(max_pages, static_cast<int>(tokens.size()) / block_size_);
  ++tick_;
  ChainPos pos = from;
  for (int i = from.page; i < pages; ++i) {
    const auto page = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    uint64_t h = 0, check = 0;
    auto found = find_page(salt, page, pos, &h, &check);
    if (found == entries_.end()) break;
    auto it = entries_.find(h);  // the same entry, mutable
    it->second.last_use = tick_;
    reindex(h, it->second);
    chain.push_back(it);
    pos = ChainPos{i + 1, h, check};
  }
  return chain;
}

std::vector<int32_t> PrefixCache::lookup(uint64_t salt, std::span<const int32_t> tokens,
                                         int max_pages) {
  poll_spills();
  std::vector<int32_t> hits;
  note_lookup(std::min<int>(max_pages, static_cast<int>(tokens.size()) / block_size_));
  for (Map::iterator it : walk(salt, tokens, max_pages, ChainPos{})) {
    if (it->second.where != PageLocation::kDevice) break;
    hits.push_back(it->second.block);
  }
  stats_.hit_pages += static_cast<int64_t>(hits.size());
  return hits;
}

std::vector<int32_t> PrefixCache::acquire(uint64_t salt, std::span<const int32_t> tokens,
                                          int max_pages, BlockAllocator& alloc, ChainPos* at) {
  poll_spills();
  const ChainPos from = at != nullptr ? *at : ChainPos{};
  if (at == nullptr)
    note_lookup(std::min<int>(max_pages, static_cast<int>(tokens.size()) / block_size_));
  const std::vector<Map::iterator> chain = walk(salt, tokens, max_pages, from);
  std::vector<int32_t> out;
  size_t k = 0;
  for (; k < chain.size() && chain[k]->second.where == PageLocation::kDevice; ++k) {
    alloc.incref(chain[k]->second.block);
    out.push_back(chain[k]->second.block);
  }
  if (k < chain.size() && pool_ != nullptr) {
    // The rest of the chain: pinned (no spill or reclaim touches it), then a device block for
    // every spilled page while the pool has one, disk reads started ahead (at most
    // kMaxRestoresInFlight, each into a page buffer: the oldest page is brought back before
    // another read starts), and each page brought back in order.
    struct Job {
      Map::iterator it;
      int32_t block = -1;
      bool restore = false;  // a spilled page (else on the device: the caller's reference taken)
      Buffer staging;
      DiskOp op;
      Status started = ok_status();
    };
    std::vector<Job> jobs;
    for (size_t j = k; j < chain.size(); ++j) {
      chain[j]->second.pinned = true;
      reindex(chain[j]->first, chain[j]->second);
    }
    DiskTier* disk = tiers_->disk();
    size_t done = 0;  // jobs[0, done) are finished
    int reading = 0;  // jobs past `done` holding a page buffer
    bool failed = false;
    auto finish = [&](Job& job) {
      Entry& e = job.it->second;
      e.pinned = false;
      reindex(job.it->first, e);
      if (job.staging) --reading;
      if (failed) {
        if (job.restore && !job.op.finished()) (void)disk->wait(job.op);
        give_buffer(std::move(job.staging));
        alloc.decref(job.block);  // the caller's reference, or the unused new block
        return;
      }
      if (!job.restore) {
        out.push_back(job.block);
        return;
      }
      Status st = job.started;
      if (e.where == PageLocation::kHost) {
        // A page whose disk write is in flight is served from the spill's buffer, never the
        // record (not readable before the write completes).
        if (e.spill != nullptr) ++stats_.hit_pages_spilling;
        st = page_to_device(
            *pool_, e.spill != nullptr ? e.spill->buf.get() : tiers_->host_slot(e.slot), job.block);
      } else {
        if (st.ok()) st = disk->wait(job.op);
        if (st.ok()) {
          // The record must be this page of this tenant's prefix: key, chain and tokens.
          RecordMeta m;
          const std::byte* meta = job.staging.get() + pool_->bytes_per_block();
          std::memcpy(&m, meta, sizeof(m));
          const bool same =
              m.magic == kMetaMagic && m.salt == e.salt && m.parent == e.parent &&
              m.hash == job.it->first && m.depth == e.depth && m.num_tokens == block_size_ &&
              std::memcmp(meta + sizeof(m), e.tokens.data(), e.tokens.size() * sizeof(int32_t)) ==
                  0;
          if (!same) st = data_loss("prefix cache: disk record does not match its page");
        }
        if (st.ok()) st = page_to_device(*pool_, job.staging.get(), job.block);
        give_buffer(std::move(job.staging));
      }
      if (!st.ok()) {
        // Slower, never wrong: the entry goes, the lookup ends here, the rest is recomputed.
        ++stats_.restore_faults;
        alloc.decref(job.block);
        drop(job.it, &alloc);
        failed = true;
        return;
      }
      // A page whose write was in flight counts with the disk tier's hits: it left the host tier.
      (e.where == PageLocation::kHost && e.spill == nullptr ? stats_.hit_pages_host
                                                            : stats_.hit_pages_disk)++;
      release_storage(job.it->first, e, &alloc);
      e.where = PageLocation::kDevice;
      e.block = job.block;      // the cache's reference: the new block's first
      alloc.incref(job.block);  // the caller's
      bind_block(job.block, job.it->first, alloc);
      reindex(job.it->first, e);
      out.push_back(job.block);
    };
    for (size_t j = k; j < chain.size(); ++j) {
      Entry& e = chain[j]->second;
      Job job;
      job.it = chain[j];
      if (e.where == PageLocation::kDevice) {
        alloc.incref(e.block);
        job.block = e.block;
        jobs.push_back(std::move(job));
        continue;
      }
      if (e.where == PageLocation::kDisk)
        while (reading >= kMaxRestoresInFlight && !failed) finish(jobs[done++]);
      if (failed) break;
      auto b = pool_->allocate_blocks(1);  // may spill other (unpinned) pages
      if (!b) break;
      job.block = (*b)[0];
      job.restore = true;
      if (e.where == PageLocation::kDisk) {
        // No buffer to be had (host memory): the lookup stops here, a miss; the entry stays.
        job.staging = take_buffer();
        if (!job.staging) {
          alloc.decref(job.block);
          break;
        }
        ++reading;
        const std::span<std::byte> dst[] = {
            {job.staging.get(), static_cast<size_t>(disk_record_bytes())}};
        auto op = disk->read(e.record, dst, RecordKey{e.salt, chain[j]->first});
        if (op.ok())
          job.op = std::move(op).value();
        else
          job.started = op.status();
      }
      jobs.push_back(std::move(job));
    }
    for (size_t j = k + jobs.size(); j < chain.size(); ++j) {
      chain[j]->second.pinned = false;
      reindex(chain[j]->first, chain[j]->second);
    }
    while (done < jobs.size()) finish(jobs[done++]);
  }
  stats_.hit_pages += static_cast<int64_t>(out.size());
  if (at != nullptr && !out.empty()) {
    const auto& last = *chain[out.size() - 1];
    *at = ChainPos{from.page + static_cast<int>(out.size()), last.first, last.second.check};
  }
  return out;
}

void PrefixCache::release_storage(uint64_t hash, Entry& e, BlockAllocator* alloc) {
  unindex(hash, e);
  switch (e.where) {
    case PageLocation::kDevice:
      note_chain_event(hash, e);
      if (e.landing_slot >= 0) cancel_landing(hash, e);
      unbind_block(e.block);
      if (alloc != nullptr) alloc->decref(e.block);
      e.block = -1;
      break;
    case PageLocation::kHost:
      if (e.spill != nullptr) {  // the write goes on; its record is freed when it completes
        e.spill->hash = 0;
        e.spill = nullptr;
        --pages_spilling_;
        break;
      }
      tiers_->host_allocator().decref(e.slot);
      e.slot = -1;
      --pages_host_;
      break;
    case PageLocation::kDisk:
      (void)tiers_->disk()->free(e.record);  // kNotFound only if already gone: nothing to leak
      e.record = 0;
      --pages_disk_;
      break;
    case PageLocation::kEvicted:
      break;
  }
}

void PrefixCache::drop(Map::iterator it, BlockAllocator* alloc) {
  release_storage(it->first, it->second, alloc);
  entries_.erase(it);
  ++stats_.evicted;
}

bool PrefixCache::disk_room(bool make_room) {
  DiskTier* disk = tiers_->disk();
  DiskTierStats ds = disk->stats();
  const int64_t extents = DiskTier::extents_for(disk_record_bytes(), ds.extent_bytes);
  if (extents > ds.extents_total) return false;
  while (ds.extents_total - ds.extents_used < extents) {
    if (!make_room) return false;
    // Older spilled pages make room for a newer one (the cache's own records only); pages whose
    // write is still in flight are older too: wait for the oldest, then it is a disk page.
    auto it = lru(PageLocation::kDisk);
    if (it != entries_.end()) {
      drop(it, nullptr);
    } else if (wait_oldest_spill()) {
      ++stats_.spill_waits;
    } else {
      return false;
    }
    ds = disk->stats();
  }
  return true;
}

bool PrefixCache::start_spill(Map::iterator it, bool make_room, BlockAllocator* alloc,
                              const std::function<Status(std::byte*)>& fill) {
  DiskTier* disk = tiers_->disk();
  if (disk == nullptr) return false;
  poll_spills();
  // Bounded: each spill in flight holds a page-sized buffer.
  while (async_spills_ && spills_in_flight() >= kMaxSpillsInFlight && wait_oldest_spill())
    ++stats_.spill_waits;
  if (!disk_room(make_room)) return false;
  Entry& e = it->second;
  Spill& sp = spills_.emplace_back();
  auto undo = [&] {
    give_buffer(std::move(sp.buf));
    spills_.pop_back();
    ++stats_.spill_faults;
    return false;
  };
  const int64_t kv_bytes = pool_->bytes_per_block();
  sp.buf = take_buffer();
  if (!sp.buf || !fill(sp.buf.get()).ok()) return undo();
  const RecordMeta m{kMetaMagic, e.salt, e.parent, it->first, e.depth, block_size_};
  std::memcpy(sp.buf.get() + kv_bytes, &m, sizeof m);
  std::memcpy(sp.buf.get() + kv_bytes + sizeof m, e.tokens.data(),
              e.tokens.size() * sizeof(int32_t));
  const std::span<const std::byte> payload[] = {
      {sp.buf.get(), static_cast<size_t>(disk_record_bytes())}};
  auto op = disk->write(payload, RecordKey{e.salt, it->first});
  if (!op.ok()) return undo();  // the tier allocated nothing
  sp.op = std::move(op).value();
  if (!async_spills_) {
    // The synchronous path: the record is complete before the allocation goes on.
    if (!disk->wait(sp.op).ok()) return undo();  // the tier freed the failed write
    release_storage(it->first, e, alloc);
    e.where = PageLocation::kDisk;
    e.record = sp.op.record();
    reindex(it->first, e);
    give_buffer(std::move(sp.buf));
    spills_.pop_back();
    ++pages_disk_;
    ++stats_.spilled_disk;
    return true;
  }
  // In flight: the page lives in the spill's buffer until the write completes (poll_spills).
  release_storage(it->first, e, alloc);
  sp.hash = it->first;
  e.where = PageLocation::kHost;
  e.slot = -1;
  e.spill = &sp;
  ++pages_spilling_;
  return true;
}

void PrefixCache::finish_spill(std::list<Spill>::iterator s) {
  KVSPLIT_CHECK(s->result.has_value());
  const bool ok = s->result->ok();
  if (s->hash != 0) {
    auto it = entries_.find(s->hash);
    KVSPLIT_CHECK(it != entries_.end() && it->second.spill == &*s);
    Entry& e = it->second;
    e.spill = nullptr;
    --pages_spilling_;
    if (ok) {
      e.where = PageLocation::kDisk;  // only now does the entry name the record
      e.record = s->op.record();
      reindex(it->first, e);
      ++pages_disk_;
      ++stats_.spilled_disk;
    } else {
      // A failed store is never visible: the tier freed the record, the entry goes.
      ++stats_.spill_faults;
      ++stats_.evicted;
      unindex(it->first, e);
      entries_.erase(it);
    }
  } else if (ok) {
    (void)tiers_->disk()->free(s->op.record());  // the entry left meanwhile: nobody reads it
  } else {
    ++stats_.spill_faults;
  }
  give_buffer(std::move(s->buf));
  spills_.erase(s);
}

PrefixCache::Buffer PrefixCache::take_buffer() {
  if (!free_bufs_.empty()) {
    Buffer b = std::move(free_bufs_.back());
    free_bufs_.pop_back();
    return b;
  }
  backend::Backend& be = tiers_->backend();
  auto mem = be.alloc_host(static_cast<size_t>(disk_record_bytes()));
  return mem.ok() ? Buffer(static_cast<std::byte*>(*mem), FreeHost{&be}) : Buffer();
}

void PrefixCache::give_buffer(Buffer buf) {
  if (buf && static_cast<int>(free_bufs_.size()) < kMaxSpillsInFlight)
    free_bufs_.push_back(std::move(buf));
}

int PrefixCache::poll_spills() {
  int n = 0;
  for (auto s = spills_.begin(); s != spills_.end();) {
    const auto next = std::next(s);
    if (!s->result) s->result = tiers_->disk()->poll(s->op);
    // A pinned entry is being restored from the spill's buffer: finished after the restore.
    if (s->result && (s->hash == 0 || !entries_.at(s->hash).pinned)) {
      finish_spill(s);
      ++n;
    }
    s = next;
  }
  return n;
}

bool PrefixCache::wait_oldest_spill() {
  for (auto s = spills_.begin(); s != spills_.end(); ++s) {
    if (s->hash != 0 && entries_.at(s->hash).pinned) continue;
    if (!s->result) s->result = tiers_->disk()->wait(s->op);
    finish_spill(s);
    return true;
  }
  return false;
}

void PrefixCache::wait_spills() {
  for (Spill& s : spills_)
    if (!s.result) s.result = tiers_->disk()->wait(s.op);
  poll_spills();
}

int32_t PrefixCache::host_slot_for_spill() {
  BlockAllocator& host = tiers_->host_allocator();
  if (host.num_blocks() == 0) return -1;
  if (host.num_free() == 0) {
    auto it = lru(PageLocation::kHost);
    if (it == entries_.end()) return -1;  // swap and semantic originals hold every slot
    host_to_disk(it, /*make_room=*/true);
  }
  auto s = host.allocate(1);
  return s ? (*s)[0] : -1;
}

void PrefixCache::host_to_disk(Map::iterator it, bool make_room) {
  // The slot's bytes go into the spill's buffer, so the slot is free at once (for the page being
  // evicted, or for swap), whatever the write's progress.
  const std::byte* src = tiers_->host_slot(it->second.slot);
  const size_t bytes = static_cast<size_t>(pool_->bytes_per_block());
  if (!start_spill(it, make_room, nullptr, [&](std::byte* dst) {
        std::memcpy(dst, src, bytes);
        return ok_status();
      }))
    drop(it, nullptr);
}

void PrefixCache::spill(Map::iterator it, BlockAllocator& alloc) {
  Entry& e = it->second;
  if (pool_ != nullptr) {
    const int32_t slot = host_slot_for_spill();
    if (slot >= 0) {
      if (page_to_host(*pool_, e.block, tiers_->host_slot(slot)).ok()) {
        release_storage(it->first, e, &alloc);
        e.where = PageLocation::kHost;
        e.slot = slot;
        reindex(it->first, e);
        ++pages_host_;
        ++stats_.spilled_host;
        return;
      }
      tiers_->host_allocator().decref(slot);
      ++stats_.spill_faults;
    } else if (tiers_->disk() != nullptr) {
      const int32_t block = e.block;
      if (start_spill(it, /*make_room=*/true, &alloc,
                      [&](std::byte* dst) { return page_to_host(*pool_, block, dst); }))
        return;
    }
  }
  drop(it, &alloc);
}

int PrefixCache::evict(int need, BlockAllocator& alloc) {
  if (need <= 0) return 0;
  poll_spills();
  // Spill-ahead copies already in flight are the cheapest blocks: they finish first.
  int freed = 0;
  while (freed < need && !landing_.empty()) {
    const uint64_t h = landing_.front();
    Entry& e = entries_.at(h);
    auto landed = pool_->backend().wait_fence(e.landing_fence, -1);
    freed += finish_landing(h, e, &alloc, landed.ok() && *landed);
  }
  // Then the least recently used device pages only the cache holds: each spill takes its page
  // off the device (down a tier, or dropped), so it leaves the index.
  KVSPLIT_CHECK(idle_.empty() || watched_ == &alloc);
  while (freed < need && !idle_.empty()) {
    spill(entries_.find(idle_.begin()->hash), alloc);
    ++freed;
  }
  return freed;
}

int PrefixCache::spill_ahead(int free_target, BlockAllocator& alloc) {
  if (pool_ == nullptr || free_target <= 0) return 0;
  poll_landings(alloc, 0);
  BlockAllocator& host = tiers_->host_allocator();
  const int short_by = free_target - alloc.num_free() - landings_in_flight();
  if (short_by <= 0 || host.num_free() == 0) return 0;
  KVSPLIT_CHECK(idle_.empty() || watched_ == &alloc);
  int started = 0;
  std::vector<backend::Backend::CopyRange> copies;
  while (started < short_by && host.num_free() > 0 && !idle_.empty()) {
    // The least recently used device page only the cache holds; landing, it leaves the index.
    const uint64_t h = idle_.begin()->hash;
    Entry& e = entries_.at(h);
    const int32_t slot = (*host.allocate(1))[0];
    copies.clear();
    pool_->add_page_copies(e.block, tiers_->host_slot(slot),
                           backend::Backend::CopyDir::kDeviceToHost, &copies);
    auto fence = pool_->backend().copy_batch_fenced(backend::Backend::CopyDir::kDeviceToHost,
                                                    copies.data(), copies.size());
    if (!fence.ok()) {
      host.decref(slot);
      ++stats_.spill_faults;
      break;  // a backend error: the allocation path spills as before
    }
    e.landing_slot = slot;
    e.landing_fence = *fence;
    reindex(h, e);
    landing_.push_back(h);
    ++stats_.ahead_started;
    ++started;
  }
  poll_landings(alloc, 0);  // synchronous backends: landed already
  return started;
}

int PrefixCache::poll_landings(BlockAllocator& alloc, int64_t wait_us) {
  int freed = 0;
  const std::vector<uint64_t> in_flight = landing_;
  for (uint64_t h : in_flight) {
    Entry& e = entries_.at(h);
    auto landed = pool_->backend().wait_fence(e.landing_fence, wait_us);
    if (landed.ok() && !*landed) continue;
    freed += finish_landing(h, e, &alloc, landed.ok());
  }
  return freed;
}

bool PrefixCache::finish_landing(uint64_t hash, Entry& e, BlockAllocator* alloc, bool landed) {
  landing_.erase(std::find(landing_.begin(), landing_.end(), hash));
  const int32_t slot = e.landing_slot;
  e.landing_slot = -1;
  e.landing_fence = 0;
  if (!landed) ++stats_.spill_faults;
  if (!landed || e.pinned || alloc == nullptr || alloc->refcount(e.block) != 1) {
    // Failed, or a sequence holds the page again: it stays on the device.
    tiers_->host_allocator().decref(slot);
    if (landed) ++stats_.ahead_kept;
    reindex(hash, e);
    return false;
  }
  note_chain_event(hash, e);
  unindex(hash, e);
  unbind_block(e.block);
  alloc->decref(e.block);
  e.block = -1;
  e.where = PageLocation::kHost;
  e.slot = slot;
  reindex(hash, e);
  ++pages_host_;
  ++stats_.spilled_host;
  ++stats_.ahead_spilled;
  return true;
}

// The caller reindexes the entry (or releases its block).
void PrefixCache::cancel_landing(uint64_t hash, Entry& e) {
  (void)pool_->backend().wait_fence(e.landing_fence, -1);  // the slot is written until then
  landing_.erase(std::find(landing_.begin(), landing_.end(), hash));
  tiers_->host_allocator().decref(e.landing_slot);
  e.landing_slot = -1;
  e.landing_fence = 0;
}

int PrefixCache::evictable(const BlockAllocator& alloc) const {
  KVSPLIT_CHECK(entries_.empty() || watched_ == nullptr || watched_ == &alloc);
  // The idle index, and the pages landing on the host (out of the index, evictable all the same:
  // evict finishes them first).
  int n = static_cast<int>(idle_.size());
  for (uint64_t h : landing_) {
    const Entry& e = entries_.at(h);
    n += !e.pinned && alloc.refcount(e.block) == 1;
  }
  return n;
}

int PrefixCache::reclaimable_host() const {
  // Spill-ahead slots can be given back too (cancel_landing).
  return landings_in_flight() + static_cast<int>(host_lru_.size());
}

int PrefixCache::reclaim_host(int need) {
  poll_spills();
  int freed = 0;
  while (freed < need) {
    auto it = lru(PageLocation::kHost);
    if (it == entries_.end()) break;
    host_to_disk(it, /*make_room=*/false);
    ++freed;
  }
  // Spill-ahead copies in flight give their slots back too (their pages stay on the device).
  while (freed < need && !landing_.empty()) {
    const uint64_t h = landing_.front();
    Entry& e = entries_.at(h);
    cancel_landing(h, e);
    reindex(h, e);
    ++freed;
  }
  stats_.reclaimed += freed;
  return freed;
}

int64_t PrefixCache::disk_extents_held() const {
  const DiskTier* disk = tiers_ != nullptr ? tiers_->disk() : nullptr;
  if (disk == nullptr) return 0;
  return int64_t{pages_disk_ + pages_spilling_} *
         DiskTier::extents_for(disk_record_bytes(), disk->stats().extent_bytes);
}

int PrefixCache::reclaim_disk(int64_t extents, bool whole_group) {
  DiskTier* disk = tiers_ != nullptr ? tiers_->disk() : nullptr;
  if (disk == nullptr) return 0;
  int freed = 0;
  DiskTierStats ds = disk->stats();
  if (extents > ds.extents_total) return 0;  // never fits: keep the cache's records
  poll_spills();
  // Nor when dropping every record of the cache (and its spills in flight) would still leave too
  // little room: the caller's write fails all the same, and the cache would be lost for nothing.
  if (!whole_group && ds.extents_total - ds.extents_used + disk_extents_held() < extents) return 0;
  while (ds.extents_total - ds.extents_used < extents) {
    auto it = lru(PageLocation::kDisk);
    if (it != entries_.end()) {
      drop(it, nullptr);
      ++freed;
    } else if (!wait_oldest_spill()) {  // then it is a disk page, dropped next
      break;
    }
    ds = disk->stats();
  }
  stats_.reclaimed += freed;
  return freed;
}

void PrefixCache::clear(BlockAllocator& alloc) {
  for (auto& [h, e] : entries_) release_storage(h, e, &alloc);  // detaches the spills
  entries_.clear();
  by_block_.clear();
  KVSPLIT_CHECK(idle_.empty() && host_lru_.empty() && disk_lru_.empty());
  wait_spills();  // every spill detached: their records are freed as they complete
  KVSPLIT_CHECK(spills_.empty() && pages_spilling_ == 0);
}

PrefixCache::~PrefixCache() {
  if (watched_ != nullptr) {  // the allocator outlives the cache (KvPool destroys it first)
    for (const auto& [b, h] : by_block_) watched_->watch(b, false);
    watched_->set_watcher(nullptr);
  }
  for (uint64_t h : landing_)  // the host slots are written until then
    (void)pool_->backend().wait_fence(entries_.at(h).landing_fence, -1);
  for (auto& [h, e] : entries_)
    if (e.spill != nullptr) e.spill->hash = 0;
  for (Spill& s : spills_)
    if (!s.result) s.result = tiers_->disk()->wait(s.op);
  for (Spill& s : spills_)
    if (s.result->ok()) (void)tiers_->disk()->free(s.op.record());
}

}  // namespace kvsplit::kv
