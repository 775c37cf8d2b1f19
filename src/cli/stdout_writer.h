// Incremental output of a `kvsplit` subcommand (streamed text, one JSON line per prompt or per
// input line): notices the first write to stdout that fails, so that the subcommand stops the
// work whose output could not be written instead of finishing it (README "Exit codes").
//
// A closed pipe is such a failure and not a signal: main() ignores SIGPIPE, so `kvsplit ... |
// head -c 10` ends at the first write after `head` exits, with exit 1 and one line on stderr.
#pragma once

#include <string>
#include <string_view>

#include "kvsplit/status.h"

namespace kvsplit::cli {

// Not thread-safe: one thread writes (the one that runs the subcommand).
class StdoutWriter {
 public:
  // Writes `text` to stdout (the stdio stream std::cout shares), and with `flush` hands it to the
  // OS at once: a pipe's reader sees it now, and a full disk or a reader gone is noticed at this
  // write. Without it a failure is noticed once stdio's buffer is written out (a few KiB later).
  // False once a write has failed (this one or an earlier one); nothing is written after that.
  bool write(std::string_view text, bool flush);

  bool failed() const { return failed_; }
  // "writing the output to stdout failed: <errno text>" (as cli::flush_stdout says it); OK while
  // every write succeeded.
  Status status() const;

 private:
  bool failed_ = false;
  int error_ = 0;  // errno of the failed write (0: unknown)
};

}  // namespace kvsplit::cli
