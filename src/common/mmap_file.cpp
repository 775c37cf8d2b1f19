#include "common/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvsplit::common {

namespace {
std::string errno_text(int err) { return std::strerror(err); }
}  // namespace

StatusOr<std::shared_ptr<const MmapFile>> MmapFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(path + ": no such file");
    if (err == EACCES) return Status(StatusCode::kPermissionDenied, path + ": permission denied");
    return invalid_argument(path + ": cannot open: " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return internal_error(path + ": fstat failed: " + errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": is a directory, expected a file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return invalid_argument(path + ": empty file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping stays valid after close
  if (p == MAP_FAILED) return internal_error(path + ": mmap failed: " + errno_text(err));
  return std::shared_ptr<const MmapFile>(new MmapFile(path, static_cast<const uint8_t*>(p), size));
}

MmapFile::~MmapFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kvsplit::common
