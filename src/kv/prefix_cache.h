// Prefix cache (the temporal cut, kv-cuts.md §3): full KV pages of prompts, keyed by a hash
// chained over the token prefix and salted per tenant, shared across requests. A cached page is a
// block of the owning KvPool that the cache holds one reference on; sequences that hit take their
// own reference. Shared pages are full and never written again (a hit never covers the position
// a sequence computes next), and every page transition (demote, evict, swap) replaces the
// sequence's reference with its own copy, so sharing is copy-on-write by construction.
//
// Pages only the cache holds are evictable, least recently used first (KvPool evicts them when
// it needs blocks). Tenants never share pages: the salt (a tenant id or a request's cache_salt)
// seeds every hash and is stored and compared with the tokens, so a lookup never matches another
// tenant's page, even on a hash collision.
//
// Not thread-safe: one owner (the worker that owns the pool).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_allocator.h"

namespace kvsplit::kv {

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t lookup_pages = 0;  // full pages asked for (the hit-rate denominator)
  int64_t hit_pages = 0;     // pages served from the cache
  int64_t inserted = 0;      // pages registered
  int64_t evicted = 0;       // pages dropped to free their block
};

class PrefixCache {
 public:
  explicit PrefixCache(int block_size) : block_size_(block_size) {}

  // The salt of a tenant (or a request's cache_salt): one 64-bit value mixed into every hash.
  static uint64_t salt_of(std::string_view tenant_or_salt);

  // Blocks of the longest cached prefix of `tokens` in whole pages, at most `max_pages`, in page
  // order (each touched as most recently used). The caller increfs the ones it keeps.
  std::vector<int32_t> lookup(uint64_t salt, std::span<const int32_t> tokens, int max_pages);
  // Registers pages [0, num_pages) of `tokens`, held in `blocks`, taking a reference on each page
  // newly cached. Pages already cached (by any block) are left as they are. Returns the number
  // of pages newly cached.
  int insert(uint64_t salt, std::span<const int32_t> tokens, std::span<const int32_t> blocks,
             int num_pages, BlockAllocator& alloc);
  // Drops least recently used pages that only the cache holds until `need` blocks were freed (or
  // none is left); returns how many were freed.
  int evict(int need, BlockAllocator& alloc);
  // Pages only the cache holds (free for the asking).
  int evictable(const BlockAllocator& alloc) const;
  // True when the cache holds a reference on `block`.
  bool holds(int32_t block) const { return by_block_.count(block) > 0; }
  int size() const { return static_cast<int>(entries_.size()); }
  // Drops every page (the cache's references).
  void clear(BlockAllocator& alloc);
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t block = -1;
    uint64_t parent = 0;  // the previous page's hash (0 for the first page)
    uint64_t salt = 0;
    std::vector<int32_t> tokens;  // the page's tokens, compared on every hit
    uint64_t last_use = 0;
  };
  uint64_t page_hash(uint64_t parent, uint64_t salt, std::span<const int32_t> page) const;
  void drop(std::unordered_map<uint64_t, Entry>::iterator it, BlockAllocator& alloc);

  int block_size_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;     // by chained hash
  std::unordered_map<int32_t, uint64_t> by_block_;  // block -> hash
  PrefixCacheStats stats_;
};

}  // namespace kvsplit::kv
