#include "common/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/file_read.h"

namespace kvsplit::common {

namespace {
std::string errno_text(int err) { return std::strerror(err); }
}  // namespace

StatusOr<std::shared_ptr<const MmapFile>> MmapFile::open(const std::string& path) {
  // Non-blocking open and a regular-file check before anything is mapped (a FIFO never blocks).
  size_t size = 0;
  KVSPLIT_ASSIGN_OR_RETURN(const int fd, open_regular_file(path, "", &size));
  if (size == 0) {
    ::close(fd);
    return invalid_argument(path + ": empty file");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid after close
  if (p == MAP_FAILED) return internal_error(path + ": mmap failed: " + errno_text(err));
  return std::shared_ptr<const MmapFile>(new MmapFile(path, static_cast<const uint8_t*>(p), size));
}

MmapFile::~MmapFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kvsplit::common
