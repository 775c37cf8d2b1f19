#include "sched/swap_cost.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "kv/disk_tier.h"

namespace kvsplit::sched {
namespace {

// The best rates (bytes/s) of `reps` rounds of a device -> host copy then a host -> device copy
// of `bytes` each; the copies return false on an error (then so does this, *d2h / *h2d unset).
template <typename D2h, typename H2d>
bool best_round_trip(int reps, size_t bytes, D2h d2h, H2d h2d, double* best_d2h, double* best_h2d) {
  using Clock = std::chrono::steady_clock;
  auto rate = [&](Clock::time_point a, Clock::time_point b) {
    return static_cast<double>(bytes) /
           std::max(1e-9, std::chrono::duration<double>(b - a).count());
  };
  double out = 0, in = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const Clock::time_point t0 = Clock::now();
    if (!d2h()) return false;
    const Clock::time_point t1 = Clock::now();
    if (!h2d()) return false;
    const Clock::time_point t2 = Clock::now();
    out = std::max(out, rate(t0, t1));
    in = std::max(in, rate(t1, t2));
  }
  *best_d2h = out;
  *best_h2d = in;
  return true;
}

}  // namespace

SwapChoice choose_swap(SwapMode mode, const SwapCosts& costs, int64_t swap_bytes,
                       int recompute_tokens, SwapTier tier) {
  SwapChoice c;
  c.tier = tier;
  const double bytes = static_cast<double>(swap_bytes);
  const bool host_known = costs.d2h_bytes_per_s > 0 && costs.h2d_bytes_per_s > 0;
  const double host_ms =
      host_known ? 1e3 * (bytes / costs.d2h_bytes_per_s + bytes / costs.h2d_bytes_per_s) : 0;
  bool copies_known = host_known;
  c.swap_ms = host_ms;
  if (tier == SwapTier::kDisk) {
    // Out: the disk write (and a staging copy), or with write-behind only the copy into the
    // staging buffer. In: the disk read (and a staging copy).
    const bool behind = costs.disk_write_behind && costs.d2h_bytes_per_s > 0;
    copies_known = (behind || costs.disk_write_bytes_per_s > 0) && costs.disk_read_bytes_per_s > 0;
    c.swap_ms = 0;
    if (copies_known) {
      const bool staged =
          costs.disk_staging_d2h_bytes_per_s > 0 && costs.disk_staging_h2d_bytes_per_s > 0;
      const double out_ms =
          behind ? 1e3 * bytes / costs.d2h_bytes_per_s
                 : 1e3 * bytes / costs.disk_write_bytes_per_s +
                       (staged ? 1e3 * bytes / costs.disk_staging_d2h_bytes_per_s : 0);
      const double in_ms = 1e3 * bytes / costs.disk_read_bytes_per_s +
                           (staged ? 1e3 * bytes / costs.disk_staging_h2d_bytes_per_s : 0);
      c.swap_ms = out_ms + in_ms;
    }
  }
  if (costs.prefill_tokens_per_s > 0)
    c.recompute_ms = 1e3 * recompute_tokens / costs.prefill_tokens_per_s;
  c.priced = copies_known && costs.prefill_tokens_per_s > 0;
  switch (mode) {
    case SwapMode::kAlways:
      c.swap = true;
      break;
    case SwapMode::kNever:
      c.swap = false;
      break;
    case SwapMode::kAuto:
      c.swap = !c.priced || c.swap_ms < c.recompute_ms;
      break;
  }
  return c;
}

SwapTier swap_tier(const kv::KvPool& pool, int pages) {
  return pool.available_host_slots() < pages && pool.disk() != nullptr ? SwapTier::kDisk
                                                                       : SwapTier::kHost;
}

double ewma(double mean, double sample, double alpha) {
  return mean <= 0 ? sample : mean + alpha * (sample - mean);
}

const char* swap_mode_name(SwapMode mode) {
  switch (mode) {
    case SwapMode::kAuto:
      return "auto";
    case SwapMode::kAlways:
      return "always";
    case SwapMode::kNever:
      return "never";
  }
  return "?";
}

bool measure_copy_bandwidth(const kv::KvPool& pool, SwapCosts* costs) {
  backend::Backend& backend = pool.backend();
  const size_t bytes = static_cast<size_t>(
      std::clamp<int64_t>(pool.bytes_per_block() * 16, int64_t{1} << 20, int64_t{16} << 20));
  auto dev = backend::DeviceBuffer::make(backend, bytes);
  if (!dev.ok()) return false;
  // Host memory and copies as a swap has them: alloc_host (pinned on CUDA; pageable memory would
  // measure the driver's staged copy, well below what the host tier gets) and copy_batch_async.
  auto host_mem = backend.alloc_host(bytes);
  if (!host_mem.ok()) return false;
  struct FreeHost {
    backend::Backend& b;
    void* p;
    ~FreeHost() { b.free_host(p); }
  } free_host{backend, *host_mem};
  auto copy = [&](backend::Backend::CopyDir dir) {
    backend::Backend::CopyRange r;
    const bool d2h = dir == backend::Backend::CopyDir::kDeviceToHost;
    r.dst = d2h ? *host_mem : dev->get();
    r.src = d2h ? dev->get() : *host_mem;
    r.bytes = bytes;
    return backend.copy_batch_async(dir, &r, 1).ok() && backend.synchronize().ok();
  };
  double best_d2h = 0, best_h2d = 0;
  if (!best_round_trip(
          3, bytes, [&] { return copy(backend::Backend::CopyDir::kDeviceToHost); },
          [&] { return copy(backend::Backend::CopyDir::kHostToDevice); }, &best_d2h, &best_h2d))
    return false;
  costs->d2h_bytes_per_s = best_d2h;
  costs->h2d_bytes_per_s = best_h2d;
  return true;
}

bool measure_disk_swap_bandwidth(kv::KvPool& pool, SwapCosts* costs) {
  kv::DiskTier* disk = pool.disk();
  if (disk == nullptr) return false;
  const int64_t record =
      std::clamp<int64_t>(pool.bytes_per_block() * 16, int64_t{1} << 20, int64_t{8} << 20);
  // Read cold (the page cache dropped after the writes): a swapped record is read back after
  // other work has had the page cache, and a buffered tier's warm reads measure memory copies
  // (2.2-6.0 GB/s against 0.85-1.0 cold on the dev VM). An O_DIRECT tier reads the device anyway.
  StatusOr<kv::DiskBandwidth> bw =
      kv::measure_disk_bandwidth(*disk, record, record * 4, /*cold=*/true);
  if (!bw.ok() || bw->write_bytes_per_s <= 0 || bw->read_bytes_per_s <= 0) return false;
  bool stages = false;
  for (int s = 0; s < pool.num_shards(); ++s)
    stages = stages || pool.shard(s).backend().kind() != backend::DeviceKind::kCpu;
  // A staged record goes through the pool's staging memory (KvPool::take_staging: alloc_host
  // memory, pinned on CUDA, the spare reused) by batches of copies, as the host tier's pages do:
  // its copies cost what measure_copy_bandwidth measured.
  const double staging_d2h = stages ? costs->d2h_bytes_per_s : 0;
  const double staging_h2d = stages ? costs->h2d_bytes_per_s : 0;
  costs->disk_write_bytes_per_s = bw->write_bytes_per_s;
  costs->disk_read_bytes_per_s = bw->read_bytes_per_s;
  costs->disk_staging_d2h_bytes_per_s = staging_d2h;
  costs->disk_staging_h2d_bytes_per_s = staging_h2d;
  costs->disk_write_behind = pool.disk_write_behind();
  return true;
}

}  // namespace kvsplit::sched
