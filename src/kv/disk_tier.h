// DiskTier: the temporal cut's disk tier (kv-cuts.md §3, docs/kv-tiers.md). Checksummed records
// in one data file under a directory (`kv.disk.path`), bounded by `capacity_bytes`.
//
// A record is one caller payload (e.g. a run of pages, every layer of each, laid out as the caller
// gives them), stored as is from the start of its first extent: no header on disk (format 2).
// Space is allocated in fixed-size extents; a record takes ceil(payload / extent_bytes) of them,
// sorted, and contiguous extents go to the kernel as one request, so a sequence moves in large
// transfers. The index lives in memory and holds each record's key, length and checksum: XXH3-64
// of the payload, piece by piece, seeded by the record's key, id and this open's nonce, so bytes
// verify only as the record, key and open they were written for. Records live as long as the
// DiskTier, and opening a directory truncates what a previous process left there (never served).
//
// Faults (DiskFault) never return wrong data: every read checks the checksum (computed by the I/O
// backend as the data lands, IoRequest::digest, else by the reader). A failed write frees its
// space and its record never becomes readable.
//
// Thread-safety: every method may be called from any thread (one mutex guards the index and the
// counters); I/O completes on the BlockIo's helper thread. A DiskOp belongs to the thread that
// started it. Buffers handed to write()/read() belong to the tier until the op is finished.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/block_io.h"
#include "kvsplit/status.h"

namespace kvsplit::kv {

struct DiskTierConfig {
  std::string path;                         // kv.disk.path: a directory, created when missing
  int64_t capacity_bytes = 0;               // kv.disk.capacity_mb << 20; record space, > 0
  int64_t extent_bytes = int64_t{1} << 20;  // allocation unit: a multiple of 4096
  IoOptions io;  // backend: auto (threads buffered, io_uring with O_DIRECT) | uring | threads
  // kv.disk.direct_io: O_DIRECT, so the tier bypasses the page cache (a large tier does not
  // fill it; reads measure the device). Records go through a 4 KiB-aligned bounce buffer (the
  // callers' pages are not aligned). A file system that refuses O_DIRECT (some FUSE and network
  // ones; tmpfs before Linux 6.6) falls back to buffered I/O, logged; DiskTierStats::direct_io says
  // which is in use.
  bool direct_io = false;
  // Buffered reads smaller than DiskTier::kInlineReadBytes first try the page cache on the
  // reading thread (IoRequest::inline_if_cached). Off: every read goes through the I/O backend
  // (bench_tiers --no-inline compares the two).
  bool inline_reads = true;
};

// Why an operation failed; each has its own counter and is logged once per tier.
enum class DiskFault : uint8_t {
  kNone = 0,
  kCapacity,  // capacity_bytes reached (kResourceExhausted, at write(); no I/O)
  kNoSpace,   // the file system is full: ENOSPC/EDQUOT (kResourceExhausted)
  kIoError,   // any other errno, EIO above all (kUnavailable)
  kShortIo,   // the kernel moved fewer bytes than asked (kDataLoss)
  // The payload's seeded checksum differs from the index's: corrupted bytes, or bytes of another
  // record, key or open at its place (kDataLoss).
  kChecksum,
};
inline constexpr int kNumDiskFaults = 6;
std::string_view disk_fault_name(DiskFault f);

// Faults the hook can inject into the next record operations (tests): kNoSpace / kIoError fail
// the operation's first request without I/O, kShortIo truncates its last request, kCorrupt flips
// a payload byte after a read (or stores a wrong checksum on a write, seen by the next read).
// kNoBuffer: an O_DIRECT tier cannot allocate the op's aligned buffer (memory pressure); no
// effect on a buffered tier.
enum class InjectedFault : uint8_t { kNoSpace, kIoError, kShortIo, kCorrupt, kNoBuffer };
// Asked once per record operation (on the thread that starts it, under the tier's lock);
// nullopt = no fault. Unset (the default) costs one branch.
using DiskFaultHook = std::function<std::optional<InjectedFault>(IoOp op)>;
// A hook that injects `fault` into the next `n` operations of kind `op`.
DiskFaultHook inject_next(IoOp op, InjectedFault fault, int n);

// The caller's fields of a record, checked on every read (e.g. owner = tenant salt hash,
// tag = the chained prefix hash or a sequence id).
struct RecordKey {
  uint64_t owner = 0;
  uint64_t tag = 0;
  bool operator==(const RecordKey&) const = default;
};

// A record's handle: slot and generation, so a freed id never names a later record. Never 0
// (generations start at 1 and skip 0 when they wrap), which callers use for "no record".
using RecordId = uint64_t;

struct DiskTierStats {
  int64_t capacity_bytes = 0;  // extents * extent_bytes
  int64_t extent_bytes = 0;
  int64_t extents_total = 0;
  int64_t extents_used = 0;                   // by records being written or readable
  int64_t records = 0;                        // being written or readable
  int64_t writes = 0, reads = 0, frees = 0;   // completed without a fault
  int64_t bytes_written = 0, bytes_read = 0;  // payload bytes of those
  // I/O requests of reads the page cache served on the reading thread (IoRequest's
  // inline_if_cached: buffered requests under DiskTier::kInlineReadBytes).
  int64_t read_requests_inline = 0;
  // Pieces of reads (one per run of extents, at most 8 MiB) whose checksum the I/O backend
  // computed as the data landed (IoRequest::digest), and those the reader hashed itself (a
  // piece split over several requests, an injected corruption, a backend wrapper without it).
  int64_t read_pieces_digested = 0, read_pieces_hashed = 0;
  // EWMA (weight 0.2) of the time from starting a write or read to finishing it (wait() or the
  // poll() that saw it done), in ms; 0 before the first. The KV cache manager's storage latency.
  double latency_ms_ewma = 0;
  // When the last of those finished (the epoch before the first): a monitor reads the EWMA as
  // current only while operations keep coming.
  std::chrono::steady_clock::time_point latency_at{};
  bool direct_io = false;  // O_DIRECT in use (asked for and accepted by the file system)
  std::array<int64_t, kNumDiskFaults> faults{};  // by DiskFault (kNone unused)
  int64_t fault_count(DiskFault f) const { return faults[static_cast<int>(f)]; }
};

// The latency EWMA after an operation of `ms` that finished `since_s` seconds after the previous
// one (`first`: none before): the old average keeps weight 0.8 decayed by e^-since_s, so a disk
// idle for seconds starts afresh instead of its old latency returning with the next operation
// (a rule that stopped using a slow disk would enter again at once); under load it is the plain
// EWMA of weight 0.2.
inline double next_latency_ewma(double ewma, double ms, double since_s, bool first) {
  if (first) return ms;
  const double keep = 0.8 * std::exp(-std::max(0.0, since_s));
  return keep * ewma + (1.0 - keep) * ms;
}

class DiskTier;

// One record operation in flight. Finish it with DiskTier::wait() (or poll() until it returns a
// status); destroying an unfinished op waits for it. Movable, not copyable.
class DiskOp {
 public:
  DiskOp() = default;
  DiskOp(DiskOp&& other) noexcept;
  DiskOp& operator=(DiskOp&& other) noexcept;
  DiskOp(const DiskOp&) = delete;
  DiskOp& operator=(const DiskOp&) = delete;
  ~DiskOp();

  RecordId record() const { return id_; }  // a write's new record (readable once finished OK)
  bool finished() const { return finished_; }
  DiskFault fault() const { return fault_; }  // after finishing; kNone on success

 private:
  friend class DiskTier;
  DiskTier* tier_ = nullptr;
  IoOp op_ = IoOp::kRead;
  RecordId id_ = 0;
  bool finished_ = true;
  DiskFault fault_ = DiskFault::kNone;
  std::optional<InjectedFault> injected_;
  // The record's pieces: its payload cut at each run of consecutive extents and every 8 MiB
  // within a run; each has its own digest (xxh3_64 with seed_ + its index) and is one request
  // unless its iovecs pass IOV_MAX.
  struct Piece {
    int64_t offset = 0;  // in the data file
    int64_t begin = 0;   // in the payload
    int64_t bytes = 0;
  };
  std::vector<Piece> pieces_;
  std::vector<int32_t> piece_of_;  // per request: the piece it covers whole, else -1
  uint64_t seed_ = 0;              // the record's checksum seed (key, id, session, length)
  // Writes: the checksum the index gets when the write completes; reads: the index's, to check.
  uint64_t checksum_ = 0;
  // O_DIRECT: payload + zero padding, 4 KiB-aligned and a multiple of 4 KiB long; reads land here
  // and are checked and copied to dst_ when the op finishes.
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte[], FreeDeleter> bounce_;
  int64_t bounce_bytes_ = 0;
  std::vector<std::span<std::byte>> dst_;  // reads: where the payload goes
  std::vector<std::shared_ptr<IoCompletion>> io_;
  std::vector<int64_t> expected_;  // bytes each request must move
  std::chrono::steady_clock::time_point started_{};
  // The read was done and checked on the caller (DiskTier::read_cached; fault_ holds the
  // verdict): finishing it only updates the index and the counters.
  bool cached_ = false;
  // A write begin_write reserved and submit_write has not started: its payload's bytes.
  int64_t reserved_bytes_ = 0;
};

class DiskTier {
 public:
  // Opens (creates) `config.path`/kvsplit-kv-tier.data, locked against other openers; it holds
  // the header, and the records go to a file with no name in the same directory (lock_fd_, fd_).
  // Errors name the path and the errno text: kInvalidArgument (bad config, more than kMaxExtents
  // extents, a path that is not a directory), kResourceExhausted (no memory for the extents'
  // bookkeeping; nothing opened), kPermissionDenied, kFailedPrecondition (the data file exists and
  // is not ours; it is left untouched), kUnavailable (locked by another tier, or no usable I/O
  // backend).
  static StatusOr<std::unique_ptr<DiskTier>> open(const DiskTierConfig& config);
  ~DiskTier();  // waits for nothing: every DiskOp must be finished or destroyed first
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Starts writing one record: the concatenation of `payload`. kResourceExhausted (kCapacity)
  // when the space is not free, kInvalidArgument for an empty payload; nothing is allocated then.
  StatusOr<DiskOp> write(std::span<const std::span<const std::byte>> payload, RecordKey key);
  // write() in two halves, for a caller that hands the second to another thread (the swap
  // write-behind): begin_write reserves the record (its id is op.record(); kCapacity, kInvalid-
  // Argument as write()) and submit_write, on any thread, checksums `payload` (exactly the
  // reserved bytes), copies it for O_DIRECT and submits it. The op then belongs to that thread.
  // A reserved op must be submitted (until then its record is neither readable nor freeable).
  StatusOr<DiskOp> begin_write(int64_t bytes, RecordKey key);
  void submit_write(DiskOp& op, std::span<const std::span<const std::byte>> payload);
  // Starts reading record `id` into `dst` (whose sizes must add up to its payload length); its
  // checksum is seeded with `key`, so it verifies only for the key it was written with. kNotFound
  // for an unknown id or a record still being written, kPermissionDenied when `key` is not the
  // record's, kInvalidArgument for a size mismatch.
  StatusOr<DiskOp> read(RecordId id, std::span<const std::span<std::byte>> dst, RecordKey key);
  // Waits for `op` and returns how it ended (the fault's Status; see DiskFault). A failed write
  // has freed its space; a failed read leaves the record (free it: its bytes cannot be trusted).
  Status wait(DiskOp& op);
  // nullopt while `op` is in flight, else what wait() would return.
  std::optional<Status> poll(DiskOp& op);
  // Returns the record's extents. kNotFound for an unknown id; kFailedPrecondition while an op
  // on it is in flight.
  Status free(RecordId id);

  // Synchronous forms.
  StatusOr<RecordId> write_sync(std::span<const std::span<const std::byte>> payload, RecordKey key);
  Status read_sync(RecordId id, std::span<const std::span<std::byte>> dst, RecordKey key);

  // Payload bytes of record `id` (kNotFound when it is not readable).
  StatusOr<int64_t> payload_bytes(RecordId id) const;
  DiskTierStats stats() const;
  IoBackend io_backend() const { return io_->backend(); }
  // The named file (header and lock; errors name it).
  const std::string& data_file() const { return file_; }
  // A path to the records' unnamed file while the tier is open, in this process
  // (/proc/self/fd/N; tests that read or corrupt records through it).
  std::string records_path() const { return "/proc/self/fd/" + std::to_string(fd_); }
  // Tests: replace (or with nullptr clear) the fault hook.
  void set_fault_hook(DiskFaultHook hook);
  // Writes back and drops the data file's page cache (measurements of the device itself).
  void drop_cache();

  // Extents a record of `payload_bytes` takes.
  static int64_t extents_for(int64_t payload_bytes, int64_t extent_bytes) {
    return (payload_bytes + extent_bytes - 1) / extent_bytes;
  }
  // 2: no record header on disk; key, length and checksum in the index (docs/kv-tiers.md).
  static constexpr uint32_t kFormatVersion = 2;
  // Buffered read requests smaller than this try the page cache on the reading thread first.
  static constexpr int64_t kInlineReadBytes = int64_t{256} << 10;
  static constexpr int64_t kDirectAlign = 4096;  // O_DIRECT buffer, offset and length alignment
  // Destination spans a read may have to take the fast path on the caller (read_cached).
  static constexpr size_t kCachedReadSpans = 16;
  // At most this many extents per tier (kv.disk.capacity_mb / extent_bytes), as KvPool::kMaxBlocks
  // per pool: their bookkeeping (~9 bytes each: ~600 MB at the cap) is allocated at open.
  static constexpr int64_t kMaxExtents = int64_t{1} << 26;

 private:
  struct Record;
  DiskTier(DiskTierConfig config, std::string file, int lock_fd, int fd,
           std::unique_ptr<BlockIo> io, BlockAllocator extents, uint64_t session, bool direct);
  // O_DIRECT: a zeroed, aligned buffer of `bytes` rounded up to kDirectAlign, in `op`.
  // False when the buffer cannot be allocated (then fail_without_io fails the op).
  bool make_bounce(DiskOp& op, int64_t bytes) const;
  // Completes `op` with errno `error` and no I/O (finish() reports it as any failed I/O).
  void fail_without_io(DiskOp& op, int64_t bytes, int error);
  Status finish(DiskOp& op);  // op's I/O is done: check it, update the index and counters
  Status fault_locked(DiskOp* op, DiskFault f, const std::string& detail);
  Record* find_locked(RecordId id);
  const Record* find_locked(RecordId id) const;
  void release_locked(Record& r, uint32_t slot);
  // The pieces of a record of `payload_bytes` over `extents` (DiskOp::pieces_).
  std::vector<DiskOp::Piece> plan_pieces(const std::vector<int32_t>& extents,
                                         int64_t payload_bytes) const;
  // Splits the byte stream (the payload, plus O_DIRECT's padding) over op's pieces into requests;
  // fills op.piece_of_.
  std::vector<IoRequest> plan_io(DiskOp& op, std::span<const iovec> stream) const;
  // The record checksum over `stream` (the payload from its start), hashing each piece not
  // already in `digests` (nullopt entries).
  uint64_t checksum(const DiskOp& op, std::span<const iovec> stream,
                    std::span<std::optional<uint64_t>> digests) const;
  // Submits `reqs` for `op` (which must be complete but for its I/O), applying op's injected fault.
  void submit_all(DiskOp& op, std::vector<IoRequest> reqs);
  // The small-read fast path: reads `bytes` at `offset` (one piece) into `dst` on this thread with
  // preadv2(RWF_NOWAIT) and checks it (op.cached_ set; finish() settles the index and counters).
  // False, with nothing changed, when the page cache does not hold all of it (the caller then
  // goes the asynchronous way).
  bool read_cached(DiskOp& op, std::span<const std::span<std::byte>> dst, int64_t offset,
                   int64_t bytes);
  // The latency EWMA and its time after an operation started at `started` finished now.
  void note_latency_locked(std::chrono::steady_clock::time_point started);

  const DiskTierConfig config_;
  const std::string file_;
  // The named file: the header and the lock, no record. The records live in fd_, a file with no
  // name in the same directory (O_TMPFILE, or created and unlinked at once): the kernel frees it
  // when the process ends, however it ends, so tenants' KV never stays at rest after a crash.
  const int lock_fd_;
  const int fd_;
  const std::unique_ptr<BlockIo> io_;
  const uint64_t session_;  // random per open: records of another open never match
  const bool direct_;       // O_DIRECT on fd_

  mutable std::mutex mu_;  // everything below
  BlockAllocator extents_;
  std::vector<Record> records_;
  std::vector<uint32_t> free_slots_;
  DiskTierStats stats_;
  std::array<bool, kNumDiskFaults> logged_{};
  DiskFaultHook fault_hook_;

  friend class DiskOp;
};

// Write and read bandwidth of `tier` with records of `record_bytes`, `total_bytes` in all
// (the records are freed again). `cold`: drop the page cache between writing and reading, so the
// read figure is the device's. For the cost model at start-up: the defaults take well under a
// second on a local SSD.
struct DiskBandwidth {
  double write_bytes_per_s = 0;
  double read_bytes_per_s = 0;
};
StatusOr<DiskBandwidth> measure_disk_bandwidth(DiskTier& tier,
                                               int64_t record_bytes = int64_t{4} << 20,
                                               int64_t total_bytes = int64_t{64} << 20,
                                               bool cold = false);

}  // namespace kvsplit::kv
