// bench_tiers: write and read bandwidth of the disk tier (kv/disk_tier.h) with large records
// (a run of whole pages of every layer, 1-8 MiB) against small per-layer-sized records (a few
// KiB), all in one run, against two references of the same sizes: host memcpy, and the raw file
// system (a plain pwrite / pread loop over a file in the same directory: the tier's "raw
// bandwidth", issue 12). Prints GB/s and the ratios tier/raw, tier/memcpy and large/small.
// Reads are checksummed (part of the tier's cost).
//
//   build/bench_tiers [--dir DIR] [--backend auto|uring|threads|both] [--total-mb 256]
//                     [--large-kb 1024,4096,8192] [--small-kb 4,16] [--repeats 3] [--cold]
//                     [--direct]
//
// --direct opens the tier with O_DIRECT (kv.disk.direct_io) and the raw loop's file too, from
// 4 KiB-aligned buffers: both go to the device, never the page cache.
// --cold drops the data file's page cache between writing and reading, so reads come from the
// device; without it both directions mostly run against the page cache, as a warm server does.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kv/disk_tier.h"

namespace {

using kvsplit::kv::DiskBandwidth;
using kvsplit::kv::DiskTier;
using kvsplit::kv::DiskTierConfig;
using kvsplit::kv::IoBackend;

using Clock = std::chrono::steady_clock;

// memcpy of `total` bytes in `chunk`-byte copies between two pre-touched buffers, best of
// `repeats`, in bytes/s.
double memcpy_bandwidth(int64_t chunk, int64_t total, int repeats) {
  std::vector<char> src(total, 1), dst(total, 2);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int64_t off = 0; off + chunk <= total; off += chunk)
      std::memcpy(dst.data() + off, src.data() + off, chunk);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(total / chunk * chunk) / s);
  }
  if (dst[total / 2] != 1) std::abort();  // keep the copies
  return best;
}

// The raw file system's bandwidth with `chunk`-byte calls: pwrite `total` bytes sequentially into
// a fresh file in `dir`, then pread them back (after dropping its page cache when `cold`), one
// call at a time, rotating over four buffers as the tier's probe does (its reads in flight), best
// of `repeats`. No checksum, no header, no index.
bool raw_bandwidth(const std::string& dir, int64_t chunk, int64_t total, int repeats, bool cold,
                   bool direct, DiskBandwidth* out) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/raw-baseline.data";
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<char, Free>> bufs;
  for (int i = 0; i < 4; ++i) {
    bufs.emplace_back(static_cast<char*>(std::aligned_alloc(4096, (chunk + 4095) / 4096 * 4096)));
    std::memset(bufs.back().get(), 0x5a, chunk);
  }
  *out = DiskBandwidth{};
  const int64_t n = total / chunk;
  for (int r = 0; r < repeats; ++r) {
    const int fd = ::open(path.c_str(),
                          O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
    if (fd < 0) {
      std::fprintf(stderr, "bench_tiers: cannot create %s: %s\n", path.c_str(),
                   std::strerror(errno));
      return false;
    }
    bool ok = true;
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n && ok; ++i)
      ok = ::pwrite(fd, bufs[i % 4].get(), chunk, i * chunk) == static_cast<ssize_t>(chunk);
    const double ws = std::chrono::duration<double>(Clock::now() - t0).count();
    if (cold) {
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    t0 = Clock::now();
    for (int64_t i = 0; i < n && ok; ++i)
      ok = ::pread(fd, bufs[i % 4].get(), chunk, i * chunk) == static_cast<ssize_t>(chunk);
    const double rs = std::chrono::duration<double>(Clock::now() - t0).count();
    ::close(fd);
    ::unlink(path.c_str());
    if (!ok) {
      std::fprintf(stderr, "bench_tiers: raw I/O on %s failed: %s\n", path.c_str(),
                   std::strerror(errno));
      return false;
    }
    out->write_bytes_per_s = std::max(out->write_bytes_per_s, n * chunk / ws);
    out->read_bytes_per_s = std::max(out->read_bytes_per_s, n * chunk / rs);
  }
  return true;
}

struct Row {
  int64_t record_bytes;
  DiskBandwidth disk;
  DiskBandwidth raw;
  double memcpy_bps;
  double inline_share = 0;  // tier read requests served on the reading thread, over reads
};

// Best-of-`repeats` disk bandwidth with records of `record_bytes` (the extent fits one record
// exactly, as a caller sizing extents to its pages would do).
bool disk_bandwidth(const std::string& dir, IoBackend backend, int64_t record_bytes, int64_t total,
                    int repeats, bool cold, bool direct, bool inline_reads, Row* row,
                    std::string* ran) {
  DiskBandwidth* out = &row->disk;
  DiskTierConfig c;
  c.path = dir;
  c.extent_bytes = (DiskTier::kHeaderBytes + record_bytes + 4095) / 4096 * 4096;
  c.capacity_bytes = (total / record_bytes + 1) * c.extent_bytes;
  c.io.backend = backend;
  c.direct_io = direct;
  c.inline_reads = inline_reads;
  auto tier = DiskTier::open(c);
  if (!tier.ok()) {
    std::fprintf(stderr, "bench_tiers: %s\n", tier.status().to_string().c_str());
    return false;
  }
  *out = DiskBandwidth{};
  *ran = kvsplit::kv::io_backend_name(tier.value()->io_backend());
  if (direct && !tier.value()->stats().direct_io) {
    std::fprintf(stderr, "bench_tiers: %s refuses O_DIRECT\n", dir.c_str());
    return false;
  }
  for (int r = 0; r < repeats; ++r) {
    auto bw = kvsplit::kv::measure_disk_bandwidth(*tier.value(), record_bytes, total, cold);
    if (!bw.ok()) {
      std::fprintf(stderr, "bench_tiers: %s\n", bw.status().to_string().c_str());
      return false;
    }
    out->write_bytes_per_s = std::max(out->write_bytes_per_s, bw->write_bytes_per_s);
    out->read_bytes_per_s = std::max(out->read_bytes_per_s, bw->read_bytes_per_s);
  }
  const auto st = tier.value()->stats();
  row->inline_share = static_cast<double>(st.read_requests_inline) /
                      static_cast<double>(std::max<int64_t>(1, st.reads));
  return true;
}

std::string size_name(int64_t b) {
  return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvsplit disk tier bandwidth: large vs small records vs memcpy"};
  std::string dir = (std::filesystem::temp_directory_path() /
                     ("kvsplit-bench-tiers-" + std::to_string(::getpid())))
                        .string();
  std::string backend_name = "auto";
  int64_t total_mb = 256;
  std::vector<int64_t> large_kb{1024, 4096, 8192}, small_kb{4, 16};
  int repeats = 3;
  bool cold = false, direct = false, no_inline = false;
  app.add_option("--dir", dir, "directory for the tier's data file (removed at the end)");
  app.add_option("--backend", backend_name, "auto | uring | threads | both");
  app.add_option("--total-mb", total_mb, "bytes moved per measurement");
  app.add_option("--large-kb", large_kb, "large record sizes (KiB)")->delimiter(',');
  app.add_option("--small-kb", small_kb, "small record sizes (KiB)")->delimiter(',');
  app.add_option("--repeats", repeats, "best of N");
  app.add_flag("--cold", cold, "drop the page cache between writing and reading");
  app.add_flag("--direct", direct, "O_DIRECT for the tier and the raw loop (the device itself)");
  app.add_flag("--no-inline", no_inline,
               "every tier read through the I/O backend (no page-cache reads on the caller)");
  CLI11_PARSE(app, argc, argv);

  std::vector<IoBackend> backends;
  if (backend_name == "both") {
    backends = {IoBackend::kUring, IoBackend::kThreads};
  } else {
    auto b = kvsplit::kv::parse_io_backend(backend_name);
    if (!b.ok()) {
      std::fprintf(stderr, "bench_tiers: %s\n", b.status().to_string().c_str());
      return 2;
    }
    backends = {b.value()};
  }
  const int64_t total = total_mb << 20;
  std::vector<int64_t> sizes;
  for (int64_t kb : large_kb) sizes.push_back(kb << 10);
  for (int64_t kb : small_kb) sizes.push_back(kb << 10);

  int rc = 0;
  for (IoBackend backend : backends) {
    std::vector<Row> rows;
    std::string ran = "?";
    for (int64_t size : sizes) {
      Row row{size, {}, {}, memcpy_bandwidth(size, total, repeats)};
      if (!raw_bandwidth(dir, size, total, repeats, cold, direct, &row.raw) ||
          !disk_bandwidth(dir, backend, size, total, repeats, cold, direct, !no_inline, &row,
                          &ran)) {
        rc = 1;
        break;
      }
      rows.push_back(row);
    }
    if (rows.empty()) continue;
    std::printf("\ndisk tier, backend %s, %lld MiB per measurement, %s%s, best of %d\n",
                ran.c_str(), static_cast<long long>(total_mb),
                direct ? "O_DIRECT" : (cold ? "cold reads" : "warm reads"),
                no_inline ? ", no inline reads" : "", repeats);
    std::printf("%-10s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "record", "write GB/s",
                "read GB/s", "raw wr", "raw rd", "write/raw", "read/raw", "memcpy", "read/mcpy",
                "rd inline");
    for (const Row& r : rows)
      std::printf("%-10s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n",
                  size_name(r.record_bytes).c_str(), r.disk.write_bytes_per_s / 1e9,
                  r.disk.read_bytes_per_s / 1e9, r.raw.write_bytes_per_s / 1e9,
                  r.raw.read_bytes_per_s / 1e9, r.disk.write_bytes_per_s / r.raw.write_bytes_per_s,
                  r.disk.read_bytes_per_s / r.raw.read_bytes_per_s, r.memcpy_bps / 1e9,
                  r.disk.read_bytes_per_s / r.memcpy_bps, r.inline_share);
    // Large over small: what moving a sequence as whole pages buys over per-layer pieces.
    const size_t nl = std::min(large_kb.size(), rows.size());
    if (nl < rows.size()) {
      const Row& big = *std::max_element(rows.begin(), rows.begin() + nl, [](auto& a, auto& b) {
        return a.disk.read_bytes_per_s < b.disk.read_bytes_per_s;
      });
      for (size_t i = nl; i < rows.size(); ++i)
        std::printf("large %s / small %s: write %.1fx, read %.1fx\n",
                    size_name(big.record_bytes).c_str(), size_name(rows[i].record_bytes).c_str(),
                    big.disk.write_bytes_per_s / rows[i].disk.write_bytes_per_s,
                    big.disk.read_bytes_per_s / rows[i].disk.read_bytes_per_s);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
