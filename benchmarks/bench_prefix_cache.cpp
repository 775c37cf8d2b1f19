// bench_prefix_cache: how the prefix cache's bookkeeping scales with the number of cached pages
// (issue 12, the prefix cache across tiers). A server with a large host or disk tier caches
// hundreds of thousands of pages; what a step asks of the cache (the pool's free-block count, an
// allocation that evicts, a lookup) must not grow with them.
//
// For each cache size N (pages, most of them in the host tier), one run fills a CPU-backend pool
// with N cached pages, then times:
// - available:  KvPool::available_blocks() (free blocks + evictable cached pages), per call;
// - churn:      a sequence reserves one device block (evicting the cache's least recently used
//               device page, which spills to the host tier and pushes the host tier's oldest page
//               out), caches it, and ends: per page;
// - hit:        share_prefix of a cached 8-page prompt on the device, per lookup.
// Prints microseconds per operation and, per operation, the ratio of the largest size's time to
// the smallest's (same run): about 1 when the cost does not grow with the cache.
//
// --chunked-prefill: a prompt's pages cached chunk by chunk as a prefill computes them
// (KvPool::cache_prefix after each chunk, as the worker does), for each prompt length: the
// inserts walking the prompt's chain from page 0 every time, and resumed where the last one
// stopped (PrefixCache::Cursor). Prints milliseconds per prompt and microseconds per chunk.
//
//   build/benchmarks/bench_prefix_cache [--sizes 1024,16384,131072] [--device-blocks 256]
//                                       [--ops 2000]
//   build/benchmarks/bench_prefix_cache --chunked-prefill [--prompts 4096,16384,65536,131072]
//                                       [--chunk 512]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "common/cli_options.h"
#include "kv/kv_pool.h"

namespace {

using kvsplit::kv::BlockTable;
using kvsplit::kv::KvPool;
using kvsplit::kv::KvPoolConfig;
using kvsplit::kv::KvShape;
using kvsplit::kv::PrefixCache;
using Clock = std::chrono::steady_clock;

constexpr int kBlock = 16;
const KvShape kShape{1, 1, 8};  // 1 KiB per page: the bookkeeping, not the copies, dominates

struct Figures {
  double available_us = 0, churn_us = 0, hit_us = 0;
};

double since_us(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One page of distinct tokens per prompt id.
std::vector<int32_t> prompt(int64_t id, int pages) {
  std::vector<int32_t> t(static_cast<size_t>(pages) * kBlock);
  std::iota(t.begin(), t.end(), static_cast<int32_t>(id * 1000 + 1));
  t[0] = static_cast<int32_t>(id);  // unique first page
  return t;
}

void cache_one(KvPool& pool, uint64_t salt, const std::vector<int32_t>& t, int pages) {
  BlockTable a;
  if (!pool.reserve(a, static_cast<int>(t.size()))) {
    std::fprintf(stderr, "bench_prefix_cache: reserve failed\n");
    std::exit(1);
  }
  pool.cache_prefix(a, salt, t, pages);
  pool.release(a);
}

Figures measure(kvsplit::backend::Backend& be, int cached, int device_blocks, int ops) {
  KvPoolConfig c;
  c.num_blocks = device_blocks;
  c.block_size = kBlock;
  c.host_bytes = int64_t{cached} * KvPool::block_bytes(c, kShape);
  auto pool = std::move(KvPool::create(be, c, kShape)).value();
  pool->enable_prefix_cache();
  const uint64_t salt = PrefixCache::salt_of("bench");
  // Fill: `cached` one-page prompts; the device keeps the newest, the rest spill to the host.
  for (int64_t i = 0; i < cached; ++i) cache_one(*pool, salt, prompt(i, 1), 1);
  // A hot 8-page prompt held on the device by a running sequence's share (refcount 2).
  const std::vector<int32_t> hot = prompt(-7, 8);
  cache_one(*pool, salt, hot, 8);
  BlockTable holder;
  pool->share_prefix(holder, salt, hot, 8);
  Figures f;
  volatile int64_t sink = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < ops * 10; ++i) sink = sink + pool->available_blocks();
  f.available_us = since_us(t0) / (ops * 10);
  t0 = Clock::now();
  for (int64_t i = 0; i < ops; ++i) cache_one(*pool, salt, prompt(cached + i, 1), 1);
  f.churn_us = since_us(t0) / ops;
  t0 = Clock::now();
  for (int i = 0; i < ops; ++i) {
    BlockTable b;
    sink = sink + pool->share_prefix(b, salt, hot, 8);
    pool->release(b);
  }
  f.hit_us = since_us(t0) / ops;
  if (pool->prefix_cache()->size() < cached) {
    std::fprintf(stderr, "bench_prefix_cache: the cache holds %d pages, not %d\n",
                 pool->prefix_cache()->size(), cached);
    std::exit(1);
  }
  pool->release(holder);
  return f;
}

// Milliseconds the chunk-by-chunk inserts of one `tokens`-token prompt take, resumed at a cursor
// or walking from page 0.
double chunked_prefill_ms(kvsplit::backend::Backend& be, int tokens, int chunk, bool resumed) {
  KvPoolConfig c;
  c.num_blocks = tokens / kBlock + 64;
  c.block_size = kBlock;
  auto pool = std::move(KvPool::create(be, c, kShape)).value();
  pool->enable_prefix_cache();
  const uint64_t salt = PrefixCache::salt_of("bench");
  std::vector<int32_t> t(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) t[static_cast<size_t>(i)] = (i * 7919) % 500 + 3;
  BlockTable table;
  PrefixCache::Cursor cursor;
  double us = 0;
  for (int done = 0; done < tokens;) {
    done = std::min(done + chunk, tokens);
    if (!pool->reserve(table, done)) {
      std::fprintf(stderr, "bench_prefix_cache: reserve failed\n");
      std::exit(1);
    }
    const auto t0 = Clock::now();
    pool->cache_prefix(table, salt, t, done / kBlock, resumed ? &cursor : nullptr);
    if (done == tokens) pool->settle_prefix(cursor);
    us += since_us(t0);
  }
  if (pool->prefix_cache()->size() != tokens / kBlock) {
    std::fprintf(stderr, "bench_prefix_cache: the cache holds %d pages, not %d\n",
                 pool->prefix_cache()->size(), tokens / kBlock);
    std::exit(1);
  }
  pool->release(table);
  return us / 1000;
}

int chunked_prefill(const std::vector<int>& prompts, int chunk) {
  auto be = std::move(kvsplit::backend::create_backend("cpu", 1)).value();
  std::printf(
      "chunked prefill, %d-token chunks: the prompt's inserts walk its chain from page 0 "
      "/ resume at a cursor\n",
      chunk);
  std::printf("prompt tokens | from page 0 ms | us/chunk | resumed ms | us/chunk | ratio\n");
  for (int tokens : prompts) {
    const int chunks = (tokens + chunk - 1) / chunk;
    const double walked = chunked_prefill_ms(*be, tokens, chunk, false);
    const double resumed = chunked_prefill_ms(*be, tokens, chunk, true);
    std::printf("%13d | %14.2f | %8.1f | %10.2f | %8.1f | %5.1fx\n", tokens, walked,
                walked * 1000 / chunks, resumed, resumed * 1000 / chunks, walked / resumed);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"prefix-cache bookkeeping cost against the number of cached pages"};
  std::vector<int> sizes{1024, 16384, 131072};
  int device_blocks = 256, ops = 2000;
  app.add_option("--sizes", sizes, "cached pages per run")
      ->delimiter(',')
      ->check(CLI::Range(64, 1 << 22));
  app.add_option("--device-blocks", device_blocks, "device pages of the pool")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--ops", ops, "timed operations of each kind")->check(CLI::Range(1, 1 << 24));
  bool chunked = false;
  std::vector<int> prompts{4096, 16384, 65536, 131072};
  int chunk = 512;
  app.add_flag("--chunked-prefill", chunked, "time a chunked prefill's inserts instead");
  app.add_option("--prompts", prompts, "prompt tokens (--chunked-prefill)")
      ->delimiter(',')
      ->check(CLI::Range(kBlock, 1 << 24));
  app.add_option("--chunk", chunk, "prefill chunk tokens (--chunked-prefill)")
      ->check(CLI::Range(1, 1 << 20));
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (chunked) return chunked_prefill(prompts, chunk);
  std::sort(sizes.begin(), sizes.end());
  auto be = std::move(kvsplit::backend::create_backend("cpu", 1)).value();
  std::printf("cached pages | available_blocks us | churn us/page | hit us/lookup\n");
  std::vector<Figures> all;
  for (int n : sizes) {
    all.push_back(measure(*be, n, device_blocks, ops));
    std::printf("%12d | %19.3f | %13.3f | %13.3f\n", n, all.back().available_us,
                all.back().churn_us, all.back().hit_us);
  }
  const Figures &lo = all.front(), &hi = all.back();
  std::printf("largest / smallest (%d / %d pages): available %.2fx, churn %.2fx, hit %.2fx\n",
              sizes.back(), sizes.front(), hi.available_us / lo.available_us,
              hi.churn_us / lo.churn_us, hi.hit_us / lo.hit_us);
  return 0;
}
