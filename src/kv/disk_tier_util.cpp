// DiskTier's helpers: fault names, the fault-injection hook, the bandwidth probe.
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "kv/disk_tier.h"

namespace kvsplit::kv {

std::string_view disk_fault_name(DiskFault f) {
  switch (f) {
    case DiskFault::kNone:
      return "none";
    case DiskFault::kCapacity:
      return "capacity";
    case DiskFault::kNoSpace:
      return "no_space";
    case DiskFault::kIoError:
      return "io_error";
    case DiskFault::kShortIo:
      return "short_io";
    case DiskFault::kChecksum:
      return "checksum";
  }
  return "?";
}

DiskFaultHook inject_next(IoOp op, InjectedFault fault, int n) {
  // The hook runs under the tier's lock, so the shared count needs no lock of its own.
  auto left = std::make_shared<int>(n);
  return [op, fault, left](IoOp o) -> std::optional<InjectedFault> {
    if (o != op || *left <= 0) return std::nullopt;
    --*left;
    return fault;
  };
}

StatusOr<DiskBandwidth> measure_disk_bandwidth(DiskTier& tier, int64_t record_bytes,
                                               int64_t total_bytes, bool cold) {
  if (record_bytes <= 0 || total_bytes < record_bytes)
    return invalid_argument("measure_disk_bandwidth: need 0 < record_bytes <= total_bytes");
  const DiskTierStats st = tier.stats();
  const int64_t per_record = DiskTier::extents_for(record_bytes, st.extent_bytes);
  const int64_t n =
      std::min(total_bytes / record_bytes, (st.extents_total - st.extents_used) / per_record);
  if (n < 1) return resource_exhausted("measure_disk_bandwidth: no room for one record");
  constexpr int64_t kReadsInFlight = 4;  // each needs its own destination buffer
  const int64_t buffers = std::min(n, kReadsInFlight);
  std::vector<std::unique_ptr<std::byte[]>> bufs;
  for (int64_t i = 0; i < buffers; ++i) {
    bufs.push_back(std::make_unique<std::byte[]>(record_bytes));
    std::memset(bufs.back().get(), static_cast<int>(0x11 * (i + 1)), record_bytes);
  }
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<RecordId> ids;
  Status status;
  // Writes: all in flight at once (the source buffer is only read).
  const std::span<const std::byte> src(bufs[0].get(), record_bytes);
  const RecordKey key{0x62656e6368, 0};  // "bench"
  std::vector<DiskOp> ops;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < n && status.ok(); ++i) {
    StatusOr<DiskOp> op = tier.write({&src, 1}, key);
    if (!op.ok())
      status = op.status();
    else
      ops.push_back(std::move(op).value());
  }
  for (DiskOp& op : ops) {
    Status s = tier.wait(op);
    if (s.ok())
      ids.push_back(op.record());
    else if (status.ok())
      status = s;
  }
  const double write_s = seconds(t0);
  double read_s = 0;
  if (status.ok()) {
    if (cold) tier.drop_cache();
    ops.clear();
    t0 = Clock::now();
    for (size_t i = 0; i < ids.size() && status.ok(); ++i) {
      const size_t b = i % static_cast<size_t>(buffers);
      if (ops.size() > b) {
        Status s = tier.wait(ops[b]);  // its buffer is free again
        if (!s.ok()) status = s;
      }
      const std::span<std::byte> dst(bufs[b].get(), record_bytes);
      StatusOr<DiskOp> op = tier.read(ids[i], {&dst, 1}, key);
      if (!op.ok()) {
        status = op.status();
      } else if (ops.size() > b) {
        ops[b] = std::move(op).value();
      } else {
        ops.push_back(std::move(op).value());
      }
    }
    for (DiskOp& op : ops) {
      if (op.finished()) continue;
      Status s = tier.wait(op);
      if (!s.ok() && status.ok()) status = s;
    }
    read_s = seconds(t0);
  }
  ops.clear();
  for (RecordId id : ids) (void)tier.free(id);
  if (!status.ok()) return status;
  const double bytes = static_cast<double>(n * record_bytes);
  return DiskBandwidth{bytes / write_s, bytes / read_s};
}

}  // namespace kvsplit::kv
