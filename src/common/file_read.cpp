#include "common/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvsplit::common {
namespace {

std::string prefix(const std::string& kind, const std::string& path) {
  return kind.empty() ? path + ": " : kind + " " + path + ": ";
}

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string format_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024.0 && unit < 3) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<int64_t>(v)))
    std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(v), kUnits[unit]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

StatusOr<int> open_regular_file(const std::string& path, const std::string& kind, size_t* size) {
  const std::string where = prefix(kind, path);
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(where + "no such file");
    if (err == EACCES) return Status(StatusCode::kPermissionDenied, where + "permission denied");
    if (err == EISDIR) return invalid_argument(where + "is a directory, expected a regular file");
    return invalid_argument(where + "cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return internal_error(where + "fstat failed: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(where + "is " + file_type_name(st.st_mode) +
                            ", expected a regular file");
  }
  // Regular files never block; clear O_NONBLOCK so reads behave normally.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = static_cast<size_t>(st.st_size);
  return fd;
}

StatusOr<std::string> read_regular_file(const std::string& path, size_t max_bytes,
                                        const std::string& kind) {
  const std::string where = prefix(kind, path);
  size_t size = 0;
  KVSPLIT_ASSIGN_OR_RETURN(const int fd, open_regular_file(path, kind, &size));
  if (size > max_bytes) {
    ::close(fd);
    return invalid_argument(where + "file is " + format_bytes(size) + ", over the " +
                            format_bytes(max_bytes) + " cap for " +
                            (kind.empty() ? std::string("this kind of") : kind) + " files");
  }
  std::string data(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, data.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return data_loss(where + (n < 0 ? std::string("read error: ") + std::strerror(err)
                                      : std::string("file shrank while being read")));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

}  // namespace kvsplit::common
