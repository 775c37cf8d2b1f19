// The prefix cache's indices (kv/prefix_cache.h): which of the three ordered sets an entry
// belongs in, keeping them in step with the entries and the allocator's sharing reports, and the
// scan that checks them in tests, the stats' sum over a shard group's caches, and the read-only
// walk a handoff's admission counts its shared pages with. The tiers' operations live in
// prefix_cache.cpp.
#include <algorithm>
#include <set>
#include <utility>

#include "common/check.h"
#include "kv/prefix_cache.h"

namespace kvsplit::kv {

static_assert(sizeof(PrefixCacheStats) == 17 * sizeof(int64_t),
              "PrefixCacheStats::operator+= adds every field");

PrefixCacheStats& PrefixCacheStats::operator+=(const PrefixCacheStats& o) {
  for (auto [mine, theirs] : {std::pair{&lookups, o.lookups},
                              {&lookup_pages, o.lookup_pages},
                              {&hit_pages, o.hit_pages},
                              {&hit_pages_host, o.hit_pages_host},
                              {&hit_pages_disk, o.hit_pages_disk},
                              {&inserted, o.inserted},
                              {&evicted, o.evicted},
                              {&spilled_host, o.spilled_host},
                              {&spilled_disk, o.spilled_disk},
                              {&spill_faults, o.spill_faults},
                              {&restore_faults, o.restore_faults},
                              {&reclaimed, o.reclaimed},
                              {&hit_pages_spilling, o.hit_pages_spilling},
                              {&spill_waits, o.spill_waits},
                              {&ahead_started, o.ahead_started},
                              {&ahead_spilled, o.ahead_spilled},
                              {&ahead_kept, o.ahead_kept}})
    *mine += theirs;
  return *this;
}

PrefixCache::Map::iterator PrefixCache::lru(PageLocation where) {
  KVSPLIT_CHECK(where == PageLocation::kHost || where == PageLocation::kDisk);
  const std::set<OrderKey>& order = where == PageLocation::kHost ? host_lru_ : disk_lru_;
  return order.empty() ? entries_.end() : entries_.find(order.begin()->hash);
}

PrefixCache::Index PrefixCache::index_for(const Entry& e) const {
  if (e.pinned) return Index::kNone;
  switch (e.where) {
    case PageLocation::kDevice:
      return e.landing_slot < 0 && watched_ != nullptr && watched_->refcount(e.block) == 1
                 ? Index::kIdleDevice
                 : Index::kNone;
    case PageLocation::kHost:
      return e.spill == nullptr ? Index::kHost : Index::kNone;
    case PageLocation::kDisk:
      return Index::kDisk;
    case PageLocation::kEvicted:
      break;
  }
  return Index::kNone;
}

std::set<PrefixCache::OrderKey>* PrefixCache::index_set(Index i) {
  switch (i) {
    case Index::kIdleDevice:
      return &idle_;
    case Index::kHost:
      return &host_lru_;
    case Index::kDisk:
      return &disk_lru_;
    case Index::kNone:
      break;
  }
  return nullptr;
}

void PrefixCache::unindex(uint64_t hash, Entry& e) {
  if (std::set<OrderKey>* set = index_set(e.index))
    KVSPLIT_CHECK(set->erase(OrderKey{e.indexed_use, -e.depth, hash}) == 1);
  e.index = Index::kNone;
}

void PrefixCache::reindex(uint64_t hash, Entry& e) {
  const Index want = index_for(e);
  if (want == e.index && e.indexed_use == e.last_use) return;
  unindex(hash, e);
  if (std::set<OrderKey>* set = index_set(want)) set->insert(OrderKey{e.last_use, -e.depth, hash});
  e.index = want;
  e.indexed_use = e.last_use;
}

void PrefixCache::bind_block(int32_t block, uint64_t hash, BlockAllocator& alloc) {
  if (watched_ == nullptr) {
    watched_ = &alloc;
    alloc.set_watcher(this);
  }
  KVSPLIT_CHECK_MSG(watched_ == &alloc, "prefix cache: one device allocator per cache");
  by_block_.emplace(block, hash);
  alloc.watch(block, true);
}

void PrefixCache::unbind_block(int32_t block) {
  by_block_.erase(block);
  watched_->watch(block, false);
}

void PrefixCache::on_sharing_changed(int32_t block) {
  auto b = by_block_.find(block);
  if (b == by_block_.end()) return;
  auto it = entries_.find(b->second);
  if (it == entries_.end()) return;
  if (watched_->refcount(block) == 1) note_chain_event(it->first, it->second);  // idle now
  reindex(it->first, it->second);
}

bool PrefixCache::index_consistent() const {
  size_t idle = 0, host = 0, disk = 0;
  for (const auto& [h, e] : entries_) {
    const Index want = index_for(e);
    if (want != e.index || (want != Index::kNone && e.indexed_use != e.last_use)) return false;
    const OrderKey key{e.last_use, -e.depth, h};
    switch (want) {
      case Index::kIdleDevice:
        idle += idle_.count(key);
        break;
      case Index::kHost:
        host += host_lru_.count(key);
        break;
      case Index::kDisk:
        disk += disk_lru_.count(key);
        break;
      case Index::kNone:
        break;
    }
  }
  return idle == idle_.size() && host == host_lru_.size() && disk == disk_lru_.size();
}

int PrefixCache::shared_device_pages(uint64_t salt, std::span<const int32_t> tokens, int max_pages,
                                     const BlockAllocator& alloc) const {
  const int pages = std::min<int>(max_pages, static_cast<int>(tokens.size()) / block_size_);
  int shared = 0;
  ChainPos pos;
  for (; pos.page < pages; ++pos.page) {
    const auto page = tokens.subspan(static_cast<size_t>(pos.page) * block_size_, block_size_);
    uint64_t h = 0, check = 0;
    const auto it = find_page(salt, page, pos, &h, &check);
    if (it == entries_.end() || it->second.where != PageLocation::kDevice ||
        alloc.refcount(it->second.block) <= 1)
      break;
    ++shared;
    pos.parent = h;
    pos.check = check;
  }
  return shared;
}

}  // namespace kvsplit::kv
