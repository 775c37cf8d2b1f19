// DiskTier::open: the directory, the data file (ours or refused), its lock and its file header.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <random>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "kv/disk_format.h"
#include "kv/disk_tier.h"

namespace kvsplit::kv {

using disk_format::FileHeader;
using disk_format::kDataOffset;
using disk_format::kFileMagic;
using disk_format::kFileName;

namespace {
std::string errno_text(int err) { return std::strerror(err); }
}  // namespace

StatusOr<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierConfig& config) {
  const std::string& dir = config.path;
  if (dir.empty()) return invalid_argument("disk tier: kv.disk.path is empty");
  if (config.extent_bytes <= 0 || config.extent_bytes % 4096 != 0)
    return invalid_argument("disk tier " + dir + ": extent_bytes " +
                            std::to_string(config.extent_bytes) + " is not a multiple of 4096");
  const int64_t extents = config.capacity_bytes / config.extent_bytes;
  if (extents < 1)
    return invalid_argument("disk tier " + dir + ": capacity_bytes " +
                            std::to_string(config.capacity_bytes) + " holds no whole extent of " +
                            std::to_string(config.extent_bytes) + " bytes");
  if (extents > kMaxExtents)
    return invalid_argument(
        "disk tier " + dir + ": capacity_bytes " + std::to_string(config.capacity_bytes) +
        " (kv.disk.capacity_mb, --disk-capacity-mb) gives " + std::to_string(extents) +
        " extents of " + std::to_string(config.extent_bytes) + " bytes, more than " +
        std::to_string(kMaxExtents) + " per tier; at most " +
        std::to_string(kMaxExtents * config.extent_bytes >> 20) + " MiB with this extent size");
  // The extents' bookkeeping (~9 bytes each) before any file is opened: when it cannot be
  // allocated, nothing is left open or locked.
  std::optional<BlockAllocator> allocator;
  try {
    allocator.emplace(static_cast<int>(extents));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("disk tier " + dir + ": no memory for the bookkeeping of " +
                              std::to_string(extents) + " extents (~" +
                              std::to_string(extents * 9 >> 20) +
                              " MiB); lower kv.disk.capacity_mb (--disk-capacity-mb)");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    const int err = ec.value();
    const StatusCode code = err == EACCES || err == EPERM || err == EROFS
                                ? StatusCode::kPermissionDenied
                                : StatusCode::kInvalidArgument;
    return Status(code, "disk tier " + dir + ": cannot create the directory: " + ec.message());
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalid_argument("disk tier " + dir + ": is not a directory");

  const std::string file = (std::filesystem::path(dir) / kFileName).string();
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int err = errno;
    const StatusCode code = err == EACCES || err == EPERM || err == EROFS
                                ? StatusCode::kPermissionDenied
                                : StatusCode::kFailedPrecondition;
    return Status(code, "disk tier " + file + ": cannot open: " + errno_text(err));
  }
  auto fail = [&](StatusCode code, const std::string& what) {
    ::close(fd);
    return Status(code, "disk tier " + file + ": " + what);
  };
  if (::fstat(fd, &st) != 0) return fail(StatusCode::kInternal, "fstat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return fail(StatusCode::kFailedPrecondition, "not a regular file");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    return fail(StatusCode::kUnavailable, err == EWOULDBLOCK
                                              ? "in use by another disk tier (locked)"
                                              : "flock: " + errno_text(err));
  }
  if (st.st_size > 0) {
    uint64_t magic = 0;
    const bool read = ::pread(fd, &magic, sizeof magic, 0) == static_cast<ssize_t>(sizeof magic);
    // A header that never reached the disk (a crash or power loss while a tier was being set up)
    // reads back as zeros over at most the header page: ours, to set up again.
    const bool unwritten = read && magic == 0 && st.st_size <= kDataOffset;
    if (!read || (magic != kFileMagic && !unwritten))
      return fail(StatusCode::kFailedPrecondition,
                  "exists and is not a kvsplit disk tier file; left untouched");
  }
  // The records: a file with no name beside it (DiskTier::fd_), laid out as the named one was.
  // Made before the named file is touched, so a directory it cannot be made in changes nothing.
  int data = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (data < 0) {  // a file system without O_TMPFILE: create it and take its name away at once
    std::string name = (std::filesystem::path(dir) / ".kvsplit-kv-tier-XXXXXX").string();
    data = ::mkostemp(name.data(), O_CLOEXEC);
    if (data >= 0) ::unlink(name.c_str());
  }
  if (data < 0) {
    const int err = errno;
    return fail(err == EACCES || err == EPERM || err == EROFS ? StatusCode::kPermissionDenied
                                                              : StatusCode::kUnavailable,
                "cannot create its data file in " + dir + ": " + errno_text(err));
  }
  auto fail_data = [&](StatusCode code, const std::string& what) {
    ::close(data);
    return fail(code, what);
  };
  // Records never outlive the tier that wrote them: drop whatever a previous process left. The
  // header is synced once: a power loss must not leave a file every later open refuses.
  std::random_device rd;
  const uint64_t session =
      (uint64_t{rd()} << 32 | rd()) ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const FileHeader fh{kFileMagic, kFormatVersion, 0, config.extent_bytes, session};
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, &fh, sizeof fh, 0) != sizeof fh ||
      ::ftruncate(fd, kDataOffset) != 0 || ::fdatasync(fd) != 0)
    return fail_data(StatusCode::kUnavailable, "cannot initialize: " + errno_text(errno));
  if (::pwrite(data, &fh, sizeof fh, 0) != sizeof fh ||
      ::ftruncate(data, kDataOffset + extents * config.extent_bytes) != 0)
    return fail_data(StatusCode::kUnavailable, "cannot initialize: " + errno_text(errno));
  struct statvfs vfs {};
  if (::fstatvfs(data, &vfs) == 0 &&
      static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize) <
          config.capacity_bytes)
    KVSPLIT_LOG_WARN(
        "disk tier {}: the file system has {} bytes free, less than capacity {}; "
        "writes may fail with ENOSPC (counted as no_space)",
        file, static_cast<int64_t>(vfs.f_bavail) * vfs.f_frsize, config.capacity_bytes);
  // O_DIRECT after the (unaligned) header write: every record I/O from here on is aligned.
  bool direct = false;
  if (config.direct_io) {
    const int flags = ::fcntl(data, F_GETFL);
    if (flags >= 0 && ::fcntl(data, F_SETFL, flags | O_DIRECT) == 0) {
      direct = true;
    } else {
      KVSPLIT_LOG_WARN("disk tier {}: the file system refuses O_DIRECT ({}); using buffered I/O",
                       file, errno_text(errno));
    }
  }
  // IoBackend::kAuto, per tier (docs/kv-tiers.md "I/O backends"): a buffered tier takes the
  // helper threads, which measured at or above io_uring for every record size against the page
  // cache (io_uring punts buffered writes to its workers one by one and hashes a read's digest on
  // its single reaper); an O_DIRECT tier takes io_uring when it runs, for its deep device queues.
  IoOptions io_options = config.io;
  if (io_options.backend == IoBackend::kAuto && !direct) io_options.backend = IoBackend::kThreads;
  StatusOr<std::unique_ptr<BlockIo>> io = BlockIo::create(io_options);
  if (!io.ok()) return fail_data(io.status().code(), io.status().message());
  return std::unique_ptr<DiskTier>(new DiskTier(config, file, fd, data, std::move(io).value(),
                                                std::move(*allocator), session, direct));
}

DiskTier::DiskTier(DiskTierConfig config, std::string file, int lock_fd, int fd,
                   std::unique_ptr<BlockIo> io, BlockAllocator extents, uint64_t session,
                   bool direct)
    : config_(std::move(config)),
      file_(std::move(file)),
      lock_fd_(lock_fd),
      fd_(fd),
      io_(std::move(io)),
      session_(session),
      direct_(direct),
      extents_(std::move(extents)) {
  const int64_t total = extents_.num_blocks();
  stats_.direct_io = direct_;
  stats_.extent_bytes = config_.extent_bytes;
  stats_.extents_total = total;
  stats_.capacity_bytes = total * config_.extent_bytes;
  KVSPLIT_LOG_INFO("disk tier {}: {} extents of {} bytes, I/O backend {}{}", file_, total,
                   config_.extent_bytes, io_backend_name(io_->backend()),
                   direct_ ? ", O_DIRECT" : "");
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Record& r : records_)
      KVSPLIT_CHECK_MSG(r.state != Record::State::kWriting && r.readers == 0,
                        "DiskTier destroyed with an unfinished DiskOp");
  }
  // Records never outlive the tier: their file has no name, so closing it gives its space back
  // (as a crash would). The named file keeps the header, so the next open knows it is ours.
  ::close(fd_);
  ::close(lock_fd_);  // releases the lock
}

void DiskTier::drop_cache() {
  ::fdatasync(fd_);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

}  // namespace kvsplit::kv
