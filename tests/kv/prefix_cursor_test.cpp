// A chunked prefill's inserts resumed at its cursor (PrefixCache::Cursor) against inserts that
// walk the prompt's chain from page 0 after every chunk, on two caches driven alike: the same
// pages cached, at the same tiers and blocks, evicted in the same order once the sequences end;
// and, when a page of the chain left the cache between two chunks, a resumed insert walks from
// page 0 again and caches it back as the walk from page 0 does.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kv/prefix_cache.h"

namespace kvsplit::kv {
namespace {

constexpr int kBlock = 4;
constexpr int kPages = 24;  // the prompt
constexpr int kChunk = 3;   // pages per prefill chunk

std::vector<int32_t> tokens(int pages, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(pages) * kBlock);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// One cache and its device allocator, and the prompt's table (a sequence's block per page, -1
// until computed). Resumed: each chunk's insert takes the cursor; else it walks from page 0.
struct Prefill {
  explicit Prefill(bool resumed) : resumed(resumed) {}
  bool resumed;
  BlockAllocator alloc{256};
  PrefixCache cache{kBlock};
  PrefixCache::Cursor cursor;
  std::vector<int32_t> table = std::vector<int32_t>(kPages, -1);

  // Caches a whole other prompt whose sequence then ends (its pages idle in the cache).
  void cache_and_end(uint64_t salt, const std::vector<int32_t>& t) {
    const int pages = static_cast<int>(t.size()) / kBlock;
    std::vector<int32_t> blocks = *alloc.allocate(pages);
    cache.insert(salt, t, blocks, pages, alloc);
    for (int32_t b : blocks) alloc.decref(b);
  }
  // The prompt's first `pages` pages served from the cache (share_prefix): the table holds them.
  void share(uint64_t salt, const std::vector<int32_t>& t, int pages) {
    const std::vector<int32_t> hit = cache.lookup(salt, t, pages);
    for (size_t i = 0; i < hit.size(); ++i) {
      alloc.incref(hit[i]);
      table[i] = hit[i];
    }
  }
  // A chunk computed: pages [0, done) of the table hold blocks; the prefill's insert.
  int chunk(uint64_t salt, const std::vector<int32_t>& t, int done) {
    for (int i = 0; i < done; ++i)
      if (table[static_cast<size_t>(i)] < 0)
        table[static_cast<size_t>(i)] = (*alloc.allocate(1))[0];
    return resumed ? cache.insert(salt, t, table, done, alloc, cursor)
                   : cache.insert(salt, t, table, done, alloc);
  }
  void end_prefill() {
    if (resumed) cache.settle(cursor);
  }
  void release() {
    for (int32_t& b : table) {
      if (b >= 0) alloc.decref(b);
      b = -1;
    }
  }
};

// For every page of each prompt, whether the cache holds it. Touches nothing.
std::vector<bool> contents(const Prefill& p, uint64_t salt,
                           const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<bool> out;
  for (const std::vector<int32_t>& t : prompts) {
    PrefixCache::ChainPos pos;
    for (int i = 0; i < static_cast<int>(t.size()) / kBlock; ++i) {
      out.push_back(p.cache.contains(salt, t, pos));
      pos = p.cache.next(salt, t, pos);
    }
  }
  return out;
}

// The device blocks the cache holds.
std::vector<int32_t> held_blocks(const Prefill& p) {
  std::vector<int32_t> out;
  for (int32_t b = 0; b < p.alloc.num_blocks(); ++b)
    if (p.cache.holds(b)) out.push_back(b);
  return out;
}

// The cache's pages evicted one at a time until none is left to evict: for each eviction, the
// index (over the prompts' pages in order) of the page that went.
std::vector<int> eviction_order(Prefill& p, uint64_t salt,
                                const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<int> order;
  std::vector<bool> before = contents(p, salt, prompts);
  while (p.cache.evict(1, p.alloc) == 1) {
    const std::vector<bool> after = contents(p, salt, prompts);
    for (size_t i = 0; i < after.size(); ++i)
      if (before[i] != after[i]) order.push_back(static_cast<int>(i));
    before = after;
  }
  return order;
}

// `shared`: the prefill takes the first 5 pages from the cache (share_prefix), as a prompt does
// at admission; else it computes them itself and the cache keeps another sequence's copies,
// which only the cache holds (the cursor cannot pass them: every chunk walks from page 0).
TEST(PrefixCursor, ResumedInsertsLeaveWhatInsertsFromPageZeroLeave) {
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> prompt = tokens(kPages, 1);
  // Another prompt with the same first 5 pages, cached earlier.
  std::vector<int32_t> other = tokens(8, 1);
  other[5 * kBlock] = 9999;
  const std::vector<int32_t> unrelated = tokens(6, 50000);
  const std::vector<std::vector<int32_t>> prompts = {prompt, other, unrelated};
  for (const bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared" : "computed");
    Prefill resumed(true), walked(false);
    for (Prefill* p : {&resumed, &walked}) {
      p->cache_and_end(salt, other);
      if (shared) p->share(salt, prompt, 5);
    }
    for (int done = 5; done < kPages;) {
      done = std::min(done + kChunk, kPages);
      EXPECT_EQ(resumed.chunk(salt, prompt, done), walked.chunk(salt, prompt, done));
      // Every page held by the prefill: it walks none twice.
      EXPECT_EQ(resumed.cursor.pos.page, shared ? done : 0);
      for (Prefill* p : {&resumed, &walked}) {
        if (done == 8) {
          // Meanwhile others look up and cache: the other prompt's pages and an unrelated
          // prompt get newer than the prefill's.
          p->cache.lookup(salt, other, 8);
          p->cache_and_end(salt, unrelated);
        } else if (done == 11) {
          EXPECT_EQ(p->cache.evict(4, p->alloc), 4);  // the least recently used idle pages
        }
      }
      EXPECT_EQ(contents(resumed, salt, prompts), contents(walked, salt, prompts));
    }
    resumed.end_prefill();
    EXPECT_EQ(contents(resumed, salt, prompts), contents(walked, salt, prompts));
    EXPECT_EQ(held_blocks(resumed), held_blocks(walked));
    EXPECT_EQ(resumed.cache.stats().inserted, walked.cache.stats().inserted);
    EXPECT_TRUE(resumed.cache.index_consistent());
    // The sequence ends: its pages leave the cache tail first, after the older ones, in both.
    resumed.release();
    walked.release();
    const std::vector<int> order = eviction_order(walked, salt, prompts);
    EXPECT_EQ(eviction_order(resumed, salt, prompts), order);
    EXPECT_FALSE(order.empty());
    EXPECT_EQ(resumed.cache.size(), 0);  // every page evicted
  }
}

// A page of the chain that left the cache between two chunks (the sequence let it go and an
// eviction took it): the next resumed insert walks from page 0 and caches it back.
TEST(PrefixCursor, APageOfTheChainEvictedBetweenChunksIsCachedBack) {
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> prompt = tokens(kPages, 1);
  for (const int flood : {0, static_cast<int>(PrefixCache::kChainEvents)}) {
    Prefill resumed(true), walked(false);
    for (Prefill* p : {&resumed, &walked}) {
      p->chunk(salt, prompt, 6);
      // Page 2's block moves out of the table (as a KV cut moves a page) and is evicted.
      p->alloc.decref(p->table[2]);
      p->table[2] = -1;
      ASSERT_EQ(p->cache.evict(1, p->alloc), 1);
      // With a flood, more chain events than the cache keeps happen meanwhile (unrelated pages
      // cached and evicted): the cursor cannot tell page 2's from them.
      for (int k = 0; k < flood; ++k) {
        p->cache_and_end(salt, tokens(1, 100000 + 8 * k));
        p->cache.evict(1, p->alloc);
      }
    }
    EXPECT_EQ(resumed.cursor.pos.page, 6);
    EXPECT_EQ(resumed.chunk(salt, prompt, 9), walked.chunk(salt, prompt, 9));  // page 2 again
    EXPECT_EQ(resumed.cache.lookup(salt, prompt, kPages).size(), 9u) << "flood " << flood;
    EXPECT_EQ(walked.cache.lookup(salt, prompt, kPages).size(), 9u);
    EXPECT_EQ(resumed.cursor.pos.page, 9);
  }
}

// A prefill released between chunks (cancelled, timed out) after more chain events than the cache
// keeps: its cursor is stale, yet settling it still gives its pages the recency of the last
// walk, so its chain evicts from the tail as the walk from page 0 leaves it (settle returned at
// once for a stale cursor, and the first chunk's pages went first).
TEST(PrefixCursor, AStaleCursorReleasedBetweenChunksStillEvictsItsChainFromTheTail) {
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> prompt = tokens(kPages, 1);
  Prefill resumed(true), walked(false);
  for (Prefill* p : {&resumed, &walked}) {
    for (int done = kChunk; done <= 9; done += kChunk) p->chunk(salt, prompt, done);
    for (int k = 0; k <= static_cast<int>(PrefixCache::kChainEvents); ++k) {
      p->cache_and_end(salt, tokens(1, 100000 + 8 * k));
      p->cache.evict(1, p->alloc);
    }
    p->end_prefill();  // what releasing the KV mid-prefill does first (Worker::release_kv)
    p->release();
  }
  const std::vector<int> order = eviction_order(walked, salt, {prompt});
  ASSERT_EQ(order.size(), 9u);
  EXPECT_EQ(order.front(), 8);  // the tail first
  EXPECT_EQ(eviction_order(resumed, salt, {prompt}), order);
}

// The cursor passes only pages cached from the sequence's own blocks: a page another sequence
// cached (its copy, held by it) goes idle when that one ends, which this one's settle does not
// cover, so the cursor stays before it and each chunk's walk touches it.
TEST(PrefixCursor, ThePagesOfAnotherSequencesCopyAreNotPassed) {
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> prompt = tokens(kPages, 1);
  Prefill a(true);
  const std::vector<int32_t> other = *a.alloc.allocate(kChunk);  // still held by its sequence
  a.cache.insert(salt, prompt, other, kChunk, a.alloc);
  a.chunk(salt, prompt, kChunk);  // the same pages computed again into a's own blocks
  EXPECT_EQ(a.cursor.pos.page, 0);
  EXPECT_NE(a.table[0], other[0]);
}

// A cursor is its cache's: another cache (another worker's pool) walks from page 0.
TEST(PrefixCursor, ACursorLeftByAnotherCacheWalksFromPageZero) {
  const uint64_t salt = PrefixCache::salt_of("t");
  const std::vector<int32_t> prompt = tokens(kPages, 1);
  Prefill first(true), second(true);
  first.chunk(salt, prompt, 6);
  second.cursor = first.cursor;
  EXPECT_EQ(second.chunk(salt, prompt, 9), 9);
  EXPECT_EQ(second.cache.lookup(salt, prompt, kPages).size(), 9u);
}

}  // namespace
}  // namespace kvsplit::kv
