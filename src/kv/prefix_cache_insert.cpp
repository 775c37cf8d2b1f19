// The prefix cache's inserts (kv/prefix_cache.h): registering a prompt's pages along its hash
// chain, from page 0, from a shard group's position, or from a chunked prefill's cursor, and the
// chain events that tell a cursor whether it still holds. The tiers' operations live in
// prefix_cache.cpp, the indices in prefix_cache_index.cpp.
#include <algorithm>
#include <atomic>

#include "common/check.h"
#include "kv/prefix_cache.h"

namespace kvsplit::kv {

uint64_t PrefixCache::next_generation() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

int PrefixCache::insert(uint64_t salt, std::span<const int32_t> tokens,
                        std::span<const int32_t> blocks, int num_pages, BlockAllocator& alloc,
                        ChainPos* at) {
  return insert_chain(salt, tokens, blocks, num_pages, alloc, at, nullptr);
}

int PrefixCache::insert(uint64_t salt, std::span<const int32_t> tokens,
                        std::span<const int32_t> blocks, int num_pages, BlockAllocator& alloc,
                        Cursor& cursor) {
  poll_spills();  // before the check: what it finishes is the cursor's business too
  if (!cursor_valid(cursor, salt) || num_pages < cursor.pos.page) {
    cursor = Cursor{};
    cursor.salt = salt;
    cursor.generation = generation_;
  }
  ChainPos at = cursor.pos;
  const int added = insert_chain(salt, tokens, blocks, num_pages, alloc, &at, &cursor);
  cursor.events = num_chain_events_;
  cursor.tick = tick_;
  return added;
}

int PrefixCache::insert_chain(uint64_t salt, std::span<const int32_t> tokens,
                              std::span<const int32_t> blocks, int num_pages, BlockAllocator& alloc,
                              ChainPos* at, Cursor* cursor) {
  num_pages = std::min<int>(
      {num_pages, static_cast<int>(tokens.size()) / block_size_, static_cast<int>(blocks.size())});
  poll_spills();
  const ChainPos from = at != nullptr ? *at : ChainPos{};
  uint64_t parent = from.parent, check = from.check;
  int added = 0;
  ++tick_;
  int i = from.page;
  for (; i < num_pages; ++i) {
    const auto page = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t h = page_hash(parent, salt, page);
    const uint64_t page_check = chain_check(check, salt, page);
    const int32_t b = blocks[static_cast<size_t>(i)];
    Entry* entry = nullptr;
    auto it = entries_.find(h);
    if (it != entries_.end()) {
      Entry& e = it->second;
      // A collision with a different page: keep the cached one, and cache nothing past it (its
      // chain would be unreachable).
      if (e.salt != salt || e.parent != parent || e.check != page_check ||
          !std::equal(page.begin(), page.end(), e.tokens.begin(), e.tokens.end()))
        break;
      e.last_use = tick_;
      if (e.where != PageLocation::kDevice && !e.pinned && b >= 0 && !by_block_.count(b)) {
        // Computed again while spilled: the device copy replaces the lower tier's.
        release_storage(h, e, &alloc);
        alloc.incref(b);
        e.where = PageLocation::kDevice;
        e.block = b;
        bind_block(b, h, alloc);
        ++added;
      }
      reindex(h, e);
      entry = &e;
    } else {
      if (b < 0 || by_block_.count(b)) break;  // not on the device, or cached as another page
      alloc.incref(b);
      Entry e;
      e.block = b;
      e.parent = parent;
      e.check = page_check;
      e.salt = salt;
      e.tokens.assign(page.begin(), page.end());
      e.last_use = tick_;
      e.depth = i;
      Entry& added_entry = entries_.emplace(h, std::move(e)).first->second;
      bind_block(b, h, alloc);
      reindex(h, added_entry);
      ++added;
      entry = &added_entry;
    }
    parent = h;
    check = page_check;
    // The cursor moves past a page that no eviction can take while a sequence holds it: any
    // change to it is a chain event.
    if (cursor != nullptr && cursor->pos.page == i) {
      // Only the sequence's own block: a page cached from another sequence's copy goes idle when
      // that one ends, not when this one is released (its settle would not cover it).
      if (entry->where == PageLocation::kDevice && !entry->pinned && entry->landing_slot < 0 &&
          entry->block == b && alloc.refcount(entry->block) > 1) {
        cursor->hashes.push_back(h);
        cursor->pos = ChainPos{i + 1, h, page_check};
      }
    }
  }
  if (at != nullptr) *at = ChainPos{i, parent, check};  // where it stopped
  stats_.inserted += added;
  return added;
}

void PrefixCache::note_chain_event(uint64_t hash, const Entry& e) {
  const ChainEvent event{hash, e.depth};
  if (chain_events_.size() < kChainEvents) {
    chain_events_.push_back(event);
  } else {
    chain_events_[num_chain_events_ % kChainEvents] = event;
  }
  ++num_chain_events_;
}

bool PrefixCache::cursor_valid(const Cursor& cursor, uint64_t salt) const {
  if (cursor.generation != generation_ || cursor.salt != salt ||
      cursor.hashes.size() != static_cast<size_t>(cursor.pos.page) ||
      num_chain_events_ - cursor.events > kChainEvents)
    return false;
  for (uint64_t n = cursor.events; n < num_chain_events_; ++n) {
    const ChainEvent& e = chain_events_[n % kChainEvents];
    if (e.depth < cursor.pos.page && cursor.hashes[static_cast<size_t>(e.depth)] == e.hash)
      return false;
  }
  return true;
}

void PrefixCache::settle(const Cursor& cursor) {
  // A stale cursor settles too (only another cache's is ignored): its pages still cached take
  // the recency the last walk from page 0 would have given them, whatever happened to the others
  // since, so a chain released between chunks evicts from its tail. A page cached again since has
  // a newer tick of its own and keeps it.
  if (cursor.pos.page == 0 || cursor.generation != generation_) return;
  for (uint64_t h : cursor.hashes) {
    auto it = entries_.find(h);
    if (it == entries_.end()) continue;  // evicted since
    Entry& e = it->second;
    if (e.last_use >= cursor.tick) continue;
    e.last_use = cursor.tick;
    reindex(h, e);
  }
}

}  // namespace kvsplit::kv
