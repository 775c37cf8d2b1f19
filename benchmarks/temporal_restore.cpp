// bench_temporal --restore: one sequence's KV restored from the host tier and from the disk tier
// (page cache warm, and with --cold dropped first), against recomputing it. Every swap-in's pages
// are compared with the prefill's, byte for byte: a restore that lost data fails the run.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv/disk_tier.h"
#include "kv/kv_pool.h"
#include "kv/swap.h"
#include "temporal.h"

namespace kvsplit::bench_temporal {

namespace {

// The full-precision pages of `table`, page after page, each layer after layer (CPU backend:
// device memory is host memory). `layers` layers of bytes_per_block() / layers bytes each.
std::vector<std::byte> page_bytes(const kvsplit::kv::KvPool& pool,
                                  const kvsplit::kv::BlockTable& table, int layers) {
  const size_t layer_bytes = static_cast<size_t>(pool.bytes_per_block() / layers);
  std::vector<std::byte> out;
  out.reserve(table.blocks.size() * layer_bytes * static_cast<size_t>(layers));
  for (int32_t block : table.blocks)
    for (int l = 0; l < layers; ++l) {
      const std::byte* p = pool.full_page(l, block);
      out.insert(out.end(), p, p + layer_bytes);
    }
  return out;
}

// The first page (of `page_size` bytes) where `a` and `b` differ; -1 when they are equal.
int first_different_page(const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                         size_t page_size) {
  if (a.size() != b.size()) return 0;
  for (size_t off = 0; off < a.size(); off += page_size)
    if (std::memcmp(a.data() + off, b.data() + off, std::min(page_size, a.size() - off)) != 0)
      return static_cast<int>(off / page_size);
  return -1;
}

}  // namespace

bool load_cpu_model(const Options& o, CpuModel* m) {
  auto loaded = kvsplit::model::load_model(o.model);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), false;
  m->loaded.emplace(std::move(loaded).value());
  auto be = kvsplit::backend::create_backend("cpu", o.threads);
  if (!be.ok()) return std::fprintf(stderr, "%s\n", be.status().to_string().c_str()), false;
  m->be = std::move(be).value();
  auto model = kvsplit::model::LlamaModel::create(*m->loaded, *m->be);
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().to_string().c_str()), false;
  m->model = std::move(model).value();
  return true;
}

int run_restore(const Options& o) {
  CpuModel m;
  if (!load_cpu_model(o, &m)) return 1;
  const kvsplit::model::LoadedModel* loaded = &*m.loaded;
  kvsplit::backend::Backend* be = m.be.get();
  kvsplit::model::LlamaModel* model = m.model.get();
  const int tokens = std::min(o.tokens, loaded->config.max_seq_len);
  kvsplit::kv::KvPoolConfig pc;
  pc.block_size = 16;
  pc.num_blocks = (tokens + 15) / 16 + 1;
  const kvsplit::kv::KvShape shape = model->kv_shape();
  pc.host_bytes = pc.num_blocks * kvsplit::kv::KvPool::block_bytes(pc, shape);
  auto pool = kvsplit::kv::KvPool::create(*be, pc, shape);
  if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().to_string().c_str()), 1;
  std::filesystem::create_directories(o.disk_path);
  kvsplit::kv::DiskTierConfig dc;
  dc.path = o.disk_path;
  dc.extent_bytes = 1 << 20;
  // Room for the sequence twice over, in whole extents plus one for each record's rounding (a
  // small model's sequence is less than one extent).
  const int64_t want = int64_t{pc.num_blocks + 4} * kvsplit::kv::KvPool::block_bytes(pc, shape) * 2;
  dc.capacity_bytes = (want / dc.extent_bytes + 2) * dc.extent_bytes;
  dc.direct_io = o.disk_direct_io;
  auto disk = kvsplit::kv::DiskTier::open(dc);
  if (!disk.ok()) return std::fprintf(stderr, "%s\n", disk.status().to_string().c_str()), 1;
  (*pool)->attach_disk(std::move(disk).value());

  std::mt19937 rng(1);
  std::vector<int32_t> ids(tokens);
  for (int32_t& t : ids) t = 3 + static_cast<int32_t>(rng() % (loaded->config.vocab_size - 3));
  kvsplit::kv::BlockTable table;
  // Each failure says what failed (the swaps' StatusOr is checked before it is read).
  auto failed = [](const std::string& what) {
    std::fprintf(stderr, "restore: %s\n", what.c_str());
    return 1;
  };
  auto swap_failed = [&](const kvsplit::StatusOr<bool>& r, const char* what) {
    return failed(std::string(what) + ": " + (r.ok() ? "refused" : r.status().to_string()));
  };
  if (!(*pool)->reserve(table, tokens)) return failed("the pool is too small for the sequence");
  kvsplit::model::SeqStep step;
  step.tokens = ids;
  step.start_pos = 0;
  step.table = &table;
  step.logits = kvsplit::model::SeqStep::Logits::kNone;
  std::vector<float> logits;
  const int layers = shape.num_layers;
  const size_t page_size = static_cast<size_t>((*pool)->bytes_per_block());
  double recompute = 1e30, host_in = 1e30, disk_in = 1e30, host_out = 1e30, disk_out = 1e30;
  double wb_out = 1e30, wb_written = 1e30, wb_in = 1e30, cold_in = 1e30;
  const int64_t bytes = int64_t{(tokens + 15) / 16} * (*pool)->bytes_per_block();
  for (int r = 0; r < o.reps; ++r) {
    auto t0 = Clock::now();
    const std::vector<kvsplit::model::SeqStep> steps = {step};
    if (const auto fw = model->forward(steps, **pool, &logits); !fw.ok())
      return failed("prefill: " + fw.to_string());
    recompute = std::min(recompute, ms_since(t0));
    // What every swap-in must give back: the sequence's pages as the prefill wrote them.
    const std::vector<std::byte> want = page_bytes(**pool, table, layers);
    // The sequence is swapped out: no device block holds anything; overwrite them all.
    auto poison = [&] {
      for (int32_t b = 0; b < pc.num_blocks; ++b)
        for (int l = 0; l < layers; ++l)
          std::memset((*pool)->full_page(l, b), 0xA5, page_size / static_cast<size_t>(layers));
    };
    auto same_pages = [&](const char* what) {
      const int page = first_different_page(want, page_bytes(**pool, table, layers), page_size);
      if (page < 0) return true;
      failed(std::string(what) + ": page " + std::to_string(page) +
             " differs from the page before the swap-out");
      return false;
    };
    kvsplit::kv::SwapStats st;
    // A timed swap-in into overwritten device blocks (it must write every page it gives back),
    // its best time in *best, its pages compared with the prefill's; false (reported) on failure.
    auto timed_swap_in = [&](const char* what, double* best) {
      poison();
      const auto start = Clock::now();
      const auto in = kvsplit::kv::swap_in(**pool, table, &st);
      if (!in.ok() || !*in) {
        swap_failed(in, what);
        return false;
      }
      *best = std::min(*best, ms_since(start));
      return same_pages(what);
    };
    t0 = Clock::now();
    auto out = kvsplit::kv::swap_out(**pool, table, &st);
    if (!out.ok() || !*out) return swap_failed(out, "host swap out");
    host_out = std::min(host_out, ms_since(t0));
    if (!timed_swap_in("host swap in", &host_in)) return 1;
    // The disk tier: no host tier room (take every host slot first).
    auto hog = (*pool)->host_allocator().allocate((*pool)->host_allocator().num_free());
    t0 = Clock::now();
    out = kvsplit::kv::swap_out(**pool, table, &st);
    if (!out.ok() || !*out) return swap_failed(out, "disk swap out");
    if (st.to_disk != 1) return failed("the disk swap out did not go to the disk tier");
    disk_out = std::min(disk_out, ms_since(t0));
    if (!timed_swap_in("disk swap in", &disk_in)) return 1;
    if (o.cold) {
      // The same round trip with the record written back and dropped from the page cache before
      // the swap-in: it reads the device (the warm one above reads memory).
      out = kvsplit::kv::swap_out(**pool, table, &st);
      if (!out.ok() || !*out) return swap_failed(out, "cold disk swap out");
      if (st.to_disk != 2) return failed("the cold swap out did not go to the disk tier");
      (*pool)->disk()->drop_cache();
      if (!timed_swap_in("cold disk swap in", &cold_in)) return 1;
    }
    // Write-behind: swap_out returns once the pages are staged; the record is complete when a
    // poll (a step boundary) sees its write end.
    (*pool)->set_disk_write_behind(true);
    t0 = Clock::now();
    out = kvsplit::kv::swap_out(**pool, table, &st);
    if (!out.ok() || !*out) return swap_failed(out, "write-behind swap out");
    if (st.write_behind != 1) return failed("the swap out was not written behind");
    wb_out = std::min(wb_out, ms_since(t0));
    while ((*pool)->swap_write(table.disk_record) != nullptr &&
           kvsplit::kv::poll_swap_writes(**pool, &st) == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    wb_written = std::min(wb_written, ms_since(t0));
    if (st.disk_faults != 0) return failed("the write-behind record faulted");
    if (!timed_swap_in("write-behind swap in", &wb_in)) return 1;
    (*pool)->set_disk_write_behind(false);
    if (hog)
      for (int32_t s : *hog) (*pool)->host_allocator().decref(s);
  }
  (*pool)->release(table);
  std::printf(
      "restore: %s, %d tokens (%.1f MiB of KV, f32 pages), %d threads, best of %d; every "
      "swap-in's pages compared byte for byte with the prefill's: same\n"
      "  recompute (prefill)  %9.2f ms\n"
      "  host tier: out %8.2f ms, in %8.2f ms (%.1f GB/s in): restore %.1fx faster than "
      "recompute\n"
      "  disk tier: out %8.2f ms, in %8.2f ms (%.1f GB/s in): restore %.1fx faster than "
      "recompute%s\n",
      o.model.c_str(), tokens, bytes / 1048576.0, o.threads, o.reps, recompute, host_out, host_in,
      bytes / host_in / 1e6, recompute / host_in, disk_out, disk_in, bytes / disk_in / 1e6,
      recompute / disk_in,
      o.disk_direct_io ? " (O_DIRECT)"
                       : " (page cache warm: the swap-in reads what its swap-out just wrote; "
                         "--cold drops it)");
  if (o.cold)
    std::printf(
        "  disk tier, cold: in %8.2f ms (%.1f GB/s in): restore %.1fx faster than recompute "
        "(DiskTier::drop_cache before each swap-in: written back, page cache dropped); cold / "
        "warm in %.2fx\n",
        cold_in, bytes / cold_in / 1e6, recompute / cold_in, cold_in / disk_in);
  std::printf(
      "  disk tier, write-behind: out %8.2f ms (%.2fx the synchronous out; record complete after "
      "%.2f ms), in %8.2f ms\n",
      wb_out, wb_out / disk_out, wb_written, wb_in);
  return 0;
}

}  // namespace kvsplit::bench_temporal
