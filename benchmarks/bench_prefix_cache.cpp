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
//   build/benchmarks/bench_prefix_cache [--sizes 1024,16384,131072] [--device-blocks 256]
//                                       [--ops 2000]
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
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
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
