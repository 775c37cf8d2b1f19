#include "kv/disk_tier.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "kv/checksum.h"
#include "kv/disk_format.h"

namespace kvsplit::kv {

using disk_format::kDataOffset;
using disk_format::kRequestBytes;

namespace {

constexpr size_t kFewPieces = 8;  // pieces whose digests finish() keeps on the stack

std::string errno_text(int err) { return std::strerror(err); }

// The seed of a record's checksum: XXH3-64 of its identity, so its bytes verify only as this
// record (id: slot and generation), of this key, in this open, of this length.
uint64_t record_seed(RecordKey key, RecordId id, uint64_t session, int64_t payload_bytes) {
  const uint64_t words[5] = {key.owner, key.tag, id, session, static_cast<uint64_t>(payload_bytes)};
  return xxh3_64(std::as_bytes(std::span<const uint64_t>(words)), 0);
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
  if (++r.generation == 0) r.generation = 1;  // id 0 means "no record" to the callers (swap.cpp)
  --stats_.records;
  free_slots_.push_back(slot);
}

Status DiskTier::fault_locked(DiskOp* op, DiskFault f, const std::string& detail) {
  ++stats_.faults[static_cast<int>(f)];
  if (op) op->fault_ = f;
  std::string msg = "disk tier " + file_ + ": " + std::string(disk_fault_name(f)) + ": " + detail;
  if (!logged_[static_cast<int>(f)]) {
    logged_[static_cast<int>(f)] = true;
    KVSPLIT_LOG_WARN(
        "{} (the caller falls back: recompute, or a write-behind's staged copy; later {} faults "
        "are only counted)",
        msg, disk_fault_name(f));
  }
  return Status(code_of(f), std::move(msg));
}

std::vector<DiskOp::Piece> DiskTier::plan_pieces(const std::vector<int32_t>& extents,
                                                 int64_t payload_bytes) const {
  std::vector<DiskOp::Piece> pieces;
  const int64_t eb = config_.extent_bytes;
  int64_t begin = 0;
  for (size_t i = 0; i < extents.size() && begin < payload_bytes;) {
    size_t j = i + 1;  // [i, j): a run of consecutive extents
    while (j < extents.size() && extents[j] == extents[j - 1] + 1) ++j;
    int64_t offset = kDataOffset + int64_t{extents[i]} * eb;
    int64_t room = std::min(static_cast<int64_t>(j - i) * eb, payload_bytes - begin);
    while (room > 0) {
      const int64_t take = std::min(room, kRequestBytes);
      pieces.push_back(DiskOp::Piece{offset, begin, take});
      offset += take;
      begin += take;
      room -= take;
    }
    i = j;
  }
  KVSPLIT_CHECK_MSG(begin == payload_bytes, "record larger than its extents");
  return pieces;
}

std::vector<IoRequest> DiskTier::plan_io(DiskOp& op, std::span<const iovec> stream) const {
  std::vector<IoRequest> reqs;
  op.piece_of_.clear();
  size_t si = 0;    // stream segment
  size_t used = 0;  // bytes of stream[si] already planned
  for (size_t k = 0; k < op.pieces_.size(); ++k) {
    int64_t left = op.pieces_[k].bytes;
    if (k + 1 == op.pieces_.size()) {  // the last piece takes the rest: O_DIRECT's zero padding
      int64_t rest = -static_cast<int64_t>(used);
      for (size_t i = si; i < stream.size(); ++i) rest += static_cast<int64_t>(stream[i].iov_len);
      KVSPLIT_CHECK(rest >= left && rest < left + kDirectAlign);
      left = rest;
    }
    int64_t offset = op.pieces_[k].offset;
    const size_t first = reqs.size();
    reqs.push_back(IoRequest{op.op_, fd_, offset, {}});
    while (left > 0) {
      KVSPLIT_CHECK_MSG(si < stream.size(), "record longer than its buffers");
      if (reqs.back().iov.size() == IOV_MAX) reqs.push_back(IoRequest{op.op_, fd_, offset, {}});
      const int64_t take = std::min(static_cast<int64_t>(stream[si].iov_len - used), left);
      reqs.back().iov.push_back(
          iovec{static_cast<std::byte*>(stream[si].iov_base) + used, static_cast<size_t>(take)});
      offset += take;
      left -= take;
      used += static_cast<size_t>(take);
      if (used == stream[si].iov_len) ++si, used = 0;
    }
    for (size_t r = first; r < reqs.size(); ++r)
      op.piece_of_.push_back(reqs.size() - first == 1 ? static_cast<int32_t>(k) : -1);
  }
  KVSPLIT_CHECK_MSG(si == stream.size(), "record shorter than its buffers");
  return reqs;
}

uint64_t DiskTier::checksum(const DiskOp& op, std::span<const iovec> stream,
                            std::span<std::optional<uint64_t>> digests) const {
  KVSPLIT_CHECK(digests.size() == op.pieces_.size());
  std::array<uint64_t, kFewPieces> few;
  std::vector<uint64_t> many;
  if (digests.size() > kFewPieces) many.resize(digests.size());
  const std::span<uint64_t> all = many.empty() ? std::span(few).first(digests.size()) : many;
  for (size_t k = 0; k < digests.size(); ++k) {
    const DiskOp::Piece& p = op.pieces_[k];
    all[k] = digests[k] ? *digests[k] : xxh3_64(stream, op.seed_ + k, p.begin, p.bytes);
  }
  return xxh3_64(std::as_bytes(std::span<const uint64_t>(all)), op.seed_);
}

StatusOr<DiskOp> DiskTier::write(std::span<const std::span<const std::byte>> payload,
                                 RecordKey key) {
  int64_t bytes = 0;
  for (const auto& s : payload) bytes += static_cast<int64_t>(s.size());
  KVSPLIT_ASSIGN_OR_RETURN(DiskOp op, begin_write(bytes, key));
  submit_write(op, payload);
  return op;
}

StatusOr<DiskOp> DiskTier::begin_write(int64_t bytes, RecordKey key) {
  if (bytes <= 0) return invalid_argument("disk tier " + file_ + ": empty record");
  const int64_t need = extents_for(bytes, config_.extent_bytes);

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
    r.checksum = 0;  // set when the write completes
    r.extents = extents;
    ++stats_.records;
    op.id_ = uint64_t{r.generation} << 32 | slot;
    if (fault_hook_) op.injected_ = fault_hook_(IoOp::kWrite);
  }
  op.seed_ = record_seed(key, op.id_, session_, bytes);
  op.pieces_ = plan_pieces(extents, bytes);
  op.reserved_bytes_ = bytes;
  return op;
}

void DiskTier::submit_write(DiskOp& op, std::span<const std::span<const std::byte>> payload) {
  KVSPLIT_CHECK_MSG(op.op_ == IoOp::kWrite && op.tier_ == nullptr && op.reserved_bytes_ > 0,
                    "disk tier: submit_write of an op begin_write did not start");
  const int64_t bytes = op.reserved_bytes_;
  int64_t given = 0;
  for (const auto& s : payload) given += static_cast<int64_t>(s.size());
  KVSPLIT_CHECK_MSG(given == bytes, "disk tier: submit_write's payload is not the reserved size");
  op.reserved_bytes_ = 0;
  // Outside the lock: the checksum is CPU work over the payload (the record is not readable yet).
  std::vector<iovec> stream;
  for (const auto& s : payload)
    if (!s.empty()) stream.push_back(iovec{const_cast<std::byte*>(s.data()), s.size()});
  std::vector<std::optional<uint64_t>> none(op.pieces_.size());
  op.checksum_ = checksum(op, stream, none);
  if (op.injected_ == InjectedFault::kCorrupt) op.checksum_ ^= 1;  // seen by the next read
  if (direct_) {  // one aligned copy: payload, zeros to the alignment
    if (!make_bounce(op, bytes)) return fail_without_io(op, bytes, ENOMEM);
    std::byte* at = op.bounce_.get();
    for (const iovec& v : stream) {
      std::memcpy(at, v.iov_base, v.iov_len);
      at += v.iov_len;
    }
    stream.assign(1, iovec{op.bounce_.get(), static_cast<size_t>(op.bounce_bytes_)});
  }
  op.tier_ = this;
  op.finished_ = false;
  submit_all(op, plan_io(op, stream));
}

bool DiskTier::make_bounce(DiskOp& op, int64_t bytes) const {
  const int64_t aligned = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  // Under memory pressure (the time swaps happen) the buffer may not be there: the op fails as a
  // disk fault would, and its caller keeps its copy or recomputes.
  void* p = op.injected_ == InjectedFault::kNoBuffer ? nullptr
                                                     : std::aligned_alloc(kDirectAlign, aligned);
  if (p == nullptr) return false;
  op.bounce_bytes_ = aligned;
  op.bounce_.reset(static_cast<std::byte*>(p));
  std::memset(op.bounce_.get() + bytes, 0, static_cast<size_t>(aligned - bytes));
  return true;
}

void DiskTier::fail_without_io(DiskOp& op, int64_t bytes, int error) {
  op.expected_.assign(1, bytes);
  auto c = std::make_shared<IoCompletion>(bytes);
  c->complete(IoResult{0, error});
  op.io_.push_back(std::move(c));
  op.tier_ = this;
  op.finished_ = false;
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
    reqs.back().digest = false;  // its piece is no longer all there
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
  // Seeded with the reader's key (the index's, checked below): the bytes verify only as this
  // record of this key in this open.
  op.seed_ = record_seed(key, id, session_, bytes);
  // A small buffered read of one run of extents (one piece) may be served from the page cache on
  // this thread: read_cached() below, at `cached_at` in the data file.
  int64_t cached_at = -1;
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
    op.checksum_ = r->checksum;  // fixed while the read holds the record (free() refuses)
    if (fault_hook_) op.injected_ = fault_hook_(IoOp::kRead);
    const auto& ext = r->extents;
    if (!direct_ && config_.inline_reads && bytes < kInlineReadBytes && !op.injected_ &&
        dst.size() <= kCachedReadSpans &&
        ext.back() - ext.front() + 1 == static_cast<int32_t>(ext.size()))
      cached_at = kDataOffset + int64_t{ext.front()} * config_.extent_bytes;
    else
      op.pieces_ = plan_pieces(ext, bytes);
  }
  if (cached_at >= 0) {
    if (read_cached(op, dst, cached_at, bytes)) return op;
    std::lock_guard<std::mutex> lock(mu_);                      // not all cached: the usual way
    op.pieces_ = plan_pieces(find_locked(id)->extents, bytes);  // held by op's read
  }
  op.dst_.assign(dst.begin(), dst.end());
  std::vector<iovec> stream;
  if (direct_) {  // into the aligned buffer; finish() checks it and copies the payload out
    if (!make_bounce(op, bytes)) {
      fail_without_io(op, bytes, ENOMEM);
      return op;
    }
    stream.push_back(iovec{op.bounce_.get(), static_cast<size_t>(op.bounce_bytes_)});
  } else {
    for (const auto& s : dst)
      if (!s.empty()) stream.push_back(iovec{s.data(), s.size()});
  }
  op.tier_ = this;
  op.finished_ = false;
  std::vector<IoRequest> reqs = plan_io(op, stream);
  for (size_t i = 0; i < reqs.size(); ++i) {
    IoRequest& r = reqs[i];
    // Small buffered reads the page cache holds are copied on this thread, without the hand-off
    // to the I/O thread that costs them more than their copy; large ones stay asynchronous
    // (docs/kv-tiers.md).
    r.inline_if_cached = !direct_ && config_.inline_reads && r.bytes() < kInlineReadBytes;
    // A request that is a whole piece is hashed by the thread that reads it, as it lands (an
    // injected corruption is applied after the read, so those ops hash in finish()).
    const int32_t k = op.piece_of_[i];
    if (k >= 0 && op.injected_ != InjectedFault::kCorrupt) {
      r.digest = true;
      r.digest_seed = op.seed_ + static_cast<uint64_t>(k);
      r.digest_bytes = op.pieces_[k].bytes;
    }
  }
  submit_all(op, std::move(reqs));
  return op;
}

bool DiskTier::read_cached(DiskOp& op, std::span<const std::span<std::byte>> dst, int64_t offset,
                           int64_t bytes) {
#ifdef RWF_NOWAIT
  std::array<iovec, kCachedReadSpans> iov;
  int n = 0;
  for (const auto& d : dst)
    if (!d.empty()) iov[n++] = iovec{d.data(), d.size()};
  ssize_t got;
  do got = ::preadv2(fd_, iov.data(), n, offset, RWF_NOWAIT);
  while (got < 0 && errno == EINTR);
  // EAGAIN (not all cached), EOPNOTSUPP, a short read or an error: the asynchronous path reads it
  // again (over any partial copy) and reports its own result.
  if (got != bytes) return false;
  // The record checksum of a one-piece record (checksum() with one digest), hashed right after
  // the copy while the bytes are in this core's cache.
  const uint64_t piece = xxh3_64(std::span<const iovec>(iov.data(), n), op.seed_);
  if (xxh3_64(std::as_bytes(std::span<const uint64_t>(&piece, 1)), op.seed_) != op.checksum_)
    op.fault_ = DiskFault::kChecksum;
  op.cached_ = true;
  op.tier_ = this;
  op.finished_ = false;
  return true;
#else
  (void)op, (void)dst, (void)offset, (void)bytes;
  return false;
#endif
}

void DiskTier::note_latency_locked(std::chrono::steady_clock::time_point started) {
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - started).count();
  const double since_s = std::chrono::duration<double>(now - stats_.latency_at).count();
  stats_.latency_ms_ewma =
      next_latency_ewma(stats_.latency_ms_ewma, ms, since_s, stats_.writes + stats_.reads <= 1);
  stats_.latency_at = now;
}

Status DiskTier::finish(DiskOp& op) {
  KVSPLIT_CHECK(op.tier_ == this && !op.finished_);
  if (op.cached_) {  // read and checked on the caller (read_cached): the index and counters
    std::lock_guard<std::mutex> lock(mu_);
    op.finished_ = true;
    op.cached_ = false;
    Record* r = find_locked(op.id_);
    KVSPLIT_CHECK(r != nullptr);  // held by this read
    --r->readers;
    ++stats_.read_requests_inline;
    ++stats_.read_pieces_digested;
    if (op.fault_ == DiskFault::kNone) {
      ++stats_.reads;
      stats_.bytes_read += r->payload_bytes;
    }
    note_latency_locked(op.started_);
    if (op.fault_ == DiskFault::kNone) return ok_status();
    return fault_locked(&op, op.fault_,
                        "record " + std::to_string(op.id_) +
                            ": payload checksum mismatch (corrupted bytes, or another record's)");
  }
  // 1. The kernel's verdict, then (reads) the record's own: the checksum.
  DiskFault fault = DiskFault::kNone;
  std::string detail;
  int64_t served_inline = 0;
  // The pieces' digests the backend computed (a record of a few pieces needs no allocation).
  std::array<std::optional<uint64_t>, kFewPieces> few;
  std::vector<std::optional<uint64_t>> many;
  if (op.pieces_.size() > kFewPieces) many.resize(op.pieces_.size());
  const std::span<std::optional<uint64_t>> digests =
      many.empty() ? std::span(few).first(op.pieces_.size()) : std::span(many);
  for (size_t i = 0; i < op.io_.size(); ++i) {
    const IoResult res = op.io_[i]->wait();
    served_inline += op.io_[i]->served_inline();
    if (res.digested && i < op.piece_of_.size() && op.piece_of_[i] >= 0)
      digests[op.piece_of_[i]] = res.digest;
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
  int64_t pieces_digested = 0;
  for (const auto& d : digests) pieces_digested += d.has_value();
  const bool verify = op.op_ == IoOp::kRead && fault == DiskFault::kNone;
  if (verify) {
    if (op.injected_ == InjectedFault::kCorrupt) {
      if (op.bounce_)
        op.bounce_[0] ^= std::byte{0x5a};
      else if (!op.dst_.empty() && !op.dst_[0].empty())
        op.dst_[0][0] ^= std::byte{0x5a};
    }
    std::vector<iovec> stream;  // only needed for pieces the backend did not hash
    if (pieces_digested < static_cast<int64_t>(op.pieces_.size())) {
      if (op.bounce_) {
        stream.push_back(iovec{op.bounce_.get(), static_cast<size_t>(op.bounce_bytes_)});
      } else {
        for (const auto& d : op.dst_)
          if (!d.empty()) stream.push_back(iovec{d.data(), d.size()});
      }
    }
    if (checksum(op, stream, digests) != op.checksum_) {
      fault = DiskFault::kChecksum;
      detail = "record " + std::to_string(op.id_) +
               ": payload checksum mismatch (corrupted bytes, or another record's)";
    } else if (op.bounce_) {  // checked: now the caller's buffers get the payload
      const std::byte* at = op.bounce_.get();
      for (const auto& d : op.dst_) {
        if (!d.empty()) std::memcpy(d.data(), at, d.size());
        at += d.size();
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
      r->checksum = op.checksum_;
      r->state = Record::State::kReady;
      ++stats_.writes;
      stats_.bytes_written += r->payload_bytes;
    }
  } else {
    --r->readers;
    stats_.read_requests_inline += served_inline;
    if (verify) {
      stats_.read_pieces_digested += pieces_digested;
      stats_.read_pieces_hashed += static_cast<int64_t>(op.pieces_.size()) - pieces_digested;
    }
    if (fault == DiskFault::kNone) {
      ++stats_.reads;
      stats_.bytes_read += r->payload_bytes;
    }
  }
  note_latency_locked(op.started_);
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
  pieces_ = std::move(o.pieces_);
  piece_of_ = std::move(o.piece_of_);
  seed_ = o.seed_;
  checksum_ = o.checksum_;
  bounce_ = std::move(o.bounce_);
  bounce_bytes_ = std::exchange(o.bounce_bytes_, 0);
  dst_ = std::move(o.dst_);
  io_ = std::move(o.io_);
  expected_ = std::move(o.expected_);
  started_ = o.started_;
  cached_ = std::exchange(o.cached_, false);
  reserved_bytes_ = std::exchange(o.reserved_bytes_, 0);
  return *this;
}

DiskOp::~DiskOp() {
  if (tier_ && !finished_) (void)tier_->finish(*this);
}

}  // namespace kvsplit::kv
