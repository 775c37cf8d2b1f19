#include "kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

namespace kvsplit::kv {

uint64_t PrefixCache::salt_of(std::string_view s) {
  // Never 0, so "no salt" and a salt never collide by construction.
  return XXH3_64bits_withSeed(s.data(), s.size(), 0x6b76737061726b31ull) | 1u;
}

uint64_t PrefixCache::page_hash(uint64_t parent, uint64_t salt,
                                std::span<const int32_t> page) const {
  return XXH3_64bits_withSeed(page.data(), page.size_bytes(),
                              parent * 0x9E3779B97F4A7C15ull ^ salt);
}

std::vector<int32_t> PrefixCache::lookup(uint64_t salt, std::span<const int32_t> tokens,
                                         int max_pages) {
  std::vector<int32_t> hits;
  const int pages = std::min<int>(max_pages, static_cast<int>(tokens.size()) / block_size_);
  ++stats_.lookups;
  stats_.lookup_pages += std::max(0, pages);
  uint64_t parent = 0;
  ++tick_;
  for (int i = 0; i < pages; ++i) {
    const auto page = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t h = page_hash(parent, salt, page);
    auto it = entries_.find(h);
    if (it == entries_.end()) break;
    Entry& e = it->second;
    // The hash is a key, not a proof: the tenant, the chain and the tokens must all match.
    if (e.salt != salt || e.parent != parent ||
        !std::equal(page.begin(), page.end(), e.tokens.begin(), e.tokens.end()))
      break;
    e.last_use = tick_;
    hits.push_back(e.block);
    parent = h;
  }
  stats_.hit_pages += static_cast<int64_t>(hits.size());
  return hits;
}

int PrefixCache::insert(uint64_t salt, std::span<const int32_t> tokens,
                        std::span<const int32_t> blocks, int num_pages, BlockAllocator& alloc) {
  num_pages = std::min<int>(
      {num_pages, static_cast<int>(tokens.size()) / block_size_, static_cast<int>(blocks.size())});
  uint64_t parent = 0;
  int added = 0;
  ++tick_;
  for (int i = 0; i < num_pages; ++i) {
    const auto page = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t h = page_hash(parent, salt, page);
    auto it = entries_.find(h);
    if (it != entries_.end()) {
      Entry& e = it->second;
      // A collision with a different page: keep the cached one, and cache nothing past it (its
      // chain would be unreachable).
      if (e.salt != salt || e.parent != parent ||
          !std::equal(page.begin(), page.end(), e.tokens.begin(), e.tokens.end()))
        break;
      e.last_use = tick_;
    } else {
      const int32_t b = blocks[static_cast<size_t>(i)];
      if (b < 0 || by_block_.count(b)) break;  // not on the device, or cached as another page
      alloc.incref(b);
      entries_.emplace(
          h, Entry{b, parent, salt, std::vector<int32_t>(page.begin(), page.end()), tick_});
      by_block_.emplace(b, h);
      ++added;
    }
    parent = h;
  }
  stats_.inserted += added;
  return added;
}

void PrefixCache::drop(std::unordered_map<uint64_t, Entry>::iterator it, BlockAllocator& alloc) {
  by_block_.erase(it->second.block);
  alloc.decref(it->second.block);
  entries_.erase(it);
}

int PrefixCache::evict(int need, BlockAllocator& alloc) {
  if (need <= 0) return 0;
  std::vector<std::pair<uint64_t, uint64_t>> cand;  // (last_use, hash)
  for (const auto& [h, e] : entries_)
    if (alloc.refcount(e.block) == 1) cand.emplace_back(e.last_use, h);
  std::sort(cand.begin(), cand.end());
  int freed = 0;
  for (const auto& [use, h] : cand) {
    if (freed >= need) break;
    drop(entries_.find(h), alloc);
    ++freed;
  }
  stats_.evicted += freed;
  return freed;
}

int PrefixCache::evictable(const BlockAllocator& alloc) const {
  int n = 0;
  for (const auto& [h, e] : entries_) n += alloc.refcount(e.block) == 1;
  return n;
}

void PrefixCache::clear(BlockAllocator& alloc) {
  for (const auto& [h, e] : entries_) alloc.decref(e.block);
  entries_.clear();
  by_block_.clear();
}

}  // namespace kvsplit::kv
