#include "cli/stdout_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvsplit::cli {

bool StdoutWriter::write(std::string_view text, bool flush) {
  if (failed_) return false;
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), stdout) == text.size();
  const bool flushed = !flush || std::fflush(stdout) == 0;
  if (written && flushed && !std::ferror(stdout)) return true;
  failed_ = true;
  error_ = errno;
  return false;
}

Status StdoutWriter::status() const {
  if (!failed_) return ok_status();
  return internal_error(std::string("writing the output to stdout failed") +
                        (error_ != 0 ? std::string(": ") + std::strerror(error_) : std::string()));
}

}  // namespace kvsplit::cli
