// bench_tiers: write and read bandwidth of the disk tier (kv/disk_tier.h) with large records
// (a run of whole pages of every layer, 1-8 MiB) against small per-layer-sized records (a few
// KiB), all in one run, against two references of the same sizes: host memcpy, and the raw file
// system: plain pwrite / pread loops over the same bytes of the tier's own data file, timed back
// to back with the tier's writes and reads in each repeat (the tier's "raw bandwidth", issue 12).
// Prints GB/s (best of the repeats), the ratios tier/raw (of the bests, and the median of each
// repeat's ratio: steadier on a shared machine), tier/memcpy and large/small. Reads are checked
// (part of the tier's cost).
//
//   build/benchmarks/bench_tiers [--dir DIR] [--backend auto|uring|threads|both]
//       [--total-mb 256] [--large-kb 1024,4096,8192] [--small-kb 4,16] [--repeats 3] [--cold]
//       [--direct] [--no-inline]
// (every record size at most --total-mb; --repeats 1..1000)
//
// --direct opens the tier with O_DIRECT (kv.disk.direct_io) and the raw loops' descriptor too,
// from 4 KiB-aligned buffers: both go to the device, never the page cache (record sizes must then
// be multiples of 4 KiB).
// --cold drops the data file's page cache before each read pass, so reads come from the device;
// without it both directions mostly run against the page cache, as a warm server does.
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

#include "common/cli_options.h"
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

struct Row {
  int64_t record_bytes;
  DiskBandwidth disk;  // best of the repeats
  DiskBandwidth raw;   // best of the repeats
  double memcpy_bps;
  double inline_share = 0;    // tier read requests served on the reading thread, over reads
  double digested_share = 0;  // read pieces hashed by the I/O backend as they landed
  double write_ratio_median = 0, read_ratio_median = 0;  // of each repeat's tier/raw
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// Tier against raw with records of `record_bytes`, `total` bytes per measurement. The tier's
// extent fits one record exactly (as a caller sizing extents to its pages would do) and its
// capacity is exactly the records, so they fill the data file's extents 0..n-1. Each repeat:
//   tier write: n records, all in flight (the same source buffer, as the probe does);
//   raw write:  pwrite of the same bytes at each extent of the same file, one call at a time
//               (the records stay valid: the bytes do not change);
//   raw read:   pread of each extent's record bytes from the same file, one at a time, rotating
//               over four destination buffers;
//   tier read:  the n records, four in flight (one per buffer), checked;
// then the records are freed. Raw and tier thus move the same bytes of the same file, in the same
// page-cache state, back to back. `cold` drops the file's page cache before each read pass;
// `direct` opens both with O_DIRECT.
bool measure(const std::string& dir, IoBackend backend, int64_t record_bytes, int64_t total,
             int repeats, bool cold, bool direct, bool inline_reads, Row* row, std::string* ran) {
  DiskTierConfig c;
  c.path = dir;
  c.extent_bytes = (record_bytes + 4095) / 4096 * 4096;
  const int64_t n = total / record_bytes;
  c.capacity_bytes = n * c.extent_bytes;
  c.io.backend = backend;
  c.direct_io = direct;
  c.inline_reads = inline_reads;
  auto opened = DiskTier::open(c);
  if (!opened.ok()) {
    std::fprintf(stderr, "bench_tiers: %s\n", opened.status().to_string().c_str());
    return false;
  }
  DiskTier& tier = *opened.value();
  *ran = kvsplit::kv::io_backend_name(tier.io_backend());
  if (direct && !tier.stats().direct_io) {
    std::fprintf(stderr, "bench_tiers: %s refuses O_DIRECT\n", dir.c_str());
    return false;
  }
  const int fd = ::open(tier.data_file().c_str(), O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) {
    std::fprintf(stderr, "bench_tiers: cannot open %s: %s\n", tier.data_file().c_str(),
                 std::strerror(errno));
    return false;
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  constexpr int kBuffers = 4;  // reads in flight, each into its own buffer
  std::vector<std::unique_ptr<std::byte, Free>> bufs;
  for (int i = 0; i < kBuffers; ++i) {
    bufs.emplace_back(static_cast<std::byte*>(std::aligned_alloc(4096, c.extent_bytes)));
    std::memset(bufs.back().get(), 0x11 * (i + 1), c.extent_bytes);
  }
  const std::span<const std::byte> src(bufs[0].get(), record_bytes);
  const kvsplit::kv::RecordKey key{0x62656e6368, 1};
  const int64_t data_offset = 4096;  // disk_format.h: extent i at 4096 + i * extent_bytes
  const double bytes = static_cast<double>(n * record_bytes);
  std::vector<double> write_ratios, read_ratios;
  row->disk = row->raw = DiskBandwidth{};
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_tiers: %s\n", what.c_str());
    ::close(fd);
    return false;
  };
  for (int r = 0; r < repeats; ++r) {
    std::vector<kvsplit::kv::DiskOp> ops;
    std::vector<kvsplit::kv::RecordId> ids;
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      auto op = tier.write({&src, 1}, key);
      if (!op.ok()) return fail(op.status().to_string());
      ops.push_back(std::move(op).value());
    }
    for (auto& op : ops) {
      const kvsplit::Status s = tier.wait(op);
      if (!s.ok()) return fail(s.to_string());
      ids.push_back(op.record());
    }
    const double tier_ws = seconds_since(t0);

    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i)
      if (::pwrite(fd, src.data(), record_bytes, data_offset + i * c.extent_bytes) !=
          static_cast<ssize_t>(record_bytes))
        return fail("raw pwrite: " + std::string(std::strerror(errno)));
    const double raw_ws = seconds_since(t0);

    if (cold) tier.drop_cache();
    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i)
      if (::pread(fd, bufs[i % kBuffers].get(), record_bytes, data_offset + i * c.extent_bytes) !=
          static_cast<ssize_t>(record_bytes))
        return fail("raw pread: " + std::string(std::strerror(errno)));
    const double raw_rs = seconds_since(t0);

    if (cold) tier.drop_cache();
    ops.clear();
    ops.resize(kBuffers);
    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      kvsplit::kv::DiskOp& slot = ops[i % kBuffers];
      if (!slot.finished()) {
        const kvsplit::Status s = tier.wait(slot);  // its buffer is free again
        if (!s.ok()) return fail(s.to_string());
      }
      const std::span<std::byte> dst(bufs[i % kBuffers].get(), record_bytes);
      auto op = tier.read(ids[i], {&dst, 1}, key);
      if (!op.ok()) return fail(op.status().to_string());
      slot = std::move(op).value();
    }
    for (auto& op : ops) {
      if (op.finished()) continue;
      const kvsplit::Status s = tier.wait(op);
      if (!s.ok()) return fail(s.to_string());
    }
    const double tier_rs = seconds_since(t0);
    ops.clear();
    for (auto id : ids) (void)tier.free(id);

    row->disk.write_bytes_per_s = std::max(row->disk.write_bytes_per_s, bytes / tier_ws);
    row->disk.read_bytes_per_s = std::max(row->disk.read_bytes_per_s, bytes / tier_rs);
    row->raw.write_bytes_per_s = std::max(row->raw.write_bytes_per_s, bytes / raw_ws);
    row->raw.read_bytes_per_s = std::max(row->raw.read_bytes_per_s, bytes / raw_rs);
    write_ratios.push_back(raw_ws / tier_ws);
    read_ratios.push_back(raw_rs / tier_rs);
  }
  ::close(fd);
  row->write_ratio_median = median(write_ratios);
  row->read_ratio_median = median(read_ratios);
  const auto st = tier.stats();
  row->inline_share = static_cast<double>(st.read_requests_inline) /
                      static_cast<double>(std::max<int64_t>(1, st.reads));
  row->digested_share =
      static_cast<double>(st.read_pieces_digested) /
      static_cast<double>(std::max<int64_t>(1, st.read_pieces_digested + st.read_pieces_hashed));
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
  // Bounds keep the shifts below in range; each record must also fit --total-mb (checked below).
  app.add_option("--total-mb", total_mb, "bytes moved per measurement")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--large-kb", large_kb, "large record sizes (KiB)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--small-kb", small_kb, "small record sizes (KiB)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--repeats", repeats, "best of N")->check(CLI::Range(1, 1000));
  app.add_flag("--cold", cold, "drop the page cache between writing and reading");
  app.add_flag("--direct", direct, "O_DIRECT for the tier and the raw loop (the device itself)");
  app.add_flag("--no-inline", no_inline,
               "every tier read through the I/O backend (no page-cache reads on the caller)");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;

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
  for (int64_t size : sizes) {
    if (size > total) {
      std::fprintf(stderr,
                   "bench_tiers: a record of %lld KiB is larger than --total-mb %lld (no record "
                   "would be moved)\n",
                   static_cast<long long>(size >> 10), static_cast<long long>(total_mb));
      return 2;
    }
  }

  int rc = 0;
  for (IoBackend backend : backends) {
    std::vector<Row> rows;
    std::string ran = "?";
    for (int64_t size : sizes) {
      Row row{size, {}, {}, memcpy_bandwidth(size, total, repeats)};
      if (!measure(dir, backend, size, total, repeats, cold, direct, !no_inline, &row, &ran)) {
        rc = 1;
        break;
      }
      rows.push_back(row);
    }
    if (rows.empty()) continue;
    std::printf("\ndisk tier, backend %s, %lld MiB per measurement, %s%s, %d repeats\n",
                ran.c_str(), static_cast<long long>(total_mb),
                direct ? "O_DIRECT" : (cold ? "cold reads" : "warm reads"),
                no_inline ? ", no inline reads" : "", repeats);
    std::printf("%-8s %8s %8s %8s %8s %9s %9s %9s %9s %8s %9s %9s %9s\n", "record", "write", "read",
                "raw wr", "raw rd", "write/raw", "read/raw", "wr/raw", "rd/raw", "memcpy",
                "read/mcpy", "rd inline", "rd digest");
    std::printf("%-8s %8s %8s %8s %8s %9s %9s %9s %9s %8s %9s %9s %9s\n", "", "GB/s", "GB/s",
                "GB/s", "GB/s", "best", "best", "median", "median", "GB/s", "", "", "");
    for (const Row& r : rows)
      std::printf("%-8s %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f %9.2f %8.2f %9.2f %9.2f %9.2f\n",
                  size_name(r.record_bytes).c_str(), r.disk.write_bytes_per_s / 1e9,
                  r.disk.read_bytes_per_s / 1e9, r.raw.write_bytes_per_s / 1e9,
                  r.raw.read_bytes_per_s / 1e9, r.disk.write_bytes_per_s / r.raw.write_bytes_per_s,
                  r.disk.read_bytes_per_s / r.raw.read_bytes_per_s, r.write_ratio_median,
                  r.read_ratio_median, r.memcpy_bps / 1e9, r.disk.read_bytes_per_s / r.memcpy_bps,
                  r.inline_share, r.digested_share);
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
