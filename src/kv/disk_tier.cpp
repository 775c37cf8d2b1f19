#include "kv/disk_tier.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
// The checksum is inlined from the header (the same XXH3 values as the library's): Debian's
// libxxhash is built for baseline x86-64, about 3x slower than the AVX2/AVX-512 code the
// compiler generates here, and on warm reads it was most of the tier's cost (docs/kv-tiers.md).
#define XXH_INLINE_ALL
#if defined(__AVX2__)
#define XXH_VECTOR XXH_AVX2  // not its AVX-512 loop: GCC 12 warns on it, and it gains little
#endif
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "kv/disk_format.h"

namespace kvsplit::kv {

using disk_format::kDataOffset;
using disk_format::kRecordMagic;
using disk_format::kRequestBytes;
using disk_format::RecordHeader;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

uint64_t checksum(std::span<const std::span<const std::byte>> segs) {
  if (segs.size() == 1) return XXH3_64bits(segs[0].data(), segs[0].size());
  XXH3_state_t* st = XXH3_createState();
  KVSPLIT_CHECK(st != nullptr);
  XXH3_64bits_reset(st);
  for (const auto& s : segs) XXH3_64bits_update(st, s.data(), s.size());
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

StatusCode code_of(DiskFault f) {
  switch (f) {
    case DiskFault::kCapacity:
    case DiskFault::kNoSpace:
      return StatusCode::kResourceExhausted;
    case DiskFault::kIoError:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kDataLoss;
  }
}

}  // namespace

DiskTier::Record* DiskTier::find_locked(RecordId id) {
  const uint32_t slot = static_cast<uint32_t>(id);
  if (slot >= records_.size()) return nullptr;
  Record& r = records_[slot];
  if (r.state == Record::State::kFree || r.generation != static_cast<uint32_t>(id >> 32))
    return nullptr;
  return &r;
}
const DiskTier::Record* DiskTier::find_locked(RecordId id) const {
  return const_cast<DiskTier*>(this)->find_locked(id);
}

void DiskTier::release_locked(Record& r, uint32_t slot) {
  for (int32_t e : r.extents) extents_.decref(e);
  r.extents.clear();
  r.state = Record::State::kFree;
  ++r.generation;
  --stats_.records;
  free_slots_.push_back(slot);
}

Status DiskTier::fault_locked(DiskOp* op, DiskFault f, const std::string& detail) {
  ++stats_.faults[static_cast<int>(f)];
  if (op) op->fault_ = f;
  std::string msg = "disk tier " + file_ + ": " + std::string(disk_fault_name(f)) + ": " + detail;
  if (!logged_[static_cast<int>(f)]) {
    logged_[static_cast<int>(f)] = true;
    KVSPLIT_LOG_WARN("{} (the caller falls back to recompute; later {} faults are only counted)",
                     msg, disk_fault_name(f));
  }
  return Status(code_of(f), std::move(msg));
}

std::vector<IoRequest> DiskTier::plan_io(IoOp op, const std::vector<int32_t>& extents,
                                         std::span<const iovec> stream) const {
  std::vector<IoRequest> reqs;
  const int64_t eb = config_.extent_bytes;
  size_t si = 0;    // stream segment
  size_t used = 0;  // bytes of stream[si] already planned
  int64_t req_bytes = 0;
  for (size_t i = 0; i < extents.size() && si < stream.size();) {
    size_t j = i + 1;  // [i, j): a run of consecutive extents
    while (j < extents.size() && extents[j] == extents[j - 1] + 1) ++j;
    int64_t off = kDataOffset + int64_t{extents[i]} * eb;
    int64_t room = static_cast<int64_t>(j - i) * eb;
    bool fresh = true;  // the next bytes start a new request (a new run)
    while (room > 0 && si < stream.size()) {
      if (fresh || req_bytes == kRequestBytes || reqs.back().iov.size() == IOV_MAX) {
        reqs.push_back(IoRequest{op, fd_, off, {}});
        req_bytes = 0;
        fresh = false;
      }
      const int64_t take = std::min(
          {static_cast<int64_t>(stream[si].iov_len - used), room, kRequestBytes - req_bytes});
      reqs.back().iov.push_back(
          iovec{static_cast<std::byte*>(stream[si].iov_base) + used, static_cast<size_t>(take)});
      req_bytes += take;
      off += take;
      room -= take;
      used += static_cast<size_t>(take);
      if (used == stream[si].iov_len) ++si, used = 0;
    }
    i = j;
  }
  KVSPLIT_CHECK_MSG(si == stream.size(), "record larger than its extents");
  return reqs;
}

StatusOr<DiskOp> DiskTier::write(std::span<const std::span<const std::byte>> payload,
                                 RecordKey key) {
  int64_t bytes = 0;
  for (const auto& s : payload) bytes += static_cast<int64_t>(s.size());
  if (bytes == 0) return invalid_argument("disk tier " + file_ + ": empty record");
  const int64_t need = (kHeaderBytes + bytes + config_.extent_bytes - 1) / config_.extent_bytes;
  const uint64_t sum = checksum(payload);  // before the lock: CPU work over the payload

  DiskOp op;
  op.started_ = std::chrono::steady_clock::now();
  op.op_ = IoOp::kWrite;
  std::vector<int32_t> extents;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<std::vector<int32_t>> got;
    if (need <= extents_.num_free()) got = extents_.allocate(static_cast<int>(need));
    if (!got)
      return fault_locked(nullptr, DiskFault::kCapacity,
                          std::to_string(bytes) + " bytes need " + std::to_string(need) +
                              " extents, " + std::to_string(extents_.num_free()) + " free");
    extents = std::move(*got);
    std::sort(extents.begin(), extents.end());
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<uint32_t>(records_.size());
      records_.emplace_back();
    }
    Record& r = records_[slot];
    r.state = Record::State::kWriting;
    r.key = key;
    r.payload_bytes = bytes;
    r.extents = extents;
    ++stats_.records;
    op.id_ = uint64_t{r.generation} << 32 | slot;
    if (fault_hook_) op.injected_ = fault_hook_(IoOp::kWrite);
  }
  RecordHeader h{kRecordMagic, kFormatVersion, kHeaderBytes, static_cast<uint64_t>(bytes),
                 sum,          key.owner,      key.tag,      op.id_,
                 session_};
  if (op.injected_ == InjectedFault::kCorrupt) h.checksum ^= 1;  // seen by the next read
  std::vector<iovec> stream;
  if (direct_) {  // one aligned copy: header, payload, zeros to the alignment
    make_bounce(op, kHeaderBytes + bytes);
    std::memcpy(op.bounce_.get(), &h, sizeof h);
    std::byte* at = op.bounce_.get() + kHeaderBytes;
    for (const auto& s : payload) {
      if (!s.empty()) std::memcpy(at, s.data(), s.size());
      at += s.size();
    }
    stream.push_back(iovec{op.bounce_.get(), static_cast<size_t>(op.bounce_bytes_)});
  } else {
    op.header_ = std::make_unique<std::byte[]>(kHeaderBytes);
    std::memcpy(op.header_.get(), &h, sizeof h);
    stream.push_back(iovec{op.header_.get(), kHeaderBytes});
    for (const auto& s : payload)
      if (!s.empty()) stream.push_back(iovec{const_cast<std::byte*>(s.data()), s.size()});
  }
  op.tier_ = this;
  op.finished_ = false;
  submit_all(op, plan_io(IoOp::kWrite, extents, stream));
  return op;
}

void DiskTier::make_bounce(DiskOp& op, int64_t bytes) const {
  op.bounce_bytes_ = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  void* p = std::aligned_alloc(kDirectAlign, static_cast<size_t>(op.bounce_bytes_));
  KVSPLIT_CHECK_MSG(p != nullptr, "disk tier: out of memory for an O_DIRECT buffer");
  op.bounce_.reset(static_cast<std::byte*>(p));
  std::memset(op.bounce_.get() + bytes, 0, static_cast<size_t>(op.bounce_bytes_ - bytes));
}

void DiskTier::submit_all(DiskOp& op, std::vector<IoRequest> reqs) {
  for (const IoRequest& r : reqs) op.expected_.push_back(r.bytes());
  if (op.injected_ == InjectedFault::kNoSpace || op.injected_ == InjectedFault::kIoError) {
    // The first request fails without I/O; the rest are never submitted.
    auto c = std::make_shared<IoCompletion>(op.expected_[0]);
    c->complete(IoResult{0, op.injected_ == InjectedFault::kNoSpace ? ENOSPC : EIO});
    op.io_.push_back(std::move(c));
    op.expected_.resize(1);
    return;
  }
  if (op.injected_ == InjectedFault::kShortIo) {
    iovec& v = reqs.back().iov.back();
    // O_DIRECT lengths stay aligned (an unaligned one would be EINVAL, not a short transfer).
    const size_t unit = direct_ ? static_cast<size_t>(kDirectAlign) : 1;
    v.iov_len -= std::max(unit, v.iov_len / 2 / unit * unit);
  }
  op.io_.reserve(reqs.size());
  for (IoRequest& r : reqs) op.io_.push_back(io_->submit(std::move(r)));
}

StatusOr<DiskOp> DiskTier::read(RecordId id, std::span<const std::span<std::byte>> dst,
                                RecordKey key) {
  int64_t bytes = 0;
  for (const auto& s : dst) bytes += static_cast<int64_t>(s.size());
  DiskOp op;
  op.started_ = std::chrono::steady_clock::now();
  op.op_ = IoOp::kRead;
  op.id_ = id;
  std::vector<int32_t> extents;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Record* r = find_locked(id);
    if (!r || r->state != Record::State::kReady)
      return not_found("disk tier " + file_ + ": no readable record " + std::to_string(id));
    if (!(r->key == key))
      return Status(StatusCode::kPermissionDenied, "disk tier " + file_ + ": record " +
                                                       std::to_string(id) +
                                                       " belongs to another owner or tag");
    if (bytes != r->payload_bytes)
      return invalid_argument("disk tier " + file_ + ": record " + std::to_string(id) + " has " +
                              std::to_string(r->payload_bytes) + " payload bytes, the buffers " +
                              std::to_string(bytes));
    ++r->readers;
    extents = r->extents;
    if (fault_hook_) op.injected_ = fault_hook_(IoOp::kRead);
  }
  op.dst_.assign(dst.begin(), dst.end());
  std::vector<iovec> stream;
  if (direct_) {  // into the aligned buffer; finish() checks it and copies the payload out
    make_bounce(op, kHeaderBytes + bytes);
    stream.push_back(iovec{op.bounce_.get(), static_cast<size_t>(op.bounce_bytes_)});
  } else {
    op.header_ = std::make_unique<std::byte[]>(kHeaderBytes);
    stream.push_back(iovec{op.header_.get(), kHeaderBytes});
    for (const auto& s : dst)
      if (!s.empty()) stream.push_back(iovec{s.data(), s.size()});
  }
  op.tier_ = this;
  op.finished_ = false;
  std::vector<IoRequest> reqs = plan_io(IoOp::kRead, extents, stream);
  // Small buffered reads the page cache holds are copied on this thread, without the hand-off to
  // the I/O thread that costs them more than their copy; large ones stay asynchronous, so their
  // copy overlaps the caller's checksum of the record before (docs/kv-tiers.md).
  if (!direct_ && config_.inline_reads)
    for (IoRequest& r : reqs) r.inline_if_cached = r.bytes() < kInlineReadBytes;
  submit_all(op, std::move(reqs));
  return op;
}

Status DiskTier::finish(DiskOp& op) {
  KVSPLIT_CHECK(op.tier_ == this && !op.finished_);
  // 1. The kernel's verdict, then (reads) the record's own: header, then checksum.
  DiskFault fault = DiskFault::kNone;
  std::string detail;
  int64_t served_inline = 0;
  for (size_t i = 0; i < op.io_.size(); ++i) {
    const IoResult res = op.io_[i]->wait();
    served_inline += op.io_[i]->served_inline();
    if (fault != DiskFault::kNone) continue;
    if (res.error != 0) {
      fault =
          res.error == ENOSPC || res.error == EDQUOT ? DiskFault::kNoSpace : DiskFault::kIoError;
      detail = std::string(op.op_ == IoOp::kRead ? "read: " : "write: ") + errno_text(res.error);
    } else if (res.bytes < op.expected_[i]) {
      fault = DiskFault::kShortIo;
      detail = std::string(op.op_ == IoOp::kRead ? "read " : "wrote ") + std::to_string(res.bytes) +
               " of " + std::to_string(op.expected_[i]) + " bytes";
    }
  }
  if (op.op_ == IoOp::kRead && fault == DiskFault::kNone) {
    if (op.injected_ == InjectedFault::kCorrupt) {
      if (op.bounce_)
        op.bounce_[kHeaderBytes] ^= std::byte{0x5a};
      else if (!op.dst_.empty() && !op.dst_[0].empty())
        op.dst_[0][0] ^= std::byte{0x5a};
    }
    RecordHeader h;
    std::memcpy(&h, op.bounce_ ? op.bounce_.get() : op.header_.get(), sizeof h);
    RecordKey key;
    int64_t payload = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Record* r = find_locked(op.id_);
      KVSPLIT_CHECK(r != nullptr);
      key = r->key;
      payload = r->payload_bytes;
    }
    if (h.magic != kRecordMagic || h.version != kFormatVersion || h.header_bytes != kHeaderBytes ||
        h.payload_bytes != static_cast<uint64_t>(payload) || h.owner != key.owner ||
        h.tag != key.tag || h.record_id != op.id_ || h.session != session_) {
      fault = DiskFault::kHeader;
      detail = "record " + std::to_string(op.id_) + ": the header on disk is not this record's";
    } else {
      std::vector<std::span<const std::byte>> segs;
      if (op.bounce_)
        segs.emplace_back(op.bounce_.get() + kHeaderBytes, static_cast<size_t>(payload));
      else
        segs.assign(op.dst_.begin(), op.dst_.end());
      if (checksum(segs) != h.checksum) {
        fault = DiskFault::kChecksum;
        detail = "record " + std::to_string(op.id_) + ": payload checksum mismatch";
      } else if (op.bounce_) {  // checked: now the caller's buffers get the payload
        const std::byte* at = op.bounce_.get() + kHeaderBytes;
        for (const auto& d : op.dst_) {
          if (!d.empty()) std::memcpy(d.data(), at, d.size());
          at += d.size();
        }
      }
    }
  }
  // 2. The index and the counters.
  std::lock_guard<std::mutex> lock(mu_);
  op.finished_ = true;
  op.io_.clear();
  op.bounce_.reset();  // the payload is in the caller's buffers (or the read failed)
  op.bounce_bytes_ = 0;
  const uint32_t slot = static_cast<uint32_t>(op.id_);
  Record* r = find_locked(op.id_);
  KVSPLIT_CHECK(r != nullptr);
  Status status;
  if (op.op_ == IoOp::kWrite) {
    if (fault != DiskFault::kNone) {
      release_locked(*r, slot);  // a failed store is never visible
    } else {
      r->state = Record::State::kReady;
      ++stats_.writes;
      stats_.bytes_written += r->payload_bytes;
    }
  } else {
    --r->readers;
    stats_.read_requests_inline += served_inline;
    if (fault == DiskFault::kNone) {
      ++stats_.reads;
      stats_.bytes_read += r->payload_bytes;
    }
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - op.started_)
          .count();
  stats_.latency_ms_ewma =
      stats_.writes + stats_.reads <= 1 ? ms : 0.8 * stats_.latency_ms_ewma + 0.2 * ms;
  if (fault != DiskFault::kNone) status = fault_locked(&op, fault, detail);
  return status;
}

Status DiskTier::wait(DiskOp& op) {
  if (op.finished_) return failed_precondition("disk tier: the op is already finished");
  return finish(op);
}

std::optional<Status> DiskTier::poll(DiskOp& op) {
  if (op.finished_) return failed_precondition("disk tier: the op is already finished");
  for (const auto& c : op.io_)
    if (!c->done()) return std::nullopt;
  return finish(op);
}

Status DiskTier::free(RecordId id) {
  std::lock_guard<std::mutex> lock(mu_);
  Record* r = find_locked(id);
  if (!r) return not_found("disk tier " + file_ + ": no record " + std::to_string(id));
  if (r->state == Record::State::kWriting || r->readers > 0)
    return failed_precondition("disk tier " + file_ + ": record " + std::to_string(id) +
                               " has an operation in flight");
  release_locked(*r, static_cast<uint32_t>(id));
  ++stats_.frees;
  return ok_status();
}

StatusOr<RecordId> DiskTier::write_sync(std::span<const std::span<const std::byte>> payload,
                                        RecordKey key) {
  KVSPLIT_ASSIGN_OR_RETURN(DiskOp op, write(payload, key));
  KVSPLIT_RETURN_IF_ERROR(wait(op));
  return op.record();
}

Status DiskTier::read_sync(RecordId id, std::span<const std::span<std::byte>> dst, RecordKey key) {
  KVSPLIT_ASSIGN_OR_RETURN(DiskOp op, read(id, dst, key));
  return wait(op);
}

StatusOr<int64_t> DiskTier::payload_bytes(RecordId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Record* r = find_locked(id);
  if (!r || r->state != Record::State::kReady)
    return not_found("disk tier " + file_ + ": no readable record " + std::to_string(id));
  return r->payload_bytes;
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats s = stats_;
  s.extents_used = extents_.num_used();
  return s;
}

void DiskTier::set_fault_hook(DiskFaultHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  fault_hook_ = std::move(hook);
}

DiskOp::DiskOp(DiskOp&& o) noexcept { *this = std::move(o); }

DiskOp& DiskOp::operator=(DiskOp&& o) noexcept {
  if (this == &o) return *this;
  if (tier_ && !finished_) (void)tier_->finish(*this);
  tier_ = std::exchange(o.tier_, nullptr);
  op_ = o.op_;
  id_ = o.id_;
  finished_ = std::exchange(o.finished_, true);
  fault_ = o.fault_;
  injected_ = o.injected_;
  header_ = std::move(o.header_);
  bounce_ = std::move(o.bounce_);
  bounce_bytes_ = std::exchange(o.bounce_bytes_, 0);
  dst_ = std::move(o.dst_);
  io_ = std::move(o.io_);
  expected_ = std::move(o.expected_);
  started_ = o.started_;
  return *this;
}

DiskOp::~DiskOp() {
  if (tier_ && !finished_) (void)tier_->finish(*this);
}

}  // namespace kvsplit::kv
